"""``tessera.jit(donate_argnums=...)`` and the multi-tensor optimizer step (issue 28).

Donated results equal non-donated ones (float64 oracle, fresh random data); where the donation
is honoured the result lives in the donated buffer (np.shares_memory), and nothing else is
written; where a kernel reads the donated input at other elements (a transpose, a GEMM) it is
refused -- and a planted flag that forces aliasing there gives a wrong answer the oracle catches.
AdamW over 10 steps with donation matches float64 numpy, runs in two launches a step whatever the
number of parameters (a planted one-launch-per-parameter pipeline is caught), and allocates no
parameter-sized buffer per step with donation (it allocates p', m', v' without)."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import optim
from tessera.errors import ArgumentError, DonationError
from tessera.runtime import cpu, memory

O = ts.ops


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------- honoured / refused

def axpy(x, y, a):
    return x * a + O.tanh(y)


def test_donated_result_equals_plain_and_lives_in_the_donated_buffer(rng):
    x, y = _f32(rng, 129, 65), _f32(rng, 129, 65)
    want = x.astype(np.float64) * 0.5 + np.tanh(y.astype(np.float64))
    plain = ts.jit(axpy)(x, y, 0.5)
    donor = x.copy()
    y0 = y.copy()
    got = ts.jit(axpy, donate_argnums=0)(donor, y, 0.5)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(got, plain)
    assert np.shares_memory(got, donor) and got.ctypes.data == donor.ctypes.data
    assert not np.shares_memory(got, y) and np.array_equal(y, y0)   # a non-donated argument is untouched
    assert not donor.flags.writeable   # consumed: read-only
    with pytest.raises(ValueError):
        donor[0, 0] = 1.0
    with pytest.raises(DonationError) as e:   # donating the consumed array again
        ts.jit(axpy, donate_argnums=0)(donor, y, 0.5)
    assert e.value.code == "BAD_DONATION"
    got[0, 0] = 7.0   # the result is the caller's to write


def test_loop_updates_in_place_from_result_to_result(rng):
    """``x = step(x, ...)``: every step writes the same buffer."""
    step = ts.jit(axpy, donate_argnums=0)
    x = _f32(rng, 300, 40)
    addr = x.ctypes.data
    ref = x.astype(np.float64)
    for _ in range(4):
        y = _f32(rng, 300, 40)
        x = step(x, y, 0.9)
        ref = ref * 0.9 + np.tanh(y.astype(np.float64))
        assert x.ctypes.data == addr
    np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-5)


def transposed(x, y):
    return x.T * 2.0 + y


def gemm_then(x, w):
    return x @ w + 1.0


@pytest.mark.parametrize("fn", [transposed, gemm_then])
def test_refused_where_a_kernel_reads_other_elements(rng, fn):
    x, y = _f32(rng, 96, 96), _f32(rng, 96, 96)
    jf = ts.jit(fn, donate_argnums=0)
    want = ts.jit(fn)(x, y)
    donor = x.copy()
    got = jf(donor, y)
    np.testing.assert_array_equal(got, want)
    assert not np.shares_memory(got, donor) and np.array_equal(donor, x) and donor.flags.writeable
    lines = ts.explain(jf, x, y).donated
    assert len(lines) == 1 and "refused" in lines[0] and "other elements" in lines[0], lines


def test_plant_forced_aliasing_of_a_transpose_is_caught(rng):
    """Teeth: ``x.T * 2 + y`` is refused (the transpose reads x across rows); a planted flag claiming
    the transpose kernel reads x only where it writes (and that its [N, M] result has x's [M, N]
    sizes: x is square) makes the host program write the transpose into x while the kernel still
    reads it -- the float64 oracle sees the wrong answer."""
    n = 256
    x, y = _f32(rng, n, n), _f32(rng, n, n)
    want = x.T.astype(np.float64) * 2 + y
    jf = ts.jit(transposed, donate_argnums=0)
    exe = jf.compile(x, y).variant.compiled.executable
    planted = 0
    for s in exe.program.steps:   # the plant: the kernel reading x "reads it only at its own index"
        if 0 in s.args:
            s.inplace = tuple((i, j) for i in range(len(s.args)) for j in range(len(s.outs)))
            s.out_types = [exe.program.inputs[0]] * len(s.outs)
            planted += 1
    assert planted == 1
    exe._donations.clear()
    jf._plans.clear()
    donor = x.copy()
    got = jf(donor, y)
    assert np.shares_memory(got, donor) or not np.array_equal(donor, x)   # the plant took effect ...
    assert np.abs(got - want).max() > 1e-2   # ... and the answer is wrong


def test_returned_argument_and_unread_argument_are_refused(rng):
    def f(x, y):
        return x, y * 3.0
    jf = ts.jit(f, donate_argnums=(0, 1))
    x, y = _f32(rng, 10, 7), _f32(rng, 10, 7)
    lines = ts.explain(jf, x, y).donated
    assert "argument 0: refused: the function returns it as it is" in lines[0]
    assert lines[1].startswith("argument 1: honoured")
    a, b = jf(x.copy(), y.copy())
    np.testing.assert_array_equal(a, x)
    np.testing.assert_allclose(b, y.astype(np.float64) * 3, rtol=1e-6)


def test_dynamic_sizes_refuse_donation_visibly(rng):
    """dynamic= pads the arguments into bucket buffers: the donated array is never written, the
    result is allocated, and explain says so (it used to list nothing: a silent no-op)."""
    f = ts.jit(lambda p, g: p - 0.5 * g, donate_argnums=0, dynamic={"p": {0: "n"}, "g": {0: "n"}})
    p, g = _f32(rng, 300, 17), _f32(rng, 300, 17)
    keep = p.copy()
    r = f(p, g)
    np.testing.assert_allclose(r, keep.astype(np.float64) - 0.5 * g, rtol=1e-6, atol=1e-6)
    assert not np.shares_memory(r, p) and p.flags.writeable
    np.testing.assert_array_equal(p, keep)
    lines = ts.explain(f, p, g).donated
    assert len(lines) == 1 and lines[0].startswith("argument 0: refused: dynamic= pads"), lines
    # teeth: the same function without dynamic= honours it (so the line above is not vacuous)
    h = ts.jit(lambda p, g: p - 0.5 * g, donate_argnums=0)
    assert ts.explain(h, p, g).donated[0].startswith("argument 0: honoured")


def test_bad_donations_are_refused_with_a_code(rng):
    x, y = _f32(rng, 8, 8), _f32(rng, 8, 8)
    jf = ts.jit(axpy, donate_argnums=0)
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(DonationError):
        jf(ro, y, 1.0)
    same = x.copy()
    with pytest.raises(DonationError) as e:   # one buffer passed twice: writing it changes argument 1
        jf(same, same, 1.0)
    assert "share memory" in str(e.value)
    np.testing.assert_array_equal(same, x)
    with pytest.raises(ArgumentError):
        ts.jit(axpy, donate_argnums=-1)
    with pytest.raises(ArgumentError):
        ts.jit(axpy, donate_argnums=5)(x, y, 1.0)


class _Dl:
    """A DLPack producer around a numpy array (numpy exports DLPack 1.0 with its read-only flag)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_donation_writes_only_writable_tensors(rng):
    x, y = _f32(rng, 33, 20), _f32(rng, 33, 20)
    jf = ts.jit(axpy, donate_argnums=0)
    buf = x.copy()
    got = jf(_Dl(buf), y, 2.0)
    np.testing.assert_allclose(got, x.astype(np.float64) * 2 + np.tanh(y.astype(np.float64)), rtol=2e-6, atol=2e-6)
    assert np.shares_memory(got, buf)
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(DonationError) as e:
        jf(_Dl(ro), y, 2.0)
    assert "read-only" in str(e.value)
    np.testing.assert_array_equal(ro, x)


