"""Calibrate the register-tile cost model: measure GEMM GFLOP/s per MR x NR on this CPU.

``tessera bench tiles [--write]`` compiles a GEMM on every usable CPU (as kernels run by
default; the team shares B panels, so a tile's cost includes its cache traffic) for each
candidate register tile of the selected record and times it on a set of shapes — square and odd ones,
since edge tiles are part of a tile's cost — in interleaved rounds (so that drift of the
machine does not favour one tile), median per shape, geometric mean over shapes; it prints
the table and ``--write`` stores it in ``tessera/mma/calibration.json`` under the CPU name,
where ``register_tile`` prefers measured figures to the model.
"""
from __future__ import annotations

import json
import time

import numpy as np


SHAPES = ((2048, 2048, 2048), (1000, 1000, 1000), (777, 513, 1029))


def measure(dtype: str = "f32", shapes=SHAPES, tiles=None, rounds: int = 9, threads: int = 0) -> dict[str, float]:
    import tessera as ts
    from tessera.mma.selector import get_isa, ranked_register_tiles, select_mma
    isa = get_isa("x86", None)
    sel = select_mma(isa, dtype, out_dtype="f32")
    if tiles is None:   # one to four vectors wide, leaving LLVM at least 3 free registers (on Zen 4
        ranked = ranked_register_tiles(isa, sel)   # the 31-register tiles 9x3 and 14x2 spilled)
        tiles = sorted((t.mr, t.nr) for t in ranked if t.mr * t.nr >= 8 and t.registers <= isa.register_budget - 3)
    rng = np.random.default_rng()
    npdt = np.float32 if dtype == "f32" else ts.bfloat16
    data = [(rng.standard_normal((m, k)).astype(npdt), rng.standard_normal((k, n)).astype(npdt), 2 * m * n * k)
            for m, n, k in shapes]
    fns = {}
    for mr, nr in tiles:
        fns[(mr, nr)] = ts.jit(lambda x, w: ts.ops.matmul(x, w, out_dtype=np.float32) if dtype != "f32" else x @ w,
                               schedule={"register_tile": (mr, nr), **({"threads": threads} if threads else {})})
        for a, b, _ in data:
            fns[(mr, nr)](a, b)
    times: dict = {(t, i): [] for t in tiles for i in range(len(data))}
    for _ in range(rounds):
        for t in tiles:
            for i, (a, b, _) in enumerate(data):
                t0 = time.perf_counter()
                fns[t](a, b)
                times[(t, i)].append(time.perf_counter() - t0)
    out = {}
    for t in tiles:
        rates = [flops / float(np.median(times[(t, i)])) / 1e9 for i, (_, _, flops) in enumerate(data)]
        out[f"{t[0]}x{t[1]}"] = round(float(np.exp(np.mean(np.log(rates)))), 1)
    return {"record": sel.record.id, "arch": isa.arch, "gflops": out, "threads": threads or "all"}


def write(result: dict) -> None:
    from tessera.mma.selector import CALIBRATION
    data = json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else {}
    data.setdefault(result["arch"], {})[result["record"]] = result["gflops"]
    CALIBRATION.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
