"""uint8 on the CPU lane (the quantised models' asymmetric dtype): arguments and results, casts to and
from every dtype (zext, uitofp, a saturating fptoui), arithmetic modulo 256, unsigned compares,
max / min, floor division and shifts, the promotion rules, the reference lane, and coded refusals
(GPU lanes, out-of-range weak ints).  Oracles are numpy in uint8 (its wraparound is the meaning),
Python ints for the saturating float -> uint8 cast; planted signed-semantics bugs fail."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.codegen import x86_int_elem
from tessera.errors import DtypeError, ScheduleIllegalError, TesseraError
from tessera.frontend import reference
from tessera.frontend.trace import ARRAY, trace

U8 = np.dtype(np.uint8)
BF16 = np.dtype(ml_dtypes.bfloat16)
ALL = [np.dtype(d) for d in (np.float64, np.float32, np.float16, BF16, np.int8, np.uint8, np.int32, np.int64,
                             np.bool_)]


def sample(rng, d, shape):
    """Random values of ``d`` over its whole range, edges first (0, 255, 127, 128; NaN, +-inf, -0, 255.9, -3)."""
    d = np.dtype(d)
    if d == np.bool_:
        return rng.random(shape) < 0.5
    if d.kind in "iu":
        i = np.iinfo(d)
        v = rng.integers(i.min, i.max, shape, dtype=np.int64, endpoint=True).astype(d)
        v.flat[:5] = [i.min, i.max, 127, 1, -1 if d.kind == "i" else 128]
        return v
    big = 6e4 if d == np.float16 else 3e38
    v = rng.uniform(-40, 300, shape)
    v.flat[:10] = [np.nan, np.inf, -np.inf, -0.0, big, 255.9, 256.0, -0.9, -3.0, 127.5]
    with np.errstate(over="ignore"):
        return v.astype(d)


def to_u8_oracle(x: np.ndarray) -> np.ndarray:
    """float -> uint8: truncate toward zero, saturate to 0..255, NaN -> 0 (numpy leaves it undefined)."""
    vals = [0 if math.isnan(v) else 0 if v == -math.inf else 255 if v == math.inf else min(max(math.trunc(v), 0), 255)
            for v in x.astype(np.float64).ravel().tolist()]
    return np.array(vals, dtype=U8).reshape(x.shape)


def cast_oracle(x: np.ndarray, to: np.dtype) -> np.ndarray:
    if to == U8 and x.dtype.kind in "fV":
        return to_u8_oracle(x)
    if to.kind == "i" and x.dtype.kind in "fV":
        lo, hi = int(np.iinfo(to).min), int(np.iinfo(to).max)
        vals = [0 if math.isnan(v) else lo if v == -math.inf else hi if v == math.inf else
                min(max(math.trunc(v), lo), hi) for v in x.astype(np.float64).ravel().tolist()]
        return np.array(vals, dtype=to).reshape(x.shape)
    with np.errstate(all="ignore"):
        return x.astype(to)


CASTS_FROM = ts.jit(lambda x: tuple(x.astype(d) for d in ALL))


def test_uint8_casts_to_every_dtype(rng):
    x = sample(rng, U8, (3, 37))
    for d, g in zip(ALL, CASTS_FROM(x)):
        assert g.dtype == d and np.array_equal(g.astype(np.float64), cast_oracle(x, d).astype(np.float64)), d


@pytest.mark.parametrize("src", ALL, ids=str)
def test_every_dtype_casts_to_uint8(rng, src):
    x = sample(rng, src, (3, 37))
    got = ts.jit(lambda v: v.astype(np.uint8))(x)
    want = cast_oracle(x, U8)
    assert got.dtype == U8 and np.array_equal(got, want), (x[got != want], got[got != want], want[got != want])
    if src.kind in "fV":
        assert (want == 255).any() and (want == 0).any()      # both saturation edges exercised


def _arith(a, b):
    return (a + b, a - b, a * b, -a, ts.ops.abs(a), ts.ops.maximum(a, b), ts.ops.minimum(a, b), a * 3 + 7,
            ts.ops.clip(a, 5, 200), a // b, a % b, a >> (b % 10), a << 3, a & b, a | b, a ^ b, ~a,
            a < b, a <= b, a > b, a >= b, a == b, a != b, ts.ops.where(a > b, a, b))


def arith_want(a, b):
    with np.errstate(all="ignore"):
        sh = b % np.uint8(10)
        return (a + b, a - b, a * b, -a, np.abs(a), np.maximum(a, b), np.minimum(a, b), a * U8.type(3) + U8.type(7),
                np.clip(a, U8.type(5), U8.type(200)), np.where(b == 0, 0, a // np.where(b == 0, 1, b)).astype(U8),
                np.where(b == 0, 0, a % np.where(b == 0, 1, b)).astype(U8),
                np.where(sh < 8, a >> np.minimum(sh, 7), 0).astype(U8), a << U8.type(3), a & b, a | b, a ^ b, ~a,
                a < b, a <= b, a > b, a >= b, a == b, a != b, np.where(a > b, a, b))


def arith_ok(rng, fn) -> bool:
    a, b = sample(rng, U8, (5, 41)), sample(rng, U8, (41,))
    b[3] = 0                                                # a zero divisor: 0, as the int lanes define it
    ok = True
    for i, (g, w) in enumerate(zip(fn(a, b), arith_want(a, b))):
        ok &= g.dtype == w.dtype and np.array_equal(g, w)
    return ok


def test_uint8_arithmetic_compares_and_bits_like_numpy(rng):
    fn = ts.jit(_arith)
    a, b = sample(rng, U8, (5, 41)), sample(rng, U8, (41,))
    b[3] = 0
    for i, (g, w) in enumerate(zip(fn(a, b), arith_want(a, b))):
        assert g.dtype == w.dtype and np.array_equal(g, w), (i, a[g != w], b[np.nonzero(g != w)[-1]], g[g != w])
    # both sides of 127/128 compared (a signed compare would order them wrongly)
    assert ((a > 127) & (np.broadcast_to(b, a.shape) < 128)).any()


def test_reference_lane_agrees(rng):
    a, b = sample(rng, U8, (5, 41)), sample(rng, U8, (41,))
    b[3] = 0
    g = trace(_arith, [a, b], [ARRAY, ARRAY])
    got = reference.evaluate(g, [a, b])
    for i, (r, w) in enumerate(zip(got, arith_want(a, b))):
        assert np.asarray(r).dtype == w.dtype and np.array_equal(r, w), i
    x = sample(rng, np.float32, (2, 29))
    assert np.array_equal(reference.evaluate(trace(lambda v: v.astype(np.uint8), [x], [ARRAY]), [x])[0],
                          to_u8_oracle(x))


def test_uint8_views_and_layout(rng):
    a = sample(rng, U8, (6, 10))
    got = ts.jit(lambda p, i: (ts.ops.concatenate([p.T, p.T[:, 1:]], axis=1), p.reshape(3, 20)[:, 1::2],
                               p[::-1, 2:9], ts.ops.take(p, i, axis=0)))(a, np.array([5, 0, 3], np.int32))
    want = (np.concatenate([a.T, a.T[:, 1:]], 1), a.reshape(3, 20)[:, 1::2], a[::-1, 2:9], a[[5, 0, 3]])
    for g, w in zip(got, want):
        assert g.dtype == U8 and np.array_equal(g, w)


@pytest.mark.parametrize("other, want", [("i8", "i32"), ("i32", "i32"), ("i64", "i64"), ("f16", "f16"),
                                         ("bf16", "bf16"), ("f32", "f32"), ("f64", "f64"), ("bool", "u8")])
def test_promotion(rng, other, want):
    assert dt.name(dt.promote(U8, dt.as_dtype(other))) == want
    assert dt.name(dt.promote(dt.as_dtype(other), U8)) == want
    if other != "bool":
        a, b = sample(rng, U8, (3, 7)), sample(rng, dt.as_dtype(other), (3, 7))
        got = ts.jit(lambda p, q: p + q)(a, b)
        assert dt.name(got.dtype) == want
        with np.errstate(all="ignore"):
            ref = a.astype(dt.as_dtype(want)) + b.astype(dt.as_dtype(want))
        assert np.array_equal(got.astype(np.float64), ref.astype(np.float64), equal_nan=True)


def test_weak_numbers_keep_uint8(rng):
    a = sample(rng, U8, (4, 19))
    got = ts.jit(lambda v, s: v * s + 3)(a, 5)
    assert got.dtype == U8 and np.array_equal(got, a * U8.type(5) + U8.type(3))
    got = ts.jit(lambda v: v * 0.5)(a)
    assert got.dtype == np.float32 and np.array_equal(got, a.astype(np.float32) * np.float32(0.5))


@pytest.mark.parametrize("fn, match", [
    (lambda v: v + 300, r"300 is out of range for u8"),
    (lambda v: v - (-1), r"-1 is out of range for u8"),
    (lambda v: ts.ops.exp(v), r"exp: dtype u8"),
    (lambda v: v @ v.T, r"matmul: dtype u8"),
])
def test_coded_refusals(fn, match):
    with pytest.raises(DtypeError, match=match) as e:
        ts.jit(fn)(np.full((2, 3), 7, np.uint8))
    assert isinstance(e.value, TesseraError) and e.value.code == "DTYPE_UNSUPPORTED"


@pytest.mark.parametrize("target, arch", [("nvidia", "sm_90"), ("rocm", "gfx942")])
def test_gpu_lanes_refuse_uint8_by_name(target, arch):
    a = np.arange(64, dtype=np.uint8).reshape(8, 8)
    with pytest.raises(ScheduleIllegalError, match=f"the {target} lane has no kernel for tessera.add on uint8"):
        ts.compile(lambda v: v + v, a, target=target, arch=arch)


@pytest.mark.parametrize("target, arch", [("nvidia", "sm_90"), ("rocm", "gfx942")])
def test_gpu_gemm_epilogue_cast_to_int_refused_by_name(target, arch):
    x, w = np.ones((64, 32), np.float16), np.ones((32, 64), np.float16)
    for d in ("uint8", "int32"):
        with pytest.raises(ScheduleIllegalError, match=f"the {target} lane has no GEMM epilogue storing {d}"):
            ts.compile(lambda p, q: (p @ q).astype(d), x, w, target=target, arch=arch)


GEMM_CAST_DTYPES = [np.dtype(d) for d in (np.uint8, np.int8, np.int32)]


def gemm_cast_ok(rng) -> bool:
    """``(x @ w).astype(int)``: the cast ends the GEMM epilogue and is applied at the store."""
    x, w = (rng.standard_normal((37, 29)) * 40).astype(np.float32), rng.standard_normal((29, 21)).astype(np.float32)
    f = ts.jit(lambda p, q: tuple((p @ q).astype(d) for d in GEMM_CAST_DTYPES))
    ref = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    ok = True
    for d, g in zip(GEMM_CAST_DTYPES, f(x, w)):
        got_f = (x @ w)        # float32 rounding may differ from ours by an ulp: compare where not near an integer
        far = np.abs(ref - np.round(ref)) > 1e-3
        ok &= g.dtype == d and np.array_equal(g[far], cast_oracle(got_f, d)[far])
    return ok and bool((np.abs(ref) > 300).any())


def test_gemm_epilogue_cast_to_int(rng):
    assert gemm_cast_ok(rng)


# --- teeth: the signed meaning planted on uint8 lanes fails the checks above -----------------------

def test_planted_signed_compare_fails(monkeypatch, rng):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(x86_int_elem, "is_unsigned", lambda t: False)
    assert not arith_ok(rng, ts.jit(_arith))


def test_planted_sign_extension_fails(monkeypatch, rng):
    """teeth: uint8 -> int32 / float sign-extended (sext / sitofp) must fail."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = x86_int_elem.convert
    monkeypatch.setattr(x86_int_elem, "convert", lambda cg, a, rt, su=False, du=False: real(cg, a, rt, False, du))
    x = sample(rng, U8, (3, 37))
    got = ts.jit(lambda v: (v.astype(np.int32), v.astype(np.float32)))(x)
    assert not np.array_equal(got[0], x.astype(np.int32))
    assert not np.array_equal(got[1], x.astype(np.float32))


def test_planted_signed_saturation_fails(monkeypatch, rng):
    """teeth: float -> uint8 through fptosi.sat to i8 (saturating at 127) must fail."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = x86_int_elem.convert
    monkeypatch.setattr(x86_int_elem, "convert", lambda cg, a, rt, su=False, du=False: real(cg, a, rt, su, False))
    x = sample(rng, np.float32, (3, 37))
    assert not np.array_equal(ts.jit(lambda v: v.astype(np.uint8))(x), to_u8_oracle(x))


def test_planted_unsaturated_gemm_store_fails(monkeypatch, rng):
    """teeth: the GEMM's float registers stored to int memory without saturation (plain fptosi) fail."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = x86_int_elem.convert

    def planted(cg, a, rt, su=False, du=False):
        if not x86_int_elem._is_int(a.type) and x86_int_elem._is_int(rt) and x86_int_elem._width(rt) > 1:
            return cg.b.fptosi(a, rt)
        return real(cg, a, rt, su, du)
    monkeypatch.setattr(x86_int_elem, "convert", planted)
    assert not gemm_cast_ok(rng)
