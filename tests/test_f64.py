"""float64 on the CPU lane: every op computes in f64 vectors (4 lanes with AVX2, 8 with AVX-512)
and is checked against a float64 numpy oracle (or, for the transcendentals, 60-digit Decimal
references: tessera/tools/numerics64) on fresh random data; every call must have run on
``cpu-x86``.  The AVX-512 schedules run here too (``avx512_here``).

Bounds: add/sub/mul/div/maximum/neg/relu/sqrt, casts and copies are correctly rounded, so they
equal numpy bit for bit; sums (reductions, rows, GEMM) differ from numpy's only in the order of
the additions (bounded by K u sum|terms|, u = 2^-53); the transcendentals hold the ULP bounds of
``ULP_BOUND`` (docs/numerics.md)."""
from __future__ import annotations

import math
import os
import sys
from decimal import Decimal as D

import ml_dtypes
import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera.frontend.reference import attention64
from tessera.tools import numerics64 as N64

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import fit_math64 as FIT  # noqa: E402

U = 2.0 ** -53
BF16 = ml_dtypes.bfloat16
# maximum error in float64 ULPs against 60-digit references; the largest seen over 24 000 random
# points each (the sweeps below, at three seeds): exp 0.93, tanh 1.33, erf 2.71, silu 2.76,
# gelu_tanh 2.57, gelu_erf 4.56
# erf: its worst inputs sit in [0.5, 0.6] (3.06 ULP at 0.51791 in one random draw; a dense sweep of
# [0, 3] peaks at 2.86), beyond the fixed sample of docs/numerics.md (2.45); gelu_erf reached 5.04 at
# x = -3.449 in one draw (3.54 in that sample)
ULP_BOUND = {"exp": 1.1, "tanh": 1.5, "erf": 3.5, "silu": 3.0, "gelu_tanh": 3.0, "gelu_erf": 6.0}


def rnd(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def run(f, *args, **kw):
    """f jitted and called; every call it made ran on the CPU lane (not the numpy reference)."""
    before = len(ts.lane_log.entries)
    out = ts.jit(f, **kw)(*args)
    lanes = {e.lane for e in ts.lane_log.entries[before:]}
    assert lanes == {"cpu-x86"}, lanes
    return out


def assert_f64(y, shape=None):
    assert isinstance(y, np.ndarray) and y.dtype == np.float64, getattr(y, "dtype", type(y))
    if shape is not None:
        assert y.shape == tuple(shape)


def assert_sum_close(got, want, bound):
    """|got - want| <= bound elementwise (bound: a rounding-error bound of both sums)."""
    err = np.abs(np.asarray(got, np.float64) - want)
    assert np.all(err <= bound), f"worst {np.max(err / np.maximum(bound, 1e-300)):.3g} x the bound"


# --------------------------------------------------------------------------- elementwise, exactly rounded
EXACT_UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "relu": (ts.ops.relu, lambda x: np.maximum(x, 0)),
    "sqrt": (lambda x: ts.ops.sqrt(x * x + 1.0), lambda x: np.sqrt(x * x + 1)),
    "affine": (lambda x: (2.0 - x) * 0.1 / 3.0 + (-x) - 1.5, lambda x: (2.0 - x) * 0.1 / 3.0 + (-x) - 1.5),
}
SHAPES = [(1,), (3,), (5,), (7, 13), (3, 31, 127), (1025,), (4097,), (2, 1, 9)]


@pytest.mark.parametrize("name", sorted(EXACT_UNARY))
@pytest.mark.parametrize("shape", SHAPES)
def test_exact_unary_equals_numpy(rng, name, shape):
    f, ref = EXACT_UNARY[name]
    x = rnd(rng, *shape, scale=3.0)
    y = run(f, x)
    assert_f64(y, shape)
    np.testing.assert_array_equal(y, ref(x))


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sa, sb", [((7, 13), (7, 13)), ((7, 13), (13,)), ((7, 1), (1, 13)), ((2, 3, 5), (3, 1)),
                                     ((31,), ()), ((4, 1, 6), (1, 5, 1)), ((1,), (1,)), ((9,), (9,))])
def test_binary_broadcasting_equals_numpy(rng, name, sa, sb):
    a, b = rnd(rng, *sa), rnd(rng, *sb)
    if name == "div":
        b = np.abs(b) + 0.5
    y = run(lambda x, z: getattr(ts.ops, name)(x, z), a, b)
    want = BINARY[name](a, b)
    assert_f64(y, want.shape)
    np.testing.assert_array_equal(y, want)


def test_empty_and_scalar_shapes(rng):
    assert_f64(run(lambda x: x * 2.0, np.zeros((0,))), (0,))
    x = rnd(rng, 1)
    np.testing.assert_array_equal(run(lambda a: a * 3.0 + 1.0, x), x * 3.0 + 1.0)


def test_special_values_propagate_like_numpy():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, -5e-324, 2.2250738585072014e-308])
    for f, ref in [(lambda a: a * 2.0, lambda a: a * 2.0), (lambda a: a / 3.0, lambda a: a / 3.0),
                   (lambda a: -a, lambda a: -a), (ts.ops.relu, lambda a: np.maximum(a, 0.0))]:
        with np.errstate(all="ignore"):
            got, want = run(f, x), ref(x)
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


