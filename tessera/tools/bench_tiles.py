"""Calibrate the register-tile cost model: measure GEMM GFLOP/s per MR x NR on this CPU.

``tessera bench tiles [--write]`` compiles a single-threaded GEMM for each candidate
register tile of the selected record, times it (median of repeats after warm-up, random
data), and prints the table; ``--write`` stores it in ``tessera/mma/calibration.json``
under the CPU name, where ``register_tile`` prefers measured figures to the model.
"""
from __future__ import annotations

import json
import time

import numpy as np


def measure(dtype: str = "f32", n: int = 2048, tiles=None, reps: int = 5) -> dict[str, float]:
    import tessera as ts
    from tessera.mma.selector import get_isa, ranked_register_tiles, select_mma
    isa = get_isa("x86", None)
    sel = select_mma(isa, dtype, out_dtype="f32")
    if tiles is None:
        ranked = ranked_register_tiles(isa, sel)
        tiles = sorted({(t.mr, t.nr) for t in ranked[:12]} | {(6, 2), (4, 2), (8, 2), (6, 3), (12, 2), (4, 3)})
        tiles = [t for t in tiles if t[0] * t[1] + t[1] + 1 <= isa.register_budget]
    rng = np.random.default_rng()
    npdt = np.float32 if dtype == "f32" else ts.bfloat16
    a = rng.standard_normal((n, n)).astype(npdt)
    b = rng.standard_normal((n, n)).astype(npdt)
    out = {}
    for mr, nr in tiles:
        f = ts.jit(lambda x, w: ts.ops.matmul(x, w, out_dtype=np.float32) if dtype != "f32" else x @ w,
                   schedule={"register_tile": (mr, nr), "threads": 1})
        f(a, b)
        ts_ = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f(a, b)
            ts_.append(time.perf_counter() - t0)
        out[f"{mr}x{nr}"] = round(2 * n ** 3 / float(np.median(ts_)) / 1e9, 1)
    return {"record": sel.record.id, "arch": isa.arch, "gflops": out}


def write(result: dict) -> None:
    from tessera.mma.selector import CALIBRATION
    data = json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else {}
    data.setdefault(result["arch"], {})[result["record"]] = result["gflops"]
    CALIBRATION.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
