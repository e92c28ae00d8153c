"""SwiGLU as one pass: two matmuls of one A whose products meet in one elementwise epilogue run as
one dual-B GEMM kernel (passes/graph/fuse_dual_gemm.py, passes/tile/kernels/gemm_dual.py),
checked against float64 numpy on fresh random data."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import oracle as O
import tessera as ts

BF16 = ml_dtypes.bfloat16
TOL = {np.float32: 1e-5, BF16: 1e-2, np.float16: 5e-3, np.float64: 1e-12}

# one jitted function serves every dtype and shape below: its recompiles are expected
pytestmark = pytest.mark.filterwarnings("ignore::tessera.errors.RecompileWarning")

SWIGLU = ts.jit(lambda x, w1, w3: ts.ops.silu(x @ w1) * (x @ w3))
GEGLU = ts.jit(lambda x, w1, w3: ts.ops.gelu(x @ w1, "erf") * (x @ w3))
GATE = ts.jit(lambda x, w1, w3, b1, b3: (x @ w1 + b1) * ts.ops.sigmoid(x @ w3 + b3))
SWIGLU_T = ts.jit(lambda x, w1, w3: ts.ops.silu(x @ w1.T) * (x @ w3.T))
SWIGLU_AT = ts.jit(lambda x, w1, w3: ts.ops.silu(x.T @ w1) * (x.T @ w3))   # two transposes: one view of x


def _also_returned(x, w1, w3):
    a = x @ w1
    return ts.ops.silu(a) * (x @ w3), a


ALSO_RETURNED = ts.jit(_also_returned)
TWO_AS = ts.jit(lambda x, y, w1, w3: ts.ops.silu(x @ w1) * (y @ w3))


def rnd(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def swiglu64(x, w1, w3):
    x, w1, w3 = O.f64(x), O.f64(w1), O.f64(w3)
    return O.silu(x @ w1) * (x @ w3)


def gemm_kernels(fn, *args):
    return [k for k in ts.explain(fn, *args).kernels if k["kind"] == "gemm"]


def assert_dual(fn, *args):
    ks = ts.explain(fn, *args).kernels
    assert len(ks) == 1 and ks[0]["ops"].count("tessera.matmul") == 2, ks


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.float64], ids=["f32", "bf16", "f16", "f64"])
@pytest.mark.parametrize("mkn", [(37, 129, 95), (1, 3, 5), (64, 1100, 41)], ids=["odd", "tiny", "two-k-blocks"])
def test_swiglu_matches_float64(rng, dtype, mkn):
    m, k, n = mkn
    x, w1, w3 = rnd(rng, m, k, dtype=dtype), rnd(rng, k, n, dtype=dtype), rnd(rng, k, n, dtype=dtype)
    O.assert_close(SWIGLU(x, w1, w3), swiglu64(x, w1, w3), TOL[dtype], f"swiglu {dtype.__name__} {mkn}")


def test_swiglu_large(rng):
    """The Llama-small MLP shape (256 x 512 @ 512 x 1408): several n-blocks and row chunks."""
    x, w1, w3 = rnd(rng, 256, 512), rnd(rng, 512, 1408), rnd(rng, 512, 1408)
    O.assert_close(SWIGLU(x, w1, w3), swiglu64(x, w1, w3), 1e-5, "swiglu large")


def test_swiglu_batched_a_and_transposed_operands(rng):
    # rank 3: the b*m split (private panels); 3 x 61 x 95 x 129 is enough work for two threads, whose
    # ranges of row tiles meet inside the second batch entry
    x, w1, w3 = rnd(rng, 3, 61, 129), rnd(rng, 129, 95), rnd(rng, 129, 95)
    O.assert_close(SWIGLU(x, w1, w3), swiglu64(x, w1, w3), 1e-5, "batched A")
    assert_dual(SWIGLU, x, w1, w3)
    x2, v1, v3 = rnd(rng, 29, 70), rnd(rng, 33, 70), rnd(rng, 33, 70)
    O.assert_close(SWIGLU_T(x2, v1, v3), swiglu64(x2, v1.T, v3.T), 1e-5, "transposed B")
    assert_dual(SWIGLU_T, x2, v1, v3)
    x3, u1, u3 = rnd(rng, 70, 29), rnd(rng, 70, 45), rnd(rng, 70, 45)
    O.assert_close(SWIGLU_AT(x3, u1, u3), swiglu64(x3.T, u1, u3), 1e-5, "transposed A")
    assert_dual(SWIGLU_AT, x3, u1, u3)


def test_geglu_and_a_biased_sigmoid_gate(rng):
    x, w1, w3 = rnd(rng, 37, 129), rnd(rng, 129, 95), rnd(rng, 129, 95)
    want = O.gelu_erf(O.f64(x) @ O.f64(w1)) * (O.f64(x) @ O.f64(w3))
    O.assert_close(GEGLU(x, w1, w3), want, 1e-5, "geglu")
    assert_dual(GEGLU, x, w1, w3)
    b1, b3 = rnd(rng, 95), rnd(rng, 95)
    p, q = O.f64(x) @ O.f64(w1) + b1, O.f64(x) @ O.f64(w3) + b3
    O.assert_close(GATE(x, w1, w3, b1, b3), p / (1 + np.exp(-q)), 1e-5, "biased sigmoid gate")
    assert_dual(GATE, x, w1, w3, b1, b3)


RELU_GLU = ts.jit(lambda x, w1, w3: ts.ops.relu(x @ w1) * (x @ w3))


@pytest.mark.parametrize("mkn", [(37, 129, 95), (64, 1100, 41)], ids=["odd", "two-k-blocks"])
def test_a_light_epilogue_on_whole_tiles(rng, mkn):
    """ReGLU: an epilogue without polynomial functions runs on the whole register tile (not row by
    row), here also after partial sums past one k-block."""
    m, k, n = mkn
    x, w1, w3 = rnd(rng, m, k), rnd(rng, k, n), rnd(rng, k, n)
    p, q = O.f64(x) @ O.f64(w1), O.f64(x) @ O.f64(w3)
    O.assert_close(RELU_GLU(x, w1, w3), np.maximum(p, 0) * q, 1e-5, f"reglu {mkn}")
    assert_dual(RELU_GLU, x, w1, w3)


def test_one_kernel_and_no_product_written(rng):
    """One gemm kernel holds both matmuls; its launch returns the gated result and the partial-sum
    scratch used only past one k-block ([M, 2N], f32), never a product of shape [M, N]."""
    x, w1, w3 = rnd(rng, 37, 129), rnd(rng, 129, 95), rnd(rng, 129, 95)
    assert_dual(SWIGLU, x, w1, w3)
    tile = ts.compile(lambda a, b, c: ts.ops.silu(a @ b) * (a @ c), x, w1, w3).ir("tile")
    launches = [ln for ln in tile.splitlines() if "tile.launch" in ln]
    assert len(launches) == 1, launches
    results = launches[0].split("->")[-1]
    assert results.count("!tessera.tensor") == 2 and "2*" in results, results


def test_gathered_rows_as_the_shared_a(rng):
    """Embedding rows feeding both matmuls: the gather runs once, the pair is one dual gemm."""
    table, w1, w3 = rnd(rng, 50, 64), rnd(rng, 64, 40), rnd(rng, 64, 40)
    idx = rng.integers(0, 50, size=(30,)).astype(np.int32)
    f = ts.jit(lambda e, i, a, b: (lambda x: ts.ops.silu(x @ a) * (x @ b))(ts.ops.take(e, i, axis=0)))
    O.assert_close(f(table, idx, w1, w3), swiglu64(table[idx], w1, w3), 1e-5, "gathered A")
    assert [k["ops"].count("tessera.matmul") for k in ts.explain(f, table, idx, w1, w3).kernels] == [0, 2]


def test_a_product_also_returned_is_not_fused(rng):
    x, w1, w3 = rnd(rng, 37, 129), rnd(rng, 129, 95), rnd(rng, 129, 95)
    y, a = ALSO_RETURNED(x, w1, w3)
    O.assert_close(y, swiglu64(x, w1, w3), 1e-5, "gated")
    O.assert_close(a, O.f64(x) @ O.f64(w1), 1e-5, "returned product")
    assert len(gemm_kernels(ALSO_RETURNED, x, w1, w3)) == 2


def test_different_a_is_not_fused(rng):
    x, y, w1, w3 = rnd(rng, 20, 33), rnd(rng, 20, 33), rnd(rng, 33, 17), rnd(rng, 33, 17)
    want = O.silu(O.f64(x) @ O.f64(w1)) * (O.f64(y) @ O.f64(w3))
    O.assert_close(TWO_AS(x, y, w1, w3), want, 1e-5, "two As")
    assert len(gemm_kernels(TWO_AS, x, y, w1, w3)) == 2


@pytest.mark.parametrize("act", ["silu", "relu"])
def test_teeth_swapped_products_fail_the_oracle(rng, monkeypatch, act):
    """The check has teeth: a kernel whose epilogue takes A @ B3 for A @ B1 (and back) misses the
    float64 oracle (silu: the row-by-row epilogue; relu: the whole-tile one)."""
    from tessera.passes.tile.kernels import gemm_dual
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = gemm_dual.epilogue
    monkeypatch.setattr(gemm_dual, "epilogue",
                        lambda bf, kf, kop, plan, v1, v3, *rest: orig(bf, kf, kop, plan, v3, v1, *rest))
    x, w1, w3 = rnd(rng, 37, 129), rnd(rng, 129, 95), rnd(rng, 129, 95)
    fn = getattr(ts.ops, act)
    got = ts.jit(lambda a, b, c: fn(a @ b) * (a @ c))(x, w1, w3)
    p, q = O.f64(x) @ O.f64(w1), O.f64(x) @ O.f64(w3)
    want = O.silu(p) * q if act == "silu" else np.maximum(p, 0) * q
    assert not O.gate(got, want, 1e-2)


def test_teeth_one_panel_read_twice_fails_the_oracle(rng, monkeypatch):
    """A kernel that reads B1's packed panel for both products misses the oracle (the second
    panel's offset is what pairs columns of A @ B3 with those of A @ B1)."""
    from tessera.passes.tile.kernels import gemm_dual
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = gemm_dual.generate

    def one_panel(kop, plan, cfg):
        plan.b3 = plan.b1
        return orig(kop, plan, cfg)
    monkeypatch.setattr(gemm_dual, "generate", one_panel)
    x, w1, w3 = rnd(rng, 37, 129), rnd(rng, 129, 95), rnd(rng, 129, 95)
    got = ts.jit(lambda a, b, c: ts.ops.silu(a @ b) * (a @ c))(x, w1, w3)
    assert not O.gate(got, swiglu64(x, w1, w3), 1e-2)