# --------------------------------------------------------------------------- the programs
def test_python_operators_and_methods_on_f64(rng):
    """What a user writes with float64 numpy arrays (the issue's reproducers: ``x * 2`` with an int,
    ``softmax``, ``astype``, ``.sum()``), each against numpy in float64."""
    x, y, w = rnd(rng, 7, 13, scale=3.0), rnd(rng, 13), rnd(rng, 13, 5)
    exact = [(lambda a: a * 2, lambda a: a * 2), (lambda a: 2 * a + 1, lambda a: 2 * a + 1),
             (lambda a: a / 2 - 1, lambda a: a / 2 - 1), (lambda a: 1 - a / 3, lambda a: 1 - a / 3),
             (lambda a: -a * 0.1, lambda a: -a * 0.1), (lambda a: a.T * 1.5, lambda a: a.T * 1.5),
             (lambda a: a.max(axis=-1), lambda a: a.max(axis=-1)), (lambda a: a.max(), lambda a: a.max()),
             (lambda a: a.astype(np.float32), lambda a: a.astype(np.float32)),
             (lambda a: a.astype("float64") * 3, lambda a: a * 3)]
    for f, ref in exact:
        got, want = run(f, x), ref(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    got = run(lambda a, b: a * b + b, x, y)                    # broadcast of a row vector
    np.testing.assert_array_equal(got, x * y + y)
    x32 = x.astype(np.float32)
    got = run(lambda a: a.astype(np.float64) / 3, x32)       # f32 -> f64 widens exactly, then f64 math
    assert_f64(got, x.shape)
    np.testing.assert_array_equal(got, x32.astype(np.float64) / 3)
    for f, ref, axis in [(lambda a: a.sum(), np.sum, None), (lambda a: a.sum(axis=0), np.sum, 0),
                         (lambda a: a.mean(axis=-1), np.mean, -1)]:
        got, want = run(f, x), ref(x, axis=axis)
        n = x.size // np.size(want)
        assert_f64(got, np.shape(want))
        assert_sum_close(got, want, 2 * (n + 2) * U * np.sum(np.abs(x), axis=axis) / (n if ref is np.mean else 1))
    assert_sum_close(run(lambda a, b: a @ b, x, w), x @ w, _gemm_bound(x, w))
    O.assert_close(run(ts.ops.softmax, x), _softmax64(x), 1e-14, "softmax")


# --------------------------------------------------------------------------- unary math on tensors
@pytest.mark.parametrize("name", sorted(ULP_BOUND))
@pytest.mark.parametrize("shape", [(7, 13), (3, 31, 9), (1,), (517,)])
def test_unary_math_on_shapes(rng, name, shape):
    """Each transcendental on odd shapes (vector bodies and tails), alone and fused behind an
    elementwise prologue with a broadcast operand, within its ULP bound of the exact value (the
    60-digit references: numpy's float64 gelu formulas are themselves tens of ULPs off in the
    tails)."""
    f = N64.functions()[name]
    x, b = rnd(rng, *shape, scale=3.0), rnd(rng, shape[-1])
    got = run(f, x)
    assert_f64(got, shape)
    e = N64.ulp_errors(got.ravel(), x.ravel(), name)
    assert e.max() <= ULP_BOUND[name], (x.ravel()[np.argmax(e)], e.max())
    got = run(lambda a, c: f(a * 0.5 + c), x, b)
    arg = x * 0.5 + b                          # x * 0.5 is exact: a fused multiply-add rounds the same
    e = N64.ulp_errors(got.ravel(), arg.ravel(), name)
    assert e.max() <= ULP_BOUND[name], (arg.ravel()[np.argmax(e)], e.max())


# --------------------------------------------------------------------------- casts
@pytest.mark.parametrize("to", ["f32", "bf16", "f16"])
def test_cast_from_f64_rounds_once(rng, to):
    """f64 -> f32 / bf16 / f16 equals numpy's and ml_dtypes' direct conversion, including values just
    past a halfway point of the narrow type (which two roundings, through f32, send the wrong way),
    overflow, subnormals, infinities and NaN."""
    npd = {"f32": np.float32, "bf16": BF16, "f16": np.float16}[to]
    info = ml_dtypes.finfo(npd)
    mant = int(info.nmant)
    ties = np.array([1 + 2.0 ** -(mant + 1) + 2.0 ** -40, 1 + 2.0 ** -(mant + 1) - 2.0 ** -40,
                     3 + 2.0 ** -(mant) * 3 + 2.0 ** -45, -(1 + 2.0 ** -(mant + 1) + 2.0 ** -40)])
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e300, float(info.max) * 1.001,
                        float(info.tiny) / 3, float(info.tiny) * 0.75, 1e-320])
    x = np.concatenate([rnd(rng, 37, scale=100.0), ties, special])
    with np.errstate(all="ignore"):
        want = x.astype(npd)
    got = run(lambda a: ts.ops.cast(a, to), x)
    assert got.dtype == want.dtype
    bits = np.uint16 if to != "f32" else np.uint32
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


def test_f64_to_bf16_needs_round_to_odd(monkeypatch):
    """Teeth: a plain f64 -> f32 -> bf16 double rounding (the planted bug) fails the check above."""
    from tessera.codegen import x86 as cg
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = np.array([1 + 2.0 ** -8 + 2.0 ** -40, -(1 + 2.0 ** -8 + 2.0 ** -40)])
    want = x.astype(BF16).view(np.uint16)
    np.testing.assert_array_equal(run(lambda a: ts.ops.cast(a, "bf16"), x).view(np.uint16), want)
    monkeypatch.setattr(cg._Fn, "_round_to_odd_f32",
                        lambda self, a: self.b.fptrunc(a, cg.ir.VectorType(cg.F32, a.type.count)))
    assert not np.array_equal(run(lambda a: ts.ops.cast(a, "bf16"), x).view(np.uint16), want)


