"""f32 GEMM and attention on the NVIDIA lane: the tf32 ``mma.sync`` records (m16n8k8, m16n8k4),
PTX assembled by ptxas, numerics proven by the warp emulator against float64 — with teeth.

Tolerance.  tf32 keeps 10 explicit mantissa bits: ``cvt.rna.tf32.f32`` rounds each input to
nearest with a relative error of at most u = 2^-11.  A product of two rounded inputs is then off by
at most (2u + u^2)|a||b|; the instruction sums its k products exactly enough (f32 accumulate, one
rounding per instruction: at most K/k roundings of 2^-24 each on the running sum).  So, element by
element, |C - A@B| <= (2u + u^2 + (K/k + 1) 2^-24) (|A| @ |B|) — K-aware, never a flat epsilon.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from tessera.emulate.layouts import tf32_rna
from tessera.toolchain import find_ptxas

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
U = 2.0 ** -11        # tf32 unit roundoff (round to nearest, 10-bit mantissa)
F32 = 2.0 ** -24
# (M, N, K): edges in every dimension, K not a multiple of 8 (masked k tail), K = 1
SHAPES = [(70, 72, 48), (33, 29, 37), (17, 9, 1)]


def tf32_bound(a, b, k_step: int = 8) -> np.ndarray:
    K = a.shape[-1]
    return (2 * U + U * U + (K / k_step + 1) * F32) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))


def gemm_c0(a, b, c0):
    return a @ b + c0


def _inputs(rng, m, n, k):
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32),
            (rng.standard_normal((m, n)) * 4).astype(np.float32))


def _compile(fn, args, arch="sm_80", **schedule):
    return ts.compile(fn, *args, target="nvidia", arch=arch, schedule={"math_mode": "tf32", **schedule})


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tf32_gemm_assembles_and_selects_the_tf32_record(arch, rng):
    a, b, c0 = _inputs(rng, 70, 72, 48)
    art = _compile(gemm_c0, (a, b, c0), arch)
    k = art.report().kernels[0]
    assert art.report().lane == f"nvidia-{arch}"
    assert k["mma"]["record"] == "nvidia.mma_sync.m16n8k8.tf32"
    ptx = art.ptx()
    assert set(re.findall(r"mma\.sync\.aligned\.\S+", ptx)) == {"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"}
    # every A and B register is rounded (4 + 2 per instruction), never passed as raw f32 bits
    assert ptx.count("cvt.rna.tf32.f32") >= 6
    assert art.binary()[:4] == b"\x7fELF"                      # ptxas assembled it
    assert 0 < k["registers"] <= 255


def test_emulated_tf32_gemm_within_the_k_aware_bound(rng):
    art = None
    for m, n, k in SHAPES:
        a, b, c0 = _inputs(rng, m, n, k)
        art = art or _compile(gemm_c0, (a, b, c0))
        got = art.emulate(a, b, c0).astype(np.float64)
        want = a.astype(np.float64) @ b.astype(np.float64) + c0
        err = np.abs(got - want)
        assert (err <= tf32_bound(a, b) + 4 * F32 * np.abs(want)).all(), (m, n, k, float(err.max()))
        # and tf32 is really what ran: the model that rounds the inputs to tf32 and adds one 8-wide
        # slice per instruction agrees to an ulp; plain f32 inputs do not (the products differ)
        ar, br = tf32_rna(a).astype(np.float64), tf32_rna(b).astype(np.float64)
        acc = c0.copy()
        for k0 in range(0, k, 8):
            acc = (acc.astype(np.float64) + ar[:, k0:k0 + 8] @ br[k0:k0 + 8]).astype(np.float32)
        ulps = np.abs(got.astype(np.float32).view(np.int32).astype(np.int64) - acc.view(np.int32).astype(np.int64))
        assert ulps.max() <= 1, (m, n, k, ulps.max())


def test_tf32_rounding_is_round_to_nearest_ties_away():
    x = np.array([1.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -12, -(1.0 + 2 ** -11), 1.0 + 2 ** -12, np.inf, -np.inf],
                 np.float32)
    got = tf32_rna(x)
    np.testing.assert_array_equal(got, np.array([1.0, 1.0 + 2 ** -10, 1.0 + 2 ** -10, -(1.0 + 2 ** -10), 1.0,
                                                 np.inf, -np.inf], np.float32))
    assert np.isnan(tf32_rna(np.array([np.nan], np.float32)))[0]
    r = np.random.default_rng(7).standard_normal(10_000).astype(np.float32)
    rel = np.abs(tf32_rna(r).astype(np.float64) - r) / np.abs(r)
    assert rel.max() <= U and (tf32_rna(r).view(np.uint32) & 0x1FFF).max() == 0


def test_emulated_tf32_gemm_with_epilogue_and_k4_record(rng):
    a, b, _ = _inputs(rng, 37, 29, 23)
    bias = rng.standard_normal(29).astype(np.float32)
    art = _compile(lambda a, b, c: ts.ops.relu(a @ b + c), (a, b, bias), mma_shape=(16, 8, 4))
    assert art.report().kernels[0]["mma"]["record"] == "nvidia.mma_sync.m16n8k4.tf32"
    assert "mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32" in art.ptx()
    got = art.emulate(a, b, bias).astype(np.float64)
    x = a.astype(np.float64) @ b.astype(np.float64) + bias
    assert (np.abs(got - np.maximum(x, 0)) <= tf32_bound(a, b, 4) + 4 * F32 * np.abs(x)).all()


def test_emulated_tf32_attention_matches_float64(rng):
    """Attention in f32: Q K^T and P V on tf32; P (<= 1) is rounded to tf32 before P V, so the output
    carries a relative error of a few u on top of the scores' (|s| <~ 6 here: exp amplifies by |ds|)."""
    from test_gpu_attention import oracle
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 37, 32), (1, 2, 53, 32), (1, 2, 53, 32)))
    art = ts.compile(lambda q, k, v: ts.ops.attention(q, k, v, causal=True), q, k, v, target="nvidia", arch="sm_80",
                     schedule={"math_mode": "tf32"})
    assert art.report().kernels[0]["mma"]["record"] == "nvidia.mma_sync.m16n8k8.tf32"
    got = art.emulate(q, k, v).astype(np.float64)
    want = oracle(q, k, v, causal=True)
    # scores: |ds| <= 2u sum|q||k| / sqrt(d) ~ 2u * 32 * 0.8 / 5.7 ~ 5e-3 at worst; P V adds ~2u
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-2
    assert np.abs(got - want).max() / np.abs(want).max() > 0       # not bit-equal to float64: tf32 ran


