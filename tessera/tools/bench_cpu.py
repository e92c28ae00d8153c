"""``tessera bench cpu``: Tessera's CPU lane against its peers, in one run, on the same random inputs.

Method: every workload gets fresh random inputs (never zeros); each implementation is
called twice to warm up, then timed in ``REPS`` interleaved rounds (one call of each
implementation per round); the median is reported.  ratio =
best peer time / Tessera time (above 1: Tessera is faster).  Peers: numpy (OpenBLAS),
and, when installed (the ``bench`` extra), torch eager, ``torch.compile`` and
``jax.jit``.  Single-thread rows run in a child process pinned to one CPU
(affinity, OPENBLAS/OMP threads 1, torch threads 1); the others use every CPU this
process may use.

Allocation: Tessera returns results from its reusing huge-page pool (``runtime/memory.py``);
peers allocate fresh outputs as they normally do.  Memory-bound rows are therefore also
run with ``TESSERA_POOL=0`` (fresh ``numpy.empty`` outputs) and reported as a second
Tessera column, so both like-with-like and as-used figures are visible.
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

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


# --------------------------------------------------------------------------- host peaks
def _peak_loop(threads: int, decls: str, entry: str, phis: str, body: str, done: str, iters: int,
               flops_per_iter: int, out_floats: int, inp: np.ndarray) -> float:
    """GFLOP/s of ``void @peak(i64 iters, ptr out, ptr in)``: ``entry``, then a loop of ``body``
    (values carried by ``phis``), then ``done``; one call per thread, the fastest of three timed
    after a warm-up."""
    import ctypes
    from concurrent.futures import ThreadPoolExecutor

    from tessera.codegen import jit as cj
    from tessera.mma.x86 import host_cpu, llvm_feature_string
    cpu, feats = host_cpu()
    ir = f"""
{decls}
define void @peak(i64 %iters, ptr %out, ptr %in) {{
entry:
  {entry}
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  {phis}
  {body}
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %iters
  br i1 %c, label %loop, label %done
done:
  {done}
  ret void
}}
"""
    oc = cj.emit(ir, cpu, llvm_feature_string(feats))
    lo = cj.LoadedObject(oc.obj, ["peak"])
    fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(lo.addresses["peak"])
    out = np.zeros((threads, out_floats), np.float32)

    def run(t):
        fn(iters, out[t].ctypes.data, inp.ctypes.data)

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(run, range(threads)))
        dts = []
        for _ in range(3):   # the fastest of three: a thread that starts late (a waking vCPU) is not the peak
            t0 = time.perf_counter()
            list(ex.map(run, range(threads)))
            dts.append(time.perf_counter() - t0)
    return iters * flops_per_iter * threads / min(dts) / 1e9


def fma_peak(threads: int, bf16: bool = False) -> float:
    """GFLOP/s of a loop of independent vector FMAs (or vdpbf16ps) per thread, in the host's widest
    vectors: 12 accumulators of 512 bits, or 10 of 256 bits where there is no AVX-512 (two FMA pipes
    of latency 4 need 8 in flight; 12 of 16 ymm registers would leave too few for the operands)."""
    from tessera.mma.x86 import host_cpu
    feats = host_cpu()[1]
    if bf16 and "avx512bf16" not in feats:
        return float("nan")
    w, n = (16, 12) if "avx512f" in feats else (8, 10)
    vt = f"<{w} x float>"
    if bf16:
        decl = "declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)"
        op = "call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %a{i}, <32 x bfloat> %x, <32 x bfloat> %y)"
        xs = "%x = bitcast <16 x float> %xf to <32 x bfloat>\n  %y = bitcast <16 x float> %yf to <32 x bfloat>"
        flops = 4 * w
    else:
        decl = f"declare {vt} @llvm.fma.v{w}f32({vt}, {vt}, {vt})"
        op = f"call {vt} @llvm.fma.v{w}f32({vt} %xf, {vt} %yf, {vt} %a{{i}})"
        xs = ""
        flops = 2 * w
    entry = f"%xf = load {vt}, ptr %in, align 4\n  %yf = load {vt}, ptr %in, align 4\n  {xs}"
    phis = "\n  ".join(f"%a{i} = phi {vt} [zeroinitializer, %entry], [%b{i}, %loop]" for i in range(n))
    body = "\n  ".join(f"%b{i} = " + op.format(i=i) for i in range(n))
    done = "\n  ".join([f"%s0 = fadd {vt} %b0, %b0"] +
                       [f"%s{i} = fadd {vt} %s{i - 1}, %b{i}" for i in range(1, n)] +
                       [f"store {vt} %s{n - 1}, ptr %out, align 4"])
    return _peak_loop(threads, decl, entry, phis, body, done, 20_000_000, n * flops, 16,
                      np.full(16, 1e-3, np.float32))


def amx_peak(threads: int) -> float:
    """GFLOP/s of a loop of tdpbf16ps on four independent accumulator tiles per thread
    (NaN where the host has no AMX or Linux refuses the tile state)."""
    from tessera import host
    from tessera.mma.x86 import host_cpu
    if not {"amx-tile", "amx-bf16"} <= host_cpu()[1] or host.amx_refusal():
        return float("nan")
    sh = "i16 16, i16 64"
    decls = "\n".join(["declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
                       "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)",
                       "declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
                       "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)"])
    entry = (f"%z = call x86_amx @llvm.x86.tilezero.internal({sh})\n"
             f"  %x = call x86_amx @llvm.x86.tileloadd64.internal({sh}, ptr %in, i64 64)\n"
             f"  %y = call x86_amx @llvm.x86.tileloadd64.internal({sh}, ptr %in, i64 64)")
    phis = "\n  ".join(f"%a{i} = phi x86_amx [%z, %entry], [%b{i}, %loop]" for i in range(4))
    body = "\n  ".join(f"%b{i} = call x86_amx @llvm.x86.tdpbf16ps.internal({sh}, i16 64, x86_amx %a{i}, "
                       f"x86_amx %x, x86_amx %y)" for i in range(4))
    done = "\n  ".join(f"call void @llvm.x86.tilestored64.internal({sh}, ptr %out, i64 64, x86_amx %b{i})"
                       for i in range(4))
    # inputs: bf16 0.0078125 (no overflow over the loop)
    return _peak_loop(threads, decls, entry, phis, body, done, 500_000, 4 * 2 * 16 * 16 * 32, 256,
                      np.full(512, 0x3C00, np.uint16))


def bf16_instruction() -> str:
    """The instruction the selector picks for a bf16 GEMM on this host."""
    from tessera.mma.selector import get_isa, select_mma
    return select_mma(get_isa("x86", None), "bf16", out_dtype="f32", lowering="lower-tile-to-x86").record.mnemonic.split()[0]


def bandwidth() -> dict:
    """Bytes read + written per second for a large copy: numpy (1 thread) and Tessera (all CPUs)."""
    import tessera as ts
    x = np.random.default_rng().standard_normal((8192, 4096)).astype(np.float32)
    out = np.empty_like(x)
    cp = ts.jit(lambda a: a * 1.0)
    t, _ = _interleaved({"numpy": (np.copyto, [out, x]), "tessera": (cp, [x])})
    t_np, t_ts = t["numpy"], t["tessera"]
    return {"numpy_copyto_1t": 2 * x.nbytes / t_np / 1e9, "tessera_copy": 2 * x.nbytes / t_ts / 1e9}


# --------------------------------------------------------------------------- peers
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


def _interleaved(cands: dict, reps: int | None = None) -> tuple[dict[str, float], int]:
    """Median seconds per call of each ``name -> (fn, args)``, and the number of rounds, measured in
    rounds (``reps``, else from REPS up to MAX_REPS within ROUNDS_BUDGET_S): every round
    times each candidate once (who goes first rotates), so a drift in the host's speed during
    the row reaches every library alike instead of whichever was measured in the slow moment.
    Each timing follows a pause (peers' thread pools spin after a call) and, for calls under
    ``WAKE_BELOW_S``, one untimed call that wakes the library's threads."""
    warm = {}
    for name, (fn, args) in cands.items():
        time.sleep(QUIESCE_S)
        fn(*args)
        t0 = time.perf_counter()
        fn(*args)
        warm[name] = time.perf_counter() - t0
    names = list(cands)
    times: dict[str, list[float]] = {n: [] for n in names}
    least, most = (reps, reps) if reps else (REPS, MAX_REPS)
    start = time.perf_counter()
    r = 0
    while _more_rounds(r, least, most, start, ROUNDS_BUDGET_S):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn, args = cands[n]
            time.sleep(QUIESCE_S)
            if warm[n] < WAKE_BELOW_S:
                fn(*args)
            t0 = time.perf_counter()
            fn(*args)
            times[n].append(time.perf_counter() - t0)
        r += 1
    return {n: float(np.median(t)) for n, t in times.items()}, r


def paired_overhead(fn, args, base_fn, base_args, least: int = PAIR_LEAST, most: int = PAIR_MOST,
                    budget_s: float = PAIR_BUDGET_S) -> dict:
    """The cost of ``fn`` over ``base_fn`` from calls timed back to back: each round times both
    (who goes first alternates), and the median of the rounds' ratios is reported with a
    bootstrap 95 % interval.  The two calls of a round are a fraction of a second apart, so the
    VM's drift (up to about 1.5x over minutes) cancels in each ratio, where a ratio of medians
    taken over a row of peers would not resolve the few per cent this measures.  Rounds are added
    (``least`` to ``most``, within ``budget_s``) because single calls of the same kernel vary by
    about 5 % here: 21 rounds of the gelu(x@w+b) pair, run four times in one process, read +0.2 to
    +4.6 % (81 rounds: +1.3 to +3.0 %).  Both callables are Tessera's, whose workers sleep after
    ``SPIN_SECONDS`` of polling, so the pause before each call is ``PAIR_PAUSE_S``."""
    for f, a in ((fn, args), (base_fn, base_args)):
        f(*a)
    ratios = []
    start = time.perf_counter()
    while _more_rounds(len(ratios), least, most, start, budget_s):
        pair = [0.0, 0.0]
        for i in ((0, 1) if len(ratios) % 2 == 0 else (1, 0)):
            f, a = ((fn, args), (base_fn, base_args))[i]
            time.sleep(PAIR_PAUSE_S)
            t0 = time.perf_counter()
            f(*a)
            pair[i] = time.perf_counter() - t0
        ratios.append(pair[0] / pair[1])
    r = np.array(ratios)
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    boot = np.median(r[np.random.default_rng(0).integers(0, len(r), (2000, len(r)))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    pct = lambda v: float((v - 1) * 100)   # noqa: E731
    return {"median_pct": pct(med), "q1_pct": pct(q1), "q3_pct": pct(q3), "ci95_pct": (pct(lo), pct(hi)),
            "rounds": len(r)}


def run_workload(name: str, kind: str, inputs: list[np.ndarray], work: float, unit: str, threads: int | None,
                 peers: dict, use_compile: bool = True, fresh_alloc_column: bool = False,
                 also: dict | None = None) -> dict:
    """One row.  ``also``: more Tessera callables ``name -> (fn, args)`` timed in the same rounds
    (reported in ``row["also_ms"]``, not as peers)."""
    row = {"workload": name, "threads": threads or "all", "unit": unit, "times_ms": {}}
    tf = _tessera_fn(kind, threads)
    cands = {"tessera": (tf, inputs), **(also or {})}
    if fresh_alloc_column:
        from tessera.runtime import memory

        def fresh(*a):
            memory.POOL.enabled = False
            try:
                return tf(*a)
            finally:
                memory.POOL.enabled = True
        cands["tessera (fresh outputs)"] = (fresh, inputs)
    if inputs[0].dtype == np.float32:
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
                row["times_ms"]["torch.compile"] = f"failed: {type(e).__name__}"
    if "jax" in peers:
        jax, jnp = peers["jax"]
        jin = [jnp.asarray(np.asarray(a, np.float32)).astype(jnp.bfloat16) if a.dtype != np.float32 else
               jnp.asarray(a) for a in inputs]
        jf = _jax_fn(jax, jnp, kind)
        cands["jax.jit"] = (lambda *a: jf(*a).block_until_ready(), jin)
    row["also_ms"] = {}
    timed, row["rounds"] = _interleaved(cands)
    for n, t in timed.items():
        (row["also_ms"] if n in (also or {}) else row["times_ms"])[n] = t * 1e3
    peer_times = {k: v for k, v in row["times_ms"].items() if not k.startswith("tessera") and isinstance(v, float)}
    if peer_times:
        best = min(peer_times, key=peer_times.get)
        row["best_peer"] = best
        row["ratio"] = peer_times[best] / row["times_ms"]["tessera"]
    row["tessera_rate"] = work / (row["times_ms"]["tessera"] / 1e3) / 1e9
    return row


def gemm_rows(threads: int | None, quick: bool, peers: dict) -> list[dict]:
    rng = np.random.default_rng()
    shapes = [(1024, 1024, 1024), (2048, 2048, 2048), (1000, 1000, 1000), (777, 513, 1029)]
    if not quick:
        shapes.insert(2, (4096, 4096, 4096))
    rows = []
    for m, n, k in shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        rows.append(run_workload(f"sgemm {m}x{n}x{k}", "gemm", [a, b], 2 * m * n * k, "GFLOP/s", threads, peers,
                                 use_compile=False))
    return rows


def main(args) -> int:
    quick = getattr(args, "quick", False)
    global REPS, MAX_REPS
    if quick:
        REPS = MAX_REPS = 3
    if os.environ.get("TESSERA_BENCH_CHILD") == "1thread":
        peers = _peers()
        if "torch" in peers:
            peers["torch"].set_num_threads(1)
        rows = gemm_rows(1, quick, peers)
        print(json.dumps({"rows": rows, "fma_peak_1t": fma_peak(1)}))
        return 0
    from tessera import host
    peers = _peers()
    env = dict(os.environ, TESSERA_BENCH_CHILD="1thread", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    child = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m",
                            "tessera.tools.cli", "bench", "cpu"] + (["--quick"] if quick else []),
                           env=env, capture_output=True, text=True)
    if child.returncode != 0:
        print(child.stderr, file=sys.stderr)
        return 1
    one = json.loads(child.stdout.strip().splitlines()[-1])
    rows = one["rows"] + gemm_rows(None, quick, peers)
    rng = np.random.default_rng()
    from tessera import bfloat16
    a16 = rng.standard_normal((2048, 2048)).astype(bfloat16)
    b16 = rng.standard_normal((2048, 2048)).astype(bfloat16)
    rows.append(run_workload(f"bf16 gemm 2048^3 ({bf16_instruction()})", "gemm", [a16, b16], 2 * 2048 ** 3, "GFLOP/s", None, peers,
                             use_compile=False))
    x = rng.standard_normal((2048, 1024)).astype(np.float32)
    w = rng.standard_normal((1024, 4096)).astype(np.float32)
    bias = rng.standard_normal(4096).astype(np.float32)
    # the bare GEMM of the same shape is timed in the same rounds: the fused epilogue's cost
    gelu_fn, gemm_fn = _tessera_fn("gelu", None), _tessera_fn("gemm", None)
    rows.append(run_workload("gelu(x@w+b) 2048x1024x4096", "gelu", [x, w, bias], 2 * 2048 * 1024 * 4096, "GFLOP/s",
                             None, peers, also={"bare gemm": (gemm_fn, [x, w])}))
    # the epilogue's cost depends on the activations' scale: with x and w unit normals, x@w+b has a
    # standard deviation of 32 and 1.2 % of its elements fall where gelu's result is tiny or
    # subnormal (x in about (-11.2, -10.2)), whose exact tail runs in a branch that about a fifth
    # of the 16-lane vectors take, unpredictably; w / sqrt(K), the scale of an initialised layer,
    # gives unit-scale activations, which never take it
    w_unit = (w / np.float32(np.sqrt(w.shape[0]))).astype(np.float32)
    rows[-1]["epilogue_paired"] = {
        "the row's inputs (activations of standard deviation 32)":
            paired_overhead(gelu_fn, [x, w, bias], gemm_fn, [x, w]),
        "w / sqrt(K) (unit-scale activations)": paired_overhead(gelu_fn, [x, w_unit, bias], gemm_fn, [x, w_unit])}
    rows.append(run_workload("bare gemm 2048x1024x4096", "gemm", [x, w], 2 * 2048 * 1024 * 4096, "GFLOP/s", None, peers,
                             use_compile=False))
    big = rng.standard_normal((8192, 4096)).astype(np.float32)
    g, bb = rng.standard_normal(4096).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
    traffic = 2 * big.nbytes
    for kind, ins in (("softmax", [big]), ("layer_norm", [big, g, bb]), ("rms_norm", [big, g])):
        rows.append(run_workload(f"{kind} 8192x4096", kind, ins, traffic, "GB/s", None, peers,
                                 fresh_alloc_column=True))
    for seq in ((1024,) if quick else (1024, 4096)):
        q, k, v = (rng.standard_normal((1, 16, seq, 64)).astype(np.float32) for _ in range(3))
        flops = 4 * 16 * seq * seq * 64
        for kind in ("attention", "attention_causal"):
            rows.append(run_workload(f"{kind.replace('_', ' ')} 16x{seq}x64", kind, [q, k, v],
                                     flops / (2 if kind.endswith("causal") else 1), "GFLOP/s", None, peers,
                                     use_compile=seq == 1024))
    host_info = {"cpu": cpu_description(), "usable_cpus": host.usable_cpus(),
                 "fma_peak_1t": one["fma_peak_1t"], "fma_peak_all": fma_peak(host.usable_cpus()),
                 "vdpbf16ps_peak_all": fma_peak(host.usable_cpus(), bf16=True),
                 "amx_peak_all": amx_peak(host.usable_cpus()), **bandwidth()}
    host_info["compile"] = compile_times()
    host_info["gpu"] = gpu_status()
    text = render(rows, host_info, quick)
    print(text)
    if getattr(args, "write", False):
        root = Path(__file__).resolve().parent.parent.parent
        (root / "docs" / "benchmarks.md").write_text(text)
        print("wrote docs/benchmarks.md")
    return 0


def cpu_description() -> str:
    """The model name, LLVM's name for it, and the matrix units a peer library may use (AMX)."""
    import llvmlite.binding as llvm
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine(), platform.processor()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    amx = [f for f in ("amx_bf16", "amx_int8") if f in flags]
    return f"{model} (LLVM: {llvm.get_host_cpu_name()}{'; ' + ', '.join(amx) if amx else ''})"


def compile_times() -> dict:
    """Cold compile per kernel, load from the disk cache in a warm process, dispatch overhead."""
    import tempfile

    import tessera as ts
    from tessera.frontend import compile as C
    code = ("import time, numpy as np, tessera as ts\n"
            "x=np.ones((64,64),np.float32)\n"
            "f=ts.jit(lambda a, w, b: ts.ops.gelu(a @ w + b))\n"
            "t0=time.perf_counter(); f(x, x, x[0]); print(time.perf_counter()-t0)\n")
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TESSERA_CACHE_DIR=d)
        cold = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
                     .stdout.split()[-1])
        # warm process, entry on disk: drop the in-memory entry and compile again
        os.environ["TESSERA_CACHE_DIR"] = d
        x = np.ones((64, 64), np.float32)
        f = ts.jit(lambda a, w, b: ts.ops.gelu(a @ w + b))
        f(x, x, x[0])
        C._MEMORY.clear()
        f2 = ts.jit(lambda a, w, b: ts.ops.gelu(a @ w + b))
        t0 = time.perf_counter()
        f2(x, x, x[0])
        disk = time.perf_counter() - t0
        small = np.ones((8,), np.float32)
        g = ts.jit(lambda a: a + 1.0)
        g(small)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            g(small)
        dispatch = (time.perf_counter() - t0) / n
    return {"cold_first_call_s": cold, "disk_cache_first_call_ms": disk * 1e3, "dispatch_us": dispatch * 1e6}