@pytest.mark.parametrize("src", ["f32", "bf16", "f16"])
def test_cast_to_f64_is_exact(rng, src):
    npd = {"f32": np.float32, "bf16": BF16, "f16": np.float16}[src]
    x = np.concatenate([rnd(rng, 41, scale=10.0), [np.inf, -np.inf, 0.0, -0.0]]).astype(npd)
    got = run(lambda a: ts.ops.cast(a, "f64") * 1.0, x)
    assert_f64(got)
    np.testing.assert_array_equal(got, x.astype(np.float64))


def test_mixed_kernel_f32_in_f64_out(rng):
    """An f32 input cast to f64 inside one fused kernel: the f32 values widen exactly, then f64 math."""
    a, b = rnd(rng, 5, 19).astype(np.float32), rnd(rng, 5, 19)
    got = run(lambda x, y: ts.ops.cast(x, "f64") * y + 0.1, a, b)
    np.testing.assert_array_equal(got, a.astype(np.float64) * b + 0.1)
    back = run(lambda y: ts.ops.cast(y * 3.0, "f32"), b)
    np.testing.assert_array_equal(back, (b * 3.0).astype(np.float32))


# --------------------------------------------------------------------------- reductions, copies
@pytest.mark.parametrize("shape, axis", [((7, 13), -1), ((7, 13), 0), ((3, 31, 127), -1), ((3, 31, 127), (1, 2)),
                                         ((1025,), None), ((5, 1), -1), ((1,), 0), ((2, 3, 5), 1)])
@pytest.mark.parametrize("kind", ["sum", "max", "mean"])
def test_reductions(rng, shape, axis, kind):
    x = rnd(rng, *shape, scale=2.0)
    op = {"sum": ts.ops.reduce_sum, "max": ts.ops.reduce_max, "mean": ts.ops.reduce_mean}[kind]
    got = run(lambda a: op(a, axis=axis), x)
    want = {"sum": np.sum, "max": np.max, "mean": np.mean}[kind](x, axis=axis)
    assert_f64(got, np.shape(want))
    if kind == "max":
        np.testing.assert_array_equal(got, want)
        return
    n = x.size // max(np.size(want), 1)
    scale = np.sum(np.abs(x), axis=axis) / (n if kind == "mean" else 1)
    assert_sum_close(got, want, 2 * (n + 2) * U * scale)
    if n > 8:   # an f32 sum would be far outside the bound: the gate can fail
        f32sum = {"sum": np.sum, "mean": np.mean}[kind](x.astype(np.float32), axis=axis)
        assert np.any(np.abs(f32sum - want) > 2 * (n + 2) * U * scale)


@pytest.mark.parametrize("shape, perm", [((5, 37), None), ((3, 4, 17), (2, 0, 1)), ((2, 9, 1, 5), (1, 3, 0, 2)),
                                         ((1, 1), None), ((33, 1), None)])
def test_transpose_and_reshape_copy_exactly(rng, shape, perm):
    x = rnd(rng, *shape)
    got = run(lambda a: ts.ops.transpose(a, perm) * 1.0, x)
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    flat = run(lambda a: ts.ops.reshape(ts.ops.transpose(a, perm), (-1,)) + 0.0, x)
    np.testing.assert_array_equal(flat, np.transpose(x, perm).reshape(-1))


# --------------------------------------------------------------------------- rows
ROW_LENGTHS = [1, 3, 5, 37, 1000, 16385]   # 16385 > the softmax scratch slot: the three-pass path


def _softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("c", ROW_LENGTHS)
def test_softmax_rows(rng, c):
    x = rnd(rng, 3, c, scale=4.0)
    got = run(ts.ops.softmax, x)
    assert_f64(got, x.shape)
    O.assert_close(got, _softmax64(x), 1e-14, "softmax")
    assert np.max(np.abs(got - _softmax64(x)) / _softmax64(x)) < (c + 10) * 4 * U


@pytest.mark.parametrize("c", ROW_LENGTHS[:-1])
def test_layer_norm_and_rms_norm_rows(rng, c):
    x = rnd(rng, 4, c, scale=2.0) + 3.0
    x[1] = 7.25                               # a constant row: only eps keeps it finite
    x[2] = 1.0 + rnd(rng, c) * 1e-4           # a low-variance row: eps is a visible part of it
    s, bias = rnd(rng, c), rnd(rng, c)
    eps = 1e-5
    got = run(lambda a, w, z: ts.ops.layer_norm(a, w, z, eps=eps), x, s, bias)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    want = (x - mu) / np.sqrt(var + eps) * s + bias
    O.assert_close(got, want, 1e-12, "layer_norm")
    got = run(lambda a, w: ts.ops.rms_norm(a, w, eps=eps), x, s)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * s
    O.assert_close(got, want, 1e-13, "rms_norm")


def test_row_op_with_prologue_and_epilogue(rng):
    x, b = rnd(rng, 6, 45), rnd(rng, 45)
    got = run(lambda a, z: ts.ops.softmax(a * 0.5 + z) * 2.0, x, b)
    O.assert_close(got, _softmax64(x * 0.5 + b) * 2.0, 1e-14, "softmax with prologue")


