"""Comparisons, where, logic, isnan/isinf/isfinite, integer floor division / modulo / shifts,
pow with tensor exponents, and the index generators (iota, arange, tril, triu): numpy oracles on
fresh random data with edge values, fusion checked through the lane report (a where after a
matmul is one GEMM kernel; tril(x) * 2 one kernel; a causal mask built from iotas runs correctly
with no mask array in memory), planted bugs, coded refusals and the GPU lanes' refusals."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.codegen import x86_int_elem, x86_pow
from tessera.errors import DtypeError, PassFailedError, RankMismatchError
from tessera.frontend.reference import attention64

EDGES = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-3, -7.0], np.float64)


def floats(rng, d, shape):
    v = rng.standard_normal(shape) * 4
    v.flat[:len(EDGES)] = EDGES
    return v.astype(d)


def ints(rng, d, shape, lo=None, hi=None):
    i = np.iinfo(d)
    v = rng.integers(i.min if lo is None else lo, i.max if hi is None else hi, shape, dtype=np.int64,
                     endpoint=True).astype(d)
    if lo is None:
        v.flat[:4] = [i.min, -1, 0, i.max]
    return v


def _compare(a, b):
    return (a < b, a <= b, a > b, a >= b, a == b, a != b, ts.ops.where(a > b, a, b), (a < b) & (b > 0),
            (a < b) | ~(b > 0), (a > 0) ^ (b > 0), ts.ops.logical_not(a))


COMPARE = ts.jit(_compare)


def compare_ok(rng, d, fn=COMPARE) -> bool:
    a = floats(rng, d, (3, 29)) if np.dtype(d).kind == "f" else ints(rng, d, (3, 29))
    b = floats(rng, d, (29,)) if np.dtype(d).kind == "f" else ints(rng, d, (29,))
    b[:3] = a[0, :3]   # equal pairs (NaN == NaN is false)
    got = fn(a, b)
    want = (a < b, a <= b, a > b, a >= b, a == b, a != b, np.where(a > b, a, b), (a < b) & (b > 0),
            (a < b) | ~(b > 0), (a > 0) ^ (b > 0), np.logical_not(a))
    return all(g.dtype == w.dtype and np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want))


@pytest.mark.parametrize("d", [np.float32, np.float16, np.float64, np.int32, np.int8], ids=lambda d: np.dtype(d).name)
def test_comparisons_where_logic(rng, d):
    assert compare_ok(rng, d)


def test_planted_predicate_bug_fails(monkeypatch, rng):
    """teeth: a '<' that compares '<=' on floats must fail."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setitem(x86_int_elem._FCMP, "cmp_lt", "<=")
    assert not compare_ok(rng, np.float32, ts.jit(_compare))


def test_float_predicates_and_where_forms(rng):
    x = floats(rng, np.float32, (4, 17))
    xi = ints(rng, np.int32, (4, 17), -9, 9)
    got = ts.jit(lambda a, i: (ts.ops.isnan(a), ts.ops.isinf(a), ts.ops.isfinite(a), ts.ops.isnan(i),
                               ts.ops.where(a, 1.0, a[0]), ts.ops.where(i > 0, 1, 2), ts.ops.where(i, i, 0.5),
                               ts.ops.logical_and(i, a), ts.ops.where(a > 0, -1, i)))(x, xi)
    want = (np.isnan(x), np.isinf(x), np.isfinite(x), np.zeros(xi.shape, bool), np.where(x, np.float32(1), x[0]),
            np.where(xi > 0, 1, 2).astype(np.int32), np.where(xi, xi, 0.5).astype(np.float32),
            np.logical_and(xi, x), np.where(x > 0, -1, xi).astype(np.int32))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w, equal_nan=True), (g, w)


def _intops(a, b):
    return a // b, a % b, a << b, a >> b, a & b, a | b, ~a


INTOPS = ts.jit(_intops)