def render(rows: list[dict], h: dict, quick: bool) -> str:
    cols = ["tessera", "tessera (fresh outputs)", "numpy", "torch", "torch.compile", "jax.jit"]
    lines = ["<!-- measured by `tessera bench cpu --write` (see the command below); numbers are from the last run -->",
             "", "# Benchmarks (CPU lane)", "",
             "Command: `./dev tessera bench cpu --write` (peers: `./dev python -m pip install -e .[bench]`).",
             f"Host: {h['cpu']}, {h['usable_cpus']} usable CPUs.  Measured peaks: FMA "
             f"{h['fma_peak_1t']:.0f} GFLOP/s on one thread, {h['fma_peak_all']:.0f} on all; "
             + (f"vdpbf16ps {h['vdpbf16ps_peak_all']:.0f} GFLOP/s on all; " if h.get("vdpbf16ps_peak_all", 0) > 0
                else "no vdpbf16ps (no AVX512-BF16); ")
             + (f"AMX tdpbf16ps {h['amx_peak_all']:.0f} GFLOP/s on all; " if h.get("amx_peak_all", 0) > 0 else "")
             + f"copy bandwidth {h['tessera_copy']:.1f} GB/s "
             f"(Tessera, all CPUs, streaming stores), {h['numpy_copyto_1t']:.1f} GB/s (numpy copyto, 1 thread).",
             "",
             "Method: fresh random inputs per workload; 2 warm-up calls per library, then "
             f"{REPS} interleaved rounds (a row keeps adding rounds, up to {MAX_REPS}, while they have taken under "
             f"{ROUNDS_BUDGET_S:.0f} s: the `rounds` column), each timing one call of every library (who goes first "
             "rotates), each "
             f"call after a {QUIESCE_S} s pause (peers' thread pools spin after a call) and, for calls under "
             f"{WAKE_BELOW_S} s, one untimed call that wakes the library's threads; the median per library; ratio = "
             "best peer time / Tessera time.  This host is a 2-vCPU VM whose speed drifts by up to about 1.5x "
             "within minutes; the rounds spread that drift over every library of a row, but rows measured "
             "minutes apart can still differ, so ratios near 1.0 are ties.  Tessera results come from its reusing "
             "huge-page output pool; the `tessera (fresh outputs)` column re-runs memory-bound rows with fresh "
             "`numpy.empty` outputs, like the peers.  Bandwidth counts bytes read plus bytes written.",
             "", "| workload | threads | rounds | " + " | ".join(cols) + " | best peer | ratio | Tessera rate |",
             "|---|---|---:|" + "---:|" * len(cols) + "---|---:|---:|"]
    for r in rows:
        cells = []
        for c in cols:
            v = r["times_ms"].get(c)
            cells.append("" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v)))
        lines.append(f"| {r['workload']} | {r['threads']} | {r.get('rounds', '')} | " + " | ".join(cells) +
                     f" | {r.get('best_peer', '-')} | {r.get('ratio', float('nan')):.2f} | "
                     f"{r['tessera_rate']:.1f} {r['unit']} |")
    c = h["compile"]
    lines += ["", "Times in ms."]
    for r in rows:
        bare = r.get("also_ms", {}).get("bare gemm")
        if bare:
            lines += ["", f"Fused epilogue: {r['workload']} took {r['times_ms']['tessera']:.2f} ms against "
                      f"{bare:.2f} ms for the bare GEMM x@w of the same shape, timed in the same rounds: "
                      f"{(r['times_ms']['tessera'] / bare - 1) * 100:+.1f} %."]
            for label, p in (r.get("epilogue_paired") or {}).items():
                ci = p["ci95_pct"]
                lines[-1] += (f"  Timed back to back, {label}, {p['rounds']} pairs (median of the pairs' ratios): "
                              f"**{p['median_pct']:+.1f} %** (95 % interval of the median "
                              f"{ci[0]:+.1f} / {ci[1]:+.1f} %; "
                              f"quartiles {p['q1_pct']:+.1f} / {p['q3_pct']:+.1f} %).")
            if r.get("epilogue_paired"):
                lines[-1] += (f"  (Pairs: a {PAIR_PAUSE_S} s pause before each call; {PAIR_LEAST} rounds, more "
                              f"while under {PAIR_BUDGET_S:.0f} s.  The scale matters: about 1.2 % of "
                              "activations of standard deviation 32 "
                              "fall where gelu's result is tiny or subnormal, whose exact tail runs in a branch "
                              "that about a fifth of the 16-lane vectors take, unpredictably.)")
    lines += ["",
              f"Compile: cold first call (new process, empty cache, gemm+gelu kernel) {c['cold_first_call_s']:.2f} s "
              "(after `import tessera`: tracing, the passes, LLVM and the modules they load on first use); "
              "first call served from the disk cache in a warm process "
              f"{c['disk_cache_first_call_ms']:.1f} ms; in-memory dispatch overhead {c['dispatch_us']:.1f} us per "
              "call (an 8-element elementwise kernel)."]
    if quick:
        lines += ["", "(--quick run: fewer repeats, no 4096^3.)"]
    g = h.get("gpu")
    if g:
        lines += ["", "# GPU lanes", "",
                  f"This host: {g['device']}.  GPU kernels are compiled and their numerics proven here by the wave/warp "
                  "emulator (`tests/test_rocm.py`, `tests/test_nvidia.py`); their speed can only be measured on a GPU.",
                  "",
                  "- NVIDIA: `python benchmarks/gpu/build_nvidia_bundle.py --arch sm_90` here, then "
                  "`python benchmarks/gpu/nvidia_check.py` on the GPU machine (numpy, torch, cuda-python) checks "
                  "every cubin against float64 and the emulator and times GEMM 4096^3 f16/bf16 against "
                  "`torch.matmul` (cuBLAS).  " + g["nvidia_figures"],
                  "- ROCm: no AMD GPU has been available; the code objects are checked structurally (ELF flags, "
                  "kernel descriptor, metadata note, disassembly) and numerically by the emulator only.",
                  "",
                  f"Compile time (cold, one GEMM kernel, includes the LLVM subprocess and the assembler/linker): "
                  f"rocm gfx1151 {g['compile_s']['rocm']:.2f} s, nvidia sm_90 {g['compile_s']['nvidia']:.2f} s; "
                  f"emulating it on a 256x256x256 problem: {g['emulate_s']:.2f} s."]
    return "\n".join(lines) + "\n"