# --------------------------------------------------------------------------- matmul
def _gemm_bound(a, b):
    """Both sums (ours and numpy's) are within K u |a| |b| of the exact one."""
    k = a.shape[-1]
    return 2 * (k + 2) * U * (np.abs(a) @ np.abs(b))


MM_SHAPES = [(1, 1, 1), (1, 7, 1), (2, 3, 4), (7, 1, 5), (13, 17, 19), (33, 64, 31), (64, 65, 66), (100, 1, 300),
             (129, 257, 131), (255, 300, 17), (301, 129, 257)]


@pytest.mark.parametrize("m, k, n", MM_SHAPES)
def test_matmul(rng, m, k, n):
    a, b = rnd(rng, m, k), rnd(rng, k, n)
    got = run(lambda x, w: x @ w, a, b)
    assert_f64(got, (m, n))
    assert_sum_close(got, a @ b, _gemm_bound(a, b))


def test_matmul_bound_catches_f32_accumulation(rng):
    """Teeth for the GEMM gate: an f32 product of the same inputs is far outside it."""
    a, b = rnd(rng, 33, 64), rnd(rng, 64, 31)
    f32 = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float64)
    with pytest.raises(AssertionError):
        assert_sum_close(f32, a @ b, _gemm_bound(a, b))


def test_batched_matmul_and_epilogues(rng):
    a, b = rnd(rng, 3, 17, 9), rnd(rng, 3, 9, 11)
    assert_sum_close(run(lambda x, w: x @ w, a, b), a @ b, _gemm_bound(a, b))
    a, b, bias, c0 = rnd(rng, 37, 29), rnd(rng, 29, 45), rnd(rng, 45), rnd(rng, 37, 45)
    z = a @ b
    bound = _gemm_bound(a, b)
    assert_sum_close(run(lambda x, w, c: x @ w + c, a, b, c0), z + c0, bound + 4 * U * np.abs(z + c0))
    got = run(lambda x, w, v: ts.ops.gelu(x @ w + v, "tanh"), a, b, bias)
    O.assert_close(got, O.gelu_tanh(z + bias), 1e-13, "gelu(a @ b + bias)")
    got = run(lambda x, w: ts.ops.cast(x @ w, "f32"), a, b)
    assert got.dtype == np.float32
    O.assert_close(got, z, 1e-7, "f64 matmul -> f32")
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    got = run(lambda x, w: ts.ops.cast(x @ w, "f64"), a32, b32)
    assert_f64(got)
    O.assert_close(got, O.f64(a32) @ O.f64(b32), 1e-6, "f32 matmul -> f64")


def test_matmul_uses_the_f64_fma_record(rng):
    a, b = rnd(rng, 24, 40), rnd(rng, 40, 24)
    art = ts.compile(lambda x, w: x @ w, a, b)
    rec = ts.explain(lambda x, w: x @ w, a, b).kernels[0]["mma"]["record"]
    assert rec in ("x86.avx2.fma.f64", "x86.avx512.fma.f64")
    w = 8 if "avx512" in rec else 4
    assert f"vector<{w}xf64>" in art.ir("target")
    assert "vfmadd" in art.asm() and "pd" in art.asm() and "vfmadd231ps" not in art.asm()


@pytest.mark.slow   # ~24 s of compiles; run by CI with -m slow, and test_avx512_schedule_runs_here runs the code
def test_avx512_f64_compiles_to_zmm_pd(rng):
    """The AVX-512 forms (8 x f64) compile to zmm instructions and an object with no undefined
    symbol (no libm calls), whether or not this host can run them."""
    import re

    from tessera.codegen import elf
    from tessera.codegen import jit as cj
    a, b = rnd(rng, 16, 24), rnd(rng, 24, 16)
    f = lambda x, w: ts.ops.gelu(x @ w, "erf") + ts.ops.softmax(ts.ops.tanh(x @ w)) * ts.ops.silu(x @ w)  # noqa: E731
    art = ts.compile(f, a, b, arch="avx512")
    assert "vector<8xf64>" in art.ir("target")
    assert re.search(r"vfmadd\d{3}pd\s+%zmm\d+, %zmm\d+, %zmm\d+", art.asm())
    assert not re.search(r"vfmadd\d{3}ps", art.asm())
    c = art.compiled
    assert set(elf.undefined(cj.emit_cpu(c.llvm_ir, c.cpu, c.features).obj)) <= {"sched_yield"}   # the barrier's


def test_empty_extents(rng):
    got = run(lambda x, w: x @ w, np.ones((3, 0)), np.ones((0, 4)))
    np.testing.assert_array_equal(got, np.zeros((3, 4)))
    np.testing.assert_array_equal(run(lambda x: ts.ops.reduce_sum(x, axis=-1), np.ones((3, 0))), np.zeros(3))
    assert_f64(run(ts.ops.softmax, np.ones((0, 5))), (0, 5))


# --------------------------------------------------------------------------- attention
@pytest.mark.parametrize("b, h, hkv, sq, sk, d, causal", [(1, 2, 2, 37, 37, 16, False), (2, 2, 1, 130, 130, 64, True),
                                                          (1, 1, 1, 5, 9, 3, False), (1, 1, 1, 1, 1, 1, False)])
def test_attention(rng, b, h, hkv, sq, sk, d, causal):
    q, k, v = rnd(rng, b, h, sq, d), rnd(rng, b, hkv, sk, d), rnd(rng, b, hkv, sk, d)
    got = run(lambda x, y, z: ts.ops.attention(x, y, z, causal=causal), q, k, v)
    assert_f64(got, q.shape)
    O.assert_close(got, attention64(q, k, v, None, 1 / math.sqrt(d), causal), 1e-13, "attention")


