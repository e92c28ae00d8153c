"""ULP error of the CPU lane's transcendentals over their whole float32 input range (float64:
``numerics64``).

The sweep takes every ``STRIDE``-th float32 bit pattern (both signs, all exponents,
subnormals, infinities and NaNs included), runs each function through a compiled
Tessera kernel, and compares with a float64 reference (numpy; scipy's erf).  The
error of one value is |y - ref| / ulp(ref) with ulp the float32 spacing at ref; a
NaN where the reference is NaN (or an infinity where it is the same infinity) is
exact; any other mismatch of kind is reported as infinite error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

STRIDE = 997  # prime: every exponent and many mantissa patterns are hit


def sweep(stride: int = STRIDE) -> np.ndarray:
    bits = np.arange(0, 1 << 32, stride, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 88.72, -103.9, 9.0, 0.625, 1.0],
                        dtype=np.float32)
    return np.concatenate([x, specials])


def _erf(x):
    try:
        from scipy.special import erf
        return erf(x)
    except ImportError:  # pragma: no cover
        return np.vectorize(math.erf)(x)


def _erfc(x):
    try:
        from scipy.special import erfc
        return erfc(x)
    except ImportError:  # pragma: no cover
        return np.vectorize(math.erfc)(x)


def references():
    import tessera as ts
    from tessera.frontend.reference import sigmoid64
    sq = math.sqrt(2 / math.pi)
    return {
        "exp": (ts.ops.exp, np.exp),
        "tanh": (ts.ops.tanh, np.tanh),
        "erf": (ts.ops.erf, _erf),
        # the same functions in float64, written without cancellation: 0.5(1 + tanh y) = sigmoid(2y) and
        # 0.5(1 + erf z) = 0.5 erfc(-z)
        "gelu_tanh": (lambda a: ts.ops.gelu(a, "tanh"), lambda v: v * sigmoid64(2 * sq * (v + 0.044715 * v ** 3))),
        "gelu_erf": (lambda a: ts.ops.gelu(a, "erf"), lambda v: 0.5 * v * _erfc(-v / math.sqrt(2))),
        "silu": (ts.ops.silu, lambda v: v * sigmoid64(v)),
    }


def ulp_errors(got: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):   # a reference past float32's range is inf in float32
        ref32 = ref64.astype(np.float32)
    err = np.zeros(got.shape, np.float64)
    same_nan = np.isnan(got) & np.isnan(ref64)
    same_inf = np.isinf(got) & np.isinf(ref32) & (np.sign(got) == np.sign(ref32))
    finite = np.isfinite(got) & np.isfinite(ref32)
    spacing = np.spacing(np.abs(ref32)).astype(np.float64)
    err[finite] = np.abs(got[finite].astype(np.float64) - ref64[finite]) / spacing[finite]
    bad = ~(same_nan | same_inf | finite)
    err[bad] = np.inf
    return err


# The math library has one code path per vector ISA (AVX-512 uses rcp14/scalef, AVX2 does not), so
# each is measured on its own, compiled for the ISA level's arch.  A host runs the levels its CPU has;
# the doc keeps the last measured table of a level this host cannot run (and says so).
LEVELS = (("avx512", "AVX-512 (16 lanes)"), ("avx2", "AVX2 + FMA (8 lanes)"))


def measure(stride: int = STRIDE, arch: str | None = None) -> dict[str, dict]:
    import tessera as ts
    x = sweep(stride)
    out = {}
    with np.errstate(all="ignore"):
        for name, (fn, ref) in references().items():
            got = ts.jit(fn, arch=arch)(x)
            e = ulp_errors(got, ref(x.astype(np.float64)))
            worst = int(np.argmax(e))
            out[name] = {"max_ulp": float(e.max()), "mean_ulp": float(e[np.isfinite(e)].mean()),
                         "worst_input": float(x[worst]), "points": int(x.size)}
    return out


def _marker(level: str, end: bool = False) -> str:
    return f"<!-- {'end ' if end else ''}level {level} -->\n"


def _kept_section(level: str) -> str | None:
    """The checked-in table of ``level`` (markers included), or None."""
    from pathlib import Path
    doc = Path(__file__).resolve().parents[2] / "docs" / "numerics.md"
    text = doc.read_text() if doc.exists() else ""
    a, b = text.find(_marker(level)), text.find(_marker(level, True))
    return text[a:b + len(_marker(level, True))] if 0 <= a < b else None


def _section(level: str, title: str) -> str:
    from tessera import host
    from tessera.errors import LaneUnavailableError
    from tessera.mma.x86 import resolve
    try:
        rows = measure(arch=level)
    except LaneUnavailableError:
        kept = _kept_section(level)
        if kept is not None:
            return kept
        missing = ", ".join(host.missing_features(resolve(level)[2]))
        return (_marker(level) + f"### {title}\n\nNot measured yet: the CPU that generated this page lacks "
                f"{missing}.\n\n" + _marker(level, True))
    out = [_marker(level), f"### {title}\n\n", f"Compiled with `arch={level}`; {next(iter(rows.values()))['points']:,} "
           "inputs.\n\n| function | max ULP | mean ULP | worst input |\n|---|---:|---:|---:|\n"]
    for name, r in rows.items():
        out.append(f"| {name} | {r['max_ulp']:.2f} | {r['mean_ulp']:.3f} | {r['worst_input']:.6g} |\n")
    out.append("\n" + _marker(level, True))
    return "".join(out)


def numerics_md() -> str:
    from tessera.tools.docs import HEADER
    out = [HEADER.format(cmd="tessera docs numerics --write"), "# Numerics of the CPU lane\n\n",
           "Per op family: what it accumulates in, subnormals (FTZ/DAZ), NaN and infinities, and whether its "
           "bits depend on the thread count; then the error of each transcendental.  Every table here is produced "
           "by `tessera docs numerics --write` from data and measurements in `tessera/tools/numerics.py`.\n\n"]
    out.append(_families_section(measure_families(), measure_fp_modes()))
    out += ["## Transcendentals\n\n",
           f"Maximum and mean error in float32 ULPs of each transcendental, over every {STRIDE}th float32 bit "
           "pattern (both signs, every exponent, subnormals, infinities, NaN) plus special values; reference: "
           "float64 numpy (scipy for erf).  Algorithms: `tessera/codegen/x86_math.py`; coefficients: "
           "`tools/fit_math.py`.  No fast-math: NaN and infinities propagate as in numpy.  The math has one code "
           "path per vector ISA, so each is measured separately; a CPU measures the levels it can run, and a "
           "table of a level it cannot run is kept from the last CPU that could (the drift test then checks the "
           "others).\n\n"]
    for level, title in LEVELS:
        out.append(_section(level, title) + "\n")
    out.append("exp, tanh and erf are within a few ULPs everywhere.  The composites (gelu, silu) evaluate their inner "
               "argument (`sqrt(2/pi) (x + 0.044715 x^3)`, `x / sqrt(2)`) in float32; for x << 0 the result decays "
               "like exp(-c x^2) and the argument's own rounding (a few ULPs of a value near -|x|^3) is multiplied "
               "by that exponent, so the relative error of the tiny result grows with |x| (the worst inputs above).  "
               "Where the functions are well conditioned the error stays small: `tests/test_x86_math.py` bounds "
               "gelu by 24 ULP and silu by 4 ULP on [-4, 4].  Against a float64 oracle the relative (Frobenius) error "
               "of every op is below 1e-5.\n\n"
               "Softmax and attention take exp of a difference from a running maximum, which cannot overflow; "
               "softmax uses `exp_bounded` (a Tile IR function: exp for x <= 88.7, unspecified above), which on AVX2 "
               "drops the overflow clamp and is otherwise the exp above.  `tests/test_x86_math.py` measures it "
               "within 1 ULP over every swept input <= 88.7 (the subnormal window included) and checks that each "
               "lane gets the value it gets alone.  Attention keeps its scores in log2 units (the scale multiplied by "
               "log2 e when S = Q K^T is stored, an additive mask by log2 e as it is read) and takes `exp2_bounded` "
               "(2^x for x <= 127; 0 below 2^-126: beside the row maximum's weight of 1 such a probability moves an "
               "output by less than 2^-126 times the values it weighs): its reduction x - round(x) is exact, so the "
               "Cody-Waite steps go; within 1 ULP over its domain, tested the same way.  Softmax's row maximum drops a NaN (`select_max`: one `vmaxps`); the "
               "NaN still reaches the row's sum, so the row is NaN wherever numpy's is (tested at every column "
               "position).\n\n")
    from tessera.tools.numerics64 import section
    out.append(section())
    from tessera.tools import numerics_elem
    out.append("\n" + numerics_elem.section())
    return "".join(out)


# ------------------------------------------------------------------------------------------ op families
# What each family of CPU kernels does with its sums, subnormals, NaN and infinities, and why its
# result does not depend on the thread count: written here, beside the measurement that checks it
# (``measure_families``), and rendered into docs/numerics.md.


@dataclass(frozen=True)
class Family:
    name: str
    kernels: str          # tessera/passes/tile/kernels/<file>
    accumulation: str
    subnormals: str
    nan_inf: str
    threads: str          # why the thread count and the run do not change a bit


FAMILIES: tuple[Family, ...] = (
    Family("elementwise", "elementwise.py, rows.py",
           "none: every element in f32 registers (bf16/f16 operands widened exactly as loaded, rounded once as "
           "stored)",
           "kept (IEEE arithmetic; the transcendentals have exact subnormal tails)",
           "IEEE, as numpy: NaN propagates through arithmetic and transcendentals; `maximum` returns NaN when "
           "either operand is NaN (one `vmaxps` and a NaN select)",
           "rows are split across threads; every element is computed by the same instructions wherever its row "
           "runs"),
    Family("softmax / layer_norm / rms_norm", "rowwise.py",
           "f32: per row, lane-wise partial sums over a chunk of 4 vector registers (64 lanes on AVX-512, 32 on "
           "AVX2; the `chunk` pin changes it), then one fixed halving tree; layer_norm's variance is a second pass "
           "about the mean",
           "kept",
           "as numpy: a NaN anywhere in a row makes the row NaN (softmax's row maximum drops it, the sum does "
           "not); +inf in a softmax row gives NaN (inf - inf); -inf entries get weight 0 and an all -inf row is "
           "NaN; a layer_norm/rms_norm row holding an inf is NaN",
           "a row belongs to one thread, and its order of summation is fixed by the chunk"),
    Family("reduce_sum / reduce_mean / reduce_max", "reduce.py",
           "f32.  Reduced axes last: per output, lane-wise partial sums over the chunk, then the halving tree "
           "(a full reduction is one such row, on one thread).  Otherwise: each output column summed in order "
           "over the reduced rows.  mean = sum / n",
           "kept",
           "as numpy: `reduce_max` is NaN when any element is NaN; sums follow IEEE (inf + -inf = NaN)",
           "an output element is computed by one thread, in the same order"),
    Family("matmul (f32, bf16)", "gemm.py",
           "f32 FMA in k order; the partial sums of earlier k-blocks pass through C in f32, so the blocking changes "
           "no bit.  bf16 follows its instruction record (below)",
           "f32 and bf16 widened to f32: kept.  `vdpbf16ps` and AMX `tdpbf16ps` flush subnormal inputs and "
           "outputs and ignore MXCSR (their records' semantics, below)",
           "IEEE: NaN propagates, inf x 0 = NaN, infinite sums as numpy's",
           "an element's whole k loop runs on one thread; threads take whole register tiles of rows"),
    Family("attention", "attention.py",
           "f32: S = Q K^T by FMA over the head dim; online softmax over key blocks (running maximum, weights "
           "2^(s - m), sum l) and O += P V, all f32; out = O / l",
           "a probability below 2^-126 is 0 (`exp2_bounded`), otherwise kept",
           "as the composed softmax(Q K^T * scale + mask) V in float64: a NaN or +inf in a key row makes the "
           "rows that see it NaN; a NaN or inf in V reaches every output that weighs it",
           "a (batch, head, query block) item belongs to one thread, whichever claims it"),
)
# reductions, scans and the loss ops (tests/test_reductions_scans.py)
FAMILIES += (
    Family("logsumexp / log_softmax / cross_entropy", "logrows.py, xent.py",
           "f32 (f64 for f64; bf16/f16 widened): a max pass, then lane-wise partial sums of exp(x - s) over the "
           "chunk and the fixed halving tree; s is the row maximum clamped to the finite range; cross_entropy's "
           "mean is a reduce_sum of the per-row losses over one of the valid flags",
           "kept",
           "as scipy.special: an all -inf row has logsumexp -inf (log_softmax and cross_entropy NaN), a +inf "
           "entry gives +inf, a NaN gives NaN; an ignored label's loss is 0 whatever its logits; a label outside "
           "[0, C) reads nothing and gives +inf",
           "a row belongs to one thread, and its order of summation is fixed by the chunk"),
    Family("argmax / argmin / top_k", "argrows.py, topk.py",
           "none (comparisons); indices found in the float registers (exact below 2^24 columns in f32) and "
           "stored as int64",
           "kept (compared as they are)",
           "argmax/argmin as numpy: a NaN is the extreme and the first NaN's index is returned; top_k in "
           "torch.topk's order: NaN above +inf, then descending, equal values by lower index",
           "a row belongs to one thread"),
    Family("cumsum / cumprod, reduce_prod / any / all", "scan.py, reduce.py",
           "scans: in order along the axis in the registers (f32 for f32/bf16/f16, so an f32 scan is numpy's "
           "own result; f64 for f64), each output rounded once as stored.  reduce_prod: lane-wise partial "
           "products and the fixed halving tree, as reduce_sum.  any/all: min/max of (x == 0) flags",
           "kept",
           "IEEE through the running sum/product (a NaN propagates along the axis from where it appears); any / "
           "all count NaN as nonzero, as numpy's bool(nan)",
           "an output column (scan) or element (reduction) is computed by one thread, in the same order"),
)

MEASURE_THREADS = (1, 2)


@dataclass(frozen=True)
class Case:
    family: str
    label: str
    fn: object            # a function of tessera tensors
    ref: object           # the same in float64 numpy
    shapes: tuple
    dtype: str = "float32"
    poison: int = 0       # the argument NaN / inf are planted in
    tol: float = 0.0      # relative error bound against float64 (0: 1e-5, bf16 1e-2)

    @property
    def bound(self) -> float:
        return self.tol or (1e-2 if self.dtype == "bfloat16" else 1e-5)


def _softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm64(x, s, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * s


def _rms_norm64(x, s, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * s


def cases() -> list[Case]:
    """One or more programs per family, large enough that every thread gets work."""
    import tessera as ts
    from tessera.frontend.reference import attention64, sigmoid64
    sq = math.sqrt(2 / math.pi)

    def gelu64(v):
        return v * sigmoid64(2 * sq * (v + 0.044715 * v ** 3))

    def attn64(q, k, v, causal=False):
        return attention64(q, k, v, None, 1 / math.sqrt(q.shape[-1]), causal)

    return [
        Case("elementwise", "maximum(gelu(x * y + 1), y)", lambda x, y: ts.ops.maximum(ts.ops.gelu(x * y + 1.0), y),
             lambda x, y: np.maximum(gelu64(x * y + 1), y), ((600, 777), (777,))),
        Case("softmax / layer_norm / rms_norm", "softmax", ts.ops.softmax, _softmax64, ((300, 4097),)),
        Case("softmax / layer_norm / rms_norm", "layer_norm", ts.ops.layer_norm, _layer_norm64, ((300, 4097), (4097,))),
        Case("softmax / layer_norm / rms_norm", "rms_norm", ts.ops.rms_norm, _rms_norm64, ((300, 4097), (4097,))),
        Case("reduce_sum / reduce_mean / reduce_max", "reduce_sum, last axis",
             lambda x: ts.ops.reduce_sum(x, axis=-1), lambda x: x.sum(-1), ((40000, 67),)),
        Case("reduce_sum / reduce_mean / reduce_max", "reduce_sum, first axis",
             lambda x: ts.ops.reduce_sum(x, axis=0), lambda x: x.sum(0), ((64, 40001),)),
        Case("reduce_sum / reduce_mean / reduce_max", "reduce_mean, middle axis",
             lambda x: ts.ops.reduce_mean(x, axis=1), lambda x: x.mean(1), ((4, 64, 9001),)),
        Case("reduce_sum / reduce_mean / reduce_max", "reduce_max, first axis",
             lambda x: ts.ops.reduce_max(x, axis=0), lambda x: x.max(0), ((64, 40001),)),
        Case("reduce_sum / reduce_mean / reduce_max", "reduce_sum, all of 2^21 + 3",
             ts.ops.reduce_sum, lambda x: np.sum(x), (((1 << 21) + 3,),),
             # 2^21 zero-mean terms cancel to about sqrt(n) = 1448 times their size, while each of the
             # chunk's lanes adds up 2^15 of them in order: an error of ~1e-6 of sum |x| is 1e-4 of the sum
             tol=1e-3),
        Case("matmul (f32, bf16)", "513x777 @ 777x259", lambda a, b: a @ b, lambda a, b: a @ b,
             ((513, 777), (777, 259))),
        Case("matmul (f32, bf16)", "batched 4x129x333 @ 4x333x65", lambda a, b: a @ b, lambda a, b: a @ b,
             ((4, 129, 333), (4, 333, 65))),
        Case("matmul (f32, bf16)", "bf16 257x511 @ 511x130", lambda a, b: a @ b, lambda a, b: a @ b,
             ((257, 511), (511, 130)), dtype="bfloat16"),
        Case("attention", "2x4x300x64", lambda q, k, v: ts.ops.attention(q, k, v), attn64,
             ((2, 4, 300, 64),) * 3, poison=1),
        Case("attention", "causal 2x4x300x64", lambda q, k, v: ts.ops.attention(q, k, v, causal=True),
             lambda q, k, v: attn64(q, k, v, True), ((2, 4, 300, 64),) * 3, poison=1),
    ]


def inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray]:
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if case.dtype == "bfloat16" else np.dtype(case.dtype)
    return [rng.standard_normal(s).astype(np.float32).astype(dt) for s in case.shapes]


def threads_used(jf, args) -> int:
    """The most threads any launch of ``jf(*args)`` runs on."""
    from tessera.runtime.cpu import bind_symbols
    exe = jf.compile(*args).compiled.executable
    plan = exe.plan(bind_symbols(exe.program.inputs, list(args)))
    return max(s.nthreads for s in plan.steps)


def bits(a) -> bytes:
    a = np.ascontiguousarray(a)
    return a.dtype.str.encode() + a.tobytes()


def run_threads(case: Case, args, threads=MEASURE_THREADS, runs: int = 2, **jit_kw) -> dict:
    """{thread count: (threads used, [the result of each run])}."""
    import tessera as ts
    out = {}
    for n in threads:
        jf = ts.jit(case.fn, schedule={"threads": n}, **jit_kw)
        out[n] = (threads_used(jf, args), [np.asarray(jf(*args)) for _ in range(runs)])
    return out


def special_pattern_matches(got, ref) -> bool:
    """NaN, +inf and -inf where the float64 reference has them, and nowhere else."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return all(np.array_equal(f(got), f(ref)) for f in (np.isnan, np.isposinf, np.isneginf))