def test_torch_read_only_and_writable_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, y = _f32(rng, 16, 8), _f32(rng, 16, 8)
    jf = ts.jit(axpy, donate_argnums=0)
    tx = torch.from_numpy(x.copy())
    got = jf(tx, torch.from_numpy(y), 2.0)
    np.testing.assert_allclose(got.numpy(), x * 2 + np.tanh(y), rtol=2e-6, atol=2e-6)


# ---------------------------------------------------------------------------- AdamW, multi-tensor

SHAPES = [(64, 48), (48,), (3, 5, 7), (1,), (700, 33), (33,)]


def adamw64(p, g, m, v, t, lr, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2):
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps), m, v


def _count_allocations(monkeypatch):
    """Bytes the runtime hands out for results and intermediates (memory.empty / scratch)."""
    seen = []
    for name in ("empty", "scratch"):
        real = getattr(memory, name)

        def wrapped(shape, dtype, real=real):
            a = real(shape, dtype)
            seen.append(a.nbytes)
            return a
        monkeypatch.setattr(memory, name, wrapped)
    return seen


@pytest.mark.parametrize("dtype,tol", [(np.float32, 3e-6), (np.float64, 1e-12)])
def test_adamw_donated_ten_steps_match_float64(rng, dtype, tol, monkeypatch):
    P = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    M = [np.zeros(s, dtype) for s in SHAPES]
    V = [np.zeros(s, dtype) for s in SHAPES]
    ref = [(p.astype(np.float64), np.zeros(p.shape), np.zeros(p.shape)) for p in P]
    addrs = [a.ctypes.data for a in (*P, *M, *V)]
    nparam = sum(p.nbytes for p in P)
    launches = []
    for t in range(1, 11):
        G = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
        lr = 1e-2 if t < 6 else 3e-3
        seen = _count_allocations(monkeypatch)
        cpu.STEP_TIMES = []
        try:
            P, M, V = optim.adamw(P, G, M, V, t, lr=lr, donate=True)
        finally:
            launches.append(len(cpu.STEP_TIMES))
            cpu.STEP_TIMES = None
        monkeypatch.undo()
        assert sum(seen) < nparam / 4, seen   # no parameter-sized buffer: only the 0-d coefficients
        ref = [adamw64(p, g.astype(np.float64), m, v, t, lr) for (p, m, v), g in zip(ref, G)]
    assert [a.ctypes.data for a in (*P, *M, *V)] == addrs   # every step in place
    assert launches == [2] * 10, launches   # coefficients, then every parameter in one launch
    for got, want in zip(zip(P, M, V), ref):
        for a, b in zip(got, want):
            assert a.dtype == dtype
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_adamw_without_donation_allocates_and_changes_nothing(rng, monkeypatch):
    P = [_f32(rng, *s) for s in SHAPES]
    G = [_f32(rng, *s) for s in SHAPES]
    M = [_f32(rng, *s) * 0.1 for s in SHAPES]
    V = [np.abs(_f32(rng, *s)) for s in SHAPES]
    before = [a.copy() for a in (*P, *G, *M, *V)]
    seen = _count_allocations(monkeypatch)
    p2, m2, v2 = optim.adamw(P, G, M, V, 3, lr=1e-2)
    monkeypatch.undo()
    nparam = sum(p.nbytes for p in P)
    assert sum(seen) >= 3 * nparam   # p', m', v' are new
    for a, b in zip((*P, *G, *M, *V), before):
        np.testing.assert_array_equal(a, b)
    for a, b in zip((*p2, *m2, *v2), (*P, *M, *V)):
        assert not np.shares_memory(a, b)


