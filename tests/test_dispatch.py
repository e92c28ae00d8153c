"""Repeated calls: the call plan a function keeps per argument shapes (runtime/cpu.py:
CallPlan) must give what a fresh call gives, fill its buffers from each call's arrays, and
be rebuilt when the executable's workspaces move."""
from __future__ import annotations

import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera.errors import TesseraError
from tessera.runtime import cpu


def rnd(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_data_address_reads_what_ctypes_reports():
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    ro = np.frombuffer(base.tobytes(), np.float32)          # read-only, not owning its memory
    for a in (base, base[2:], base[1:, 3:], base.T, ro, np.empty(0, np.float64), np.array(3.0, np.float32)):
        assert cpu.data_address(a) == a.ctypes.data


def test_repeated_calls_use_each_calls_arrays_and_new_results(rng):
    f = ts.jit(lambda a, b: ts.ops.gelu(a @ b) + 1.0)
    outs, refs = [], []
    for _ in range(3):                                     # the second and third calls run the kept plan
        a, b = rnd(rng, 37, 29), rnd(rng, 29, 41)
        outs.append(f(a, b))
        refs.append(O.gelu_tanh(O.f64(a) @ O.f64(b)) + 1.0)
    assert len(f._plans) == 1
    assert len({o.ctypes.data for o in outs}) == 3          # every call returns its own array ...
    for y, ref in zip(outs, refs):                         # ... which no later call overwrote
        O.assert_close(y, ref, 1e-5)


def test_a_shape_sweep_alternating_between_plans_stays_exact(rng):
    f = ts.jit(lambda x, w, c: ts.ops.softmax(x @ w + c))
    shapes = [(7, 13, 31), (127, 64, 1000), (7, 13, 31), (1, 1025, 3), (127, 64, 1000)]
    for m, k, n in shapes:
        x, w, c = rnd(rng, m, k), rnd(rng, k, n), rnd(rng, n)
        y = f(x, w, c)
        # f32 logits of magnitude ~sqrt(k) carry rounding ~k eps: softmax turns it into relative error
        O.assert_close(y, O.softmax(O.f64(x) @ O.f64(w) + c), 1e-5 * max(1.0, k / 64))
    assert len(f._plans) == 3


def test_a_plan_is_rebuilt_after_its_workspaces_moved(rng, monkeypatch):
    from collections import OrderedDict
    from tessera.frontend import compile as compile_mod
    monkeypatch.setattr(compile_mod, "_MEMORY", OrderedDict())   # an executable no earlier test grew
    f = ts.jit(lambda a, b: a @ b)
    small = (rnd(rng, 33, 17), rnd(rng, 17, 9))
    f(*small)
    f(*small)
    (v, plan), = f._plans.values()
    exe = v.compiled.executable
    gen = plan.gen
    big = (rnd(rng, 600, 700), rnd(rng, 700, 800))          # larger packing buffers: the workspaces move
    O.assert_close(f(*big), O.f64(big[0]) @ O.f64(big[1]), 1e-5)
    assert exe._gen != gen
    y = f(*small)
    O.assert_close(y, O.f64(small[0]) @ O.f64(small[1]), 1e-5)
    assert plan.gen == exe._gen
    ps = plan.steps[0]
    nbuf = len(ps.step.args) + len(ps.step.outs) + len(ps.step.dims)
    assert int(ps.words[nbuf + 1]) == exe._team[1]          # the words hold today's addresses
    assert int(ps.words[nbuf + 2]) == exe._ws_pool[0][1]


def test_the_kept_plan_still_fails_closed(rng):
    f = ts.jit(lambda x: ts.ops.exp(x) - 1.0)
    x = rnd(rng, 6, 9)
    f(x)
    f(x)
    exe = f.compile(x).compiled.executable
    saved = dict(exe.fns)
    exe.fns.clear()
    try:
        with pytest.raises(TesseraError) as e:
            f(x)
        assert e.value.code == "LANE_UNAVAILABLE"
    finally:
        exe.fns.update(saved)
    before = len(ts.lane_log.entries)
    f(x)
    assert [d.lane for d in ts.lane_log.entries[before:]] == ["cpu-x86"]


def test_arguments_a_plan_cannot_serve_take_the_checked_path(rng):
    f = ts.jit(lambda a, s: a * s)
    x = rnd(rng, 8, 6)
    O.assert_close(f(x, 2.0), O.f64(x) * 2.0, 1e-7)
    O.assert_close(f(x, 3.0), O.f64(x) * 3.0, 1e-7)                   # the scalar is a runtime value: one plan
    O.assert_close(f(x.T, 2.0), O.f64(x.T) * 2.0, 1e-7)               # not contiguous: copied, never planned
    assert len(f._plans) == 1
    fs = ts.jit(lambda a, s: a * s, static_argnums=1)
    O.assert_close(fs(x, 2.0), O.f64(x) * 2.0, 1e-7)
    O.assert_close(fs(x, 3.0), O.f64(x) * 3.0, 1e-7)                 # a static scalar is part of the key
    assert len(fs._plans) == 2
    g = ts.jit(lambda a, b: a + b)
    g(x, x)
    g(x, x)
    with pytest.raises(TesseraError) as e:                 # sizes a plan was never made for are checked
        g(x, rnd(rng, 5, 6))
    assert e.value.code == "SHAPE_MISMATCH"


def test_a_negative_zero_scalar_is_not_served_by_the_positive_zero_kernel(rng):
    # the scalar is part of the compiled kernel; -0.0 == 0.0 in Python, so keys hold its bits
    f = ts.jit(lambda a, s: a * s)
    x = np.abs(rnd(rng, 5, 3)) + 0.5
    for s in (0.0, -0.0, 0.0, -0.0):
        np.testing.assert_array_equal(np.signbit(f(x, s)), np.signbit(x * s))
