"""ULP errors of the elementary functions (log, log1p, exp2, expm1, sin, cos) on the CPU lane.

float32: against numpy's float64 functions (whose own error, below 2^-52 relative, is below 2^-28
of a float32 ULP).  float64: against 60-digit ``decimal`` references (ln and exp from ``Decimal``,
sin and cos by Taylor series after a reduction by an 80-digit pi).  Samples span each function's
range: random magnitudes over all exponents, the region near 0 (where log1p/expm1/sin are ~x),
arguments up to 1e5 for sin/cos, subnormal inputs.  Rendered into ``docs/numerics.md``; the bounds
are held by ``tests/test_elementwise_math.py``."""
from __future__ import annotations

import math
from decimal import Decimal as D, localcontext

import numpy as np

from tessera.tools.numerics64 import PI, pow10

NAMES = ("log", "log1p", "exp2", "expm1", "sin", "cos")
NUMPY = {"log": np.log, "log1p": np.log1p, "exp2": np.exp2, "expm1": np.expm1, "sin": np.sin, "cos": np.cos}
# the largest |x| at which sin/cos are held to their bound (the reduction is exact to 2^20 pi/2 = 1.6e6)
TRIG_RANGE = 1e5
_LN2 = None


def _ln2() -> D:
    global _LN2
    if _LN2 is None:
        with localcontext() as ctx:
            ctx.prec = 80
            _LN2 = D(2).ln()
    return _LN2


def _sin_taylor(r: D, k0: int) -> D:
    """sum (-1)^k r^(2k + k0) / (2k + k0)!  (k0 = 1: sin, 0: cos) for |r| <= pi."""
    term = r if k0 else D(1)
    s, n = term, k0
    r2 = r * r
    while True:
        term = -term * r2 / ((n + 1) * (n + 2))
        n += 2
        if abs(term) < D(10) ** -75:
            return s
        s += term


def reference(name: str, x: float) -> D:
    """The exact value of ``name`` at x (to ~60 digits); NaN/inf handled by the caller."""
    v = D(x)
    with localcontext() as ctx:
        ctx.prec = 70
        if name == "log":
            return v.ln()
        if name == "log1p":
            if abs(v) < D("1e-20"):
                return v - v * v / 2 + v * v * v / 3
            return (1 + v).ln()
        if name == "exp2":
            return (v * _ln2()).exp()
        if name == "expm1":
            if abs(v) < D("1e-20"):
                return v + v * v / 2 + v * v * v / 6
            return v.exp() - 1
        two_pi = 2 * PI
        r = v - two_pi * (v / two_pi).to_integral_value()
        return _sin_taylor(r, 1 if name == "sin" else 0)


def sample(name: str, rng: np.random.Generator, n: int, dtype=np.float64) -> np.ndarray:
    """Finite inputs of ``dtype`` spread over ``name``'s domain."""
    lo_exp = -300 if dtype == np.float64 else -40     # into the subnormals of float32
    hi_exp = 300 if dtype == np.float64 else 38
    k = n // 4
    mag = lambda a, b, m: pow10(rng.uniform(a, b, m))   # noqa: E731
    if name == "log":
        parts = [mag(lo_exp, hi_exp, 2 * k), 1 + rng.uniform(-0.3, 0.3, k), rng.uniform(0, 4, n - 3 * k)]
    elif name == "log1p":
        parts = [rng.uniform(-1, 1, k), mag(lo_exp, hi_exp, k), -mag(lo_exp, -0.001, k), rng.uniform(-1, 20, n - 3 * k)]
    elif name == "exp2":
        top = 1024 if dtype == np.float64 else 128
        bot = -1074 if dtype == np.float64 else -149
        parts = [rng.uniform(bot, top, 2 * k), rng.uniform(-2, 2, n - 2 * k)]
    elif name == "expm1":
        top = 709 if dtype == np.float64 else 88.7
        parts = [rng.uniform(-40, top, k), rng.uniform(-1, 1, k), mag(lo_exp, -1, k) * rng.choice([-1, 1], k),
                 rng.uniform(-0.35, 0.35, n - 3 * k)]
    else:
        parts = [rng.uniform(-10, 10, k), rng.uniform(-TRIG_RANGE, TRIG_RANGE, k),
                 mag(lo_exp, 0, k) * rng.choice([-1, 1], k), rng.uniform(-1.6, 1.6, n - 3 * k)]
    x = np.concatenate(parts).astype(dtype)
    x = x[np.isfinite(x) & ((x > -1) if name == "log1p" else True) & ((x > 0) if name == "log" else True)]
    return x


