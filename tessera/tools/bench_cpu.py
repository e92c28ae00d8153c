"""``tessera bench cpu``: Tessera's CPU lane against its peers, in one run, on the same random inputs.

Method: every workload gets fresh random inputs (never zeros); each implementation is called twice
to warm up, then timed in interleaved rounds (one call of each implementation per round); the
document reports medians.  Peers: numpy (OpenBLAS) and, when installed (the ``bench`` extra), torch
eager, ``torch.compile`` and ``jax.jit``.  Single-thread rows run in a child process pinned to one
CPU (affinity, OPENBLAS/OMP threads 1, torch threads 1); the others use every CPU this process may
use.

Allocation: Tessera's default call path returns results from its reusing huge-page pool
(``runtime/memory.py``); the peers return fresh outputs.  Every row therefore times Tessera twice:
``tessera`` (its default path, the pool) and ``tessera (fresh outputs)`` (the pool switched off: a
fresh ``numpy.empty`` per result, the peers' policy), and counts the minor page faults of every
timed call (``getrusage`` before and after).  ``tessera/tools/bench_doc.py`` computes both ratios
from the raw timings (the headline one with the same policy for everyone).

Raw log: ``--write`` keeps the run (host, commit, date, versions, load, every timing and fault
count of every round) as ``benchmarks/results/cpu/<host>/<date>-<commit>.json`` and re-renders
``docs/benchmarks.md`` from the logs; ``--log-dir DIR`` writes the log (and DIR/benchmarks.md)
elsewhere.  ``--quick`` (small sizes, three rounds) is a smoke test of the same path; its log is
marked quick and the document shows it only for a host without a full run.
"""
from __future__ import annotations

import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from tessera.tools import bench_doc, bench_peaks
from tessera.tools.bench_peaks import amx_peak, bf16_instruction, fma_peak

REPS = 7
# A row whose rounds are cheap keeps adding rounds, up to MAX_REPS, while its timed rounds have taken
# under ROUNDS_BUDGET_S: calls of a few milliseconds on this VM vary by 10-15 % from one call to the
# next, and the ratio takes the best of three peers' medians, which seven rounds bias downwards
# (sgemm 1024^3 on two threads, three runs of the same row: 0.91-1.02 at 7 rounds, 1.00-1.08 at 21).
MAX_REPS = 21
ROUNDS_BUDGET_S = 15.0
# Peers' thread pools keep spinning after a call returns (OpenMP's GOMP_SPINCOUNT, OpenBLAS's
# workers): whoever is timed next would share the cores with them.  Every measurement starts
# after this pause, so no library is timed in another's spin-down.
QUIESCE_S = 0.3
# ... and a call shorter than this gets one untimed call after the pause (it wakes the library's
# threads); longer calls are timed as they come
WAKE_BELOW_S = 0.25
# the pause before each call of ``paired_overhead``, which times Tessera only: its workers poll for
# runtime.workers.SPIN_SECONDS (2 ms) after a call and then sleep
PAIR_PAUSE_S = 0.05
# ... and its rounds: at least PAIR_LEAST, more while under PAIR_BUDGET_S, at most PAIR_MOST
PAIR_LEAST, PAIR_MOST, PAIR_BUDGET_S = 41, 201, 30.0


def set_quick() -> None:
    """``--quick``: three rounds per row, short pauses, short peak loops."""
    global REPS, MAX_REPS, QUIESCE_S, PAIR_LEAST, PAIR_MOST
    REPS = MAX_REPS = 3
    QUIESCE_S = 0.02
    PAIR_LEAST = PAIR_MOST = 5
    bench_peaks.DIVISOR = 10


def method() -> dict:
    return {"reps": REPS, "max_reps": MAX_REPS, "rounds_budget_s": ROUNDS_BUDGET_S, "quiesce_s": QUIESCE_S,
            "wake_below_s": WAKE_BELOW_S, "pair_pause_s": PAIR_PAUSE_S, "pair_least": PAIR_LEAST,
            "pair_most": PAIR_MOST, "pair_budget_s": PAIR_BUDGET_S}


