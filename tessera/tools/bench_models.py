"""``tessera bench models``: the model examples (``examples/models/``) against numpy, torch eager,
``torch.compile`` and ``jax.jit``, each at its sizes, in one run on the same random inputs.

Method: as ``tessera bench cpu`` (``bench_cpu._interleaved``: warm-up, interleaved rounds, a
pause before each call, medians).  Tessera is timed twice, on its default call path (results from
its reusing pool) and with fresh outputs like the peers (the pool off): the headline ratio is the
fastest peer's median over Tessera's with fresh outputs.  Each row also keeps where Tessera's
time goes by kernel family (``tessera.profile``) and the first call's seconds (trace + compile,
or the disk cache).  ``--write`` keeps the raw log as
``benchmarks/results/models/<host>/<date>-<commit>.json`` and re-renders ``docs/benchmarks.md``,
whose "Models" section :func:`section` renders from the latest log of each host.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from tessera.errors import BenchLogError

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / "benchmarks" / "results" / "models"
SCHEMA = 1
MODELS = ("gpt2_block", "llama_block", "bert_block", "mlp_train_step", "conv_block", "sampler")
MODELS += ("decode_attention",)
POOLED, FRESH = "tessera", "tessera (fresh outputs)"
PEERS = ("numpy", "torch", "torch.compile", "jax.jit")


def load_model(name: str):
    ex = str(ROOT / "examples")
    if ex not in sys.path:
        sys.path.insert(0, ex)
    return importlib.import_module(f"models.{name}")


def measure_row(name: str, size: str, reps: int | None) -> dict:
    import tessera as ts
    from tessera.tools import bench_cpu
    m = load_model(name)
    common = load_model("common")
    args, kwargs = m.make(np.random.default_rng(0), **m.SIZES[size])
    t0 = time.perf_counter()
    m.forward(*args, **kwargs)
    first = time.perf_counter() - t0
    fwd = lambda: m.forward(*args, **kwargs)  # noqa: E731
    cands = {POOLED: (bench_cpu.with_pool(fwd, True), ()), FRESH: (bench_cpu.with_pool(fwd, False), ())}
    cands.update({k: (f, ()) for k, f in common.peers(m, args, kwargs).items()})
    libs, rounds = bench_cpu._interleaved(cands, reps)
    prof = ts.profile(m.forward, *args, rounds=5, **kwargs)
    return {"model": name, "size": size, "sizes": m.SIZES[size], "first_call_s": first, "rounds": rounds,
            "libraries": libs, "families_s": prof.families, "profiled_call_s": prof.call_s}


def measure_rows(quick: bool, models, threads) -> list[dict]:
    from tessera.tools import bench_cpu
    if quick:
        bench_cpu.set_quick()
    rows = []
    for name in models:
        m = load_model(name)
        for size in (list(m.SIZES)[:1] if quick else m.SIZES):
            print(f"  {name} [{size}] ({threads} threads) ...", file=sys.stderr, flush=True)
            rows.append({**measure_row(name, size, 3 if quick else None), "threads": threads})
    return rows


def one_thread_rows(quick: bool, models) -> list[dict]:
    """The rows again in a child process pinned to one CPU, every library limited to one thread."""
    import subprocess
    env = dict(os.environ, TESSERA_BENCH_CHILD="1thread", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    cmd = ["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m", "tessera.tools.cli", "bench",
           "models", "--models", *models] + (["--quick"] if quick else [])
    child = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if child.returncode != 0:
        raise BenchLogError(f"the single-thread child failed (exit {child.returncode})")
    return json.loads(child.stdout.strip().splitlines()[-1])


def measure(quick: bool, models=MODELS, one_thread: bool = True) -> dict:
    from tessera.tools import bench_cpu, bench_doc
    rows = measure_rows(quick, models, "all")
    if one_thread:
        rows += one_thread_rows(quick, models)
    commit, dirty = bench_doc.git_state()
    return {"schema": SCHEMA, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
            "dirty": dirty, "quick": quick, "command": "./dev tessera bench models" + (" --quick" if quick else ""),
            "host": bench_cpu.host_record(), "software": bench_cpu.software(), "method": bench_cpu.method(),
            "load": list(os.getloadavg()), "rows": rows}


# --------------------------------------------------------------------------- logs and the document
def check(run: dict, where: str) -> None:
    for k in ("schema", "date", "commit", "quick", "host", "rows"):
        if k not in run:
            raise BenchLogError(f"{where}: a models run lacks {k!r}")
    if run["schema"] != SCHEMA:
        raise BenchLogError(f"{where}: schema {run['schema']!r}; this renderer reads schema {SCHEMA}")
    for r in run["rows"]:
        libs = r.get("libraries", {})
        if FRESH not in libs or POOLED not in libs or any(not v.get("times_s") for v in libs.values()):
            raise BenchLogError(f"{where}: row {r.get('model')!r} lacks timings")


def write_run(run: dict, log_dir: Path = LOG_DIR) -> Path:
    from tessera.tools import bench_doc
    return bench_doc.keep_log(run, log_dir, check)


def latest_runs(log_dir: Path = LOG_DIR) -> list[dict]:
    """Each host's latest full run, else its latest quick one (``bench_doc.latest_run``'s rule)."""
    from tessera.tools import bench_doc
    return bench_doc.latest_logs(log_dir, check)


def render_run(run: dict) -> list[str]:
    from tessera.tools import bench_doc
    h = run["host"]
    out = [f"### `{h['slug']}`: {h['cpu_model']} (LLVM {h['llvm_cpu']}; {h['isa']}), {h['usable_cpus']} CPUs "
           f"-- {run['date'][:10]}, commit `{run['commit'][:12]}`" + (", `--quick`: a smoke test" if run["quick"]
                                                                      else ""), "",
           "| model | size | threads | tessera (fresh) ms | tessera (pool) ms | " + " | ".join(f"{p} ms" for p in PEERS)
           + " | ratio, matched | time by family (tessera) | first call s |",
           "|---|---|---|---|---|" + "---|" * len(PEERS) + "---|---|---|"]
    for r in run["rows"]:
        libs = r["libraries"]
        med = {k: bench_doc.median(v["times_s"]) for k, v in libs.items()}
        peers = {k: v for k, v in med.items() if k in PEERS}
        best = min(peers.items(), key=lambda kv: kv[1]) if peers else None
        ratio = f"{best[1] / med[FRESH]:.2f} ({best[0]})" if best else "--"
        fam = r.get("families_s", {})
        tot = sum(fam.values()) or 1.0
        split = ", ".join(f"{k} {v / tot:.0%}" for k, v in sorted(fam.items(), key=lambda kv: -kv[1]))
        sizes = " ".join(f"{k}={v}" for k, v in r["sizes"].items())
        cells = [f"{med[p] * 1e3:.2f}" if p in med else "--" for p in PEERS]
        out.append(f"| {r['model']} | {sizes} | {r.get('threads', 'all')} | {med[FRESH] * 1e3:.2f} | {med[POOLED] * 1e3:.2f} | "
                   + " | ".join(cells) + f" | {ratio} | {split} | {r['first_call_s']:.2f} |")
    return out


def section(log_dir: Path = LOG_DIR) -> list[str]:
    runs = latest_runs(log_dir)
    out = ["## Models", "",
           "Command: `./dev tessera bench models --write` (the examples in `examples/models/`, each at its sizes; "
           "raw logs in `benchmarks/results/models/<host>/`).  Ratio, matched: the fastest peer's median over "
           "Tessera's with fresh outputs (above 1: Tessera is faster).  Time by family: where Tessera's call goes "
           "(`tessera.profile`).  First call: trace and compile (or the disk cache).", ""]
    if not runs:
        return out + ["No models run has been recorded yet.", ""]
    for run in runs:
        out += render_run(run) + [""]
    return out


def main(args) -> int:
    quick = getattr(args, "quick", False)
    models = tuple(getattr(args, "models", None) or MODELS)
    if os.environ.get("TESSERA_BENCH_CHILD") == "1thread":   # one_thread_rows's child
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            pass
        print(json.dumps(measure_rows(quick, models, 1), allow_nan=False))
        return 0
    t0 = time.perf_counter()
    run = measure(quick, models, one_thread=not getattr(args, "all_threads_only", False))
    run["elapsed_s"] = round(time.perf_counter() - t0, 1)
    print("\n".join(render_run(run)))
    if getattr(args, "write", False):
        from tessera.tools import bench_doc
        print(f"kept the run's raw log as {write_run(run)}")
        (ROOT / "docs" / "benchmarks.md").write_text(bench_doc.render_doc())
        print("wrote docs/benchmarks.md")
    return 0


__all__ = ["MODELS", "main", "measure", "render_run", "section", "write_run"]