def test_launches_do_not_grow_with_parameters_and_plant_is_caught(rng, monkeypatch):
    """Two launches a step for 3 or 12 parameters; without fuse-multi-tensor, one per parameter."""
    def launches(n):
        P = [_f32(rng, 40 + k, 3) for k in range(n)]
        G = [_f32(rng, 40 + k, 3) for k in range(n)]
        Z = [np.zeros_like(p) for p in P]
        cpu.STEP_TIMES = []
        try:
            optim.adamw(P, G, Z, [z.copy() for z in Z], 1)
            return len(cpu.STEP_TIMES)
        finally:
            cpu.STEP_TIMES = None
    assert launches(3) == launches(12) == 2
    from tessera.passes.graph import fuse_multi_tensor
    monkeypatch.setattr(fuse_multi_tensor, "MAX_GROUPS", 1)   # the plant: no merging
    monkeypatch.setattr(optim, "_JITTED", {})
    assert launches(5) >= 5


def test_multi_tensor_kernel_reading_one_input_in_two_groups_is_not_aliased(rng):
    """Two independent groups of one kernel both read x (elementwise): writing either result into x
    would let the other group read overwritten elements, so the donation is refused."""
    def f(x, y, z):
        return x * 2.0 + y, x[:, :1] * z + 1.0   # second group: a broadcast read of x
    x, y, z = _f32(rng, 50, 30), _f32(rng, 50, 30), _f32(rng, 50, 8)
    jf = ts.jit(f, donate_argnums=0)
    want = ts.jit(f)(x, y, z)
    donor = x.copy()
    got = jf(donor, y, z)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert not any(np.shares_memory(a, donor) for a in got)
    np.testing.assert_allclose(got[0], x.astype(np.float64) * 2 + y, rtol=1e-6)


def test_multi_tensor_kernel_with_an_empty_group_computes_the_others(rng):
    """A merged kernel is skipped only when every group is empty (one empty parameter must not
    leave the others' updates unwritten)."""
    def f(x, y, e):
        return x * 2.0 + 1.0, y - 3.0, e * 5.0
    x, y, e = _f32(rng, 40, 9), _f32(rng, 17), np.zeros((0, 4), np.float32)
    jf = ts.jit(f)
    assert len(ts.explain(jf, x, y, e).kernels) == 1   # one launch for the three groups
    a, b, c = jf(x, y, e)
    np.testing.assert_allclose(a, x.astype(np.float64) * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(b, y.astype(np.float64) - 3, rtol=1e-6)
    assert c.shape == (0, 4)
