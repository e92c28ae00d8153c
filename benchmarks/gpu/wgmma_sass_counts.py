"""SASS of the sm_90a wgmma GEMM's k-loop: instructions per k-block by class, with ptxas -v.

    ./dev python benchmarks/gpu/wgmma_sass_counts.py                 # 4096^3 bf16, A @ B and A @ W^T

Counted by ``tessera.codegen.sass_stats``: ``static_*`` every instruction of the loop (both arms
of the copies' aligned/edge branch), ``fast_*`` what a k-block executes when its operands are
16-byte aligned; classes: total, HGMMA, LDG, LDGSTS, STS, LDS, integer ALU (IMAD, IADD3, LOP3,
SHF, LEA, ISETP, SEL, ...), sync (BAR, WARPGROUP, DEPBAR, ...).  Counts, not timings.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tessera as ts  # noqa: E402
from tessera.codegen import ptx_tools  # noqa: E402
from tessera.codegen.sass_stats import loop_counts  # noqa: E402


def measure(fn, arrays, label: str, **schedule) -> dict:
    art = ts.compile(fn, *arrays, target="nvidia", arch="sm_90a", schedule=schedule or None)
    k = art.report().kernels[0]
    sass = ptx_tools.sass(art.binary(), "sm_90a")
    if sass is None:
        raise SystemExit("nvdisasm not installed (./dev installs nvidia-cuda-nvdisasm)")
    row = {"case": label, "mma": k["mma"]["record"], "registers": k["registers"], "spill_stores": k["spill_stores"],
           "spill_loads": k["spill_loads"], "smem_bytes": k["smem_bytes"],
           **{f"{kind}_{k}": v for kind, c in loop_counts(sass).items() for k, v in c.items()}}
    row["wgmma_wait"] = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", art.ptx())
    return row


def main(argv=None) -> int:
    import ml_dtypes
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    args = ap.parse_args(argv)
    n = args.size
    a = np.ones((n, n), ml_dtypes.bfloat16)
    rows = [measure(lambda x, y: x @ y, (a, a), f"A @ B {n}^3 bf16"),
            measure(lambda x, w: x @ w.T, (a, a), f"A @ W^T {n}^3 bf16")]
    for r in rows:
        print(" ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
