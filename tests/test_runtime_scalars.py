"""Python numbers as runtime values (issue 27, "Scalars as values").

A float or int argument is passed to the kernel as a 0-d array: one compile serves every value.  It
takes the dtype of the arrays it meets (NEP 50).  Where the traced function reads it as a Python
value, the call is specialised on it; ``static_argnums`` / ``static_argnames`` ask for that.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import tessera as ts
from tessera.errors import ArgumentError, TesseraError
from tessera.frontend import jit as J
from tessera.frontend import trace as T

import oracle as O


def x32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def compiles(f) -> int:
    return f._nvariants


# --------------------------------------------------------------------------- one compile, every value
def test_one_compile_serves_every_float(rng):
    x = x32(rng, 37, 53)
    f = ts.jit(lambda t, lr: t - lr * (t * t))
    for lr in (0.1, 1e-3, -2.5, 7.0, 0.0):
        O.assert_close(f(x, lr), O.f64(x) - lr * O.f64(x) ** 2, 1e-6)
    assert compiles(f) == 1
    assert len(f._plans) == 1   # the value is not part of the call plan's key either
    O.assert_close(f(x, 3), O.f64(x) - 3 * O.f64(x) ** 2, 1e-6)   # an int used as a value: the same kernel
    assert compiles(f) == 1


def test_runtime_scalar_feeds_fused_kernels(rng):
    """A temperature into a row kernel, a scale into a GEMM epilogue: still one fused kernel each."""
    x, w = x32(rng, 33, 70), x32(rng, 70, 40)
    sm = ts.jit(lambda t, temp: ts.ops.softmax(t / temp))
    for temp in (0.7, 1.3):
        z = O.f64(x) / temp
        e = np.exp(z - z.max(-1, keepdims=True))
        O.assert_close(sm(x, temp), e / e.sum(-1, keepdims=True), 1e-6)
    assert compiles(sm) == 1
    kernels = ts.explain(sm, x, 0.7).kernels
    assert [k["kind"] for k in kernels] == ["rowwise"], kernels
    ep = ts.jit(lambda a, b, s, c: ts.ops.relu(a @ b * s + c))
    for s, c in ((0.5, -0.1), (2.0, 0.3)):
        O.assert_close(ep(x, w, s, c), np.maximum(O.f64(x) @ O.f64(w) * s + c, 0), 1e-5)
    assert compiles(ep) == 1
    kernels = ts.explain(ep, x, w, 0.5, -0.1).kernels
    assert [k["kind"] for k in kernels] == ["gemm"], kernels


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16", np.float64])
def test_a_number_takes_the_arrays_dtype(rng, dtype):
    """NEP 50: ``x_f16 * s`` stays f16, and s is rounded to f16 once, as numpy rounds it."""
    d = np.dtype(dtype) if dtype != "bfloat16" else ts.dtypes.bfloat16
    x = rng.standard_normal((9, 31)).astype(d)
    f = ts.jit(lambda t, s: t * s)
    got = f(x, 0.1)
    want = x * 0.1 if d != ts.dtypes.bfloat16 else (x.astype(np.float32) * np.float32(d.type(0.1))).astype(d)
    assert got.dtype == d
    np.testing.assert_array_equal(got, want)
    assert f._variants[next(iter(f._variants))][0].scalar_dtype == d   # passed in the arrays' dtype: no cast


def test_numbers_meeting_two_dtypes_are_cast_at_each_use(rng):
    x16 = rng.standard_normal((8, 16)).astype(np.float16)
    x32_ = x32(rng, 8, 16)
    f = ts.jit(lambda a, b, s: (a * s, b * s))
    ga, gb = f(x16, x32_, 0.3)
    assert ga.dtype == np.float16 and gb.dtype == np.float32
    np.testing.assert_allclose(ga.astype(np.float64), O.f64(x16) * 0.3, rtol=1e-3)
    O.assert_close(gb, O.f64(x32_) * 0.3, 1e-6)


def test_a_number_meeting_float64_keeps_float64_precision(rng):
    x = x32(rng, 6, 10)
    f = ts.jit(lambda t, s: t.astype(np.float64) * s)
    got = f(x, 0.1)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x.astype(np.float64) * 0.1)   # 0.1 not rounded through f32


def test_beyond_the_range_is_inf_and_huge_ints_are_refused(rng):
    x = x32(rng, 4, 9)
    f = ts.jit(lambda t, s: t * s)
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(f(x, 1e39), x * np.float32(np.inf))
    with pytest.raises(ArgumentError) as info:
        f(x, 10 ** 400)
    assert info.value.code == "BAD_ARGUMENT" and "10000" in str(info.value)


# --------------------------------------------------------------------------- specialised where read as a value
@pytest.mark.parametrize("case", ["eps", "reshape", "math", "branch", "exponent", "numpy", "axis"])
def test_a_number_read_as_a_python_value_is_specialised(rng, case):
    x = x32(rng, 12, 8)
    fns = {
        "eps": (lambda t, e: ts.ops.layer_norm(t, eps=e), 1e-3, lambda v: O.layer_norm(O.f64(x), eps=1e-3)),
        "reshape": (lambda t, n: t.reshape(n, -1) * n, 4, lambda v: O.f64(x).reshape(4, -1) * 4),
        "math": (lambda t, s: t * math.sqrt(s), 9.0, lambda v: O.f64(x) * 3.0),
        "branch": (lambda t, s: t * s if s > 0 else -t, 2.0, lambda v: O.f64(x) * 2.0),
        "exponent": (lambda t, p: t ** p, 3, lambda v: O.f64(x) ** 3),
        "numpy": (lambda t, s: t * np.float32(np.log(s)), 4.0, lambda v: O.f64(x) * np.log(4.0)),
        "axis": (lambda t, a: ts.ops.reduce_sum(t, axis=a), 0, lambda v: O.f64(x).sum(0)),
    }
    fn, value, want = fns[case]
    f = ts.jit(fn)
    O.assert_close(f(x, value), want(value), 1e-5)
    assert set(f._learned) == {1}


def test_a_specialised_number_gets_one_compile_per_value(rng):
    x = x32(rng, 6, 6)
    f = ts.jit(lambda t, s: t * math.sqrt(s))
    for s in (4.0, 9.0, 4.0):
        O.assert_close(f(x, s), O.f64(x) * math.sqrt(s), 1e-6)
    assert compiles(f) == 2


def test_static_argnames_and_argnums_compile_the_value_in(rng):
    x = x32(rng, 5, 7)
    for kw in ({"static_argnames": "s"}, {"static_argnums": 1}, {"static_argnames": ("s",)}):
        f = ts.jit(lambda t, s: t * s, **kw)
        for s in (2.0, 3.0):
            O.assert_close(f(x, s), O.f64(x) * s, 1e-7)
        assert compiles(f) == 2
        assert "3.0" in ts.compile(f, x, 3.0).ir("graph") or "3.000" in ts.compile(f, x, 3.0).ir("graph")


def test_static_strings_and_tuples_pass_only_when_marked(rng):
    x = x32(rng, 4, 6)

    def f(t, how, axes):
        return ts.ops.gelu(t, approximate=how).sum(axes)

    with pytest.raises(ArgumentError) as info:
        ts.jit(f)(x, "erf", (0, 1))
    assert "static_argnames" in str(info.value)
    g = ts.jit(f, static_argnames=("how", "axes"))
    O.assert_close(g(x, "erf", (0, 1)), O.gelu_erf(O.f64(x)).sum(), 1e-5)
    with pytest.raises(ArgumentError, match="no hash"):
        g(x, "erf", [0, 1])
    with pytest.raises(ArgumentError, match="no parameter 'nope'"):
        ts.jit(f, static_argnames="nope")
    with pytest.raises(ArgumentError, match="argument position"):
        ts.jit(f, static_argnums=-1)


def test_keyword_arguments_take_their_parameters_positions(rng):
    """Keywords (keyword-only parameters too) are bound to their parameter's position, so a
    keyword-only head count can be static and a keyword float is a runtime scalar like a
    positional one; a parameter skipped before the last one given takes its default."""
    x, w = x32(rng, 6, 8), x32(rng, 8, 8)

    def f(t, w=None, scale=1.0, *, heads, shift=0.0):
        y = t if w is None else t @ w
        return y.reshape(6, heads, 8 // heads).sum(-1) * scale + shift

    g = ts.jit(f, static_argnames="heads")
    ref = lambda w_, s, h, sh: ((O.f64(x) if w_ is None else O.f64(x) @ w_)  # noqa: E731
                                .reshape(6, h, 8 // h).sum(-1) * s + sh)
    O.assert_close(g(x, w, heads=2), ref(w, 1.0, 2, 0.0), 1e-5)
    O.assert_close(g(x, scale=3.0, heads=4, shift=0.5), ref(None, 3.0, 4, 0.5), 1e-5)
    O.assert_close(g(x, w, 2.0, heads=2, shift=1.5), ref(w, 2.0, 2, 1.5), 1e-5)
    O.assert_close(g(t=x, w=w, heads=2, shift=0.25), ref(w, 1.0, 2, 0.25), 1e-5)
    n = len(g.compiles)
    O.assert_close(g(x, w, heads=2, shift=7.0), ref(w, 1.0, 2, 7.0), 1e-5)   # a runtime scalar
    assert len(g.compiles) == n
    assert ts.explain(g, x, w, heads=2).lane == "cpu-x86"
    with pytest.raises(ArgumentError, match="no parameter 'head'"):
        g(x, head=2)
    with pytest.raises(ArgumentError, match="by position and by keyword"):
        g(x, w, w=w, heads=2)
    with pytest.raises(ArgumentError, match="missing argument 't'"):
        g(w=w, heads=2)
    with pytest.raises(ArgumentError, match="\\*args"):
        ts.jit(lambda *ts_: ts_[0] * 2)(x, y=x)


def test_flags_are_static(rng):
    x = x32(rng, 4, 6)
    f = ts.jit(lambda t, double, bias: t * 2 if double else t + (0 if bias is None else bias))
    O.assert_close(f(x, True, None), O.f64(x) * 2, 1e-7)
    O.assert_close(f(x, False, 1.5), O.f64(x) + 1.5, 1e-7)


def test_nested_jit_takes_the_callers_scalar(rng):
    x = x32(rng, 4, 6)
    inner = ts.jit(lambda t, s: t * s)
    outer = ts.jit(lambda t, s: inner(t, s) + s)
    for s in (0.5, 2.0):
        O.assert_close(outer(x, s), O.f64(x) * s + s, 1e-6)
    assert compiles(outer) == 1


@pytest.mark.slow   # GPU code generation and the emulator: ~10-45 s (CI runs -m slow)
def test_scalar_on_the_gpu_lanes_is_a_runtime_input(rng):
    """The NVIDIA and ROCm GEMM epilogues read a runtime scalar (checked in the warp/wave emulator)."""
    a = rng.standard_normal((16, 32)).astype(np.float16)
    b = rng.standard_normal((32, 16)).astype(np.float16)
    for target, arch in (("nvidia", "sm_90"), ("rocm", "gfx942")):
        art = ts.compile(lambda p, q, s: p @ q * s, a, b, 0.25, target=target, arch=arch)
        for s in (0.25, -1.5):
            got = art.emulate(a, b, s).astype(np.float64)
            np.testing.assert_allclose(got, O.f64(a) @ O.f64(b) * s, rtol=2e-2, atol=2e-2 * abs(s))


def test_a_bare_trace_reports_the_specialisation():
    """Outside tessera.jit the request surfaces as a coded error."""
    def fn(t, s):
        return t * float(s)
    with pytest.raises(TesseraError) as info:
        T.trace(fn, [np.ones(3, np.float32), np.asarray(2.0, np.float32)], [T.ARRAY, T.SCALAR])
    assert info.value.code == "SPECIALIZE_SCALAR" and info.value.indices == {1}


# --------------------------------------------------------------------------- teeth
def test_plant_a_stale_value_is_caught(rng, monkeypatch):
    """Planted: the call plan passes the first call's number on every later call (as a value baked
    into the kernel would be); the second value's check fails."""
    x = x32(rng, 8, 8)
    f = ts.jit(lambda t, s: t * s)
    f(x, 2.0)
    stale = {}
    real = J.Variant.bind

    def bind_first(self, args):
        out = real(self, args)
        stale.setdefault("s", out[1])
        return [out[0], stale["s"]]
    monkeypatch.setattr(J.Variant, "bind", bind_first)
    f(x, 2.0)
    with pytest.raises(AssertionError):
        O.assert_close(f(x, 5.0), O.f64(x) * 5.0, 1e-6)


