"""``docs/gpu.md``: what the GPU lanes did on real hardware, rendered from the logs that
``benchmarks/gpu/device_run.sh`` wrote on a GPU machine and that are kept under
``benchmarks/gpu/results/<machine>-<date>/`` (the figures are the logs', never retyped).

Each run's ``commit.json`` names the commit its code was (``device_run.sh`` records it; the runs
made before it did carry the commit that added their logs, marked as inferred).  Which commits
changed GPU code after a run is a question for git history, which a shallow clone lacks and which
grows with every commit, so the document does not compute it while rendering:
``tessera docs gpu --since --write`` records the answer as of the current commit in
``benchmarks/gpu/results/since.json`` and the document renders that record;
``tessera docs gpu --since`` prints it as of now.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "gpu" / "results"
SINCE = "since.json"

# The code an NVIDIA run's figures depend on: a commit touching one of these after the run may
# have changed what the run measured (the CPU lane's files and the ROCm-only ones are left out).
GPU_CODE = ("benchmarks/gpu/", "tessera/codegen/gpu.py", "tessera/codegen/nvptx.py", "tessera/codegen/ptx_tools.py",
            "tessera/emulate/", "tessera/frontend/gpu_build.py", "tessera/ir/target/gpu.py",
            "tessera/ir/target/nvidia.py", "tessera/mma/nvidia.py", "tessera/passes/schedule/schedule_gpu.py",
            "tessera/passes/target/gpu/", "tessera/passes/target/nvidia/", "tessera/passes/tile/kernels/gpu_attention.py",
            "tessera/passes/tile/kernels/gpu_gemm.py", "tessera/runtime/cuda.py", "tessera/runtime/gpu.py",
            "tessera/passes/schedule/schedule_gpu_rows.py", "tessera/passes/tile/kernels/gpu_rows.py",
            "tessera/passes/tile/kernels/gpu_gemm_wgmma.py", "tessera/passes/tile/kernels/gpu_attention_backward.py",
            "tessera/passes/tile/kernels/gpu_labels.py", "tessera/passes/tile/kernels/gpu_topk.py",
            "tessera/passes/tile/kernels/gpu_scan.py", "tessera/passes/tile/kernels/gpu_rowin.py",
            "tessera/passes/tile/kernels/gpu_gemm_tma.py", "tessera/runtime/cuda_tensor_map.py")

# the kernel generators of the GPU lanes, by kernel family (what runs where: the op lists come from
# the op registry, tessera/ir/opset.py, whose declarations tests/test_opset.py checks against real compiles)
GPU_GENERATORS = {
    "gemm": "`kernels/gpu_gemm.py`: mma.sync / WMMA / MFMA, staged shared memory, fused epilogue; on sm_90a "
            "`kernels/gpu_gemm_wgmma.py`: wgmma from 128-byte-swizzled shared memory",
    "attention": "`kernels/gpu_attention.py`: flash attention, four waves per query block; "
                 "`kernels/gpu_attention_backward.py`: its backward (dQ, dK, dV from the saved log-sum-exp; one grid "
                 "of key-block and query-block workgroups, no atomics)",
    "row": "`kernels/gpu_rows.py`: one workgroup per row, 16-byte vectors, warp-shuffle reductions "
           "(argmax / top_k: `gpu_labels.py`, `gpu_topk.py`, k selection steps)",
    "reduction": "`kernels/gpu_rows.py`: one workgroup per row (last axes) or per column chunk",
    "scan": "`kernels/gpu_scan.py`: one workgroup per row, `tile.scan` per chunk (thread, xor-shuffle and "
            "cross-wave scans) after the carry; inner axes walked per thread",
    "elementwise": "`kernels/gpu_rows.py`: fused chains, one workgroup per chunk or row, 16-byte vectors",
    "view": "`kernels/gpu_rows.py`: a copy through permuted strides where no stride expresses it",
}


def where_lines() -> list[str]:
    """What runs where: per kernel family, the ops the GPU lanes run and the ones they refuse."""
    from tessera.ir import opset
    out = ["## What runs where", "",
           "Both GPU lanes (`target=\"nvidia\"`, `target=\"rocm\"`) lower the same Tile IR; ops marked refused "
           "raise a coded error naming the op and the lane.  From the op registry (`tessera lanes`, `docs/ops.md`):",
           "", "| family | GPU kernel | ops run on the GPU lanes | refused there |", "|---|---|---|---|"]
    for fam in opset.FAMILIES:
        ops = [d for d in opset.OPS.values() if d.family == fam]
        run = [d.name for d in ops if d.gpu != "refused"]
        no = [d.name for d in ops if d.gpu == "refused"]
        if not ops or fam == "structure":
            continue
        out.append(f"| {fam} | {GPU_GENERATORS.get(fam, '-')} | {', '.join(run) or '-'} | {', '.join(no) or '-'} |")
    return out + [""]

SECTIONS = (
    ("gpu.txt", "Device (nvidia-smi)"),
    ("pytest.log", "Device tests (`tests/test_nvidia_device.py`, `tests/test_cuda_runtime.py`): `@tessera.jit("
                   "target=\"nvidia\")` GEMM (f16/bf16, C0, epilogue, batch) and flash attention (causal, grouped "
                   "heads, bool masks with a fully-masked row) launched on the GPU, checked against float64 and the "
                   "warp emulator"),
    ("check.log", "`nvidia_check.py`: every cubin of the bundle against float64 and the emulator; GEMM 4096^3 "
                  "against `torch.matmul` (cuBLAS), CUDA events, median of 20 after warm-up"),
    ("attention.log", "`attention_bench.py`: flash attention (batch*heads 16, d 64, f16) against torch's "
                      "`scaled_dot_product_attention` on the same data, CUDA events, median of 20 after warm-up"),
    ("attention_bwd.log", "`attention_bwd_bench.py`: the flash-attention backward kernel (dQ, dK, dV; batch*heads "
                          "16, d 64, f16) against torch.autograd of f16 `scaled_dot_product_attention`, CUDA events, "
                          "median of 20 after warm-up"),
    ("rows.log", "`rows_bench.py`: the memory-bound kernels (softmax, layer_norm, rms_norm, gelu(x + b), a row "
                 "sum; f16 and bf16) against float64 and the emulator, then 16384 x 8192 against torch and a device "
                 "copy, CUDA events, median of 20 after warm-up"),
    ("before-bf16-fix-check.log", "The first run, before the bf16 fix: bf16 kernels ran the f16 `mma.sync` "
                                  "(the emulator, which reads the registers' types, had agreed with float64). The "
                                  "fix keys lane maps by the operand dtype and makes `tessera_nvidia.mma_sync` "
                                  "verify its `atype` against its registers; "
                                  "`test_the_emitted_instruction_is_the_selected_records_for_each_dtype` keeps it"),
)


def runs(results: Path = RESULTS) -> list[Path]:
    return sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []


def run_commit(run: Path) -> dict:
    """The run's ``commit.json`` (``{"commit": "unknown"}`` where it has none)."""
    f = run / "commit.json"
    return json.loads(f.read_text()) if f.exists() else {"commit": "unknown", "recorded": False}


