"""The model examples (examples/models/) on the GPU lanes: each compiles for ``target="nvidia"``
(sm_80, sm_90) in f32 and bf16 with every kernel assembled by ptxas on the nvidia lane — or is
refused with a coded error naming the op it lacks (never a silent host fallback); the same on
``target="rocm"`` as far as the ROCm lowering goes.  GPT-2 and Llama blocks run end to end in the
warp emulator against their float64 references (slow: 20-60 s loaded).

What stays refused, and why (the table below is the contract; a change must edit it):
(gpt2_block bf16 runs its composed attention unfused -- bf16 rounds the scores between ops; its
causal mask from ``arange`` is fused into the scores GEMM's epilogue as the tile's diagonal mask,
tests/test_gpu_causal_where.py.)
- mlp_train_step compiles onto nvidia (cross_entropy from int labels, one_hot, the ReLU's bool mask
  in a GEMM epilogue: tests/test_gpu_int.py); its bf16 program is mixed -- one_hot's rows are f32, so
  dlogits and two backward GEMMs are f32 -- and takes the tf32 pin as the f32 programs do;
- sampler compiles onto nvidia (``ids[:, -1]``, ``take``, rms_norm, the logits GEMM with its
  temperature epilogue, argmax and top_k: tests/test_gpu_topk.py); ``top_k`` with k > 128 is refused;
- ROCm f32 (and mlp_train_step's f32 GEMMs in bf16): f32 matrix instructions need xf32 (gfx942),
  which lower-tile-to-rocm does not select.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.errors import TesseraError
from tessera.toolchain import find_llvm_tool, find_ptxas

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

TINY = {
    "gpt2_block": dict(batch=1, seq=16, dim=64, heads=2),
    "llama_block": dict(batch=1, seq=16, dim=64, heads=2, kv_heads=1, hidden=96),
    "bert_block": dict(batch=1, seq=16, dim=64, heads=2),
    "mlp_train_step": dict(batch=8, din=24, hidden=32, classes=10),
    "sampler": dict(batch=2, seq=4, vocab=64, dim=32, k=5),
    "decode_attention": dict(batch=1, heads=4, kv_heads=2, head_dim=32, seq=64),
}
DT = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
# (model, dtype) -> None (compiles entirely onto the lane) or (error code, text the message names)
NVIDIA = {
    ("gpt2_block", "f32"): None, ("gpt2_block", "bf16"): None,
    ("llama_block", "f32"): None, ("llama_block", "bf16"): None,
    ("bert_block", "f32"): None, ("bert_block", "bf16"): None,
    ("mlp_train_step", "f32"): None, ("mlp_train_step", "bf16"): None,
    ("sampler", "f32"): None, ("sampler", "bf16"): None,
    ("decode_attention", "f32"): None, ("decode_attention", "bf16"): None,
}
ROCM = {**{k: v for k, v in NVIDIA.items()},
        **{(m, "f32"): ("MMA_SELECTOR", "xf32") for m in ("gpt2_block", "llama_block", "bert_block",
                                                            "mlp_train_step", "decode_attention", "sampler")},
        ("mlp_train_step", "bf16"): ("MMA_SELECTOR", "xf32")}
# programs with f32 GEMMs whatever the inputs' dtype (mlp_train_step: one_hot's f32 rows in the backward)
F32_GEMMS = {"mlp_train_step"}
SLOW_COMPILES = {"llama_block", "bert_block"}      # 10-15 s each on a loaded machine


def _model(name, dtype, rng):
    m = importlib.import_module(f"models.{name}")
    args, kw = m.make(rng, **TINY[name])
    return m, [a.astype(DT[dtype]) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args], kw


def _params(table, archs):
    out = []
    for arch in archs:
        for (name, dtype) in table:
            slow = arch != archs[0] or (name in SLOW_COMPILES and table[(name, dtype)] is None)
            out.append(pytest.param(name, dtype, arch, marks=[pytest.mark.slow] if slow else [],
                                    id=f"{name}-{dtype}-{arch}"))
    return out


def _pins(target, dtype, name=""):
    """f32 on nvidia runs on tf32 only when asked (schedule_gpu.py); rocm's xf32 is not lowered."""
    return {"math_mode": "tf32"} if target == "nvidia" and (dtype == "f32" or name in F32_GEMMS) else None


