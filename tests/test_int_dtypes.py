"""int8 / int32 / int64 / bool on the CPU lane: arguments and results, casts between all eight
dtypes, integer arithmetic (wraps as numpy's), JAX's promotion lattice and weak Python numbers,
views of int tensors, and coded refusals.  Oracles are numpy (and Python ints for the saturating
float -> int cast, whose numpy form is undefined)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.codegen import x86_int_elem
from tessera.errors import DtypeError, TesseraError
from tessera.frontend.trace import ARRAY, SCALAR, trace

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL = [np.dtype(d) for d in (np.float64, np.float32, np.float16, BF16, np.int8, np.int32, np.int64, np.bool_)]
INTS = [np.dtype(d) for d in (np.int8, np.int32, np.int64)]


def sample(rng, d, shape):
    """Random values of ``d`` over its whole range, with the edges first (INT_MIN, -1, 0; NaN, +-inf, -0)."""
    d = np.dtype(d)
    if d == np.bool_:
        return rng.random(shape) < 0.5
    if d.kind == "i":
        i = np.iinfo(d)
        v = rng.integers(i.min, i.max, shape, dtype=np.int64, endpoint=True).astype(d)
        v.flat[:5] = [i.min, -1, 0, i.max, 1]
        return v
    big = 6e4 if d == np.float16 else 3e38
    v = (rng.standard_normal(shape) * 10.0 ** rng.uniform(0, 12, shape)).astype(np.float64)
    v.flat[:8] = [np.nan, np.inf, -np.inf, -0.0, big, -2.5, 2.5, -0.7]
    with np.errstate(over="ignore"):
        return v.astype(d)


def cast_oracle(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """numpy's astype, with float -> int defined: truncate toward zero, saturate, NaN -> 0."""
    if to.kind == "i" and x.dtype.kind in "fV":
        lo, hi = int(np.iinfo(to).min), int(np.iinfo(to).max)
        vals = [0 if math.isnan(v) else lo if v == -math.inf else hi if v == math.inf else
                min(max(math.trunc(v), lo), hi) for v in x.astype(np.float64).ravel().tolist()]
        return np.array(vals, dtype=to).reshape(x.shape)
    with np.errstate(all="ignore"):
        return x.astype(to)


def _casts(x):
    return tuple(x.astype(d) for d in ALL)


CASTS = ts.jit(_casts)


@pytest.mark.parametrize("src", ALL, ids=str)
def test_cast_between_all_dtypes(rng, src):
    x = sample(rng, src, (3, 37))
    got = CASTS(x)
    for d, g in zip(ALL, got):
        want = cast_oracle(x, d)
        assert g.dtype == d and g.shape == x.shape
        gf, wf = g.astype(np.float64), want.astype(np.float64)
        assert np.array_equal(gf, wf, equal_nan=True), (src, d, x[gf != wf], g[gf != wf], want[gf != wf])


def _arith(a, b):
    return (a + b, a - b, a * b, -a, ts.ops.abs(a), ts.ops.maximum(a, b), ts.ops.minimum(a, b), a * 3 - 1,
            ts.ops.clip(a, -5, 7))


ARITH = ts.jit(_arith)


