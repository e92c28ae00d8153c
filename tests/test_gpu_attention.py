"""Flash attention on the GPU lanes: ``tessera.attention`` -> schedule-gpu -> the per-wave flash
Tile IR (kernels/gpu_attention.py) -> mma.sync / WMMA / MFMA, numerics proven by the SIMT
emulator against float64 — with teeth (the rescale step dropped fails)."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.errors import MmaSelectorError, ScheduleIllegalError, SpecializeRequest
from tessera.toolchain import find_llvm_tool, find_ptxas

DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
TOL = {"f16": 5e-3, "bf16": 2e-2}    # P is rounded to the input dtype before P @ V
LANES = [("nvidia", "sm_90"), ("nvidia", "sm_80"), ("rocm", "gfx942"), ("rocm", "gfx1151"), ("rocm", "gfx1201")]


def _skip_without_tools(target):
    if target == "nvidia" and find_ptxas() is None:
        pytest.skip("ptxas not installed")
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")


def oracle(q, k, v, causal=False, mask=None, scale=None, zero_rows=True):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    if causal:   # top-left alignment (torch's is_causal): key j is visible to query i when j <= i
        i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
        s = np.where(j <= i, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l_ = p.sum(-1, keepdims=True)
    with np.errstate(all="ignore"):
        out = (p @ v) / l_
    return np.where(l_ == 0, 0.0, out) if zero_rows else out


def qkv(rng, dtype, b, h, hkv, sq, sk, d, dv=None, mag=1.0):
    dt = DT[dtype]
    return ((rng.standard_normal((b, h, sq, d)) * mag).astype(dt), rng.standard_normal((b, hkv, sk, d)).astype(dt),
            rng.standard_normal((b, hkv, sk, dv or d)).astype(dt))


def rel(got, want) -> float:
    fin = np.isfinite(want)
    return float(np.abs(got.astype(np.float64)[fin] - want[fin]).max() / np.abs(want[fin]).max())


def run(target, arch, fn, *args):
    _skip_without_tools(target)
    art = ts.compile(fn, *args, target=target, arch=arch)
    return art, art.emulate(*args)


# the default run: f16 on sm_90 and bf16 on gfx942; the other lanes and dtypes in the slow part
@pytest.mark.parametrize("target,arch,dtype", [
    pytest.param(*lane, dtype, marks=() if (lane[1], dtype) in (("sm_90", "f16"), ("gfx942", "bf16")) else
                 pytest.mark.slow) for lane in LANES for dtype in ("f16", "bf16")])
def test_causal_grouped_query_attention_on_every_lane(target, arch, dtype, rng):
    q, k, v = qkv(rng, dtype, 1, 4, 2, 70, 45, 64)            # 2 query heads per kv head; odd lengths
    art, got = run(target, arch, lambda q, k, v: ts.ops.attention(q, k, v, causal=True), q, k, v)
    assert rel(got, oracle(q, k, v, causal=True)) < TOL[dtype]
    rep = art.report()
    assert [kk["kernel"] for kk in rep.kernels] == ["k0_attention"]
    assert rep.layers == ["graph", "schedule", "tile", "target"]
    mnemonic = rep.kernels[0]["mma"]["mnemonic"]
    if target == "nvidia":
        assert set(re.findall(r"mma\.sync\.aligned\.\S+", art.ptx())) == {mnemonic}
        assert rep.kernels[0]["spill_stores"] == 0
    else:
        assert set(re.findall(r"v_(?:wmma|mfma)_\w+", art.asm())) == {mnemonic}


@pytest.mark.parametrize("sq,sk,d,causal", [(1, 1, 32, False), (7, 13, 80, True), (100, 100, 128, False),
                                            (130, 7, 64, True),
                                            pytest.param(64, 1025, 64, False, marks=pytest.mark.slow)])
def test_sequence_lengths_and_head_dims(sq, sk, d, causal, rng):
    q, k, v = qkv(rng, "f16", 1, 2, 2, sq, sk, d)
    _, got = run("nvidia", "sm_90", lambda q, k, v: ts.ops.attention(q, k, v, causal=causal), q, k, v)
    assert rel(got, oracle(q, k, v, causal=causal)) < TOL["f16"]


def test_large_logits_do_not_overflow(rng):
    q, k, v = qkv(rng, "bf16", 1, 2, 2, 50, 70, 64, mag=40.0)   # scores past 89: a naive f32 exp overflows
    want = oracle(q, k, v)
    scores = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2) / 8
    assert float(scores.max()) > 89                       # exp overflows float32 past 88.7
    _, got = run("rocm", "gfx942", lambda q, k, v: ts.ops.attention(q, k, v), q, k, v)
    assert np.isfinite(got.astype(np.float64)).all() and rel(got, want) < TOL["bf16"]


@pytest.mark.parametrize("kind", ["float", "bool"])
def test_masks_broadcast_and_fully_masked_rows_give_zero(kind, rng):
    q, k, v = qkv(rng, "f16", 2, 2, 2, 40, 50, 64)
    if kind == "bool":
        mask = rng.random((40, 50)) > 0.3
        mask[3] = False                                       # a fully-masked row: the explicit op gives 0
    else:
        mask = rng.standard_normal((1, 2, 40, 50)).astype(np.float16)
    _, got = run("nvidia", "sm_80", lambda q, k, v, m: ts.ops.attention(q, k, v, mask=m, scale=0.3), q, k, v, mask)
    want = oracle(q, k, v, mask=mask, scale=0.3)
    assert rel(got, want) < TOL["f16"]
    if kind == "bool":
        assert (got[:, :, 3] == 0).all()


def test_teeth_dropping_the_rescale_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import gpu_attention
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gpu_attention, "rescale", lambda b, o, alpha: o)
    q, k, v = qkv(rng, "f16", 1, 1, 1, 64, 200, 64, mag=3.0)   # several key blocks with a moving maximum
    _, got = run("nvidia", "sm_90", lambda q, k, v: ts.ops.attention(q, k, v), q, k, v)
    assert rel(got, oracle(q, k, v)) > 0.05


def test_teeth_a_causal_edge_off_by_one_fails(rng, monkeypatch):
    from tessera.passes.target.gpu import simt
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = simt.SimtLowerer.op_tile_mask

    def loose(self, op, b):      # keeps one key past the diagonal
        if op.diag is not None:
            self.vmap[op.diag] = b.c(b.add(self.scalar(op.diag), 1))
        return orig(self, op, b)
    monkeypatch.setattr(simt.SimtLowerer, "op_tile_mask", loose)
    q, k, v = qkv(rng, "f16", 1, 1, 1, 40, 40, 32)
    _, got = run("nvidia", "sm_90", lambda q, k, v: ts.ops.attention(q, k, v, causal=True), q, k, v)
    assert rel(got, oracle(q, k, v, causal=True)) > 0.05


def test_score_matrix_is_never_materialised(rng):
    """Shared memory is O(block): the same for 64 and 4096 keys."""
    _skip_without_tools("nvidia")
    sizes = []
    for sk in (64, 4096):
        q, k, v = qkv(rng, "f16", 1, 1, 1, 64, sk, 64)
        art = ts.compile(lambda q, k, v: ts.ops.attention(q, k, v), q, k, v, target="nvidia", arch="sm_90")
        sizes.append(art.abi()[0]["shared_bytes"])
    assert sizes[0] == sizes[1] < 48 << 10


def test_refusals_are_coded(rng):
    _skip_without_tools("nvidia")
    q = rng.standard_normal((1, 2, 16, 64)).astype(np.float32)
    with pytest.raises(MmaSelectorError, match="sm_75.*f32"):   # f32 runs on tf32 from sm_80 (test_gpu_tf32.py)
        ts.compile(lambda q, k, v: ts.ops.attention(q, k, v), q, q, q, target="nvidia", arch="sm_75")
    h = q.astype(np.float16)
    with pytest.raises(ScheduleIllegalError, match="tile-m"):
        ts.compile(lambda q, k, v: ts.ops.attention(q, k, v), h, h, h, target="nvidia", arch="sm_90",
                   schedule={"tile_m": 32})
    # the composed form in f16 rounds its scores between ops, so it is not fused: GEMM, softmax, GEMM
    art = ts.compile(lambda q, k, v: ts.ops.softmax(q @ ts.ops.transpose(k, (0, 1, 3, 2))) @ v, h, h, h,
                     target="nvidia", arch="sm_90")
    assert [k["kind"] for k in art.report().kernels] == ["gemm", "rowwise", "gemm"]


def test_symbolic_head_dims_are_specialised_by_the_api_and_refused_in_raw_ir(rng):
    from tessera.ir.text import parse_module
    from tessera.passes.pipeline import parse_pipeline, run_pipeline
    _skip_without_tools("nvidia")
    q, k, v = qkv(rng, "f16", 1, 2, 2, 20, 20, 32)
    f = lambda q, k, v: ts.ops.attention(q, k, v)                      # noqa: E731
    art = ts.compile(f, q, k, v, target="nvidia", arch="sm_90")
    assert "32" in art.ir("graph").split("tessera.attention")[1].splitlines()[0]
    graph = ts.compile(f, q, k, v).ir("graph")                         # the CPU lane keeps the head dim symbolic
    assert "d0_3" in graph
    with pytest.raises(SpecializeRequest, match="static head dims"):
        run_pipeline(parse_module(graph), parse_pipeline("tessera-nvidia{arch=sm_90}"))
