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
    return "".join(out)
