"""AdamW step over a GPT-2-style parameter set (``tools/train_workloads.make_step``'s twelve
tensors per block, ``--blocks`` blocks): launches per step, bytes the runtime allocates per step,
resident-set growth over the steps, and the median step time, with and without donation.

    ./dev python benchmarks/adamw_bench.py --dim 768 --blocks 4 --steps 20

Runs on whatever ``tessera`` imports (a checkout older than ``donate=`` reports ``donate``
unsupported).  Times on a shared machine are rough: the printed header says so.
"""
from __future__ import annotations

import argparse
import inspect
import resource
import statistics
import time

import numpy as np


def params_of(dim: int, blocks: int, rng) -> list[np.ndarray]:
    d = dim
    shapes = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return [rng.standard_normal(s).astype(np.float32) * 0.02 for _ in range(blocks) for s in shapes]


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (resource.getpagesize() // 1024)


def run(dim: int, blocks: int, steps: int, donate: bool) -> dict:
    from tessera import optim
    from tessera.runtime import cpu, memory
    rng = np.random.default_rng(0)
    P = params_of(dim, blocks, rng)
    M = [np.zeros_like(p) for p in P]
    V = [np.zeros_like(p) for p in P]
    G = [rng.standard_normal(p.shape).astype(np.float32) * 1e-3 for p in P]
    kw = {"donate": True} if donate else {}
    allocated = []
    real = {n: getattr(memory, n) for n in ("empty", "scratch")}

    def counting(name):
        def f(shape, dtype):
            a = real[name](shape, dtype)
            allocated[-1] += a.nbytes
            return a
        return f
    P, M, V = optim.adamw(P, G, M, V, 1, **kw)   # compile and warm
    rss0 = rss_kib()
    times, launches = [], []
    for t in range(2, steps + 2):
        allocated.append(0)
        memory.empty, memory.scratch = counting("empty"), counting("scratch")
        cpu.STEP_TIMES = []
        t0 = time.perf_counter()
        P, M, V = optim.adamw(P, G, M, V, t, lr=1e-3, **kw)
        times.append(time.perf_counter() - t0)
        launches.append(len(cpu.STEP_TIMES))
        cpu.STEP_TIMES = None
        memory.empty, memory.scratch = real["empty"], real["scratch"]
    return {"params": len(P), "param_mib": sum(p.nbytes for p in P) / 2**20, "median_ms": 1e3 * statistics.median(times),
            "launches": statistics.median(launches), "alloc_mib": statistics.median(allocated) / 2**20,
            "rss_growth_mib": (rss_kib() - rss0) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--donate", choices=("yes", "no", "both"), default="both")
    a = ap.parse_args()
    from tessera import optim
    can = "donate" in inspect.signature(optim.adamw).parameters
    print(f"# AdamW step, GPT-2-style parameters: dim {a.dim}, {a.blocks} blocks, {a.steps} steps "
          "(machine shared with other jobs: times are *loaded*)")
    for donate in {"yes": [True], "no": [False], "both": [False, True]}[a.donate]:
        if donate and not can:
            print("donate=True: unsupported by this checkout")
            continue
        r = run(a.dim, a.blocks, a.steps, donate)
        print(f"donate={donate!s:<5} params {r['params']} ({r['param_mib']:.1f} MiB)  launches/step {r['launches']:.0f}  "
              f"allocated/step {r['alloc_mib']:.2f} MiB  RSS growth {r['rss_growth_mib']:.1f} MiB  "
              f"step {r['median_ms']:.2f} ms (median, loaded)")


if __name__ == "__main__":
    main()