NVIDIA_FIGURES = ("Measured figures from GPU machines (numerics on the device, GEMM against cuBLAS, flash "
                  "attention against torch's SDPA) are in `docs/gpu.md`, rendered from the recorded logs.")


def gpu_status() -> dict:
    """What this host can say about the GPU lanes: the device, compile and emulation times."""
    import time
    from tessera.runtime import cuda
    import tessera as ts
    ok, why = cuda.device_available()
    a = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float16)
    times = {}
    emu = 0.0
    os.environ["TESSERA_NO_CACHE"] = "1"
    try:
        for target, arch in (("rocm", "gfx1151"), ("nvidia", "sm_90")):
            t0 = time.perf_counter()
            art = ts.compile(lambda x, y: x @ y, a, a, target=target, arch=arch)
            times[target] = time.perf_counter() - t0
            if target == "nvidia":
                t0 = time.perf_counter()
                art.emulate(a, a)
                emu = time.perf_counter() - t0
    finally:
        os.environ.pop("TESSERA_NO_CACHE", None)
    return {"device": f"NVIDIA {why}" if ok else f"no GPU ({why})", "compile_s": times, "emulate_s": emu,
            "nvidia_figures": NVIDIA_FIGURES}


if __name__ == "__main__":
    main(type("A", (), {"quick": True, "write": False})())
