"""Build the Hopper (sm_90a, wgmma) bundle that ``nvidia_check.py`` runs on an H200 (no xDSL there).

    ./dev python benchmarks/gpu/build_hopper_bundle.py            # here: cubins, inputs, emulator outputs
    python benchmarks/gpu/nvidia_check.py --bundle benchmarks/gpu/hopper_bundle --dry-run   # here: checks it
    bash benchmarks/gpu/device_run.sh                              # there: runs it when the bundle is carried

Cases (the same manifest format as ``build_nvidia_bundle.py``):
- check: ``A @ B + C0`` (f32 out) on sm_90a for f16 and bf16 with edges in every dimension; the
  device's output is compared with float64 and with this machine's warp-emulator output;
- the same checks with ``copy_engine="tma"`` (tiles staged by the tensor copy engine, maps encoded by
  the device's driver at launch) where the rows are multiples of 16 bytes;
- bench: ``A @ B`` (f16/bf16 out) 4096^3, 8192^3 and a skinny 16384 x 1024 x 4096 on sm_90a
  (wgmma: B row-major read MN-major through 16-byte copies, one wgmma group in flight, 4 stages),
  4096^3 with 3 stages beside it (copies one k-block ahead instead of two), and 4096^3 on sm_90
  (mma.sync, the previous kernel), the three shapes again with ``copy_engine="tma"``, each timed against ``torch.matmul`` (cuBLAS) on the same
  random device inputs (CUDA events, median of repeats).
Every sm_90a cubin is checked here before it is carried: its PTX reads B MN-major (imm-trans-b 1)
and keeps a group in flight (wait_group 1 in the k-loop, 0 after it), its SASS has HGMMA .tnspB,
no local memory and, per aligned k-block, no element loads (``tessera.codegen.sass_stats``); the
manifest records those k-block counts, the registers and the commit the cubins were built from.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import tessera as ts  # noqa: E402
from build_nvidia_bundle import DT, gemm, gemm_acc, launch_record  # noqa: E402

# edges in every dimension; n % 8 (B by element loads); several k-blocks (the pipeline turns over)
CHECKS = ((128, 128, 128), (70, 72, 48), (33, 29, 37), (256, 136, 200), (128, 256, 512))
BENCH = ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 1024, 4096))
STAGING_VARIANTS = (3,)       # 4096^3 also with these staging depths (the default is 4)


def tma_ok(m: int, n: int, k: int) -> bool:
    """Shapes whose 16-bit rows a tensor map can describe (row strides multiples of 16 bytes)."""
    return (2 * k) % 16 == 0 and (2 * n) % 16 == 0


def wgmma_kernel_facts(art, tma: bool = False) -> dict:
    """What the sm_90a cubin must show before it is carried (SystemExit otherwise); a copy-engine
    cubin (``tma``) stages by UTMALDG alone (no LDGSTS) and takes its maps by value."""
    import re
    from tessera.codegen import ptx_tools
    from tessera.codegen.sass_stats import loop_counts
    ptx = art.ptx()
    trans = re.findall(r"wgmma\.mma_async[^;]*, 1, 1, 1, 0, (\d);", ptx)
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    facts = {"b_major": "mn" if trans and set(trans) == {"1"} else "k", "wgmma_waits": [int(w) for w in waits]}
    sass = ptx_tools.sass(art.binary(), "sm_90a")
    if sass is not None:
        if re.search(r"\b(LDL|STL)\b", sass) or "HGMMA" not in sass:
            raise SystemExit("sm_90a cubin has local-memory traffic or no HGMMA")
        if tma and ("UTMALDG" not in sass or "LDGSTS" in sass):
            raise SystemExit("copy-engine cubin without UTMALDG, or with thread copies (LDGSTS)")
        facts["k_block"] = loop_counts(sass)["fast"]
    return facts


def build(out: Path, seed: int = 2026) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in ("f16", "bf16"):
        for (m, n, k), engine in [(s, None) for s in CHECKS] + [(s, "tma") for s in CHECKS if tma_ok(*s)]:
            a = rng.standard_normal((m, k)).astype(DT[dtype])
            b = rng.standard_normal((k, n)).astype(DT[dtype])
            c0 = rng.standard_normal((m, n)).astype(np.float32)
            art = ts.compile(gemm_acc, a, b, c0, target="nvidia", arch="sm_90a",
                             schedule={"copy_engine": engine} if engine else None)
            rec = art.report().kernels[0]["mma"]["record"]
            if not rec.startswith("nvidia.wgmma"):
                raise SystemExit(f"sm_90a check case selected {rec}, not wgmma")
            name = f"check_sm90a_{dtype}_{m}x{n}x{k}" + (f"_{engine}" if engine else "")
            (out / f"{name}.cubin").write_bytes(art.binary())
            np.save(out / f"{name}_emulated.npy", art.emulate(a, b, c0))
            files = []
            for i, arr in enumerate((a, b, c0)):
                f = f"{name}_in{i}.npy"
                np.save(out / f, arr.view(np.uint16) if arr.dtype == DT["bf16"] else arr)
                files.append({"file": f, "dtype": dtype if i < 2 else "f32"})
            cases.append({"name": name, "kind": "check", "cubin": f"{name}.cubin", "inputs": files, "mma": rec,
                          "emulated": f"{name}_emulated.npy", **launch_record(art, [a, b, c0])})
        variants = [("sm_90a", shape, None, None) for shape in BENCH] + \
            [("sm_90a", BENCH[0], st, None) for st in STAGING_VARIANTS] + [("sm_90", BENCH[0], None, None)] + \
            [("sm_90a", shape, None, "tma") for shape in BENCH]      # the copy engine beside the thread copies
        for arch, (m, n, k), staging, engine in variants:
            a, b = np.zeros((m, k), DT[dtype]), np.zeros((k, n), DT[dtype])   # compile only: timed on random data
            pins = {**({"staging": staging} if staging else {}), **({"copy_engine": engine} if engine else {})}
            art = ts.compile(gemm, a, b, target="nvidia", arch=arch, schedule=pins or None)
            name = f"bench_{arch}_{dtype}_{m}x{n}x{k}" + (f"_s{staging}" if staging else "") + \
                (f"_{engine}" if engine else "")
            facts = {}
            if arch == "sm_90a":
                facts = wgmma_kernel_facts(art, engine == "tma")
                if facts["b_major"] != "mn" or facts["wgmma_waits"] != [1, 0]:
                    raise SystemExit(f"{name}: expected B MN-major and wait_group 1 then 0, got {facts}")
            (out / f"{name}.cubin").write_bytes(art.binary())
            cases.append({"name": name, "kind": "bench", "cubin": f"{name}.cubin", "dtype": dtype, "m": m,
                          "n": n, "k": k, "flops": 2 * m * n * k, "staging": staging or "default",
                          "copy_engine": engine or "threads",
                          "mma": art.report().kernels[0]["mma"]["record"], **facts, **launch_record(art, [a, b])})
    from tessera.tools.bench_doc import git_state
    commit, dirty = git_state(ROOT)
    manifest = {"arch": "sm_90a", "built_with": "tessera.compile(target='nvidia', arch='sm_90a' | 'sm_90')",
                "commit": commit, "dirty": dirty, "cases": cases}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "hopper_bundle"))
    args = ap.parse_args(argv)
    man = build(Path(args.out))
    for c in man["cases"]:
        kb = c.get("k_block")
        kb = f" k-block: {kb.get('total')} instr, {kb.get('HGMMA')} HGMMA, {kb.get('LDGSTS')} LDGSTS" if kb else ""
        print(f"{c['name']:40} {c['mma']:32} regs {c['registers']:>4} smem {c['shared']:>6} grid {c['grid']}{kb}")
    print(f"wrote {len(man['cases'])} cases to {args.out} (commit {man['commit'][:12]}{' dirty' if man['dirty'] else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