def arith_ok(rng, d, fn=ARITH) -> bool:
    a, b = sample(rng, d, (5, 41)), sample(rng, d, (41,))
    got = fn(a, b)
    with np.errstate(all="ignore"):
        want = (a + b, a - b, a * b, -a, np.abs(a), np.maximum(a, b), np.minimum(a, b), a * d.type(3) - d.type(1),
                np.clip(a, -5, 7))
    return all(g.dtype == d and np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("d", INTS, ids=str)
def test_int_arithmetic_wraps_like_numpy(rng, d):
    assert arith_ok(rng, d)


def test_planted_int_compare_bug_fails(monkeypatch, rng):
    """teeth: maximum/minimum on int lanes with an unsigned compare must fail the check."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = x86_int_elem._int_op

    def planted(cg, fn, args):
        if fn in ("max", "min"):
            a, c = args
            return cg.b.select(cg.b.icmp_unsigned(">" if fn == "max" else "<", a, c), a, c)
        return real(cg, fn, args)
    monkeypatch.setattr(x86_int_elem, "_int_op", planted)
    assert not arith_ok(rng, np.dtype(np.int32), ts.jit(_arith))


def test_planted_cast_bug_fails(monkeypatch, rng):
    """teeth: a float -> int cast without saturation (plain fptosi) must fail the check."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = x86_int_elem.convert

    def planted(cg, a, rt):
        if not x86_int_elem._is_int(a.type) and x86_int_elem._is_int(rt) and x86_int_elem._width(rt) > 1:
            return cg.b.fptosi(a, rt)
        return real(cg, a, rt)
    monkeypatch.setattr(x86_int_elem, "convert", planted)
    x = sample(rng, np.float32, (2, 37))
    got = ts.jit(lambda v: v.astype(np.int32))(x)
    assert not np.array_equal(got, cast_oracle(x, np.dtype(np.int32)))


# the promotion table, written from JAX's documented lattice (jax.numpy.promote_types; x64 on)
_JAX = {
    ("bool", "i8"): "i8", ("bool", "i32"): "i32", ("bool", "i64"): "i64", ("bool", "f16"): "f16",
    ("bool", "bf16"): "bf16", ("bool", "f32"): "f32", ("bool", "f64"): "f64",
    ("i8", "i32"): "i32", ("i8", "i64"): "i64", ("i32", "i64"): "i64",
    ("i8", "f16"): "f16", ("i8", "bf16"): "bf16", ("i8", "f32"): "f32", ("i8", "f64"): "f64",
    ("i32", "f16"): "f16", ("i32", "bf16"): "bf16", ("i32", "f32"): "f32", ("i32", "f64"): "f64",
    ("i64", "f16"): "f16", ("i64", "bf16"): "bf16", ("i64", "f32"): "f32", ("i64", "f64"): "f64",
    ("f16", "bf16"): "f32", ("f16", "f32"): "f32", ("bf16", "f32"): "f32", ("f16", "f64"): "f64",
    ("bf16", "f64"): "f64", ("f32", "f64"): "f64",
}


def _traced_dtype(fn, *args):
    kinds = [SCALAR if isinstance(a, (int, float)) else ARRAY for a in args]
    ints = frozenset(i for i, a in enumerate(args) if isinstance(a, int))
    arrays = [np.zeros((), np.float32) if k == SCALAR else a for a, k in zip(args, kinds)]
    return trace(fn, arrays, kinds, int_scalars=ints).outputs[0].dtype


def test_promotion_table_is_jax_lattice():
    names = ["bool", "i8", "i32", "i64", "f16", "bf16", "f32", "f64"]
    for a in names:
        assert dt.promote(dt.as_dtype(a), dt.as_dtype(a)) == dt.as_dtype(a)
        for b in names:
            if a == b:
                continue
            want = _JAX.get((a, b)) or _JAX[(b, a)]
            assert dt.name(dt.promote(dt.as_dtype(a), dt.as_dtype(b))) == want, (a, b)
            if "bool" not in (a, b):   # the traced op computes in it (a cast in the graph)
                x, y = np.zeros(3, dt.as_dtype(a)), np.zeros(3, dt.as_dtype(b))
                assert dt.name(_traced_dtype(lambda p, q: p + q, x, y)) == want


@pytest.mark.parametrize("arr, lit, want", [
    ("i8", 3, "i8"), ("i8", 0.5, "f32"), ("i64", 2, "i64"), ("i32", 2.0, "f32"), ("f16", 3, "f16"),
    ("bf16", 0.5, "bf16"), ("bool", 1, "i32"), ("bool", 1.5, "f32"), ("f64", 1, "f64")])
def test_weak_python_numbers(arr, lit, want):
    x = np.zeros(3, dt.as_dtype(arr))
    assert dt.name(_traced_dtype(lambda p: _weak_mix(p, lit), x)) == want   # a literal
    # the same number passed as a runtime argument (a weak 0-d tensor of its Python kind)
    assert dt.name(_traced_dtype(lambda p, s: _weak_mix(p, s), x, lit)) == want


def _weak_mix(p, s):
    """The dtype ``p`` and the number ``s`` compute in (bool arithmetic is refused: promote directly)."""
    if p.dtype == np.bool_:
        from tessera.frontend.trace import Tensor, as_tensor, promote_pair
        return promote_pair(p, s if isinstance(s, Tensor) else as_tensor(s, p, "t"), "t")[0]
    return p * s


def test_weak_scalars_run(rng):
    a = sample(rng, np.int8, (4, 19))
    np.testing.assert_array_equal(ts.jit(lambda v, s: v * s + 3)(a, 5), (a * np.int8(5) + np.int8(3)))
    got = ts.jit(lambda v, s: v * s)(a, 0.25)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, a.astype(np.float32) * np.float32(0.25))
    i32 = sample(rng, np.int32, (3, 11))
    got = ts.jit(lambda p, q: p / q)(i32, np.where(i32 == 0, 7, i32))
    assert got.dtype == np.float32   # JAX's true division of ints


def test_int_and_bool_views(rng):
    a, m = sample(rng, np.int64, (6, 10)), sample(rng, np.bool_, (6, 10))
    got = ts.jit(lambda p, q: (ts.ops.concatenate([p.T, p.T[:, 1:]], axis=1), p.reshape(3, 20)[:, 1::2], q.T,
                               q[1:4, 2:9], ts.ops.concatenate([q, q], axis=0)))(a, m)
    want = (np.concatenate([a.T, a.T[:, 1:]], 1), a.reshape(3, 20)[:, 1::2], m.T, m[1:4, 2:9],
            np.concatenate([m, m], 0))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)


@pytest.mark.parametrize("fn, arg, match", [
    (lambda v: ts.ops.exp(v), "i32", r"exp: dtype i32"),
    (lambda v: v @ v.T, "i64", r"matmul: dtype i64"),
    (lambda v: ts.ops.softmax(v), "i8", r"softmax: dtype i8"),
    (lambda v: v.sum(), "i32", r"reduce_sum: dtype i32"),
    (lambda v: v + v, "bool", r"add: dtype bool"),
    (lambda v: v + 1000, "i8", r"1000 is out of range for i8"),
])
def test_coded_refusals(fn, arg, match):
    with pytest.raises(DtypeError, match=match) as e:
        ts.jit(fn)(np.ones((2, 3), dt.as_dtype(arg)))
    assert isinstance(e.value, TesseraError) and e.value.code == "DTYPE_UNSUPPORTED"


def test_unsupported_array_dtype_is_coded():
    with pytest.raises(DtypeError, match="uint16"):
        ts.jit(lambda v: v)(np.ones(3, np.uint16))
