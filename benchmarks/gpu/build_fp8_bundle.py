"""Build the fp8 GEMM bundle that ``fp8_bench.py`` runs on an H100/H200 (no xDSL there).

    ./dev python benchmarks/gpu/build_fp8_bundle.py                # here: cubins, inputs, emulator outputs
    python benchmarks/gpu/fp8_bench.py --dry-run                   # here: checks the bundle itself
    bash benchmarks/gpu/device_run.sh                              # there: runs it when the bundle is carried

The program is ``scaled_matmul(a, w.T, scale_a, scale_b, out_dtype=bf16)``: fp8 A (row-major
[M, K]) and W ([N, K], k contiguous — the K-major B that fp8 wgmma needs and ``torch._scaled_mm``
requires too), per-tensor f32 scales passed at run time (0-d arrays), f32 accumulation, the scales
applied in the GEMM's epilogue.
- check: e4m3 and e5m2 with edges in every dimension (f32 out plus a bias, and bf16 out), on
  sm_90a (wgmma m64nNk32) and sm_90 (mma.sync m16n8k32, which ptxas runs on Hopper as F2FP
  unpacks to f16 and HMMA: fp8 is native only in wgmma there); the device's output is compared with
  float64 of the dequantised inputs and with this machine's warp-emulator output;
- bench: e4m3 4096^3, 8192^3 and 16384 x 1024 x 4096 (bf16 out) on sm_90a, 4096^3 with B
  row-major beside them, and 4096^3 on sm_90, each timed against ``torch._scaled_mm`` (cuBLASLt
  fp8, which takes W K-major only) on the same random device inputs.
Every sm_90a cubin is checked here before it is carried: QGMMA in its SASS, no local memory.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import tessera as ts  # noqa: E402
from build_nvidia_bundle import launch_record  # noqa: E402

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
CHECKS = ((128, 128, 256), (70, 131, 200), (256, 136, 384))
BENCH = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 1024, 4096))
SCALES = (0.75, 1.25)


def scaled_bias(a, w, sa, sb, bias):
    return ts.ops.scaled_matmul(a, w.T, sa, sb, bias=bias)


def scaled_bf16(a, w, sa, sb):
    return ts.ops.scaled_matmul(a, w.T, sa, sb, out_dtype=ml_dtypes.bfloat16)


def scaled_bf16_kn(a, b, sa, sb):
    """B row-major [K, N]: staged as B^T by 16-byte loads and byte stores (fp8 wgmma is K-major only)."""
    return ts.ops.scaled_matmul(a, b, sa, sb, out_dtype=ml_dtypes.bfloat16)


def kernel_facts(art, arch: str) -> dict:
    """The cubin's fp8 instruction and resources (SystemExit where it lacks them)."""
    from tessera.codegen import ptx_tools
    ptx = art.ptx()
    if re.search(r"\.extern\s+\.func", ptx):
        raise SystemExit(f"{arch}: the PTX calls an intrinsic LLVM did not lower")
    k = art.report().kernels[0]
    facts = {"registers": k["registers"], "spill_bytes": k["spill_stores"]}
    sass = ptx_tools.sass(art.binary(), arch)
    if sass is not None:
        # Hopper has fp8 only in wgmma: for sm_90 ptxas turns mma.sync .e4m3/.e5m2 into F2FP unpacks
        # to f16 and HMMA.16816 (sm_89 / sm_120 have QMMA)
        want = {"sm_90a": "QGMMA", "sm_90": "F2FP.F16"}.get(arch, "QMMA")
        if re.search(r"\b(LDL|STL)\b", sass) or want not in sass:
            raise SystemExit(f"{arch} cubin has local-memory traffic or no {want}")
        facts["sass_mma"] = sorted(set(re.findall(r"\b(?:QG?MMA|HMMA)\.[\w.]+", sass)))
    return facts


def _save(out: Path, name: str, i: int, arr: np.ndarray, fmt: str | None) -> dict:
    f = f"{name}_in{i}.npy"
    np.save(out / f, arr.view(np.uint8) if fmt else np.asarray(arr, np.float32))
    return {"file": f, "dtype": fmt or "f32"}