def ulp_errors64(got: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    """|got - exact| in float64 ULPs of the exact value (subnormal ULPs below 2^-1022)."""
    out = np.empty(len(x))
    with localcontext() as ctx:
        ctx.prec = 60
        for i, (g, v) in enumerate(zip(got, x)):
            r = reference(name, float(v))
            rf = float(r)
            if math.isinf(rf) or math.isinf(g) or math.isnan(g):
                out[i] = 0.0 if g == rf else math.inf
                continue
            out[i] = float(abs(D(float(g)) - r) / D(float(np.spacing(abs(rf))) if rf else 5e-324))
    return out


def ulp_errors32(got: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    from tessera.tools.numerics import ulp_errors
    with np.errstate(all="ignore"):
        return ulp_errors(got, NUMPY[name](x.astype(np.float64)))


def measure(dtype, seed: int = 27, n: int = 4000, arch: str = "avx2") -> dict[str, dict]:
    """Max and mean ULP error of each function on a seeded sample, compiled for ``arch``."""
    import tessera as ts
    out = {}
    for name in NAMES:
        x = sample(name, np.random.default_rng([seed, len(name), NAMES.index(name)]), n, dtype)
        got = ts.jit(getattr(ts.ops, name), arch=arch)(x)
        e = (ulp_errors64 if dtype == np.float64 else ulp_errors32)(got, x, name)
        worst = int(np.argmax(e))
        out[name] = {"max_ulp": float(e.max()), "mean_ulp": float(e.mean()), "worst_input": float(x[worst]),
                     "points": int(x.size)}
    return out


def section() -> str:
    out = ["### log, log1p, exp2, expm1, sin, cos (float32 and float64)\n\n",
           "Algorithms: `tessera/codegen/x86_math_elem.py` (range reductions and exact Taylor terms, no "
           "fitted constants).  The float32 functions are the float64 ones, computed in f64 lanes and rounded "
           "once, so they are within 0.5 ULP plus a 2^-29 fraction of the f64 error; bf16 and f16 compute in "
           "f32 registers and round once more on their store.  float32 errors are against numpy's float64 "
           "functions, float64 errors against 60-digit references (`tessera/tools/numerics_elem.py`), on a "
           "fixed sample per function (all magnitudes, the region near 0, subnormal inputs; sin and cos up to "
           f"|x| = {TRIG_RANGE:g}), compiled with `arch=avx2`.  `tests/test_elementwise_math.py` holds each to "
           "its bound on fresh random samples.  sin and cos reduce by pi/2 in three parts whose products with "
           "n are exact while |n| < 2^20 (|x| < 1.6e6); past that their error is unbounded in relative terms "
           "(the result stays in [-1, 1]).  Near a multiple of pi/2 below 1.6e6 the reduced argument carries an "
           "absolute error below ~1e-21, so float32 results there are unaffected.  sigmoid is silu's form "
           "(`_sigmoid_times` at x = 1): the tests hold it to 4 ULP (f32) and 3 ULP (f64) over [-800, 800]; "
           "abs, sign, floor, ceil, round (half to even), square, reciprocal, minimum and clip are correctly "
           "rounded (numpy's bits, signed zeros included), rsqrt within 1.5 ULP (two correctly rounded steps).\n\n",
           "| function | dtype | max ULP | mean ULP | worst input | points |\n|---|---|---:|---:|---:|---:|\n"]
    for dtype, label in ((np.float32, "f32"), (np.float64, "f64")):
        for name, m in measure(dtype).items():
            out.append(f"| {name} | {label} | {m['max_ulp']:.2f} | {m['mean_ulp']:.3f} | {m['worst_input']:.6g} | "
                       f"{m['points']} |\n")
    return "".join(out)