def _number_stays_f16(rng):
    x = rng.standard_normal((4, 8)).astype(np.float16)
    got = ts.jit(lambda t, s: t * s)(x, 0.1)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, x * 0.1)


def test_plant_no_weak_promotion_is_caught(rng, monkeypatch):
    """Planted: the number is not weak (it keeps float32 where it meets f16, so the product
    promotes to f32): the dtype check fails."""
    _number_stays_f16(rng)
    monkeypatch.setattr(T, "promote_weak", lambda a, b: (a, b))
    with pytest.raises(AssertionError):
        _number_stays_f16(rng)


# --------------------------------------------------------------------------- recompiles: counted, explained, warned
def test_compiles_are_counted_with_their_causes(rng):
    x = x32(rng, 6, 8)
    f = ts.jit(lambda t, s: t * math.sqrt(s))
    f(x, 4.0)
    f(x, 9.0)
    f(x.astype(np.float64), 9.0)
    assert len(f.compiles) == 3, f.compiles
    assert f.compiles[0] == "first call"
    assert "argument 1 = 9.0 (read as a Python value: float() at" in f.compiles[1]
    assert "test_runtime_scalars.py" in f.compiles[1]
    assert "f64[6, 8]" in f.compiles[2]
    rep = ts.explain(f, x, 4.0)
    assert rep.compiles == f.compiles
    assert "compiles  3 for this function" in str(rep) and "argument 1 (a number read as a Python value" in str(rep)


def test_many_recompiles_warn_once_with_the_cause(rng, monkeypatch):
    monkeypatch.setattr(J, "RECOMPILE_WARNING_AFTER", 3)
    x = x32(rng, 4, 4)
    f = ts.jit(lambda t, s: t + s, static_argnames="s")
    with pytest.warns(ts.RecompileWarning, match=r"compiled 4 times[\s\S]*argument 1 = 3.0 \(static\)") as rec:
        for s in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0):
            f(x, s)
    assert len([w for w in rec if issubclass(w.category, ts.RecompileWarning)]) == 1


def test_runtime_numbers_never_warn(rng, monkeypatch):
    """Planted contrast: the same loop over runtime numbers compiles once and stays quiet."""
    import warnings
    monkeypatch.setattr(J, "RECOMPILE_WARNING_AFTER", 3)
    x = x32(rng, 4, 4)
    f = ts.jit(lambda t, s: t + s)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ts.RecompileWarning)
        for s in range(10):
            f(x, float(s))
    assert f.compiles == ["first call"]