def build(out: Path, seed: int = 2026, quick: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cases = []
    checks = CHECKS[1:2] if quick else CHECKS
    for arch in (("sm_90a",) if quick else ("sm_90a", "sm_90")):
        for fmt in ("e4m3", "e5m2"):
            for m, n, k in checks:
                a = rng.standard_normal((m, k)).astype(FP8[fmt])
                w = rng.standard_normal((n, k)).astype(FP8[fmt])
                sa, sb = np.float32(SCALES[0]), np.float32(SCALES[1])
                for variant in ("bias", "bf16"):
                    if variant == "bias":
                        bias = rng.standard_normal(n).astype(np.float32)
                        fn, args = scaled_bias, (a, w, sa, sb, bias)
                    else:
                        fn, args = scaled_bf16, (a, w, sa, sb)
                    art = ts.compile(fn, *args, target="nvidia", arch=arch)
                    rec = art.report().kernels[0]["mma"]["record"]
                    name = f"check_{arch}_{fmt}_{variant}_{m}x{n}x{k}"
                    (out / f"{name}.cubin").write_bytes(art.binary())
                    emu = art.emulate(*args)
                    np.save(out / f"{name}_emulated.npy", np.asarray(emu, np.float32))
                    files = [_save(out, name, i, x, fmt if i < 2 else None) for i, x in enumerate(args)]
                    cases.append({"name": name, "kind": "check", "arch": arch, "cubin": f"{name}.cubin",
                                  "inputs": files, "mma": rec, "out_dtype": "bf16" if variant == "bf16" else "f32",
                                  "emulated": f"{name}_emulated.npy", **kernel_facts(art, arch),
                                  **launch_record(art, list(args))})
        bench = [(s, "nk") for s in (BENCH[:1] if quick or arch == "sm_90" else BENCH)]
        if arch == "sm_90a" and not quick:
            bench.append((BENCH[0], "kn"))         # B row-major beside it
        for (m, n, k), b_layout in bench:
            a = np.zeros((m, k), FP8["e4m3"])          # compile only: timed on random data
            w = np.zeros((n, k) if b_layout == "nk" else (k, n), FP8["e4m3"])
            args = (a, w, np.float32(1.0), np.float32(1.0))
            art = ts.compile(scaled_bf16 if b_layout == "nk" else scaled_bf16_kn, *args, target="nvidia", arch=arch)
            name = f"bench_{arch}_e4m3_{m}x{n}x{k}" + ("_b_row_major" if b_layout == "kn" else "")
            (out / f"{name}.cubin").write_bytes(art.binary())
            cases.append({"name": name, "kind": "bench", "arch": arch, "cubin": f"{name}.cubin", "dtype": "e4m3",
                          "b_layout": b_layout,
                          "m": m, "n": n, "k": k, "flops": 2 * m * n * k,
                          "mma": art.report().kernels[0]["mma"]["record"], **kernel_facts(art, arch),
                          **launch_record(art, list(args))})
    from tessera.tools.bench_doc import git_state
    commit, dirty = git_state(ROOT)
    manifest = {"arch": "sm_90a", "program": "scaled_matmul(a, w.T, scale_a, scale_b[, bias]) -> f32 | bf16",
                "built_with": "tessera.compile(target='nvidia', arch='sm_90a' | 'sm_90')",
                "commit": commit, "dirty": dirty, "cases": cases}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "fp8_bundle"))
    ap.add_argument("--quick", action="store_true", help="one check shape and one bench shape, sm_90a only")
    args = ap.parse_args(argv)
    man = build(Path(args.out), quick=args.quick)
    for c in man["cases"]:
        print(f"{c['name']:44} {c['mma']:32} regs {c['registers']:>4} smem {c['shared']:>6} grid {c['grid']} "
              f"{' '.join(c.get('sass_mma', []))}")
    dirty = " dirty" if man["dirty"] else ""
    print(f"wrote {len(man['cases'])} cases to {args.out} (commit {man['commit'][:12]}{dirty})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