@pytest.mark.parametrize("d", [np.int8, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
def test_int_floordiv_mod_shifts(rng, d):
    bits = np.dtype(d).itemsize * 8
    a = ints(rng, d, (3, 31))
    b = ints(rng, d, (3, 31), -9, 9)
    b[0, :6] = [0, -1, 0, -1, 3, -3]   # a zero divisor, INT_MIN // -1, INT_MIN % -1
    c = ints(rng, d, (3, 31), -3, bits + 3)   # shift counts, some >= the width or negative
    got_div = INTOPS(a, b)
    got_sh = INTOPS(a, c)
    with np.errstate(all="ignore"):
        fd = np.where(b == 0, 0, np.floor_divide(a, np.where(b == 0, 1, b))).astype(d)
        md = np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b))).astype(d)
    ok = (c >= 0) & (c < bits)
    cs = np.where(ok, c, 0)
    shl = np.where(ok, a << cs, 0).astype(d)
    shr = np.where(ok, a >> cs, np.where(a < 0, -1, 0)).astype(d)
    for g, w in ((got_div[0], fd), (got_div[1], md), (got_sh[2], shl), (got_sh[3], shr), (got_div[4], a & b),
                 (got_div[5], a | b), (got_div[6], ~a)):
        assert g.dtype == np.dtype(d) and np.array_equal(g, w), (g, w)


def _fops(x, y):
    return x // y, x % y, x ** y, ts.ops.pow(x, 2.5)


FOPS = ts.jit(_fops)


def fops_errors(d, fn=FOPS):
    """Worst mismatch of floor division, modulo and pow against numpy (float64 oracle) on a grid of
    edge values; 0 where equal (NaN with NaN, the sign of zeros included)."""
    e = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, np.inf, -np.inf, np.nan, 7.25, -7.25, 100.0])
    X, Y = (v.astype(d) for v in np.meshgrid(e, e))
    got = fn(X, Y)
    x, y = X.astype(np.float64), Y.astype(np.float64)
    with np.errstate(all="ignore"):
        want = [w.astype(d).astype(np.float64) for w in (np.floor_divide(x, y), np.mod(x, y), np.power(x, y),
                                                         np.power(x, 2.5))]   # rounded to d (f32 overflows)
    worst = 0.0
    for g, w in zip(got, want):
        g = g.astype(np.float64)
        same = (g == w) & (np.signbit(g) == np.signbit(w)) | np.isnan(g) & np.isnan(w)
        with np.errstate(all="ignore"):
            rel = np.where(same, 0.0, np.abs(g - w) / np.abs(w))
        worst = max(worst, float(np.nan_to_num(rel, nan=np.inf).max()))
    return worst


# f64 pow is exp(y log|x|) in f64: its error grows with |y log x| (100 ** 100: ~2e-14; docs)
@pytest.mark.parametrize("d, tol", [(np.float32, 1e-7), (np.float64, 1e-13)], ids=["f32", "f64"])
def test_float_floordiv_mod_pow_edges(d, tol):
    assert fops_errors(d) <= tol


