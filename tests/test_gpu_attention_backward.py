"""Attention's gradient on the GPU lanes.  Stage 1: the GPU flash-attention forward writes the
log-sum-exp per query row ([B, H, S] f32) as its second result when a gradient in the same program
asks for it.  Stage 2: the flash-attention backward kernel (``kernels/gpu_attention_backward.py``)
computes dQ, dK and dV from it on the NVIDIA mma.sync lane: ``tessera.grad`` of a jitted attention
compiles end to end (PTX assembled by ptxas) and runs in the warp emulator against a float64 oracle
on random inputs, with NaN-poisoned outputs and teeth; the same generator runs on the ROCm lane
(16x16x16 MFMA / WMMA).  What stays refused (a mask, no saved log-sum-exp) is refused by name."""
from __future__ import annotations

import re
import types

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


# --------------------------------------------------------------------------- the backward kernel
def grad_oracle(q, k, v, w, causal=False):
    """float64 (dq, dk, dv) of sum(attention(q, k, v) * w), grouped heads summed."""
    q, k, v, w = (x.astype(np.float64) for x in (q, k, v, w))
    b, h, s, d = q.shape
    hk = k.shape[1]
    g = h // hk
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    sc = 1 / np.sqrt(d)
    x = q @ np.swapaxes(kk, -1, -2) * sc
    if causal:
        x = np.where(np.tril(np.ones((s, s), bool)), x, -np.inf)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ vv
    ds = p * (w @ np.swapaxes(vv, -1, -2) - (w * o).sum(-1, keepdims=True))
    dq = ds @ kk * sc
    dk = (np.swapaxes(ds, -1, -2) @ q * sc).reshape(b, hk, g, s, d).sum(2)
    dv = (np.swapaxes(p, -1, -2) @ w).reshape(b, hk, g, s, d).sum(2)
    return dq, dk, dv