@pytest.mark.parametrize("mkn", [(37, 129, 95), (20, 1100, 41)], ids=["odd", "two-k-blocks"])
def test_two_panel_form_matches_float64(rng, monkeypatch, mkn):
    """The form that records with k groups (AVX-512 BF16, AMX) take -- B1 and B3 packed apart, two
    tile.mma per k step on one A fragment -- run here on f32 by switching the interleave off."""
    from tessera.passes.tile.kernels import gemm_dual
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gemm_dual, "INTERLEAVE", False)
    m, k, n = mkn
    x, w1, w3 = rnd(rng, m, k), rnd(rng, k, n), rnd(rng, k, n)
    got = ts.jit(lambda a, b, c: ts.ops.silu(a @ b) * (a @ c))(x, w1, w3)
    O.assert_close(got, swiglu64(x, w1, w3), 1e-5, f"two-panel {mkn}")


@pytest.mark.parametrize("arch,record", [("avx512_bf16", "dpbf16ps"),
                                         pytest.param("sapphirerapids", "amx", marks=pytest.mark.slow)])
def test_bf16_records_with_k_groups_compile(rng, arch, record):
    """A bf16 dual gemm for a chip with a bf16 dot product or AMX compiles to machine code
    (this host cannot run it: the two-panel form's numerics are checked above on f32)."""
    x, w1, w3 = (rnd(rng, *s, dtype=BF16) for s in ((37, 129), (129, 95), (129, 95)))
    art = ts.compile(lambda a, b, c: ts.ops.silu(a @ b) * (a @ c), x, w1, w3, arch=arch)
    ks = art.report().kernels
    assert len(ks) == 1 and ks[0]["ops"].count("tessera.matmul") == 2 and record in ks[0]["mma"]["record"], ks
    assert {"dpbf16ps": "vdpbf16ps", "amx": "tdpbf16ps"}[record] in art.asm()


@pytest.mark.slow
def test_gpu_lane_keeps_two_gemm_kernels(rng):
    """fuse-dual-gemm is in the CPU pipeline only: the NVIDIA lane runs the pair as two gemm
    kernels (its generator takes one matmul per kernel)."""
    x, w1, w3 = (rnd(rng, 64, 64, dtype=np.float16) for _ in range(3))
    art = ts.compile(lambda a, b, c: ts.ops.silu(a @ b) * (a @ c), x, w1, w3, target="nvidia", arch="sm_90")
    assert [k["ops"].count("tessera.matmul") for k in art.report().kernels] == [1, 1]
