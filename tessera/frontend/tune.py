"""The autotuner: measured schedule pins for a jitted function, kept in the tuning database.

``tessera.jit(tune=True)`` (or ``TESSERA_TUNE=1``) tunes a function's dominant kernel family on its
first compile for a shape and stores the winner (``runtime/tunedb.py``); every later compile, in
this process or another, takes the database's exact entry, else its nearest shape's, instead of the
cost model's guess.  The lane report says which (``schedule from the tuning database (entry ...)``
or ``schedule from the cost model``).  Pins the caller gave always win.  A tuned family's pins
reach only its own kernels (``pin_kinds``: a GEMM's MC or register tile never lands on the
attention or row kernels of the same program).

A tuning run (``tune_graph``):

1. the family's candidates from the schedule space (``passes/schedule/space.py``: the model's
   choice first, then pins pruned by register count and cache footprints);
2. every candidate compiled first (a compile never runs while another candidate is being timed),
   each in a worker process (``tune_workers.py``: a fresh interpreter, never a fork of this
   process, whose JAX / torch / pool threads may hold locks): one that fails to compile, crashes its
   worker or times out is recorded as failed (``Entry.failed`` says why);
3. each candidate run once on fresh random data (never zeros) and checked against the float64
   reference (``reference.evaluate``): a wrong result is recorded as failed;
4. interleaved rounds (a fresh random order each round), each sample repeated to at least
   ``SAMPLE_S`` (``race``); the cost model's own schedule is always a candidate and is never
   dropped; after ``MIN_ROUNDS``, a candidate whose median's confidence interval lies above the
   best one's is dropped, and so is one that cannot beat the model by ``MARGIN``; a candidate
   replaces the model only when the confidence interval of its paired per-round ratio to the
   model lies wholly below ``1 - MARGIN`` (it wins by more than the noise), else the model's
   schedule is recorded; the run stops when that is settled, at ``max_rounds``, or at the budget;
5. the best candidate's spread (interquartile range over median) above ``noise_max`` refuses the
   result (``TuneError``) rather than recording noise.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings

import numpy as np

from tessera.errors import TesseraError, TuneError, TuneWarning
from tessera.frontend import tune_workers
from tessera.passes.schedule import space
from tessera.runtime import tunedb

MIN_ROUNDS = 5
MAX_ROUNDS = 60
BUDGET_S = 20.0
SAMPLE_S = 1e-3          # one timing sample repeats the call to at least this long
MARGIN = 0.02           # a candidate replaces the model's schedule only when faster by more than this
NOISE_MAX = 1.0          # the best candidate's IQR / median above this: too noisy to rank
_DTYPES = {"float64": "f64", "float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def enabled(jf) -> bool:
    t = getattr(jf, "tune", None)
    return bool(t) if t is not None else os.environ.get("TESSERA_TUNE", "") == "1"


def _dtype(d) -> str:
    return _DTYPES.get(np.dtype(d).name, np.dtype(d).name)


ROW_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm")


def describe(graph) -> tuple[str, str, tuple[int, ...]] | None:
    """(family, dtype, shape) of the graph's dominant tunable kernel: its largest flash attention
    (64 query rows or more) or decode attention (``decode``: one query, at most 32 query heads per kv
    head) as (B*H, Sq, Skv, D) or matmul as (M, N, K), or (B, M, N, K) when
    batched, whichever has more multiply-adds; else its largest row op (softmax, layer_norm...) as
    (rows, columns); else None."""
    from tessera.passes.tile.kernels.attention_decode import MAX_ROWS
    best, work = None, 0
    for n in graph.nodes:   # attention: 2 x (B*H x Sq x Skv x D) multiply-adds
        if n.op != "attention" or len(n.shape) != 4:
            continue
        b, h, sq, dv = n.shape
        skv, hkv = n.inputs[1].shape[-2], n.inputs[1].shape[1]
        # the split-K decode kernel (attention_decode.decode_rows): a static query length (jit
        # specialises a size-1 axis only: longer queries are symbolic and run the flash kernel)
        decode = sq == 1 and hkv and h % hkv == 0 and h // hkv * sq <= MAX_ROWS
        if (sq >= 64 or decode) and 2 * b * h * sq * skv * dv > work:
            work = 2 * b * h * sq * skv * dv
            best = ("decode" if decode else "attention", _dtype(n.inputs[0].dtype), (b * h, sq, skv, dv))
    for n in graph.nodes:
        if n.op != "matmul" or len(n.shape) < 2:
            continue
        m, nn = n.shape[-2:]
        k = n.inputs[0].shape[-1]
        b = math.prod(n.shape[:-2])
        if b * m * nn * k > work:
            work = b * m * nn * k
            best = ("gemm", _dtype(n.inputs[0].dtype), (m, nn, k) if b == 1 else (b, m, nn, k))
    if best is not None:
        return best
    for n in graph.nodes:
        if n.op in ROW_OPS and n.shape and math.prod(n.shape) > work:
            work = math.prod(n.shape)
            best = ("row", _dtype(n.dtype), (math.prod(n.shape[:-1]), n.shape[-1]))
    return best


def run_threads(schedule: dict | None = None) -> int:
    """The threads a CPU kernel will run with: the usable CPUs, capped by a pinned ``threads`` and
    by ``TESSERA_NUM_THREADS`` / ``set_num_threads`` (as ``CpuExecutable.threads_for`` caps them)."""
    from tessera import host
    from tessera.runtime import threads
    n = host.usable_cpus()
    for cap in ((schedule or {}).get("threads"), threads.get_num_threads()):
        if cap:
            n = min(n, int(cap))
    return max(1, n)


def key_for(jf, family: str, dtype: str, shape) -> tunedb.Key:
    from tessera.frontend.compile import feature_list, resolve_arch
    from tessera.mma.x86 import host_cpu
    isa = resolve_arch(jf.target, jf.arch)
    arch = host_cpu()[0] if jf.arch in (None, "host") else isa.arch
    return tunedb.Key(family, space.version(family), jf.target, arch, ",".join(feature_list(isa)), dtype,
                      tuple(int(d) for d in shape), run_threads(jf.schedule))


def label(pins: dict) -> str:
    if not pins:
        return "model"
    short = {"register_tile": "rt", "tile_k": "kc", "tile_m": "mc", "tile_n": "nc", "chunk": "chunk",
             "parallel": "par", "split": "split"}
    return " ".join(f"{short.get(k, k)}{'x'.join(map(str, v)) if isinstance(v, tuple) else v}"
                    for k, v in sorted(pins.items()))


def schedule_for(jf, graph, arrays) -> tuple[dict, str, int | None]:
    """The pins to compile ``graph`` with, where they came from (a lane-report note) and the thread
    count they were chosen for: the caller's pins where they touch the family's attributes; else
    the tuning database (tuning first when enabled and no exact entry exists); else the cost model.

    The third element is None where the schedule does not depend on the thread count (the cost
    model's and the caller's choices are the same whatever ``set_num_threads`` says); where a
    database entry (or a tuning run) chose it, it is the count the entry was looked up for:
    ``tessera.jit`` keeps such a specialisation for the counts whose lookup gives the same pins
    (the compile cache's key holds the pins, so equal pins share the compiled code)."""
    if jf.target != "cpu" and getattr(jf, "tune", None):
        raise TuneError(f"tessera.jit(tune=True) on {jf.name}: tuning {jf.target} schedules is not built yet "
                        "(the tuner drives CPU schedules only); drop tune=True for this target")
    if jf.target != "cpu" or getattr(jf, "_tuning", False):
        return jf.schedule, "", None
    what = describe(graph)
    if what is None:
        return jf.schedule, "", None
    family, dtype, shape = what
    if any(k in jf.schedule for k in space.FAMILIES[family].attrs):
        return jf.schedule, "schedule pinned by the caller", None
    key = key_for(jf, family, dtype, shape)
    with tunedb.TuningDB(create=False) as db:
        entry = db.lookup(key)
    if enabled(jf) and (entry is None or entry.match != "exact"):
        try:
            tuned = tune_graph(jf, graph, arrays, key)
        except TesseraError as e:   # too noisy, nothing ran, no space here: the model's schedule, nothing recorded
            warnings.warn(TuneWarning(f"tuning {jf.name}: {e.code}: {e.message}; compiling with the cost model's "
                                      "schedule"), stacklevel=6)
        else:
            with tunedb.TuningDB() as db:
                db.store(tuned)
            entry = tuned
    if entry is None:
        # no entry of any thread count (a lookup crosses counts when its own has none): the
        # model's choice, the same for every count
        return jf.schedule, (f"schedule from the cost model (no tuning-database entry for {family} {dtype} "
                             f"{'x'.join(map(str, shape))})"), None
    scoped = {**entry.pins, "pin_kinds": space.FAMILIES[family].pin_kinds} if entry.pins else {}
    return {**scoped, **jf.schedule}, f"schedule from the tuning database (entry {entry.describe()})", key.threads


def tune(fn, *args, **opts) -> tunedb.Entry:
    """Tune ``fn`` (a ``tessera.jit`` function or a plain one) for the example ``args`` now, whatever
    the database holds, store the winner and return its entry.  ``opts`` go to ``tune_graph``
    (``limit``, ``min_rounds``, ``max_rounds``, ``budget_s``, ``noise_max``, ``seed``, ``quiet``)."""
    from tessera.frontend.jit import JitFunction, _int_scalars
    jf = fn if isinstance(fn, JitFunction) else JitFunction(fn)
    if jf.target != "cpu":
        raise TuneError(f"tessera.tune on {jf.name}: tuning {jf.target} schedules is not built yet (CPU only)")
    args = jf._flat(args, {})
    prepared, kinds, arrays, _ = jf._split_args(args)
    graph = jf._trace(prepared, kinds, _int_scalars(args, kinds))
    what = describe(graph)
    if what is None:
        raise TuneError(f"tessera.tune on {jf.name}: no tunable kernel (a matmul, softmax, log_softmax, layer_norm "
                        "or rms_norm)")
    entry = tune_graph(jf, graph, arrays, key_for(jf, *what), **opts)
    with tunedb.TuningDB() as db:
        db.store(entry)
    return entry


# --------------------------------------------------------------------------- tuning
def fresh_inputs(arrays, rng) -> list[np.ndarray]:
    """Random data of the arrays' shapes and dtypes (float arrays); scalars and int arrays as given."""
    out = []
    for a in arrays:
        if a.ndim and a.dtype.kind == "f":
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
        else:
            out.append(a.copy())
    return out


def _compile(jf, graph, pins):
    from tessera.frontend import graphgen
    from tessera.frontend.compile import compile_graph
    gir = graphgen.build(graph, frozenset())
    return compile_graph(gir.module, name=jf.name, target=jf.target, arch=jf.arch, pins={**jf.schedule, **pins})


def compile_text(text: str, name: str, target: str, arch, schedule: dict, scope: str, pins: dict):
    """Compile a candidate from the graph module's text (a tuning worker's entry point,
    ``tune_workers.Worker``: it crosses the process boundary as text and JSON)."""
    from tessera.frontend.compile import compile_graph
    from tessera.ir.text import parse_module
    schedule = {k: tuple(v) if isinstance(v, list) else v for k, v in schedule.items()}
    pins = {**pins, "pin_kinds": scope} if pins else pins
    return compile_graph(parse_module(text), name=name, target=target, arch=arch, pins={**schedule, **pins})


def _worker(jf, graph, scope: str):
    """The worker for ``graph``'s candidates, or None (compile here) when its schedule is not JSON."""
    from tessera.frontend import graphgen
    schedule = {k: list(v) if isinstance(v, tuple) else v for k, v in jf.schedule.items()}
    try:
        json.dumps(schedule)
    except (TypeError, ValueError):
        return None
    text = str(graphgen.build(graph, frozenset()).module)
    return tune_workers.Worker(__name__, "compile_text", (text, jf.name, jf.target, jf.arch, schedule, scope))


def _schedule_of(c) -> str:
    """What the schedule decided for every kernel: two candidates alike here are one candidate."""
    return repr([(k["kind"], k["tiles"], k.get("register_tile"), k["unroll"], k["parallel"], k["threads"],
                  k["vector"], k.get("split")) for k in c.meta["kernels"]])


def _runner(c, arrays):
    from tessera.runtime.cpu import bind_symbols
    exe = c.executable
    plan = exe.plan(bind_symbols(exe.program.inputs, arrays))
    return lambda: exe.run_plan(plan, arrays)


def error(got, ref) -> float:
    """The largest error of any output against the reference, relative to that output's largest
    finite reference value (at least 1); NaN where the reference has NaN, and equal infinities,
    agree (0); any other disagreement, or a shape that differs, is ``inf``."""
    worst = 0.0
    if len(got) != len(ref):
        return math.inf
    for g, r in zip(got, ref):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        if g.shape != r.shape:
            return math.inf
        fin = np.isfinite(r)
        scale = max(1.0, float(np.max(np.abs(r[fin])))) if fin.any() else 1.0
        with np.errstate(invalid="ignore"):
            same = (np.isnan(g) & np.isnan(r)) | (g == r)
            d = np.where(same, 0.0, np.abs(g - r))
        if d.size:
            m = float(np.max(d))
            worst = max(worst, m / scale if math.isfinite(m) else math.inf)
    return worst


def _close(got, ref, dtype: str, family: str = "gemm") -> bool:
    """Every output within the family's accuracy budget for ``dtype`` (``error``)."""
    return error(got, ref) <= space.error_budget(family, dtype)


def median_ci(xs: list[float]) -> tuple[float, float, float]:
    """The median and a ~95 % confidence interval of it from order statistics."""
    s = sorted(xs)
    n = len(s)
    h = 0.98 * math.sqrt(n)
    lo, hi = max(0, int(math.floor(n / 2 - h))), min(n - 1, int(math.ceil(n / 2 + h)))
    return float(np.median(s)), s[lo], s[hi]


def _spread(xs: list[float]) -> float:
    q1, q2, q3 = np.percentile(xs, [25, 50, 75])
    return float((q3 - q1) / q2) if q2 > 0 else 0.0


class Progress:
    """One stderr line per second at most: round, candidates left, ETA."""

    def __init__(self, what: str, budget: float, quiet: bool):
        self.what, self.budget, self.quiet = what, budget, quiet
        self.t0 = self.last = time.perf_counter()

    def show(self, rnd: int, max_rounds: int, left: int, force: bool = False) -> None:
        now = time.perf_counter()
        if self.quiet or (not force and now - self.last < 1.0):
            return
        self.last = now
        spent = now - self.t0
        eta = min(self.budget - spent, spent / max(rnd, 1) * (max_rounds - rnd)) if rnd else self.budget
        print(f"tessera tune {self.what}: round {rnd}/{max_rounds}, {left} candidates left, "
              f"{spent:.1f}s, eta {max(eta, 0):.0f}s", file=sys.stderr, flush=True)


def ratio_ci(xs: list[float], base: list[float]) -> tuple[float, float, float]:
    """The median of the paired ratios ``xs[i] / base[i]`` (round ``i`` of each; interleaved, so a
    round's load touches both) and its ~95 % confidence interval: (median, low, high)."""
    n = min(len(xs), len(base))
    return median_ci([x / max(b, 1e-12) for x, b in zip(xs[:n], base[:n])])


def race(runners: list, rng, *, min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
         budget_s: float = BUDGET_S, margin: float = MARGIN, prog: Progress | None = None,
         clock=time.perf_counter) -> tuple[list, int]:
    """Interleaved rounds over ``runners`` ([pins, run, reps, samples]; the cost model's own
    schedule, pins ``{}``, first when it ran) and the winner: (runner, rounds run).

    Each round times every live runner once (``reps`` calls per sample, the largest any runner
    asked for), in a fresh random order.  From ``min_rounds`` on, a candidate whose median's
    confidence interval lies above the best one's is dropped, and so is one whose paired ratio to
    the model (``ratio_ci``) cannot fall below ``1 - margin``; the model is never dropped.  The run
    stops when no candidate but the model is live, when one is left whose ratio's interval lies
    wholly below ``1 - margin``, at ``max_rounds`` or at ``budget_s``.  A candidate replaces the
    model only when its ratio's interval lies below ``1 - margin`` (it wins by more than the
    noise); otherwise the model wins.  Without a model runner (it failed), the lowest median wins.
    ``clock`` is injectable (tests time fake runners)."""
    model = runners[0] if not runners[0][0] else None
    reps = max(r[2] for r in runners)
    live = list(runners)
    t0 = clock()
    rnd = 0

    def wins(r) -> bool:
        return r is not model and (model is None or ratio_ci(r[3], model[3])[2] < 1.0 - margin)

    while rnd < max_rounds:
        rnd += 1
        live = [live[i] for i in rng.permutation(len(live))]
        for r in live:
            t = clock()
            for _ in range(reps):
                r[1]()
            r[3].append((clock() - t) / reps)
        if prog is not None:
            prog.show(rnd, max_rounds, len(live))
        if rnd < min_rounds:
            continue
        cis = {id(r): median_ci(r[3]) for r in live}
        best = min(live, key=lambda r: cis[id(r)][0])
        live = [r for r in live if r is best or r is model or cis[id(r)][1] <= cis[id(best)][2]]
        if model is not None:
            live = [r for r in live if r is model or ratio_ci(r[3], model[3])[1] < 1.0 - margin]
        others = [r for r in live if r is not model]
        if not others or (len(others) == 1 and wins(others[0])) or (model is None and len(live) == 1):
            break
        if clock() - t0 > budget_s:
            break
    if prog is not None:
        prog.show(rnd, max_rounds, len(live), force=True)
    if model is None:
        return min(live, key=lambda r: np.median(r[3])), rnd
    better = [r for r in live if wins(r)]
    return (min(better, key=lambda r: ratio_ci(r[3], model[3])[0]) if better else model), rnd


def tune_graph(jf, graph, arrays, key: tunedb.Key, *, limit: int = 6, min_rounds: int = MIN_ROUNDS,
               max_rounds: int = MAX_ROUNDS, budget_s: float | None = None, noise_max: float | None = None,
               seed: int | None = None, quiet: bool | None = None, margin: float | None = None,
               clock=time.perf_counter) -> tunedb.Entry:
    """Measure the family's candidates for ``graph`` on fresh random data; the best as an Entry.
    A candidate whose error against the float64 reference exceeds the family's accuracy budget
    (``space.error_budget``) is rejected (its error in ``Entry.errors``, why in ``Entry.failed``)
    before any timing, so it never wins.  ``clock`` is injectable (tests time fake runners)."""
    from tessera.frontend import reference
    budget_s = float(os.environ.get("TESSERA_TUNE_BUDGET", BUDGET_S)) if budget_s is None else budget_s
    noise_max = float(os.environ.get("TESSERA_TUNE_NOISE_MAX", NOISE_MAX)) if noise_max is None else noise_max
    quiet = os.environ.get("TESSERA_TUNE_QUIET", "") == "1" if quiet is None else quiet
    margin = float(os.environ.get("TESSERA_TUNE_MARGIN", MARGIN)) if margin is None else margin
    rng = np.random.default_rng(seed)
    cands = space.candidates(key.family, key.shape, arch=jf.arch, dtype=key.dtype, limit=limit, threads=key.threads)
    cands = [{}] + [p for p in cands if p]   # the cost model's own schedule is always a candidate, first
    times: dict[str, float | None] = {}
    compiled, schedules, failed = [], set(), {}
    # 1. compile every candidate before any timing, each in a worker process (tune_workers.py)
    scope = space.FAMILIES[key.family].pin_kinds   # a candidate's pins touch only the tuned family's kernels
    worker = _worker(jf, graph, scope) if tune_workers.jobs() > 1 and len(cands) > 1 else None
    for pins, c, why in tune_workers.compile_all(lambda p: _compile(jf, graph, {**p, "pin_kinds": scope} if p else p),
                                                 cands, worker=worker):
        if c is None:
            times[label(pins)] = None
            failed[label(pins)] = why
            continue
        sched = _schedule_of(c)
        if sched not in schedules:           # the model's own choice spelled as pins: timed once
            schedules.add(sched)
            compiled.append((pins, c))
    data = fresh_inputs(arrays, rng)         # 2. fresh random inputs; checked against float64
    try:
        ref = reference.evaluate(graph, data)
    except Exception:   # noqa: BLE001 - no float64 reference for this graph: the model's result is the check
        ref = None
    runners = []
    budget = space.error_budget(key.family, key.dtype)
    errors: dict[str, float] = {}
    for pins, c in compiled:
        try:
            run = _runner(c, data)
            out = run()
            if ref is None:
                ref = out
            err = errors[label(pins)] = error(out, ref)
            if not err <= budget:   # outside the accuracy budget (or wrong): never eligible
                times[label(pins)] = None
                failed[label(pins)] = (f"rejected: error {err:.3g} against the float64 reference exceeds the "
                                       f"{key.family} {key.dtype} accuracy budget {budget:g}")
                continue
            t = clock()
            run()
            one = max(clock() - t, 1e-7)
        except TesseraError as e:
            times[label(pins)] = None
            failed[label(pins)] = f"{e.code}: {e.message}"
            continue
        runners.append([pins, run, max(1, min(1000, int(SAMPLE_S / one))), []])
    if not runners:
        raise TuneError(f"tuning {jf.name}: no candidate of {key.family} {'x'.join(map(str, key.shape))} compiled "
                        f"and ran correctly ({'; '.join(f'{k}: {v}' for k, v in failed.items())})")
    shape = "x".join(map(str, key.shape))
    prog = Progress(f"{jf.name} {key.family} {key.dtype} {shape}", budget_s, quiet)
    best, rnd = race(runners, rng, min_rounds=min_rounds, max_rounds=max_rounds, budget_s=budget_s, margin=margin,
                     prog=prog, clock=clock)
    for r in runners:
        times[label(r[0])] = round(float(np.median(r[3])) * 1e3, 6)
    spread = _spread(best[3])
    if spread > noise_max:
        raise TuneError(f"tuning {jf.name} ({key.family} {shape}): the machine is too noisy to rank candidates "
                        f"(the best one's spread {spread:.2f} > {noise_max}); not recorded")
    return tunedb.Entry(key, dict(best[0]), float(np.median(best[3])) * 1e3, times, time.time(), failed=failed,
                        errors=errors)