def test_attention_masks(rng):
    q, k, v = rnd(rng, 1, 2, 21, 8), rnd(rng, 1, 2, 33, 8), rnd(rng, 1, 2, 33, 8)
    add = rnd(rng, 21, 33)
    got = run(lambda x, y, z, m: ts.ops.attention(x, y, z, mask=m), q, k, v, add)
    O.assert_close(got, attention64(q, k, v, add, 1 / math.sqrt(8), False), 1e-13, "additive mask")
    keep = rng.random((21, 33)) > 0.3
    got = run(lambda x, y, z, m: ts.ops.attention(x, y, z, mask=m), q, k, v, keep)
    O.assert_close(got, attention64(q, k, v, keep, 1 / math.sqrt(8), False), 1e-13, "bool mask")


# --------------------------------------------------------------------------- transcendentals: ULPs
FUNCTIONS = N64.functions()
ulp_errors = N64.ulp_errors


def _sweep(rng, name) -> np.ndarray:
    return N64.sample(name, rng)


@pytest.mark.parametrize("name", sorted(ULP_BOUND))
def test_transcendental_ulps(rng, name):
    x = _sweep(rng, name)
    with np.errstate(all="ignore"):
        got = run(FUNCTIONS[name], x)
    assert_f64(got, x.shape)
    e = ulp_errors(got, x, name)
    assert e.max() <= ULP_BOUND[name], (x[np.argmax(e)], e.max())


def test_transcendental_special_values():
    """NaN, infinities and signed zeros as numpy gives them; the finite edges (exp's overflow and
    underflow, subnormal arguments and results, silu past exp's range) within the ULP bounds."""
    from scipy.special import erf
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 709.7, 709.8, -745.1, -745.2, 1e-320, -1e-320, 800.0, -800.0,
                  -751.0, -39.0, 38.0])
    fin = np.isfinite(x)
    with np.errstate(all="ignore"):
        for name, ref in [("exp", np.exp), ("tanh", np.tanh), ("erf", erf), ("silu", O.silu),
                          ("gelu_tanh", O.gelu_tanh), ("gelu_erf", O.gelu_erf)]:
            got, want = run(FUNCTIONS[name], x), ref(x)
            np.testing.assert_array_equal(got[~fin], want[~fin], name)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want), name)
            assert ulp_errors(got[fin], x[fin], name).max() <= ULP_BOUND[name], name


def test_exp_polynomial_plant_fails_the_bound(rng, monkeypatch):
    """Teeth: exp with its last Taylor term dropped (degree 12) misses the 1-ULP bound."""
    from tessera.codegen import x86_math64
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.uniform(-700, 700, 400)
    assert ulp_errors(run(ts.ops.exp, x), x, "exp").max() <= ULP_BOUND["exp"]
    monkeypatch.setattr(x86_math64, "EXP_Q", x86_math64.EXP_Q[:-1])
    assert ulp_errors(run(ts.ops.exp, x), x, "exp").max() > ULP_BOUND["exp"]


def test_erfc_series_plant_fails_the_bound(rng, monkeypatch):
    from tessera.codegen import x86_math64
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.uniform(-9, -1, 300)
    monkeypatch.setattr(x86_math64, "ERFC64_H", x86_math64.ERFC64_H[:-2])
    assert ulp_errors(run(FUNCTIONS["gelu_erf"], x), x, "gelu_erf").max() > ULP_BOUND["gelu_erf"]


def test_coefficients_are_the_fit_tools():
    from tessera.codegen import x86_math64 as M
    want = FIT.constants()
    for name in ("TANH64_P", "ERF64_P", "ERFC64_MAP", "ERFC64_H", "GELU_K0", "GELU_K1"):
        assert getattr(M, name) == want[name], name
    assert (M.LN2_HI, M.LN2_LO) == want["LN2"] and (M.RSQRT2_HI, M.RSQRT2_LO) == want["RSQRT2"]
    assert M.TWO_OVER_SQRT_PI == want["TWO_OVER_SQRT_PI"][0] and M.LN2 == M.LN2_HI
    assert M.EXP_Q == tuple(float(D(1) / math.factorial(k)) for k in range(2, 14))


# --------------------------------------------------------------------------- vector width
def test_f64_kernels_get_half_the_lanes(rng):
    x = rnd(rng, 6, 40)
    rep = ts.explain(lambda a: ts.ops.softmax(a * 2.0), x)
    f32rep = ts.explain(lambda a: ts.ops.softmax(a * 2.0), x.astype(np.float32))
    assert rep.lane == "cpu-x86"
    w64 = rep.kernels[0]["vector"]
    assert w64 * 2 == f32rep.kernels[0]["vector"] and w64 in (4, 8)
    assert f"vector<{w64}xf64>" in ts.compile(lambda a: ts.ops.softmax(a * 2.0), x).ir("target")


def test_lane_width_plant_is_refused(rng, monkeypatch):
    """Teeth: a schedule that lays an f64 kernel out in f32 lanes (twice the vector) is refused by the
    x86 lowering with a coded error, never run."""
    from tessera.errors import TesseraError
    from tessera.passes.schedule import schedule_cpu
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(schedule_cpu, "register_elem", lambda fop: schedule_cpu.f32)
    with pytest.raises(TesseraError) as e:
        ts.jit(lambda a: a * 2.0)(rnd(rng, 3, 7))
    assert "f64 vectors" in str(e.value)


