"""Attention's gradient on the GPU lanes.  Stage 1 (this file): the GPU flash-attention forward
writes the log-sum-exp per query row ([B, H, S] f32) as its second result when a gradient in the
same program asks for it, proven by the SIMT emulator against float64 with teeth.  The backward
kernel itself (``attention_grad``) is still refused on the GPU lanes by name
(tests/test_attention_backward.py::test_gpu_lanes_refuse_it_by_name)."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.frontend.attention_grad import saved_lse
from tessera.toolchain import find_llvm_tool, find_ptxas

DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _skip_without_tools(target):
    if target == "nvidia" and find_ptxas() is None:
        pytest.skip("ptxas not installed")
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")


def oracle(q, k, v, causal=False, mask=None, scale=None):
    """(out, lse) in float64; lse is +inf on a row with every key masked, out 0 there."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    if causal:
        i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
        s = np.where(j <= i, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m0)
    l_ = p.sum(-1, keepdims=True)
    with np.errstate(all="ignore"):
        out = np.where(l_ == 0, 0.0, (p @ v) / l_)
        lse = np.where(l_ == 0, np.inf, m0 + np.log(l_))[..., 0]
    return out, lse


def qkv(rng, dtype, b, h, hkv, sq, sk, d):
    dt = DT[dtype]
    return (rng.standard_normal((b, h, sq, d)).astype(dt), rng.standard_normal((b, hkv, sk, d)).astype(dt),
            rng.standard_normal((b, hkv, sk, d)).astype(dt))


def with_lse(causal=False, scale=None):
    def f(q, k, v, *m):
        o = ts.ops.attention(q, k, v, causal=causal, scale=scale, mask=m[0] if m else None)
        return o, saved_lse(o._node)
    return f


def run(target, arch, fn, *args):
    _skip_without_tools(target)
    art = ts.compile(fn, *args, target=target, arch=arch)
    return art, art.emulate(*args)


@pytest.mark.parametrize("target,arch,dtype", [("nvidia", "sm_90", "f16"), ("nvidia", "sm_80", "bf16"),
                                               pytest.param("rocm", "gfx942", "bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_writes_the_log_sum_exp(target, arch, dtype, causal, rng):
    q, k, v = qkv(rng, dtype, 2, 4, 2, 70, 70, 64)            # grouped heads, a length not a multiple of the block
    art, (o, lse) = run(target, arch, with_lse(causal), q, k, v)
    want_o, want_lse = oracle(q, k, v, causal=causal)
    assert lse.shape == (2, 4, 70) and lse.dtype == np.float32
    assert np.abs(lse - want_lse).max() < 1e-4 * np.abs(want_lse).max() + 1e-5
    tol = 5e-3 if dtype == "f16" else 2e-2
    assert np.abs(o.astype(np.float64) - want_o).max() / np.abs(want_o).max() < tol
    rep = art.report()
    assert [kk["kernel"] for kk in rep.kernels] == ["k0_attention"]
    if target == "nvidia":
        assert rep.kernels[0]["spill_stores"] == 0
        assert re.search(r"mma\.sync\.aligned", art.ptx())


def test_a_fully_masked_row_gets_infinite_lse(rng):
    q, k, v = qkv(rng, "f16", 1, 2, 2, 40, 50, 64)
    mask = rng.random((40, 50)) > 0.3
    mask[3] = False
    _, (o, lse) = run("nvidia", "sm_80", with_lse(scale=0.3), q, k, v, mask)
    want_o, want_lse = oracle(q, k, v, mask=mask, scale=0.3)
    assert np.isposinf(lse[:, :, 3]).all() and (o[:, :, 3] == 0).all()
    fin = np.isfinite(want_lse)
    assert np.abs(lse[fin] - want_lse[fin]).max() < 1e-4 * np.abs(want_lse[fin]).max()


def test_teeth_lse_without_the_log_of_the_sum_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import gpu_attention
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gpu_attention, "row_lse", lambda b, m, l: m)
    q, k, v = qkv(rng, "f16", 1, 2, 1, 50, 50, 64)
    _, (_, lse) = run("nvidia", "sm_90", with_lse(), q, k, v)
    assert np.abs(lse - oracle(q, k, v)[1]).max() > 0.1



@pytest.mark.parametrize("target,arch", [("nvidia", "sm_80"), ("rocm", "gfx942")])
def test_the_backward_kernel_is_still_refused_by_name(target, arch, rng):
    from tessera.errors import ScheduleIllegalError
    q, k, v = qkv(rng, "f16", 1, 2, 2, 64, 64, 64)
    f = ts.jit(lambda q, k, v, o, g: ts.ops.attention_backward(q, k, v, o, g), target=target, arch=arch)
    with pytest.raises(ScheduleIllegalError, match=f"attention_grad.*{target}"):
        ts.compile(f, q, k, v, q, q)