def grad_fn(causal):
    def loss(q, k, v, w):
        return ts.ops.reduce_sum(ts.ops.attention(q, k, v, causal=causal) * w)
    return ts.grad(loss, argnums=(0, 1, 2))


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every kernel output of the emulated program starts as NaN (not zeros): an element the
    backward kernel does not write, or a masked edge that leaks, shows up."""
    import tessera.runtime.gpu as gpu_rt

    def full_nan(shape, dtype=float):
        dt_ = np.dtype(dtype)
        return np.full(shape, np.nan if dt_.kind == "f" or dt_ == ml_dtypes.bfloat16 else 0, dtype=dt_)
    names = {n: getattr(np, n) for n in dir(np) if not n.startswith("__")}
    monkeypatch.setattr(gpu_rt, "np", types.SimpleNamespace(**{**names, "zeros": full_nan}))


def run_grad(arch, dtype, causal, b, h, hk, s, d, rng):
    q, k, v = qkv(rng, dtype, b, h, hk, s, s, d)
    w = rng.standard_normal((b, h, s, d)).astype(DT[dtype])
    art, got = run("nvidia", arch, ts.jit(grad_fn(causal), target="nvidia", arch=arch), q, k, v, w)
    return art, got, grad_oracle(q, k, v, w, causal)


def rel_err(got, want):
    return max(np.abs(g.astype(np.float64) - w_).max() / np.abs(w_).max() for g, w_ in zip(got, want))


BWD_CASES = [("sm_90", "f16", True, 4, 2), ("sm_80", "bf16", False, 2, 2),
             pytest.param("sm_80", "f16", True, 2, 2, marks=pytest.mark.slow),
             pytest.param("sm_90", "bf16", False, 4, 1, marks=pytest.mark.slow)]


@pytest.mark.parametrize("arch,dtype,causal,h,hk", BWD_CASES)
def test_backward_matches_float64(arch, dtype, causal, h, hk, rng, poisoned_outputs):
    # 70 is not a multiple of the 64-row blocks: the last key and query blocks are masked edges
    art, got, want = run_grad(arch, dtype, causal, 1, h, hk, 70, 64, rng)
    assert [x.shape for x in got] == [(1, h, 70, 64), (1, hk, 70, 64), (1, hk, 70, 64)]
    assert all(np.isfinite(x.astype(np.float64)).all() for x in got)
    assert rel_err(got, want) < (4e-3 if dtype == "f16" else 3e-2)
    rep = art.report()
    kern = next(k for k in rep.kernels if k["kind"] == "attention_bwd")
    assert kern["spill_stores"] == 0 and kern["spill_loads"] == 0     # ptxas -v (255 registers: docs/architecture.md)
    ptx = art.ptx()
    assert re.search(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\." + dtype, ptx)
    assert not re.search(r"^\s*(atom|red)\.", ptx, re.M)    # dK, dV owned by one workgroup: no atomics


@pytest.mark.parametrize("bug", ["no_delta", "lse_of_head_0", "no_scale"])
def test_teeth_a_planted_bug_fails(bug, rng, monkeypatch):
    from tessera.passes.tile.kernels import gpu_attention_backward as gab
    from tessera.passes.tile.kernels.common import elementwise
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    if bug == "no_delta":         # dS = P * dP: the softmax vjp without its subtraction
        monkeypatch.setattr(gab, "dscores", lambda b, p, dp, delta: elementwise(b, "mul", [p, dp]))
    elif bug == "lse_of_head_0":  # every query head reads head 0's log-sum-exp (a wrong lse offset)
        real = gab.lse_at
        monkeypatch.setattr(gab, "lse_at", lambda b, bi, h, nh, ns, row: real(b, bi, 0, nh, ns, row))
    else:                         # scale 1 instead of 1 / sqrt(d)
        monkeypatch.setattr(gab, "sqrt", lambda d: 1.0)
    _, got, want = run_grad("sm_80", "f16", False, 1, 2, 1, 40, 64, rng)
    with np.errstate(all="ignore"):
        assert not rel_err(got, want) < 4e-3    # the check test_backward_matches_float64 makes fails (NaN too)


def test_standalone_backward_with_lse_matches(rng):
    """attention_backward called on its own, given the forward's output and log-sum-exp (as a
    training framework holding them would)."""
    q, k, v = qkv(rng, "f16", 1, 2, 1, 48, 48, 64)
    w = rng.standard_normal((1, 2, 48, 64)).astype(np.float16)
    o, lse = oracle(q, k, v)

    def f(q, k, v, o, w, lse):
        return ts.ops.attention_backward(q, k, v, o, w, lse=lse)
    _, got = run("nvidia", "sm_90", ts.jit(f, target="nvidia", arch="sm_90"), q, k, v, o.astype(np.float16), w,
                 lse.astype(np.float32))
    assert rel_err(got, grad_oracle(q, k, v, w)) < 4e-3


@pytest.mark.parametrize("what", ["no_lse", "mask"])
def test_what_remains_refused_is_refused_by_name(what, rng):
    from tessera.errors import ScheduleIllegalError
    _skip_without_tools("nvidia")
    q, k, v = qkv(rng, "f16", 1, 2, 2, 64, 64, 64)
    if what == "no_lse":     # the kernel reads the forward's log-sum-exp; it does not recompute it
        f = ts.jit(lambda q, k, v, o, g: ts.ops.attention_backward(q, k, v, o, g), target="nvidia", arch="sm_80")
        with pytest.raises(ScheduleIllegalError, match="attention_grad on nvidia reads the forward's log-sum-exp"):
            ts.compile(f, q, k, v, q, q)
    else:
        m = rng.random((64, 64)) > 0.2
        f = ts.jit(ts.grad(lambda q, k, v, m: ts.ops.reduce_sum(ts.ops.attention(q, k, v, mask=m)), argnums=0),
                   target="nvidia", arch="sm_80")
        with pytest.raises(ScheduleIllegalError, match="attention_grad with a mask has no nvidia kernel"):
            ts.compile(f, q, k, v, m)


@pytest.mark.parametrize("arch,dtype,causal", [("gfx942", "bf16", True),
                                               pytest.param("gfx1151", "f16", False, marks=pytest.mark.slow)])
def test_rocm_backward_matches_float64(arch, dtype, causal, rng, poisoned_outputs):
    """The same Tile IR generator on the ROCm lane: 16x16x16 MFMA (wave64) / WMMA (wave32)."""
    q, k, v = qkv(rng, dtype, 1, 2, 1, 70, 70, 64)
    w = rng.standard_normal((1, 2, 70, 64)).astype(DT[dtype])
    art, got = run("rocm", arch, ts.jit(grad_fn(causal), target="rocm", arch=arch), q, k, v, w)
    assert rel_err(got, grad_oracle(q, k, v, w, causal)) < (4e-3 if dtype == "f16" else 3e-2)
    kern = next(k for k in art.report().kernels if k["kind"] == "attention_bwd")
    assert kern["mma"]["shape"] == [16, 16, 16]


@pytest.mark.slow
def test_device_bench_dry_run():
    """benchmarks/gpu/attention_bwd_bench.py --dry-run: the launch record the device run uses, run in
    the warp emulator against float64."""
    import subprocess
    import sys
    from pathlib import Path
    _skip_without_tools("nvidia")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, str(root / "benchmarks/gpu/attention_bwd_bench.py"), "--dry-run"],
                       capture_output=True, text=True, timeout=900, cwd=root)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("emulated vs float64") == 2


def test_memory_is_linear_in_the_sequence(rng):
    """No S x S buffer: every array the compiled gradient program makes is O(S), and the backward
    kernel's shared memory does not grow with S (compile only, S = 64 and 2048)."""
    from tessera.runtime.cpu import _eval, bind_symbols
    _skip_without_tools("nvidia")
    smem = []
    for s in (64, 2048):
        q, k, v = qkv(rng, "f16", 1, 2, 1, s, s, 64)
        w = rng.standard_normal((1, 2, s, 64)).astype(np.float16)
        art = ts.compile(ts.jit(grad_fn(True), target="nvidia", arch="sm_80"), q, k, v, w, target="nvidia",
                         arch="sm_80")
        prog = art.compiled.executable.program
        env = bind_symbols(prog.inputs, [q, k, v, w])
        biggest = max(int(np.prod([_eval(d, env) for d in t.dims])) for st in prog.steps for t in st.out_types)
        assert biggest <= 4 * s * 64          # the packed [1, 1, G + 2, S, 64] gradient at most
        smem.append(next(kk["smem_bytes"] for kk in art.report().kernels if kk["kind"] == "attention_bwd"))
    assert smem[0] == smem[1] and smem[0] < 48 << 10