# --------------------------------------------------------------------------- teeth: f64 computed in f32
def _family_checks(rng, run=run) -> dict:
    """One check per op family, each the same comparison the tests above make; ``run`` compiles
    and calls."""
    x, b, g = rnd(rng, 6, 37, scale=3.0), rnd(rng, 37), rnd(rng, 37)
    x32 = x.astype(np.float32)

    def elementwise():
        np.testing.assert_array_equal(run(lambda a: a * 2, x), x * 2)

    def broadcast():
        np.testing.assert_array_equal(run(lambda a, c: a * c + c, x, b), x * b + b)

    def astype():
        np.testing.assert_array_equal(run(lambda a: a.astype(np.float64) / 3, x32), x32.astype(np.float64) / 3)

    def unary():
        e = N64.ulp_errors(run(ts.ops.exp, x).ravel(), x.ravel(), "exp")
        assert e.max() <= ULP_BOUND["exp"], e.max()

    def reduction():
        assert_sum_close(run(lambda a: a.sum(axis=-1), x), x.sum(-1), 2 * 39 * U * np.abs(x).sum(-1))

    def softmax():
        O.assert_close(run(ts.ops.softmax, x), _softmax64(x), 1e-14, "softmax")

    def norms():
        mu = x.mean(-1, keepdims=True)
        want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g
        O.assert_close(run(lambda a, s: ts.ops.layer_norm(a, s), x, g), want, 1e-12, "layer_norm")
        want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
        O.assert_close(run(lambda a, s: ts.ops.rms_norm(a, s), x, g), want, 1e-13, "rms_norm")

    def unary_all():
        for name in sorted(ULP_BOUND):
            v = N64.sample(name, rng, 120)
            with np.errstate(all="ignore"):
                e = N64.ulp_errors(run(N64.functions()[name], v), v, name)
            assert e.max() <= ULP_BOUND[name], (name, v[np.argmax(e)], e.max())

    def reductions():
        y = rnd(rng, 3, 31, 127)
        for axis in (-1, 0, (1, 2), None):
            want = y.sum(axis=axis)
            n = y.size // np.size(want)
            assert_sum_close(run(lambda a: a.sum(axis=axis), y), want, 2 * (n + 2) * U * np.abs(y).sum(axis=axis))
            np.testing.assert_array_equal(run(lambda a: a.max(axis=axis), y), y.max(axis=axis))

    def long_rows():
        for c in (1, 5, 1000, 16385):
            y = rnd(rng, 3, c, scale=4.0)
            O.assert_close(run(ts.ops.softmax, y), _softmax64(y), 1e-14, f"softmax {c}")

    def transpose():
        y = rnd(rng, 3, 4, 17)
        np.testing.assert_array_equal(run(lambda a: ts.ops.transpose(a, (2, 0, 1)) * 1.0, y), np.transpose(y, (2, 0, 1)))
        np.testing.assert_array_equal(run(lambda a: a.T + 0.0, x), x.T)

    def cast_narrow():
        ties = np.array([1 + 2.0 ** -8 + 2.0 ** -40, 1 + 2.0 ** -11 - 2.0 ** -40, 1 + 2.0 ** -24 + 2.0 ** -50])
        y = np.concatenate([x.ravel() * 100, ties, [np.inf, -0.0, 1e-320, 1e300]])
        for npd, name in ((BF16, "bf16"), (np.float16, "f16"), (np.float32, "f32")):
            with np.errstate(all="ignore"):
                want = y.astype(npd)
            got = run(lambda a: ts.ops.cast(a, name), y)
            np.testing.assert_array_equal(got.view(np.uint16 if name != "f32" else np.uint32),
                                          want.view(np.uint16 if name != "f32" else np.uint32))

    def matmul():
        for m, k, n in ((1, 7, 1), (13, 17, 19), (64, 65, 66), (129, 257, 131)):
            a, w = rnd(rng, m, k), rnd(rng, k, n)
            assert_sum_close(run(lambda p, q: p @ q, a, w), a @ w, _gemm_bound(a, w))
        a, w, v = rnd(rng, 37, 29), rnd(rng, 29, 45), rnd(rng, 45)
        O.assert_close(run(lambda p, q, c: ts.ops.gelu(p @ q + c, "tanh"), a, w, v), O.gelu_tanh(a @ w + v), 1e-13,
                       "gelu(a @ b + bias)")

    def attention():
        q, k, v = rnd(rng, 2, 2, 130, 64), rnd(rng, 2, 1, 130, 64), rnd(rng, 2, 1, 130, 64)
        got = run(lambda p, r, s: ts.ops.attention(p, r, s, causal=True), q, k, v)
        O.assert_close(got, attention64(q, k, v, None, 1 / 8, True), 1e-13, "attention")

    return {f.__name__: f for f in (elementwise, broadcast, astype, unary, reduction, softmax, norms, unary_all,
                                    reductions, long_rows, transpose, cast_narrow, matmul, attention)}