# --------------------------------------------------------------------------- teeth
def test_teeth_a_tf32_a_fragment_lane_swap_fails(rng, monkeypatch):
    """Plant: the tf32 A map lists a1 and a2 swapped (rows g+8 and columns t+4 exchanged): the k
    columns 0-3 / 4-7 of rows g+8 go to the wrong products.  The K-aware bound catches it."""
    from tessera.passes.target.gpu.simt import OperandMap
    from tessera.passes.target.nvidia import lower_tile_to_nvidia as NVL
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = NVL.MmaSyncMap.build

    def swapped(self, b_, lane):
        orig(self, b_, lane)
        if self.ptx_type == "f32":
            items = list(self.a.items)
            items[1], items[2] = items[2], items[1]
            self.a = OperandMap(items, self.a.parts)
    monkeypatch.setattr(NVL.MmaSyncMap, "build", swapped)
    a, b, c0 = _inputs(rng, 33, 29, 37)
    got = _compile(gemm_c0, (a, b, c0)).emulate(a, b, c0).astype(np.float64)
    want = a.astype(np.float64) @ b.astype(np.float64) + c0
    assert (np.abs(got - want) > tf32_bound(a, b) + 4 * F32 * np.abs(want)).any()


def test_teeth_f32_bits_passed_without_rounding_are_caught(rng, monkeypatch):
    """Plant: the codegen hands the raw f32 bits to the tf32 instruction (the hardware would truncate
    them): the PTX check above fails on the missing cvt.rna.tf32.f32."""
    from tessera.codegen import nvptx
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = nvptx.record_for

    def no_mode(op, arch):
        import dataclasses
        return dataclasses.replace(orig(op, arch), math_mode=None)
    monkeypatch.setattr(nvptx, "record_for", no_mode)
    a, b, c0 = _inputs(rng, 70, 72, 48)
    assert "cvt.rna.tf32.f32" not in _compile(gemm_c0, (a, b, c0)).ptx()


def test_f32_stays_refused_where_no_tf32_exists(rng):
    from tessera.errors import MmaSelectorError
    x = rng.standard_normal((32, 32)).astype(np.float32)
    with pytest.raises(MmaSelectorError, match="sm_75.*f32"):
        ts.compile(lambda a, b: a @ b, x, x, target="nvidia", arch="sm_75")