def _git(root: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def commits_since(commit: str, until: str = "HEAD", root: Path = ROOT) -> list[list[str]] | None:
    """``[hash, subject]`` of every commit after ``commit`` up to ``until`` that touched GPU_CODE,
    oldest first; None where git or that history is unavailable (a shallow clone, no .git)."""
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return None
    out = _git(root, "log", "--reverse", "--format=%H%x09%s", f"{commit}..{until}", "--", *GPU_CODE)
    if out is None:
        return None
    return [line.split("\t", 1) for line in out.splitlines() if line]


def since_record(results: Path = RESULTS, root: Path = ROOT) -> dict:
    """What ``since.json`` keeps: as of the current commit, each run's later GPU-code commits."""
    head = (_git(root, "rev-parse", "HEAD") or "unknown").strip()
    rec = {"as_of": head, "paths": list(GPU_CODE), "runs": {}}
    for run in runs(results):
        c = run_commit(run)["commit"]
        rec["runs"][run.name] = commits_since(c, head, root) if head != "unknown" and c != "unknown" else None
    return rec


def _subject(s: str, width: int = 100) -> str:
    first = s.split(". ")[0].split("; ")[0]
    return first if len(first) <= width else first[:width - 3].rstrip() + "..."


def since_lines(name: str, since: dict | None) -> list[str]:
    if since is None:
        return ["Later commits that changed GPU code: not recorded (`./dev tessera docs gpu --since` lists them "
                "from git history).", ""]
    lst = since["runs"].get(name)
    as_of = since["as_of"][:12]
    if lst is None:
        return [f"Later commits that changed GPU code: unknown as of `{as_of}` (the run's commit was not in the "
                "history then).", ""]
    if not lst:
        return [f"No commit changed GPU code between this run and `{as_of}`.", ""]
    out = [f"GPU code changed after this run in {len(lst)} commits up to `{as_of}` (`tessera docs gpu --since` "
           "lists them as of now); these figures may not hold for the current code:", ""]
    return out + [f"- `{h[:12]}` {_subject(s)}" for h, s in lst] + [""]


def commit_line(c: dict) -> str:
    commit = c.get("commit", "unknown")
    if commit == "unknown":
        return "Commit: not recorded."
    how = "recorded by the run" if c.get("recorded") else ("inferred, not recorded: the commit that added these "
                                                           "logs; the run did not record its own")
    dirty = " with uncommitted changes" if c.get("dirty") else ""
    line = f"Commit: these figures belong to `{commit[:12]}`{dirty} ({how})."
    for fname, what in c.get("files", {}).items():
        line += f"  `{fname}`: {what}."
    return line


def gpu_md(results: Path = RESULTS) -> str:
    out = ["# The GPU lanes on hardware", "",
           "Generated by `tessera docs gpu` from the logs under `benchmarks/gpu/results/`; each run is one call of",
           "`bash benchmarks/gpu/device_run.sh` on a GPU machine (after `./dev python "
           "benchmarks/gpu/build_nvidia_bundle.py --arch sm_90` here; the script's header says what it needs there).",
           "Each run names the commit its figures belong to and the later commits that changed GPU code (recorded "
           "in `benchmarks/gpu/results/since.json` by `tessera docs gpu --since --write`; GPU code: "
           + ", ".join(f"`{p}`" for p in GPU_CODE) + ").",
           "ROCm has had no AMD GPU: its code objects are checked structurally and by the wave emulator only.", ""]
    out += where_lines()
    out += ["The memory-bound kernels (rows, reductions, elementwise chains, copies) have not run on a device yet: "
            "`benchmarks/gpu/build_rows_bundle.py` (here) and `benchmarks/gpu/rows_bench.py` (there, one call) "
            "check them against float64 and the emulator and time them against torch and a device copy.", ""]
    rs = runs(results)
    sf = results / SINCE
    since = json.loads(sf.read_text()) if sf.exists() else None
    if not rs:
        out += ["No GPU run has been recorded yet.", ""]
    for run in rs:
        out += [f"## {run.name}", "", commit_line(run_commit(run)), ""] + since_lines(run.name, since)
        if (run / "notes.md").exists():
            out += [(run / "notes.md").read_text().strip(), ""]
        for fname, title in SECTIONS:
            f = run / fname
            if not f.exists():
                continue
            text = f.read_text().strip()
            if fname == "pytest.log":
                text = text.splitlines()[-1]
            out += [f"{title}:", "", "```", text, "```", ""]
    return "\n".join(out)


def since_md(results: Path = RESULTS) -> str:
    """The later GPU-code commits of each run, as of now (from git history)."""
    rec = since_record(results)
    out = []
    for name in rec["runs"]:
        out += [f"## {name}", ""] + since_lines(name, rec)
    return "\n".join(out)


def write_since(results: Path = RESULTS) -> Path:
    p = results / SINCE
    p.write_text(json.dumps(since_record(results), indent=1) + "\n")
    return p


__all__ = ["GPU_CODE", "GPU_GENERATORS", "where_lines", "commits_since", "gpu_md", "since_md", "since_record", "write_since"]