@pytest.mark.parametrize("family", ["elementwise", "broadcast", "astype", "unary", "reduction", "softmax", "norms"])
def test_f32_compute_plant_fails_each_family(rng, monkeypatch, family):
    """Teeth: every kernel generator and the schedule told that f64 kernels compute in f32 (the bug
    the issue reported, made consistent so that it runs: f64 loads round to f32, stores widen) gives
    float64 arrays of float32 accuracy; each family's check passes before the plant and fails with it."""
    from xdsl.dialects.builtin import f32
    from tessera.passes.schedule import schedule_cpu
    from tessera.passes.tile.kernels import elementwise, reduce, rowwise, transpose
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    check = _family_checks(rng)[family]
    check()
    for mod in (schedule_cpu, elementwise, reduce, rowwise, transpose):
        monkeypatch.setattr(mod, "register_elem", lambda op: f32)
    with pytest.raises(AssertionError):
        check()


def test_f32_gemm_plant_does_not_pass(rng, monkeypatch):
    """Teeth for matmul: a schedule that picks the f32 FMA record for float64 operands never yields
    a result (the x86 IR verifier refuses f64 panels in an f32 FMA), so it cannot pass the gate."""
    from tessera.errors import TesseraError
    from tessera.passes.schedule import schedule_cpu
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b = rnd(rng, 33, 64), rnd(rng, 64, 31)
    assert_sum_close(run(lambda x, w: x @ w, a, b), a @ b, _gemm_bound(a, b))
    real = schedule_cpu._dtype
    monkeypatch.setattr(schedule_cpu, "_dtype", lambda e: "f32" if real(e) == "f64" else real(e))
    with pytest.raises((AssertionError, TesseraError)):
        assert_sum_close(run(lambda x, w: x @ w, a, b), a @ b, _gemm_bound(a, b))


# --------------------------------------------------------------------------- the AVX-512 schedule, run here
_MAX512 = '@"llvm.x86.avx512.max.pd.512"'
_MAX512_AS_HALVES = """
define internal <8 x double> @"emu.max.pd.512"(<8 x double> %a, <8 x double> %b, i32 %r) alwaysinline {
  %al = shufflevector <8 x double> %a, <8 x double> poison, <4 x i32> <i32 0, i32 1, i32 2, i32 3>
  %ah = shufflevector <8 x double> %a, <8 x double> poison, <4 x i32> <i32 4, i32 5, i32 6, i32 7>
  %bl = shufflevector <8 x double> %b, <8 x double> poison, <4 x i32> <i32 0, i32 1, i32 2, i32 3>
  %bh = shufflevector <8 x double> %b, <8 x double> poison, <4 x i32> <i32 4, i32 5, i32 6, i32 7>
  %l = call <4 x double> @llvm.x86.avx.max.pd.256(<4 x double> %al, <4 x double> %bl)
  %h = call <4 x double> @llvm.x86.avx.max.pd.256(<4 x double> %ah, <4 x double> %bh)
  %m = shufflevector <4 x double> %l, <4 x double> %h, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>
  ret <8 x double> %m
}
declare <4 x double> @llvm.x86.avx.max.pd.256(<4 x double>, <4 x double>)
"""


@pytest.fixture
def avx512_here(monkeypatch):
    """Compile for ``arch=avx512`` (8-lane f64 schedules, tiles, tails, masks and the 1x8x1 f64 FMA
    record) and emit the LLVM IR for this host's CPU instead: LLVM legalises each <8 x double> into
    two 256-bit halves, and the one AVX-512 intrinsic the f64 kernels call (vmaxpd zmm, for
    select_max) becomes two vmaxpd ymm (same per-lane semantics, NaN handling included).  What is
    tested is everything Tessera generates for AVX-512 except the instruction encoding (which
    test_avx512_f64_compiles_to_zmm_pd inspects).  Returns a runner like ``run``."""
    import re

    from tessera import host
    from tessera.codegen import jit as cj
    from tessera.frontend.compile import resolve_arch
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    here = resolve_arch("cpu", None)
    real = cj.emit_cpu

    def emit_here(llvm_ir, cpu, features, **kw):
        if "+avx512f" in features.split(","):
            llvm_ir = re.sub(r"declare [^\n]*" + re.escape(_MAX512) + r"[^\n]*\n", "", llvm_ir)
            llvm_ir = llvm_ir.replace(_MAX512, '@"emu.max.pd.512"') + _MAX512_AS_HALVES
            left = set(re.findall(r"llvm\.x86\.avx512[\w.]*", llvm_ir))
            assert not left, f"AVX-512 intrinsics this host cannot run: {left}"
            cpu, features = here.llvm_cpu or "", here.llvm_features
        return real(llvm_ir, cpu, features, **kw)

    monkeypatch.setattr(cj, "emit_cpu", emit_here)
    monkeypatch.setattr(host, "missing_features", lambda wanted: ())

    def run512(f, *args):
        before = len(ts.lane_log.entries)
        art = ts.compile(f, *args, arch="avx512")
        assert art.compiled.arch == "avx512" and "+avx512f" in art.compiled.features
        target = art.ir("target")
        assert "vector<8xf64>" in target and "vector<4xf64>" not in target
        out = art(*args)
        assert {e.lane for e in ts.lane_log.entries[before:]} == {"cpu-x86"}
        return out

    return run512


FAMILIES = ["elementwise", "broadcast", "astype", "unary", "reduction", "softmax", "norms", "unary_all",
            "reductions", "long_rows", "transpose", "cast_narrow", "matmul", "attention"]


@pytest.mark.parametrize("family", FAMILIES)
def test_avx512_schedule_runs_here(rng, avx512_here, family):
    """Every op family compiled for AVX-512 (8 x f64) and run on this host's vectors, against the
    same float64 oracles as the AVX2 tests."""
    _family_checks(rng, avx512_here)[family]()


