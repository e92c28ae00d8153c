"""Build what ``nvidia_check.py`` needs on a GPU machine (which has no xDSL): cubins, their
launch records, and for the numerics cases the inputs and this machine's warp-emulator outputs.

    python benchmarks/gpu/build_nvidia_bundle.py --arch sm_90 --out benchmarks/gpu/bundle

Every kernel comes from ``tessera.compile(..., target="nvidia", arch=...)`` — the production
lane through all four layers — and its launch (grid, block, size arguments) from the artifact's
host program evaluated for the case's shapes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tessera as ts  # noqa: E402
from tessera.ir import dims as D  # noqa: E402
from tessera.runtime.cpu import _eval, bind_symbols  # noqa: E402

DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


# schedule pins timed by --sweep (block tiles, k-block, staging depth, warp tiles)
SWEEP = [{"staging": 3}, {"staging": 4}, {"tile_k": 64}, {"tile_k": 64, "staging": 3},
         {"register_tile": (2, 4)}, {"register_tile": (4, 2)}, {"tile_m": 64, "register_tile": (2, 4)},
         {"tile_n": 64, "register_tile": (4, 2)}, {"tile_m": 64, "tile_n": 64, "register_tile": (2, 2)},
         {"register_tile": (2, 4), "staging": 3}, {"register_tile": (4, 2), "staging": 3},
         {"register_tile": (2, 4), "staging": 4}, {"register_tile": (2, 4), "tile_k": 64, "staging": 3}]


def gemm(a, b):
    return a @ b                                  # f16/bf16 out, f32 accumulation (what torch.matmul does)


def gemm_acc(a, b, c0):
    return ts.ops.matmul(a, b, out_dtype=np.float32) + c0


def launch_record(art, arrays) -> dict:
    exe = art.compiled.executable
    prog = exe.program
    if len(prog.steps) != 1:
        raise SystemExit("expected one kernel launch")
    s = prog.steps[0]
    env = bind_symbols(prog.inputs, arrays)
    outs = [{"shape": [_eval(d, env) for d in t.dims], "dtype": t.np_dtype.name} for t in s.out_types]
    abi = art.abi()[0]
    return {"kernel": s.kernel, "grid": [D.evaluate_extent(e, env) for e in s.grid], "block": [s.block, 1, 1],
            "shared": abi["shared_bytes"], "sizes": [_eval(d, env) for d in s.dims], "outputs": outs, "abi": abi,
            "registers": art.report().kernels[0].get("registers"),
            "spill_bytes": art.report().kernels[0].get("spill_stores", 0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "gpu" / "bundle"))
    ap.add_argument("--size", type=int, default=4096, help="M = N = K of the timed GEMMs")
    ap.add_argument("--sweep", action="store_true", help="also time f16 GEMMs under the schedule pins in SWEEP")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    cases = []
    for dtype in ("f16", "bf16"):
        # numerics: edges in every dimension, the real accumulator C0, inputs and emulator outputs carried
        for m, n, k in ((70, 72, 48), (33, 29, 37), (256, 136, 200)):
            a = rng.standard_normal((m, k)).astype(DT[dtype])
            b = rng.standard_normal((k, n)).astype(DT[dtype])
            c0 = rng.standard_normal((m, n)).astype(np.float32)
            art = ts.compile(gemm_acc, a, b, c0, target="nvidia", arch=args.arch)
            name = f"check_{dtype}_{m}x{n}x{k}"
            (out / f"{name}.cubin").write_bytes(art.binary())
            emulated = art.emulate(a, b, c0)
            files = []
            for i, arr in enumerate((a, b, c0)):
                f = f"{name}_in{i}.npy"
                np.save(out / f, arr.view(np.uint16) if arr.dtype == DT["bf16"] else arr)
                files.append({"file": f, "dtype": dtype if i < 2 else "f32"})
            np.save(out / f"{name}_emulated.npy", emulated)
            cases.append({"name": name, "kind": "check", "cubin": f"{name}.cubin", "inputs": files,
                          "emulated": f"{name}_emulated.npy", **launch_record(art, [a, b, c0])})
        # timing: M = N = K = size, inputs generated on the GPU machine from a seed
        s = args.size
        a = np.zeros((s, s), DT[dtype])
        art = ts.compile(gemm, a, a, target="nvidia", arch=args.arch)
        name = f"bench_{dtype}_{s}"
        (out / f"{name}.cubin").write_bytes(art.binary())
        cases.append({"name": name, "kind": "bench", "cubin": f"{name}.cubin", "dtype": dtype, "m": s, "n": s, "k": s,
                      "flops": 2 * s ** 3, **launch_record(art, [a, a])})
    for pins in SWEEP if args.sweep else ():
        s = args.size
        a = np.zeros((s, s), DT["f16"])
        try:
            art = ts.compile(gemm, a, a, target="nvidia", arch=args.arch, schedule=pins)
        except ts.TesseraError as e:
            print(f"sweep {pins}: {e.code}")
            continue
        name = "bench_f16_" + "_".join(f"{k}{'x'.join(map(str, v)) if isinstance(v, tuple) else v}"
                                       for k, v in pins.items())
        (out / f"{name}.cubin").write_bytes(art.binary())
        cases.append({"name": name, "kind": "bench", "cubin": f"{name}.cubin", "dtype": "f16", "m": s, "n": s, "k": s,
                      "flops": 2 * s ** 3, **launch_record(art, [a, a])})
    # the commit the cubins were built from: device_run.sh copies it into the run's commit.json
    from tessera.tools.bench_doc import git_state  # noqa: E402
    commit, dirty = git_state(ROOT)
    manifest = {"arch": args.arch, "built_with": "tessera.compile(target='nvidia')", "commit": commit,
                "dirty": dirty, "cases": cases}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {len(cases)} cases to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