def test_planted_pow_sign_bug_fails(monkeypatch):
    """teeth: pow losing the sign of a negative base with an odd exponent must fail."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = x86_pow.emit_pow
    monkeypatch.setattr(x86_pow, "emit_pow", lambda cg, x, y: real(
        cg, cg.b.call(cg.gen.intrinsic(f"llvm.fabs.v{x.type.count}f32", x.type, [x.type]), [x]), y))
    assert fops_errors(np.float32, ts.jit(_fops)) > 1e-7


@pytest.mark.parametrize("d, tol", [(np.float32, 2 ** -23), (np.float64, 1e-13)], ids=["f32", "f64"])
def test_pow_random(rng, d, tol):
    x, y = rng.uniform(0.05, 20, 999).astype(d), rng.uniform(-12, 12, 999).astype(d)
    x[::7] *= -1
    y[::7] = np.round(y[::7])   # a negative base with integer exponents
    got = ts.jit(lambda a, b: a ** b)(x, y)
    want = np.power(x.astype(np.float64), y.astype(np.float64))
    assert np.nanmax(np.abs(got - want) / np.abs(want)) <= tol
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_where_after_matmul_is_one_gemm_kernel(rng):
    x, w = floats(rng, np.float32, (37, 50)), rng.standard_normal((50, 29)).astype(np.float32)
    x[0] = 1.0   # no NaN through the matmul: the rest of the rows checked exactly against float64
    f = ts.jit(lambda a, b: (lambda y: ts.ops.where(y > 0, y, 0.1 * y))(a @ b))
    y = np.nan_to_num(x.astype(np.float64)) @ w
    got = f(np.nan_to_num(x), w)
    np.testing.assert_allclose(got, np.where(y > 0, y, 0.1 * y), rtol=1e-5, atol=1e-5)
    kernels = ts.explain(f, x, w).kernels
    assert [k["kind"] for k in kernels] == ["gemm"]
    assert {"tessera.greater", "tessera.where", "tessera.mul"} <= set(kernels[0]["ops"])


def _causal_iota(q, k, v):
    s = q @ ts.ops.swapaxes(k, -1, -2) * 0.25
    n, m = s.shape[-2], s.shape[-1]
    return ts.ops.softmax(ts.ops.where(ts.ops.iota((n, m), 0) >= ts.ops.iota((n, m), 1), s, -np.inf)) @ v


def _causal_tril(q, k, v):
    s = q @ ts.ops.swapaxes(k, -1, -2) * 0.25
    n = s.shape[-1]
    ones = ts.ops.iota((n, n), 0, np.float32) * 0 + 1
    return ts.ops.softmax(ts.ops.where(ts.ops.tril(ones) > 0, s, float("-inf"))) @ v


@pytest.mark.parametrize("fn", [_causal_iota, _causal_tril], ids=["iota", "tril"])
def test_causal_mask_built_in_the_graph(rng, fn):
    q = rng.standard_normal((2, 3, 19, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, 3, 19 if fn is _causal_tril else 23, 16)).astype(np.float32) for _ in range(2))
    jf = ts.jit(fn)
    got = jf(q, k, v)
    want = attention64(*(t.astype(np.float64) for t in (q, k, v)), None, 0.25, True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kinds = [kk["kind"] for kk in ts.explain(jf, q, k, v).kernels]
    if fn is _causal_iota:   # fuse-attention recognises the iota comparison: one causal attention kernel
        assert kinds == ["attention"]
    else:                    # the tril form: a bool mask (one small kernel computes it) read by one attention
        assert kinds.count("attention") == 1 and "gemm" not in kinds and "rowwise" not in kinds, kinds


def test_index_generators(rng):
    x = floats(rng, np.float32, (2, 7, 9))
    f = ts.jit(lambda a: ts.ops.tril(a) * 2)
    np.testing.assert_array_equal(f(x), np.tril(x) * 2)
    assert [k["kind"] for k in ts.explain(f, x).kernels] == ["elementwise"]   # one kernel, no mask array
    got = ts.jit(lambda a: (ts.ops.triu(a, 1), ts.ops.tril(a, -2), ts.ops.arange(5) + a[1, 3, :5].astype(np.int32),
                            ts.ops.arange(2, 30, 3, dtype=np.int64), ts.ops.arange(0.5, 3.0, 0.5),
                            ts.ops.iota((3, 4, 5), 1) * 10 + ts.ops.iota((4, 5), 1)))(x)
    want = (np.triu(x, 1), np.tril(x, -2), np.arange(5, dtype=np.int32) + x[1, 3, :5].astype(np.int32),
            np.arange(2, 30, 3), np.arange(0.5, 3.0, 0.5, dtype=np.float32),
            (np.arange(4).reshape(1, 4, 1) * 10 + np.arange(5)).repeat(3, 0).reshape(3, 4, 5).astype(np.int32))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w, equal_nan=True), (g, w)


@pytest.mark.parametrize("fn, args, err, match", [
    (lambda a: a << 1, (np.ones(3, np.float32),), DtypeError, "left_shift: dtype f32"),
    (lambda a: a ** a.astype(np.int32), (np.ones(3, np.int32),), DtypeError, "pow: dtype i32"),
    (lambda a: ts.ops.tril(a), (np.ones(3, np.float32),), RankMismatchError, "tril needs rank >= 2"),
    (lambda a: ~a, (np.ones(3, np.float32),), DtypeError, "bitwise_not: dtype f32"),
    (lambda a: a & a, (np.ones(3, np.float32),), DtypeError, "bitwise_and: dtype f32"),
])
def test_coded_refusals(fn, args, err, match):
    with pytest.raises(err, match=match):
        ts.jit(fn)(*args)


@pytest.mark.parametrize("target, arch", [("nvidia", "sm_90"), ("rocm", "gfx942")])
def test_gpu_lanes_refuse_by_name(rng, target, arch):
    x = rng.standard_normal((32, 32)).astype(np.float16)
    # comparisons, where, pow and iota masks lower on the GPU lanes (tests/test_gpu_int.py, test_gpu_pow.py,
    # test_gpu_iota.py); log1p does not
    with pytest.raises(PassFailedError, match=r'tile.elementwise log1p has no lowering on this GPU lane.*'
                                              r'target="cpu" compiles tessera.ops.log1p'):
        ts.compile(lambda a, b: ts.ops.log1p(a @ b), x, x, target=target, arch=arch)