def test_avx512_harness_runs_what_it_compiled(rng, avx512_here, monkeypatch):
    """Teeth for the harness: the rows it runs are the AVX-512 kernels (their 8-lane row maximum
    goes through the zmm vmaxpd it rewrites): with that rewrite planted as vminpd the softmax
    check fails, so the code under test is not some other build."""
    me = sys.modules[__name__]
    check = _family_checks(rng, avx512_here)["softmax"]
    check()
    monkeypatch.setattr(me, "_MAX512_AS_HALVES", me._MAX512_AS_HALVES.replace("max.pd.256", "min.pd.256"))
    with pytest.raises(AssertionError):
        check()


# --------------------------------------------------------------------------- narrow values in f64 kernels
NARROW_IN_KERNEL = {
    # a cast the kernel computes on after it (it used to pass the f64 value through unrounded)
    "f64->f32->f64": (lambda a, b: ts.ops.cast(ts.ops.cast(a, "f32"), "f64") * 1.0,
                      lambda a, b: a.astype(np.float32).astype(np.float64)),
    "f64->bf16->f64": (lambda a, b: ts.ops.cast(ts.ops.cast(a, "bf16"), "f64") + b,
                       lambda a, b: a.astype(BF16).astype(np.float64) + b),
    "f64->f16->f64": (lambda a, b: ts.ops.cast(ts.ops.cast(a, "f16"), "f64") - b,
                      lambda a, b: a.astype(np.float16).astype(np.float64) - b),
    # f32 ops (and an f32 constant) inside a kernel that has f64 registers: each result is f32's
    "f32 chain": (lambda a, b: ts.ops.cast(a, "f32") * 0.1 + 1e-9,
                  lambda a, b: a.astype(np.float32) * np.float32(0.1) + np.float32(1e-9)),
    "f32 adds": (lambda a, b: (ts.ops.cast(a, "f32") + ts.ops.cast(b, "f32")) + ts.ops.cast(b, "f32"),
                 lambda a, b: (a.astype(np.float32) + b.astype(np.float32)) + b.astype(np.float32)),
    "softmax of f32": (lambda a, b: ts.ops.cast(ts.ops.softmax(ts.ops.cast(ts.ops.cast(a, "f32"), "f64")), "f32"),
                       lambda a, b: _softmax64(a.astype(np.float32).astype(np.float64)).astype(np.float32)),
}


@pytest.mark.parametrize("name", sorted(NARROW_IN_KERNEL))
def test_narrow_values_inside_an_f64_kernel_round_like_numpy(rng, name):
    """A kernel that touches f64 computes in f64 registers; a narrower value it goes on computing
    with holds what numpy holds: a cast rounds to its type, and f32 ops round to f32."""
    f, ref = NARROW_IN_KERNEL[name]
    a, b = rnd(rng, 7, 45, scale=3.0), rnd(rng, 45)
    got, want = run(f, a, b), ref(a, b)
    assert got.dtype == want.dtype
    if name.startswith("softmax"):
        O.assert_close(got, want, 1e-7, name)   # the f32 input is exact; softmax then runs in f64
        assert not np.array_equal(got, _softmax64(a).astype(np.float32)), "the f32 rounding of the input was lost"
    else:
        np.testing.assert_array_equal(got, want)


def test_narrow_rounding_plant_fails(rng, monkeypatch):
    """Teeth: without the in-register rounding (round_fn planted to None) the checks above fail."""
    from tessera.passes.tile.kernels import rows
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(rows, "round_fn", lambda elem, reg: None)
    a, b = rnd(rng, 7, 45, scale=3.0), rnd(rng, 45)
    for name in ("f64->f32->f64", "f64->bf16->f64", "f32 chain", "f32 adds"):
        f, ref = NARROW_IN_KERNEL[name]
        assert not np.array_equal(run(f, a, b), ref(a, b)), name


# --------------------------------------------------------------------------- the selector
@pytest.mark.parametrize("arch, rec", [("avx2", "x86.avx2.fma.f64"), ("haswell", "x86.avx2.fma.f64"),
                                       ("avx512", "x86.avx512.fma.f64"), ("sapphirerapids", "x86.avx512.fma.f64")])
def test_selector_takes_the_f64_fma_record(arch, rec):
    """f64 inputs select the f64 FMA record of the widest vectors the chip has: f64 products and
    f64 sums (never an f32 or bf16 record), and nothing accumulates f64 into a narrower type."""
    from tessera.errors import MmaSelectorError
    from tessera.mma.selector import get_isa, select_mma
    isa = get_isa("x86", arch)
    sel = select_mma(isa, "f64")
    assert sel.record.id == rec and sel.acc_dtype == "f64"
    assert (sel.record.a_dtype, sel.record.b_dtype, sel.record.widen) == ("f64", "f64", None)
    with pytest.raises(MmaSelectorError):
        select_mma(isa, "f64", out_dtype="f32")


def test_gpu_lanes_refuse_f64_matmul_with_a_code():
    """No GPU record takes f64: compiling an f64 matmul for them is refused with MMA_SELECTOR."""
    from tessera.errors import MmaSelectorError
    a = np.ones((16, 16))
    for target, arch in [("nvidia", "sm_90"), ("rocm", "gfx942")]:
        with pytest.raises(MmaSelectorError) as e:
            ts.compile(lambda x, w: x @ w, a, a, target=target, arch=arch)
        assert "f64" in str(e.value)
