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
- sampler: ``ids[:, -1]``, ``take`` and ``argmax`` compile; ``top_k`` has no GPU kernel;
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
    ("sampler", "f32"): ("SCHEDULE_ILLEGAL", "tessera.top_k"),
    ("sampler", "bf16"): ("SCHEDULE_ILLEGAL", "tessera.top_k"),
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
    """strict (the default): the call raises the coded error; nothing runs on the host instead."""
    m, args, kw = _model("sampler", "bf16", rng)
    f = ts.jit(m.forward.fn if hasattr(m.forward, "fn") else m.forward, target="nvidia", arch="sm_80",
               static_argnames="k")
    with pytest.raises(TesseraError) as ei:
        f(*args, **kw)
    assert ei.value.code == "SCHEDULE_ILLEGAL" and "tessera.top_k" in str(ei.value)


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
    assert runs["sampler"]["refused"].startswith("SCHEDULE_ILLEGAL")