def sizes(quick: bool) -> dict:
    """Every workload's shape: the full run's, or ``--quick``'s small ones."""
    if quick:
        return {"gemm": [(256, 256, 256), (200, 150, 300)], "bf16": 256, "gelu": (256, 128, 512),
                "rows": (4096, 2048), "seqs": (128,), "copy": (1024, 1024), "touch_mib": 32}
    return {"gemm": [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (1000, 1000, 1000),
                     (777, 513, 1029)], "bf16": 2048, "gelu": (2048, 1024, 4096), "rows": (8192, 4096),
            "seqs": (1024, 4096), "copy": (8192, 4096), "touch_mib": 128}


def minflt() -> int:
    """Minor page faults of this process so far (every thread)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _peers():
    out = {}
    try:
        import torch
        out["torch"] = torch
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp
        out["jax"] = (jax, jnp)
    except ImportError:
        pass
    return out


def _torch_fns(torch, kind: str):
    F = torch.nn.functional
    fns = {
        "gemm": lambda a, b: a @ b,
        "gelu": lambda x, w, b: F.gelu(x @ w + b, approximate="tanh"),
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b, 1e-5),
        "rms_norm": lambda x, g: F.rms_norm(x, (x.shape[-1],), g, 1e-6),
        "attention": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "attention_causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    return fns[kind]


def _jax_fn(jax, jnp, kind: str):
    fns = {
        "gemm": lambda a, b: a @ b,
        "gelu": lambda x, w, b: jax.nn.gelu(x @ w + b, approximate=True),
        "softmax": lambda x: jax.nn.softmax(x, -1),
        "layer_norm": lambda x, g, b: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(
            x.var(-1, keepdims=True) + 1e-5) * g + b,
        "rms_norm": lambda x, g: x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g,
        "attention": lambda q, k, v: jax.nn.dot_product_attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                                                                  v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3),
        "attention_causal": lambda q, k, v: jax.nn.dot_product_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
            is_causal=True).transpose(0, 2, 1, 3),
    }
    return jax.jit(fns[kind])


def _numpy_fn(kind: str):
    def gelu(x, w, b):
        u = x @ w + b
        return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def layer_norm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    def rms_norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g

    def attention(q, k, v, causal=False):
        s = q @ np.swapaxes(k, -1, -2) / np.float32(math.sqrt(q.shape[-1]))
        if causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        return softmax(s) @ v

    return {"gemm": np.matmul, "gelu": gelu, "softmax": softmax, "layer_norm": layer_norm, "rms_norm": rms_norm,
            "attention": attention, "attention_causal": lambda q, k, v: attention(q, k, v, True)}[kind]


def _tessera_fn(kind: str, threads: int | None):
    import tessera as ts
    fns = {
        "gemm": lambda a, b: a @ b,
        "gelu": lambda x, w, b: ts.ops.gelu(x @ w + b),
        "softmax": lambda x: ts.ops.softmax(x),
        "layer_norm": lambda x, g, b: ts.ops.layer_norm(x, g, b),
        "rms_norm": lambda x, g: ts.ops.rms_norm(x, g),
        "attention": lambda q, k, v: ts.ops.attention(q, k, v),
        "attention_causal": lambda q, k, v: ts.ops.attention(q, k, v, causal=True),
    }
    return ts.jit(fns[kind], schedule={"threads": threads} if threads else None)



def _more_rounds(done: int, least: int, most: int, start: float, budget_s: float) -> bool:
    """Whether to time another round: up to ``least`` always, then up to ``most`` while the rounds
    since ``start`` have taken under ``budget_s``."""
    return done < least or done < most and time.perf_counter() - start < budget_s


def _interleaved(cands: dict, reps: int | None = None) -> tuple[dict[str, dict], int]:
    """Every timing of each ``name -> (fn, args)`` and the number of rounds, measured in rounds
    (``reps``, else from REPS up to MAX_REPS within ROUNDS_BUDGET_S): every round times each
    candidate once (who goes first rotates), so a drift in the host's speed during the row reaches
    every library alike instead of whichever was measured in the slow moment.  Each timing follows
    a pause (peers' thread pools spin after a call) and, for calls under ``WAKE_BELOW_S``, one
    untimed call that wakes the library's threads.  Returns ``name -> {"warm_s", "times_s",
    "minflt"}``: the second warm-up call's time, then per round the call's seconds and the minor
    page faults the process took during it."""
    warm = {}
    for name, (fn, args) in cands.items():
        time.sleep(QUIESCE_S)
        fn(*args)
        t0 = time.perf_counter()
        fn(*args)
        warm[name] = time.perf_counter() - t0
    names = list(cands)
    out = {n: {"warm_s": warm[n], "times_s": [], "minflt": []} for n in names}
    least, most = (reps, reps) if reps else (REPS, MAX_REPS)
    start = time.perf_counter()
    r = 0
    while _more_rounds(r, least, most, start, ROUNDS_BUDGET_S):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn, args = cands[n]
            time.sleep(QUIESCE_S)
            if warm[n] < WAKE_BELOW_S:
                fn(*args)
            f0 = minflt()
            t0 = time.perf_counter()
            fn(*args)
            t1 = time.perf_counter()
            out[n]["minflt"].append(minflt() - f0)
            out[n]["times_s"].append(t1 - t0)
        r += 1
    return out, r


def paired_overhead(fn, args, base_fn, base_args, least: int | None = None, most: int | None = None,
                    budget_s: float | None = None) -> dict:
    """The cost of ``fn`` over ``base_fn`` from calls timed back to back: each round times both
    (who goes first alternates); the log keeps every pair and the document reports the median of
    the rounds' ratios with a bootstrap 95 % interval.  The two calls of a round are a fraction of
    a second apart, so the VM's drift (up to about 1.5x over minutes) cancels in each ratio, where a
    ratio of medians taken over a row of peers would not resolve the few per cent this measures.
    Rounds are added (``least`` to ``most``, within ``budget_s``) because single calls of the same
    kernel vary by about 5 % here: 21 rounds of the gelu(x@w+b) pair, run four times in one process,
    read +0.2 to +4.6 % (81 rounds: +1.3 to +3.0 %).  Both callables are Tessera's, whose workers
    sleep after ``SPIN_SECONDS`` of polling, so the pause before each call is ``PAIR_PAUSE_S``."""
    least = PAIR_LEAST if least is None else least
    most = PAIR_MOST if most is None else most
    budget_s = PAIR_BUDGET_S if budget_s is None else budget_s
    for f, a in ((fn, args), (base_fn, base_args)):
        f(*a)
    pairs = []
    start = time.perf_counter()
    while _more_rounds(len(pairs), least, most, start, budget_s):
        pair = [0.0, 0.0]
        for i in ((0, 1) if len(pairs) % 2 == 0 else (1, 0)):
            f, a = ((fn, args), (base_fn, base_args))[i]
            time.sleep(PAIR_PAUSE_S)
            t0 = time.perf_counter()
            f(*a)
            pair[i] = time.perf_counter() - t0
        pairs.append(pair)
    return {"times_s": pairs, "ratios": [p[0] / p[1] for p in pairs]}


def with_pool(fn, enabled: bool):
    """``fn`` called with Tessera's output pool on (its default call path) or off (a fresh
    ``numpy.empty`` for every result and intermediate, the peers' policy), whatever the setting
    outside (``TESSERA_POOL``)."""
    from tessera.runtime import memory

    def call(*a):
        before = memory.POOL.enabled
        memory.POOL.enabled = enabled
        try:
            return fn(*a)
        finally:
            memory.POOL.enabled = before
    return call


TUNED = "tessera tuned"      # the tuned kernel's name among a row's "also" callables
TUNABLE = ("gemm", "gelu", "softmax", "layer_norm", "rms_norm")


def tuning_enabled() -> bool:
    return os.environ.get("TESSERA_BENCH_TUNED") == "1"


def _tuned_fn(kind: str, threads: int | None, tf, inputs) -> tuple[object | None, dict]:
    """A jitted function compiled with the schedule ``tessera.tune`` finds for ``inputs`` (into the
    bench's private database), and what the tuning found.  ``tf`` (the untuned one) is compiled
    first, so it keeps the cost model's schedule: the database holds nothing for it yet."""
    import tempfile

    import tessera as ts
    from tessera.errors import TesseraError
    from tessera.frontend.tune import label
    # a database of its own, so the untuned column stays the cost model's even where the user's
    # database has entries (the key's thread count keeps the 1-thread and all-thread rows apart)
    os.environ["TESSERA_TUNING_DB"] = os.path.join(tempfile.mkdtemp(prefix="tessera-bench-tune-"), "tuning.sqlite")
    tf(*inputs)
    t0 = time.perf_counter()
    try:
        entry = ts.tune(_tessera_fn(kind, threads), *inputs, quiet=True)
    except TesseraError as e:
        return None, {"error": f"{e.code}: {e.message}", "tune_s": round(time.perf_counter() - t0, 1)}
    info = {"pins": label(entry.pins), "tune_s": round(time.perf_counter() - t0, 1),
            "candidates_ms": {k: v for k, v in entry.times.items()}, "failed": dict(entry.failed)}
    fn = _tessera_fn(kind, threads)   # a new function: its compile takes the database's exact entry
    fn(*inputs)
    return fn, info


def run_workload(name: str, kind: str, inputs: list[np.ndarray], work: float, unit: str, threads: int | None,
                 peers: dict, use_compile: bool = True, also: dict | None = None, reps: int | None = None,
                 with_numpy: bool = True) -> dict:
    """One row: the raw timings and fault counts of every library.  ``also``: more Tessera
    callables ``name -> (fn, args)`` timed in the same rounds (logged in ``row["also"]``, not as
    peers); with ``--tuned``, the tuned kernel among them (``TUNED``; ``row["tuning"]``)."""
    row = {"workload": name, "kind": kind, "threads": threads or "all", "unit": unit, "work": work, "failed": {}}
    tf = _tessera_fn(kind, threads)
    also = dict(also or {})
    if tuning_enabled() and kind in TUNABLE:
        fn, row["tuning"] = _tuned_fn(kind, threads, tf, inputs)
        if fn is not None:
            also[TUNED] = (fn, inputs)
    cands = {bench_doc.POOLED: (with_pool(tf, True), inputs),
             bench_doc.FRESH: (with_pool(tf, False), inputs),
             **{n: (with_pool(f, True), a) for n, (f, a) in (also or {}).items()}}
    if with_numpy and inputs[0].dtype == np.float32:
        cands["numpy"] = (_numpy_fn(kind), inputs)
    if "torch" in peers:
        torch = peers["torch"]
        tin = [torch.from_numpy(np.asarray(a, np.float32)).to(torch.bfloat16) if a.dtype != np.float32 else
               torch.from_numpy(a) for a in inputs]

        def no_grad(f):
            def call(*a):
                with torch.no_grad():
                    return f(*a)
            return call
        f = _torch_fns(torch, kind)
        cands["torch"] = (no_grad(f), tin)
        if use_compile:
            try:
                cf = no_grad(torch.compile(f))
                cf(*tin)   # compiles here: a peer that cannot compile is reported, not fatal
                cands["torch.compile"] = (cf, tin)
            except Exception as e:  # noqa: BLE001
                row["failed"]["torch.compile"] = f"failed: {type(e).__name__}"
    if "jax" in peers:
        jax, jnp = peers["jax"]
        jin = [jnp.asarray(np.asarray(a, np.float32)).astype(jnp.bfloat16) if a.dtype != np.float32 else
               jnp.asarray(a) for a in inputs]
        jf = _jax_fn(jax, jnp, kind)
        cands["jax.jit"] = (lambda *a: jf(*a).block_until_ready(), jin)
    timed, row["rounds"] = _interleaved(cands, reps)
    row["libraries"] = {n: v for n, v in timed.items() if n not in (also or {})}
    row["also"] = {n: v for n, v in timed.items() if n in (also or {})}
    return row


def gemm_rows(threads: int | None, quick: bool, peers: dict) -> list[dict]:
    rng = np.random.default_rng()
    rows = []
    for m, n, k in sizes(quick)["gemm"]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        rows.append(run_workload(f"sgemm {m}x{n}x{k}", "gemm", [a, b], 2 * m * n * k, "GFLOP/s", threads, peers,
                                 use_compile=False))
    return rows


def bandwidth(shape) -> dict:
    """A large copy, raw: numpy's ``copyto`` into a preallocated array (1 thread) and Tessera's
    ``x * 1.0`` (all CPUs, its pooled output: both write into memory already mapped)."""
    import tessera as ts
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    out = np.empty_like(x)
    cp = ts.jit(lambda a: a * 1.0)
    t, _ = _interleaved({"numpy copyto": (np.copyto, [out, x]), bench_doc.POOLED: (with_pool(cp, True), [x])})
    return {"bytes": x.nbytes, "libraries": t}


def first_touch(mib: int, rounds: int = 5) -> dict:
    """What a fresh output costs on this host: the first write to a fresh ``numpy.empty`` array of
    ``mib`` MiB (the kernel maps and zeroes its pages: minor faults) against writing it again."""
    n = mib * 2 ** 20 // 4
    out = {"bytes": n * 4, "first_s": [], "first_minflt": [], "rewrite_s": [], "rewrite_minflt": []}
    for _ in range(rounds):
        a = np.empty(n, np.float32)
        for key, v in (("first", 1.0), ("rewrite", 2.0)):
            f0 = minflt()
            t0 = time.perf_counter()
            a.fill(v)
            out[f"{key}_s"].append(time.perf_counter() - t0)
            out[f"{key}_minflt"].append(minflt() - f0)
        del a
    return out


def host_record() -> dict:
    """The host as the log names it: CPU model, LLVM's CPU name and features, usable CPUs, THP mode."""
    from tessera import host
    from tessera.mma.x86 import host_cpu
    llvm_cpu, feats = host_cpu()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        thp = "unknown"
    return {"slug": bench_doc.host_slug(model, llvm_cpu, feats), "cpu_model": model, "llvm_cpu": llvm_cpu,
            "isa": bench_doc.isa_summary(feats), "features": sorted(feats), "usable_cpus": host.usable_cpus(),
            "thp": thp}


def software() -> dict:
    import llvmlite
    out = {"python": platform.python_version(), "numpy": np.__version__, "llvmlite": llvmlite.__version__}
    for name in ("torch", "jax"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    return out


def compile_times() -> dict:
    """Cold compile per kernel, load from the disk cache in a warm process, dispatch overhead."""
    import tempfile

    import tessera as ts
    from tessera.frontend import compile as C
    code = ("import time, numpy as np, tessera as ts\n"
            "x=np.ones((64,64),np.float32)\n"
            "f=ts.jit(lambda a, w, b: ts.ops.gelu(a @ w + b))\n"
            "t0=time.perf_counter(); f(x, x, x[0]); print(time.perf_counter()-t0)\n")
    before = os.environ.get("TESSERA_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TESSERA_CACHE_DIR=d)
        cold = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
                     .stdout.split()[-1])
        # warm process, entry on disk: drop the in-memory entry and compile again
        os.environ["TESSERA_CACHE_DIR"] = d
        try:
            x = np.ones((64, 64), np.float32)
            f = ts.jit(lambda a, w, b: ts.ops.gelu(a @ w + b))
            f(x, x, x[0])
            C._MEMORY.clear()
            f2 = ts.jit(lambda a, w, b: ts.ops.gelu(a @ w + b))
            t0 = time.perf_counter()
            f2(x, x, x[0])
            disk = time.perf_counter() - t0
        finally:
            if before is None:
                os.environ.pop("TESSERA_CACHE_DIR", None)
            else:
                os.environ["TESSERA_CACHE_DIR"] = before
        small = np.ones((8,), np.float32)
        g = ts.jit(lambda a: a + 1.0)
        g(small)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            g(small)
        dispatch = (time.perf_counter() - t0) / n
    return {"cold_first_call_s": cold, "disk_cache_first_call_ms": disk * 1e3, "dispatch_us": dispatch * 1e6}


def gpu_status() -> dict:
    """What this host can say about the GPU lanes: the device, cold compile and emulation times
    (a lane whose toolchain is missing is recorded as such)."""
    import tessera as ts
    from tessera.errors import TesseraError
    from tessera.runtime import cuda
    ok, why = cuda.device_available()
    a = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float16)
    times: dict = {}
    emu = None
    os.environ["TESSERA_NO_CACHE"] = "1"
    try:
        for target, arch in (("rocm", "gfx1151"), ("nvidia", "sm_90")):
            try:
                t0 = time.perf_counter()
                art = ts.compile(lambda x, y: x @ y, a, a, target=target, arch=arch)
                times[f"{target} {arch}"] = time.perf_counter() - t0
                if target == "nvidia":
                    t0 = time.perf_counter()
                    art.emulate(a, a)
                    emu = time.perf_counter() - t0
            except TesseraError as e:
                times[f"{target} {arch}"] = f"not built ({e.code})"
    finally:
        os.environ.pop("TESSERA_NO_CACHE", None)
    return {"device": f"NVIDIA {why}" if ok else f"no GPU ({why})", "compile_s": times, "emulate_s": emu}


def _nan_to_none(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def one_thread_rows(quick: bool) -> dict:
    """The single-thread rows, measured in a child process pinned to one CPU."""
    env = dict(os.environ, TESSERA_BENCH_CHILD="1thread", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    child = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m",
                            "tessera.tools.cli", "bench", "cpu"] + (["--quick"] if quick else []),
                           env=env, capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"the single-thread child failed:\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def measure(quick: bool) -> dict:
    """One run of every workload: the record ``bench_doc`` keeps and renders."""
    from tessera import bfloat16, host
    commit, dirty = bench_doc.git_state()
    date = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    peers = _peers()
    sz = sizes(quick)
    one = one_thread_rows(quick)
    rows = one["rows"] + gemm_rows(None, quick, peers)
    rng = np.random.default_rng()
    n16 = sz["bf16"]
    a16 = rng.standard_normal((n16, n16)).astype(bfloat16)
    b16 = rng.standard_normal((n16, n16)).astype(bfloat16)
    rows.append(run_workload(f"bf16 gemm {n16}^3 ({bf16_instruction()})", "gemm", [a16, b16], 2 * n16 ** 3,
                             "GFLOP/s", None, peers, use_compile=False))
    m, k, n = sz["gelu"]
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    # the bare GEMM of the same shape is timed in the same rounds: the fused epilogue's cost
    gelu_fn, gemm_fn = _tessera_fn("gelu", None), _tessera_fn("gemm", None)
    rows.append(run_workload(f"gelu(x@w+b) {m}x{k}x{n}", "gelu", [x, w, bias], 2 * m * k * n, "GFLOP/s",
                             None, peers, use_compile=not quick, also={"bare gemm": (gemm_fn, [x, w])}))
    # the epilogue's cost depends on the activations' scale: with x and w unit normals, x@w+b has a
    # standard deviation of sqrt(K) (32 at K = 1024) and about 1.2 % of its elements fall where gelu's
    # result is tiny or subnormal (x in about (-11.2, -10.2)), whose exact tail runs in a branch that
    # about a fifth of the 16-lane vectors take, unpredictably; w / sqrt(K), the scale of an
    # initialised layer, gives unit-scale activations, which never take it
    w_unit = (w / np.float32(np.sqrt(k))).astype(np.float32)
    rows[-1]["paired"] = {
        f"the row's inputs (activations of standard deviation {math.sqrt(k):.0f})":
            dict(paired_overhead(gelu_fn, [x, w, bias], gemm_fn, [x, w]), base="bare gemm"),
        "w / sqrt(K) (unit-scale activations)":
            dict(paired_overhead(gelu_fn, [x, w_unit, bias], gemm_fn, [x, w_unit]), base="bare gemm")}
    rows.append(run_workload(f"bare gemm {m}x{k}x{n}", "gemm", [x, w], 2 * m * k * n, "GFLOP/s", None, peers,
                             use_compile=False))
    big = rng.standard_normal(sz["rows"]).astype(np.float32)
    g = rng.standard_normal(sz["rows"][1]).astype(np.float32)
    bb = rng.standard_normal(sz["rows"][1]).astype(np.float32)
    for kind, ins in (("softmax", [big]), ("layer_norm", [big, g, bb]), ("rms_norm", [big, g])):
        rows.append(run_workload(f"{kind} {sz['rows'][0]}x{sz['rows'][1]}", kind, ins, 2 * big.nbytes, "GB/s",
                                 None, peers, use_compile=not quick))
    for seq in sz["seqs"]:
        q, kk, v = (rng.standard_normal((1, 16, seq, 64)).astype(np.float32) for _ in range(3))
        flops = 4 * 16 * seq * seq * 64
        for kind in ("attention", "attention_causal"):
            rows.append(run_workload(f"{kind.replace('_', ' ')} 16x{seq}x64", kind, [q, kk, v],
                                     flops / (2 if kind.endswith("causal") else 1), "GFLOP/s", None, peers,
                                     use_compile=seq == 1024 and not quick))
    cpus = host.usable_cpus()
    measures = {"fma_peak_1t": one["fma_peak_1t"], "fma_peak_all": fma_peak(cpus),
                "vdpbf16ps_peak_all": _nan_to_none(fma_peak(cpus, bf16=True)),
                "amx_peak_all": _nan_to_none(amx_peak(cpus)), "copy": bandwidth(sz["copy"]),
                "first_touch": first_touch(sz["touch_mib"]), "compile": compile_times(),
                "gpu": gpu_status()}
    return {"schema": bench_doc.SCHEMA, "date": date, "commit": commit, "dirty": dirty, "quick": quick,
            "command": "./dev tessera bench cpu" + (" --quick" if quick else "")
            + (" --tuned" if tuning_enabled() else "") + " --write",
            "host": host_record(), "software": software(), "method": method(), "host_measures": measures,
            "rows": rows}


def main(args) -> int:
    quick = getattr(args, "quick", False)
    if quick:
        set_quick()
    if getattr(args, "tuned", False):
        os.environ["TESSERA_BENCH_TUNED"] = "1"   # the one-thread child inherits it
    if not os.environ.get("TESSERA_TUNING_DB"):   # a private tuning database: the plain column is the cost
        import tempfile                           # model's, whatever the user's database holds
        os.environ["TESSERA_TUNING_DB"] = os.path.join(tempfile.mkdtemp(prefix="tessera-bench-tune-"),
                                                       "tuning.sqlite")
    if os.environ.get("TESSERA_BENCH_CHILD") == "1thread":
        peers = _peers()
        if "torch" in peers:
            peers["torch"].set_num_threads(1)
        rows = gemm_rows(1, quick, peers)
        print(json.dumps({"rows": rows, "fma_peak_1t": fma_peak(1)}))
        return 0
    write = getattr(args, "write", False)
    log_dir = Path(getattr(args, "log_dir", None) or bench_doc.LOG_DIR)
    in_repo = log_dir.resolve() == bench_doc.LOG_DIR.resolve()
    t0 = time.perf_counter()
    load = {"cpus_online": os.cpu_count(), "loadavg_before": list(os.getloadavg())}
    run = measure(quick)
    load["loadavg_after"] = list(os.getloadavg())
    run["load"] = load
    run["elapsed_s"] = round(time.perf_counter() - t0, 1)
    print("\n".join(bench_doc.render_run(run)))
    print(f"\n(measured in {time.perf_counter() - t0:.0f} s)")
    if write:
        path = bench_doc.write_run(log_dir, run)
        print(f"kept the run's raw log as {path}")
        doc = (bench_doc.ROOT / "docs" / "benchmarks.md") if in_repo else log_dir / "benchmarks.md"
        doc.write_text(bench_doc.render_doc(log_dir))
        print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    main(type("A", (), {"quick": True, "write": False})())