def check_lane(target, arch, name, dtype, expect, rng):
    m, args, kw = _model(name, dtype, rng)
    kw = dict(kw, schedule=_pins(target, dtype, name))
    if expect is not None:
        code, text = expect
        with pytest.raises(TesseraError) as ei:
            ts.compile(m.forward, *args, target=target, arch=arch, **kw)
        assert ei.value.code == code and text in str(ei.value), str(ei.value)
        return None
    art = ts.compile(m.forward, *args, target=target, arch=arch, **kw)
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and not rep.reason, (rep.lane, rep.reason)
    assert rep.kernels
    for k in rep.kernels:       # each kernel a real binary of the lane: ptxas / the AMDGPU object's resources
        assert k["registers" if target == "nvidia" else "vgprs"] > 0, k
    return art


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("name,dtype,arch", _params(NVIDIA, ["sm_80", "sm_90"]))
def test_model_compiles_entirely_onto_nvidia_or_is_refused_by_name(name, dtype, arch, rng):
    art = check_lane("nvidia", arch, name, dtype, NVIDIA[(name, dtype)], rng)
    if art is not None:
        assert art.binary()[:4] == b"\x7fELF"


@pytest.mark.skipif(find_llvm_tool("ld.lld") is None, reason="ld.lld >= 19 not installed")
@pytest.mark.parametrize("name,dtype,arch", _params(ROCM, ["gfx942"]))
def test_model_compiles_for_rocm_or_is_refused_by_name(name, dtype, arch, rng):
    check_lane("rocm", arch, name, dtype, ROCM[(name, dtype)], rng)


def test_a_refused_model_never_falls_back_silently(rng):
    """strict (the default): the call raises the coded error; nothing runs on the host instead
    (the sampler with k = 129: over the GPU top_k kernel's bound)."""
    m = importlib.import_module("models.sampler")
    args, kw = m.make(rng, **dict(TINY["sampler"], vocab=160, k=129))
    args = [a.astype(ml_dtypes.bfloat16) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
    f = ts.jit(m.forward.fn if hasattr(m.forward, "fn") else m.forward, target="nvidia", arch="sm_80",
               static_argnames="k")
    with pytest.raises(TesseraError) as ei:
        f(*args, **kw)
    assert ei.value.code == "SCHEDULE_ILLEGAL" and "tessera.top_k with k = 129" in str(ei.value)


def _tied_sampler(rng, dtype):
    """The sampler's tiny inputs with a tie at the top: the table row of batch row 0's best column
    copied to a later column no id reads (both logits come out bitwise equal on every lane)."""
    m, args, kw = _model("sampler", dtype, rng)
    want = m.reference(*args, xp_dtype=np.float64, **kw)
    top = int(want[0][0])
    free = [j for j in range(args[1].shape[0]) if j != top and j not in set(args[0][:, -1].tolist())]
    j = max(free)
    args[1] = args[1].copy()
    args[1][j] = args[1][top]
    return m, args, kw, (top, j)


def _check_sampler(got, want, tol, tie):
    """argmax and top_k against float64: values within ``tol`` of the float64 top-k values, indices
    distinct, each picking a float64 logit equal to its value within ``tol`` (rounding may swap near
    ties); argmax is the first top-k index (both read one logits buffer: exact), and batch row 0's
    exact tie comes out lower column first."""
    amax, vals, idx = (np.asarray(a) for a in got)
    w_amax, w_vals, w_idx, logits = want
    scale = np.abs(w_vals).max()
    assert amax.dtype == idx.dtype == np.int64 and vals.shape == w_vals.shape
    v64 = vals.astype(np.float64)
    assert np.abs(v64 - w_vals).max() / scale < tol
    assert np.abs(np.take_along_axis(logits, idx, -1) - v64).max() / scale < tol
    assert np.array_equal(amax, idx[:, 0])
    assert all(len(set(r)) == len(r) for r in idx.tolist())
    assert np.all(np.diff(v64, axis=-1) <= 0)                       # sorted, descending
    assert idx[0, :2].tolist() == sorted(tie)


def _sampler_want(m, args, kw):
    from models import common as C
    ids, table, norm_g, temperature = args
    t64 = table.astype(np.float64)
    logits = C.rms_norm(t64[ids[:, -1]], norm_g.astype(np.float64)) @ t64.T / temperature
    return (*m.reference(*args, xp_dtype=np.float64, **kw), logits)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("target,arch,dtype,tol", [("nvidia", "sm_80", "f32", 2e-3), ("nvidia", "sm_90", "bf16", 2e-2),
                                                   ("rocm", "gfx942", "bf16", 2e-2)])
def test_sampler_emulated_matches_float64(rng, target, arch, dtype, tol):
    """The whole sampling step (embedding lookup, rms_norm, logits GEMM / temperature, argmax, top_k)
    on the GPU lane, emulated, against float64."""
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")
    m, args, kw, tie = _tied_sampler(rng, dtype)
    art = ts.compile(m.forward, *args, target=target, arch=arch, schedule=_pins(target, dtype), **kw)
    ops = {o for k in art.report().kernels for o in k["ops"]}
    assert {"tessera.top_k", "tessera.argmax", "tessera.matmul", "tessera.take"} <= ops, ops
    _check_sampler(art.emulate(*args, **kw), _sampler_want(m, args, kw), tol, tie)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_planted_top_k_bug_fails_the_sampler_check(rng, monkeypatch):
    from tessera.passes.tile.kernels import gpu_topk
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gpu_topk, "FIRST", False)          # ties by the last column
    m, args, kw, tie = _tied_sampler(rng, "f32")
    art = ts.compile(m.forward, *args, target="nvidia", arch="sm_80", schedule=_pins("nvidia", "f32"), **kw)
    with pytest.raises(AssertionError):
        _check_sampler(art.emulate(*args, **kw), _sampler_want(m, args, kw), 2e-3, tie)