def poisoned(case: Case, args, value: float) -> list[np.ndarray]:
    """``args`` with ``value`` planted in argument ``case.poison``: one row at an odd column (a vector's
    tail), one element of another row, and the last element."""
    out = [a.copy() for a in args]
    p = out[case.poison].reshape(-1, out[case.poison].shape[-1])
    p[min(1, p.shape[0] - 1), min(37, p.shape[1] - 1)] = value
    p[p.shape[0] // 2, 0] = value
    p[-1, -1] = value
    return out


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def measure_families(seed: int = 0) -> list[dict]:
    """Per case: the threads each thread-count pin ran on, whether every result (two runs per pin) has the
    same bits, the relative error against float64, and whether NaN / +inf / -inf land where numpy's do."""
    import tessera as ts
    rng = np.random.default_rng(seed)
    rows = []
    with np.errstate(all="ignore"):
        for c in cases():
            args = inputs(c, rng)
            res = run_threads(c, args)
            first = res[MEASURE_THREADS[0]][1][0]
            same = all(bits(r) == bits(first) for _, rs in res.values() for r in rs)
            ref = c.ref(*[f64(a) for a in args])
            err = float(np.linalg.norm(f64(first) - ref) / max(np.linalg.norm(ref), 1e-300))
            jf = ts.jit(c.fn)
            specials = {v: special_pattern_matches(jf(*pa), c.ref(*[f64(a) for a in pa]))
                        for v in (np.nan, np.inf, -np.inf) for pa in [poisoned(c, args, v)]}
            rows.append({"family": c.family, "case": c.label, "dtype": c.dtype,
                         "threads": [res[n][0] for n in MEASURE_THREADS], "identical": same, "rel_err": err,
                         "specials": {str(k): v for k, v in specials.items()}})
    return rows


TINY = 2.0 ** -149


def _has_subnormal(a) -> bool:
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return bool(np.any((u & 0x7F800000 == 0) & (u & 0x7FFFFF != 0)))


def fp_mode_programs():
    """Programs whose inputs or results are mostly subnormal float32: (label, fn, float64 ref, inputs)."""
    import tessera as ts

    def ew(rng):
        return [(rng.standard_normal((2000, 500)) * 2.0 ** -130).astype(np.float32),
                rng.standard_normal((2000, 500)).astype(np.float32)]

    def mm(rng):
        return [(rng.standard_normal((300, 257)) * 2.0 ** -133).astype(np.float32),
                rng.standard_normal((257, 130)).astype(np.float32)]
    return [("elementwise x * tanh(y) + x / 2", lambda x, y: x * ts.ops.tanh(y) + x * 0.5,
             lambda x, y: x * np.tanh(y) + x * 0.5, ew),
            ("matmul f32, subnormal A", lambda a, b: a @ b, lambda a, b: a @ b, mm)]


def measure_fp_modes(seed: int = 0) -> list[dict]:
    """Per program, calling thread's mode (default / FTZ+DAZ) and ``deterministic``: whether the results of
    1 and 2 threads have the same bits, and whether subnormals were kept (within 2^-149 units of a float32
    rounding of the float64 result, some result subnormal) or flushed (none).  The checks run after the
    caller's mode is restored: numpy follows it too."""
    import tessera as ts
    from tessera.runtime import workers
    rng = np.random.default_rng(seed)
    ftz = workers.MXCSR_DEFAULT | workers.MXCSR_FTZ | workers.MXCSR_DAZ
    rows = []
    for label, fn, ref, make in fp_mode_programs():
        args = make(rng)
        r64 = ref(*[f64(a) for a in args])
        for det in (False, True):
            jfs = [ts.jit(fn, schedule={"threads": n}, deterministic=det) for n in MEASURE_THREADS]
            for jf in jfs:
                jf(*args)                         # compiled in the default mode
            workers.pool(max(MEASURE_THREADS))    # the workers exist before the caller's mode changes
            for mode_name, mode in (("default", workers.MXCSR_DEFAULT), ("FTZ+DAZ", ftz)):
                saved = workers.get_mxcsr()
                workers.set_mxcsr(mode)
                try:
                    outs = [jf(*args) for jf in jfs for _ in range(2)]
                finally:
                    workers.set_mxcsr(saved)
                same = all(bits(o) == bits(outs[0]) for o in outs)
                excess = np.abs(f64(outs[0]) - r64) - 2 * np.finfo(np.float32).eps * np.abs(r64)
                if label.startswith("matmul"):
                    k = args[0].shape[-1]
                    excess = np.abs(f64(outs[0]) - r64) - k * np.finfo(np.float32).eps * (
                        np.abs(f64(args[0])) @ np.abs(f64(args[1]))) - k * TINY
                kept = _has_subnormal(outs[0]) and float(np.max(excess)) <= 2 * TINY
                rows.append({"program": label, "caller": mode_name, "deterministic": det, "identical": same,
                             "subnormals": "kept" if kept else "flushed" if not _has_subnormal(outs[0]) else
                             "wrong"})
    return rows


def _families_section(measured: list[dict], modes: list[dict]) -> str:
    from tessera.mma.x86 import RECORDS
    out = ["## Op families\n\n",
           "What each family of CPU kernels accumulates in, what it does with subnormals, NaN and infinities, "
           "and why its bits do not depend on the thread count (`FAMILIES` in `tessera/tools/numerics.py`; "
           "kernels in `tessera/passes/tile/kernels/`).  Float64 arrays are not covered here.\n\n",
           "| family | kernels | accumulation | subnormals | NaN / inf | thread count |\n|---|---|---|---|---|---|\n"]
    for f in FAMILIES:
        out.append(f"| {f.name} | {f.kernels} | {f.accumulation} | {f.subnormals} | {f.nan_inf} | {f.threads} |\n")
    out.append("\nThe x86 instruction records with a stated semantics (`tessera/mma/x86.py`):\n\n"
               "| record | inputs | semantics |\n|---|---|---|\n")
    for r in RECORDS:
        if r.semantics:
            out.append(f"| `{r.id}` | {r.a_dtype} x {r.b_dtype} -> {r.acc_dtype} | {r.semantics} |\n")
    out.append(
        "\n### Floating-point mode (FTZ / DAZ)\n\n"
        "Nothing in Tessera sets flush-to-zero or denormals-are-zero.  MXCSR belongs to a thread, and a thread "
        "inherits its creator's; so a launch copies the calling thread's MXCSR to its worker threads "
        "(`runtime/workers.py`), and every kernel entry runs with round-to-nearest and all exceptions masked, "
        "keeping the caller's FTZ/DAZ bits, and restores the thread's own MXCSR on return "
        "(`codegen/x86.py: add_entry`).  By default a caller that flushes subnormals (as numpy does in that "
        "thread too) gets them flushed on every thread.  `ts.jit(f, deterministic=True)` (also "
        "`schedule={\"deterministic\": True}`, `tessera-cpu{deterministic=true}`) clears FTZ/DAZ for its "
        "kernels whatever the caller set, so the same inputs give the same bits in any thread of any process.  "
        "Every kernel already gives the same bits for every thread count and run (below), so that is the only "
        "thing the setting changes.  `vdpbf16ps` and AMX flush subnormals whatever MXCSR says (records "
        "above).\n\n")
    out.append(f"Measured by `tessera docs numerics --write` (`measure_fp_modes`), threads "
               f"{', '.join(map(str, MEASURE_THREADS))}, two runs each:\n\n"
               "| program | caller's mode | deterministic | same bits for every thread count and run | subnormals |\n"
               "|---|---|---|---|---|\n")
    for m in modes:
        out.append(f"| {m['program']} | {m['caller']} | {'yes' if m['deterministic'] else 'no'} | "
                   f"{'yes' if m['identical'] else '**no**'} | {m['subnormals']} |\n")
    out.append(f"\n### Measured per family\n\nEach case is compiled with the thread count pinned to "
               f"{' and '.join(map(str, MEASURE_THREADS))} (`schedule={{\"threads\": n}}`) and run twice per pin on "
               "random normal inputs (`measure_families`; `tests/test_determinism.py` also runs 3 threads).  "
               "*threads* is what the launches ran on (small outputs run on one thread: a reduction's work is its "
               "output; a full reduction is one row).  *NaN / +inf / -inf* plants the value at three places of the "
               "poisoned argument and checks that NaN, +inf and -inf land exactly where the float64 numpy "
               "reference has them.\n\n"
               "| family | case | dtype | threads | same bits | error vs float64 | NaN | +inf | -inf |\n"
               "|---|---|---|---|---|---|---|---|---|\n")
    bound = {c.label: c.bound for c in cases()}
    for m in measured:
        ok = m["rel_err"] < bound[m["case"]]
        sp = [("as numpy" if m["specials"][k] else "**differs**") for k in ("nan", "inf", "-inf")]
        out.append(f"| {m['family']} | {m['case']} | {m['dtype']} | {', '.join(map(str, m['threads']))} | "
                   f"{'yes' if m['identical'] else '**no**'} | {'<' if ok else '**>=**'} {bound[m['case']]:.0e} | "
                   f"{' | '.join(sp)} |\n")
    return "".join(out) + "\n"
