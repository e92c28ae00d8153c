"""Build what ``rows_bench.py`` needs on a GPU machine (which has no xDSL): the row kernels'
cubins (softmax, layer_norm, rms_norm, a fused elementwise chain, a row sum), their launch records,
and for small check cases the inputs and this machine's SIMT-emulator outputs.

    ./dev python benchmarks/gpu/build_rows_bundle.py --arch sm_90 --out benchmarks/gpu/rows_bundle

Every kernel comes from ``tessera.compile(..., target="nvidia", arch=...)`` (the production lane
through all four layers); the row length is symbolic there, so one cubin serves the check shape
and the timed 16384 x 8192 shape, each with its own launch record.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tessera as ts  # noqa: E402
from build_nvidia_bundle import launch_record  # noqa: E402

DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
CHECK = (37, 1000)            # rows not a multiple of anything; 1000 columns: a partial 2048-column chunk
BENCH = (16384, 8192)


def softmax(x):
    return ts.ops.softmax(x)


def layer_norm(x, g, b):
    return ts.ops.layer_norm(x, g, b)


def rms_norm(x, g):
    return ts.ops.rms_norm(x, g)


def gelu_bias(x, b):
    return ts.ops.gelu(x + b)


def row_sum(x):
    return x.sum(-1)


# name -> (function, torch expression for the same result; x, g, b are torch tensors there)
KERNELS = {
    "softmax": (softmax, "torch.softmax(x, -1)", 1),
    "layer_norm": (layer_norm, "torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, 1e-5)", 3),
    "rms_norm": (rms_norm, "torch.nn.functional.rms_norm(x, (x.shape[-1],), g, 1e-6)", 2),
    "gelu_bias": (gelu_bias, "torch.nn.functional.gelu(x + b, approximate='tanh')", 2),
    "row_sum": (row_sum, "x.sum(-1)", 1),
}


def _args(rng, rows: int, cols: int, dtype: str, n: int) -> list[np.ndarray]:
    x = rng.standard_normal((rows, cols)).astype(DT[dtype])
    vecs = [(1 + 0.1 * rng.standard_normal(cols)).astype(DT[dtype]), (0.1 * rng.standard_normal(cols)).astype(DT[dtype])]
    if n == 2:
        vecs = vecs[:1]
    return [x] + vecs[:n - 1]


def _save(out: Path, name: str, a: np.ndarray) -> dict:
    dtype = "bf16" if a.dtype == ml_dtypes.bfloat16 else a.dtype.name
    np.save(out / name, a.view(np.uint16) if dtype == "bf16" else a)
    return {"file": name, "dtype": dtype, "shape": list(a.shape)}


def build(arch: str, out: Path, dtypes: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    cases = []
    for name, (fn, torch_expr, nargs) in KERNELS.items():
        for dtype in dtypes:
            args = _args(rng, *CHECK, dtype, nargs)
            art = ts.compile(fn, *args, target="nvidia", arch=arch)
            cubin = f"{name}_{dtype}.cubin"
            (out / cubin).write_bytes(art.binary())
            emulated = np.asarray(art.emulate(*args)).astype(np.float64)
            tag = f"{name}_{dtype}"
            np.save(out / f"{tag}_emulated.npy", emulated)
            check = {"inputs": [_save(out, f"{tag}_in{i}.npy", a) for i, a in enumerate(args)],
                     "emulated": f"{tag}_emulated.npy", **launch_record(art, args)}
            big = [np.zeros(BENCH, DT[dtype])] + [np.zeros(BENCH[1], DT[dtype])] * (nargs - 1)
            bench = launch_record(art, big)
            cases.append({"name": tag, "kernel_name": name, "dtype": dtype, "cubin": cubin, "torch": torch_expr,
                          "nargs": nargs, "check": check, "bench": {**bench, "shape": list(BENCH)}})
            print(f"{tag:18s} registers {check['registers']:3d} block {check['block'][0]} "
                  f"grid(bench) {bench['grid']}", flush=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    manifest = {"arch": arch, "commit": head.stdout.strip() or "unknown", "dirty": bool(dirty.stdout.strip()),
                "cases": cases}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu" / "rows_bundle")
    p.add_argument("--dtypes", default="f16,bf16")
    a = p.parse_args(argv)
    build(a.arch, a.out, a.dtypes.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
