"""The CPU lane against float64 numpy oracles, op by op and fused, on fresh random data."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import oracle as O
import tessera as ts

TOL32 = 1e-5
TOL16 = 1e-2
BF16 = ml_dtypes.bfloat16


def rnd(rng, *shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# --------------------------------------------------------------------------- elementwise
UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "exp": (ts.ops.exp, np.exp),
    "tanh": (ts.ops.tanh, np.tanh),
    "relu": (ts.ops.relu, lambda x: np.maximum(x, 0)),
    "silu": (ts.ops.silu, O.silu),
    "gelu_tanh": (lambda x: ts.ops.gelu(x, "tanh"), O.gelu_tanh),
    "gelu_erf": (lambda x: ts.ops.gelu(x, "erf"), O.gelu_erf),
    "sqrt": (lambda x: ts.ops.sqrt(x * x + 1.0), lambda x: np.sqrt(x * x + 1)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("shape", [(1,), (7, 13), (3, 31, 127), (1025,)])
def test_unary(rng, name, shape):
    f, ref = UNARY[name]
    x = rnd(rng, *shape, scale=3.0)
    O.assert_close(ts.jit(f)(x), ref(O.f64(x)), TOL32, name)


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("sa, sb", [((7, 13), (7, 13)), ((7, 13), (13,)), ((7, 1), (1, 13)), ((2, 3, 5), (3, 1)),
                                     ((31,), ()), ((4, 1, 6), (1, 5, 1))])
def test_binary_broadcasting(rng, name, sa, sb):
    a, b = rnd(rng, *sa), rnd(rng, *sb)
    if name == "div":
        b = (np.abs(b) + 0.5).astype(np.float32)
    f = ts.jit(lambda x, y: getattr(ts.ops, name)(x, y))
    O.assert_close(f(a, b), BINARY[name](O.f64(a), O.f64(b)), TOL32, name)


def test_python_operators_and_scalars(rng):
    x, y = rnd(rng, 9, 10), rnd(rng, 10)
    f = ts.jit(lambda a, b: (2.0 - a) * b / 4.0 + (-a) - 1.5)
    O.assert_close(f(x, y), (2 - O.f64(x)) * y / 4 + (-O.f64(x)) - 1.5, TOL32)


def test_elementwise_chain_is_one_kernel(rng):
    f = ts.jit(lambda a, b: ts.ops.tanh(a * b + 1.0) * ts.ops.exp(-a))
    x, y = rnd(rng, 33, 70), rnd(rng, 70)
    O.assert_close(f(x, y), np.tanh(O.f64(x) * y + 1) * np.exp(-O.f64(x)), TOL32)
    rep = ts.explain(f, x, y)
    assert [k["kind"] for k in rep.kernels] == ["elementwise"]
    assert rep.kernels[0]["ops"].count("tessera.exp") == 1 and "tessera.tanh" in rep.kernels[0]["ops"]


# --------------------------------------------------------------------------- row-wise
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (13, 1000), (3, 5, 1025), (2, 4096)])
def test_softmax(rng, shape):
    x = rnd(rng, *shape, scale=4.0)
    O.assert_close(ts.jit(ts.ops.softmax)(x), O.softmax(x), TOL32)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 37), (61, 300), (2, 16384), (3, 16385)])
def test_softmax_pipeline_over_rows(rng, shape, threads):
    """Softmax writes row r - 1 in row r's exp loop (two scratch slots, by row parity); every run
    of rows a thread claims starts and ends the pipeline.  Rows longer than a slot (16385) take
    three passes.  A prologue and a row-varying epilogue operand ride along."""
    s_, m, y = rnd(rng, *shape, scale=4.0), rnd(rng, shape[-1]), rnd(rng, *shape)
    f = ts.jit(lambda a, b, c: ts.ops.softmax(a * 0.5 + b) * c, schedule={"threads": threads})
    O.assert_close(f(s_, m, y), O.softmax(O.f64(s_) * 0.5 + m) * y, TOL32)


def test_softmax_large_logits_do_not_overflow(rng):
    x = rnd(rng, 8, 300, scale=1.0) * 1e4
    y = ts.jit(ts.ops.softmax)(x)
    assert np.isfinite(y).all()
    O.assert_close(y, O.softmax(x), TOL32)


def test_softmax_other_axis(rng):
    x = rnd(rng, 12, 7, 5)
    O.assert_close(ts.jit(lambda a: ts.ops.softmax(a, axis=1))(x), O.softmax(x, axis=1), TOL32)


@pytest.mark.parametrize("shape", [(7, 13), (3, 31, 127), (5, 1023)])
def test_layer_norm(rng, shape):
    x, g, b = rnd(rng, *shape, scale=2.0) + 3.0, rnd(rng, shape[-1]), rnd(rng, shape[-1])
    O.assert_close(ts.jit(lambda a, s, t: ts.ops.layer_norm(a, s, t))(x, g, b), O.layer_norm(x, g, b), TOL32)
    O.assert_close(ts.jit(ts.ops.layer_norm)(x), O.layer_norm(x), TOL32)


@pytest.mark.parametrize("shape", [(7, 13), (3, 31, 127), (5, 1025)])
def test_rms_norm(rng, shape):
    x, g = rnd(rng, *shape), rnd(rng, shape[-1])
    O.assert_close(ts.jit(lambda a, s: ts.ops.rms_norm(a, s))(x, g), O.rms_norm(x, g), TOL32)


def test_rowwise_with_prologue_and_epilogue_is_one_kernel(rng):
    def f(s, mask):
        return ts.ops.softmax(s * 0.125 + mask) * 2.0

    s_, m = rnd(rng, 4, 37, 37), rnd(rng, 37, 37)
    jf = ts.jit(f)
    O.assert_close(jf(s_, m), O.softmax(O.f64(s_) * 0.125 + m) * 2, TOL32)
    rep = ts.explain(jf, s_, m)
    assert [k["kind"] for k in rep.kernels] == ["rowwise"]


# --------------------------------------------------------------------------- reductions, layout
@pytest.mark.parametrize("op, ref", [("reduce_sum", np.sum), ("reduce_max", np.max), ("reduce_mean", np.mean)])
@pytest.mark.parametrize("shape, axis, keep", [((7, 13), -1, False), ((7, 13), 0, True), ((3, 5, 130), (1, 2), False),
                                                ((3, 5, 6), (0, 2), True), ((1025,), None, False),
                                                ((4, 3, 2, 9), 1, False)])
def test_reductions(rng, op, ref, shape, axis, keep):
    x = rnd(rng, *shape)
    y = ts.jit(lambda a: getattr(ts.ops, op)(a, axis, keep))(x)
    want = ref(O.f64(x), axis=axis, keepdims=keep)
    if op == "reduce_max":
        np.testing.assert_array_equal(y, want.astype(np.float32))
        return
    # a sum of signs that cancel can be near zero, where relative error means nothing: the
    # error is measured against the same reduction of |x| (summation's condition number)
    scale = ref(np.abs(O.f64(x)), axis=axis, keepdims=keep)
    err = np.max(np.abs(O.f64(y) - want) / scale)
    assert err < TOL32, f"{op}: error {err:.3e} of the sum of |x| >= {TOL32:.0e}"


@pytest.mark.parametrize("shape, perm", [((7, 13), None), ((3, 4, 5), (1, 0, 2)), ((3, 4, 5), (2, 0, 1)),
                                          ((2, 3, 4, 5), (0, 2, 1, 3))])
def test_transpose(rng, shape, perm):
    x = rnd(rng, *shape)
    np.testing.assert_array_equal(ts.jit(lambda a: ts.ops.transpose(a, perm))(x), np.transpose(x, perm))


@pytest.mark.parametrize("shape, new", [((6, 4), (24,)), ((6, 4), (4, 6)), ((2, 3, 4), (6, 4)), ((24,), (2, -1, 3))])
def test_reshape(rng, shape, new):
    x = rnd(rng, *shape)
    np.testing.assert_array_equal(ts.jit(lambda a: a.reshape(new) * 1.0)(x), x.reshape(new))


def test_cast_round_trip(rng):
    x = rnd(rng, 9, 17)
    y = ts.jit(lambda a: a.astype(ts.bfloat16))(x)
    assert y.dtype == ts.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), x.astype(BF16).astype(np.float32))


# --------------------------------------------------------------------------- matmul
SIZES = [1, 7, 13, 31, 127, 1000, 1023, 1025]


@pytest.mark.parametrize("which", ["M", "N", "K"])
def test_matmul_shape_sweep_every_dimension(rng, which):
    f = ts.jit(lambda a, b: a @ b)
    for s in SIZES:
        dims = {"M": 37, "N": 29, "K": 41}
        dims[which] = s
        a, b = rnd(rng, dims["M"], dims["K"]), rnd(rng, dims["K"], dims["N"])
        O.assert_close(f(a, b), O.f64(a) @ O.f64(b), TOL32, f"{which}={s}")


def test_shape_sweep_does_not_recompile(rng):
    f = ts.jit(lambda a, b, c: ts.ops.gelu(a @ b + c))
    seen = set()
    for m, k, n in [(7, 13, 31), (127, 1000, 1023), (1025, 31, 7), (13, 7, 1000), (300, 200, 100)]:
        a, b, c = rnd(rng, m, k), rnd(rng, k, n), rnd(rng, n)
        O.assert_close(f(a, b, c), O.gelu_tanh(O.f64(a) @ b + c), TOL32)
        seen.add(id(f.compile(a, b, c).compiled))
    assert len(seen) == 1, "one compiled kernel serves every size"


@pytest.mark.parametrize("sa, sb", [((3, 17, 23), (3, 23, 19)), ((3, 17, 23), (23, 19)), ((2, 1, 9, 8), (3, 8, 5)),
                                     ((5, 4), (2, 4, 6)), ((13,), (13, 7)), ((7, 13), (13,))])
def test_matmul_batched_and_broadcast(rng, sa, sb):
    a, b = rnd(rng, *sa), rnd(rng, *sb)
    O.assert_close(ts.jit(lambda x, y: x @ y)(a, b), O.f64(a) @ O.f64(b), TOL32)


def test_matmul_transposed_operands_fold_into_packing(rng):
    a, b = rnd(rng, 37, 50), rnd(rng, 29, 50)
    f = ts.jit(lambda x, y: x @ y.T)
    O.assert_close(f(a, b), O.f64(a) @ O.f64(b).T, TOL32)
    assert [k["kind"] for k in ts.explain(f, a, b).kernels] == ["gemm"]


@pytest.mark.parametrize("epi", ["bias_gelu", "residual", "bias_relu_scale", "col_bias", "silu_cast"])
def test_matmul_fused_epilogues(rng, epi):
    m, k, n = 67, 130, 53
    a, b, bias, res, col = rnd(rng, m, k), rnd(rng, k, n), rnd(rng, n), rnd(rng, m, n), rnd(rng, m, 1)
    A, B = O.f64(a), O.f64(b)
    fns = {
        "bias_gelu": (lambda x, w, v, r, c: ts.ops.gelu(x @ w + v), O.gelu_tanh(A @ B + bias)),
        "residual": (lambda x, w, v, r, c: x @ w + r, A @ B + res),
        "bias_relu_scale": (lambda x, w, v, r, c: ts.ops.relu(x @ w + v) * 0.5 + r, np.maximum(A @ B + bias, 0) * .5
                            + res),
        "col_bias": (lambda x, w, v, r, c: (x @ w) - c, A @ B - col),
        "silu_cast": (lambda x, w, v, r, c: ts.ops.silu(x @ w).astype(ts.bfloat16), O.silu(A @ B)),
    }
    f, ref = fns[epi]
    jf = ts.jit(f)
    y = jf(a, b, bias, res, col)
    O.assert_close(y, ref, TOL16 if epi == "silu_cast" else TOL32, epi)
    assert [k["kind"] for k in ts.explain(jf, a, b, bias, res, col).kernels] == ["gemm"], "the epilogue is fused"


def test_accumulate_into_c0_uses_the_real_accumulator(rng):
    a, b, c0 = rnd(rng, 50, 700), rnd(rng, 700, 40), rnd(rng, 50, 40) * 100
    jf = ts.jit(lambda x, w, c: x @ w + c)
    O.assert_close(jf(a, b, c0), O.f64(a) @ b + c0, TOL32)
    tile = jf.compile(a, b, c0).ir("tile")
    assert "tile.fragment_pack" in tile and "acc, row_major, fma>" in tile


@pytest.mark.parametrize("shape", [(64, 96, 80), (129, 1025, 65), (7, 2048, 31)])
def test_bf16_matmul(rng, shape):
    m, k, n = shape
    a, b = rnd(rng, m, k, dtype=BF16), rnd(rng, k, n, dtype=BF16)
    ref = O.f64(a) @ O.f64(b)
    y = ts.jit(lambda x, w: x @ w)(a, b)
    assert y.dtype == BF16
    O.assert_close(y, ref, TOL16)
    y32 = ts.jit(lambda x, w: ts.ops.matmul(x, w, out_dtype=np.float32))(a, b)
    assert y32.dtype == np.float32
    O.assert_close(y32, ref, 1e-5)  # products of bf16 are exact in f32; only the f32 sum rounds


def test_bf16_casts_are_ml_dtypes_bit_for_bit(rng):
    """f32 -> bf16 rounds to nearest even in integer arithmetic on every chip (LLVM's bfloat
    fptrunc is a libcall without AVX512-BF16, and vcvtneps2bf16 flushes subnormals): subnormals,
    ties, overflow to inf, signed zeros and NaN match ml_dtypes bit for bit, and so does the way
    back.  A rounding that truncates fails this."""
    x = rnd(rng, 7, 37)
    x[0] *= np.float32(1e-39)                                      # subnormal f32 -> subnormal bf16
    x[1, :8] = [np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -0.0, 0.0, 1e-45]
    x[2] = (np.arange(37, dtype=np.uint32) * 0x10000 + 0x3F808000).view(np.float32)   # exact ties
    y = ts.jit(lambda a: a.astype(ts.bfloat16))(x)
    np.testing.assert_array_equal(y.view(np.uint16), x.astype(BF16).view(np.uint16))
    back = ts.jit(lambda a: a.astype(np.float32))(y)
    np.testing.assert_array_equal(back.view(np.uint32), y.astype(np.float32).view(np.uint32))
    truncated = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert not np.array_equal(y.view(np.uint16), truncated)


def test_bf16_matmul_on_widened_f32_fma(rng):
    """bf16 runs on every x86 chip: the fma.bf16 record widens both panels to f32 while packing
    (exact) and runs the f32 FMA kernel; pinned here by its shape, the default where the chip has
    no bf16 instruction (AVX2, AVX-512 without BF16)."""
    from tessera.mma.x86 import host_cpu
    w = 16 if "avx512f" in host_cpu()[1] else 8
    a, b = rnd(rng, 77, 129, dtype=BF16), rnd(rng, 129, 45, dtype=BF16)
    f = lambda x, y: ts.ops.matmul(x, y, out_dtype=np.float32)  # noqa: E731
    jf = ts.jit(f, schedule={"mma_shape": (1, w, 1)})
    O.assert_close(jf(a, b), O.f64(a) @ O.f64(b), 1e-5)
    rep = ts.explain(jf, a, b)
    assert rep.kernels[0]["mma"]["record"] == f"x86.{'avx512' if w == 16 else 'avx2'}.fma.bf16"
    tile = ts.compile(f, a, b, schedule={"mma_shape": (1, w, 1)}).ir("tile")
    assert f"f32, f32, a, col_major, fma>" in tile and "bf16, f32, a," not in tile


@pytest.mark.parametrize("shape", [(37, 129, 71), (64, 1025, 33)])
def test_f16_matmul_widens_to_f32_fma(rng, shape, monkeypatch):
    """f16 GEMMs run on the CPU lane: the fma.f16 record widens both panels exactly to f32 while
    packing (vcvtph2ps), sums in f32 and rounds the f16 result once, epilogue included.  Teeth: a
    widening that drops the low mantissa bits (as a bf16-style shift would) fails the check."""
    m, k, n = shape
    a, b = rnd(rng, m, k, dtype=np.float16), rnd(rng, k, n, dtype=np.float16)
    c = rnd(rng, n, dtype=np.float16)
    f = lambda x, w, v: ts.ops.relu(x @ w + v)  # noqa: E731
    ref = np.maximum(O.f64(a) @ O.f64(b) + O.f64(c), 0)
    y = ts.jit(f)(a, b, c)
    assert y.dtype == np.float16
    O.assert_close(y, ref, 2e-3)   # one f16 rounding of an f32-accumulated sum
    rep = ts.explain(ts.jit(f), a, b, c)
    assert rep.kernels[0]["mma"]["record"].endswith(".fma.f16") and len(rep.kernels) == 1
    from llvmlite import ir as llir
    from tessera.codegen import x86 as cg
    real = cg._Fn._extf

    def lossy(self, v, dst):   # planted: f16 lanes scaled by 1 + 2^-6 as they widen
        if str(getattr(v.type, "element", v.type)) == "half":
            vec = isinstance(v.type, llir.VectorType)
            k = 1.0 + 2.0 ** -6
            v = self.b.fmul(v, llir.Constant(v.type, [k] * v.type.count) if vec else llir.Constant(v.type, k))
        return real(self, v, dst)
    monkeypatch.setattr(cg._Fn, "_extf", lossy)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(f)(a, b, c), ref, 2e-3)


def test_bf16_matmul_uses_the_fastest_bf16_instruction(rng):
    from tessera.mma.x86 import host_cpu
    feats = host_cpu()[1]
    if "avx512bf16" not in feats:
        pytest.skip("host has no AVX512-BF16")
    a, b = rnd(rng, 32, 64, dtype=BF16), rnd(rng, 64, 32, dtype=BF16)
    art = ts.compile(lambda x, w: x @ w, a, b)
    if {"amx-tile", "amx-bf16"} <= feats:   # AMX's tile product outruns the vector dot product
        assert "tessera_x86.tdp" in art.ir("target") and "tdpbf16ps" in art.asm()
    else:
        assert "tessera_x86.vdpbf16ps" in art.ir("target") and "vdpbf16ps" in art.asm()
    # the vector dot product stays reachable by pinning its shape, and it runs correctly
    f = lambda x, w: ts.ops.matmul(x, w, out_dtype=np.float32)  # noqa: E731
    pinned = ts.compile(f, a, b, schedule={"mma_shape": (1, 16, 2)})
    assert "tessera_x86.vdpbf16ps" in pinned.ir("target") and "vdpbf16ps" in pinned.asm()
    O.assert_close(ts.jit(f, schedule={"mma_shape": (1, 16, 2)})(a, b), O.f64(a) @ O.f64(b), 1e-5)


# --------------------------------------------------------------------------- multiple outputs, identity
def test_multiple_outputs(rng):
    x = rnd(rng, 9, 33)
    f = ts.jit(lambda a: (ts.ops.softmax(a), ts.ops.reduce_max(a, -1), a * 2.0))
    s_, m, d = f(x)
    O.assert_close(s_, O.softmax(x), TOL32)
    O.assert_close(m, O.f64(x).max(-1), TOL32)
    O.assert_close(d, O.f64(x) * 2, TOL32)