@pytest.mark.slow   # the warp emulator runs every kernel of the block: 20-60 s loaded
@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("name", ["gpt2_block", "llama_block"])
def test_block_emulated_end_to_end_matches_float64(name, rng):
    """f32 blocks: GEMMs and attention on tf32 (a relative error of a few 2^-11 per product, summed
    over K <= 96 with random signs: ~1e-3 of the output's scale at most), the rest in f32."""
    m, args, kw = _model(name, "f32", rng)
    art = ts.compile(m.forward, *args, target="nvidia", arch="sm_80", schedule={"math_mode": "tf32"}, **kw)
    got = np.asarray(art.emulate(*args, **kw), np.float64)
    want = m.reference(*args, xp_dtype=np.float64, **kw)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 2e-3, err


@pytest.mark.slow   # the warp emulator runs the 16 kernels of the step: ~15 s (f32), ~35 s (bf16) loaded
@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("dtype, tol", [("f32", 2e-3), ("bf16", 1.5e-2)])
def test_mlp_train_step_emulated_end_to_end_matches_float64(rng, dtype, tol):
    """The loss and the four updated parameters, each against float64: GEMMs on tf32 (bf16 inputs
    where the program has them), cross_entropy and one_hot from the int labels, the ReLU's bool mask
    in the dh GEMM's epilogue."""
    m, args, kw = _model("mlp_train_step", dtype, rng)
    art = ts.compile(m.forward, *args, target="nvidia", arch="sm_80", schedule={"math_mode": "tf32"}, **kw)
    kinds = {k["kind"] for k in art.report().kernels}
    assert {"gemm", "rowwise", "gather", "reduce", "elementwise"} <= kinds, kinds
    got = art.emulate(*args, **kw)
    want = m.reference(*args, xp_dtype=np.float64, **kw)
    for name, g, w in zip(("loss", "w1", "b1", "w2", "b2"), got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w)
        err = np.abs(g - w).max() / np.abs(w).max()
        assert 0 <= err < tol, (name, err)
    # the update is not the identity: the step moved every parameter
    assert all(np.abs(np.asarray(g, np.float64) - np.asarray(a, np.float64)).max() > 0
               for g, a in zip(got[1:], args[2:6]))


@pytest.mark.slow   # ~35 s loaded
@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_gpt2_block_bf16_emulated_end_to_end_matches_float64(rng):
    """bf16: the composed attention unfused, its causal mask in the scores GEMM's epilogue; every
    intermediate rounded to bf16 (2^-9 relative each): a few 1e-3 of the output's scale."""
    m, args, kw = _model("gpt2_block", "bf16", rng)
    art = ts.compile(m.forward, *args, target="nvidia", arch="sm_80", **kw)
    got = np.asarray(art.emulate(*args, **kw), np.float64)
    want = m.reference(*args, xp_dtype=np.float64, **kw)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 1.5e-2, err


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
def test_models_bench_dry_run_checks_against_float64_without_host_copies(tmp_path, monkeypatch):
    """benchmarks/gpu/models_bench.py --dry-run (the device suite's script): the fake driver and the
    warp emulator stand in for the GPU; a run that disagrees with float64 would exit 1."""
    import json
    from tessera.runtime import cuda
    monkeypatch.setattr(cuda, "_driver", cuda._driver)     # the script swaps in the fake driver: restored after
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
    import models_bench
    assert models_bench.main(["--dry-run", "--only", "decode_attention,sampler", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "models.json").read_text())
    runs = {r["model"]: r for r in rec["runs"]}
    assert runs["decode_attention"]["rel_err"] < 5e-3 and runs["decode_attention"]["lane"] == "nvidia-sm_90"
    assert not any(runs["decode_attention"]["runtime_host_copies"].values())
    assert runs["sampler"]["rel_err"] < 5e-3 and runs["sampler"]["lane"] == "nvidia-sm_90"
    assert not any(runs["sampler"]["runtime_host_copies"].values())
