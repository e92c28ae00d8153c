"""ULP error of the CPU lane's float64 transcendentals, against 60-digit references.

float64 has too many bit patterns to sweep, so each function is measured on a fixed sample
(seeded: the numbers in ``docs/numerics.md`` regenerate exactly): uniform points over the
function's interesting range, its tails, and tiny magnitudes (1e-300 .. 1).  The references
are evaluated in ``decimal`` at 60 digits: exp and tanh from ``Decimal.exp``, erf by its Taylor
series, erfc by the series below 4 and Laplace's continued fraction above (also what
``tools/fit_math64.py`` fits its coefficients to).  The error of one value is
|y - exact| / ulp(exact rounded to float64); a result past float64's range must be that inf.
"""
from __future__ import annotations

import math
from decimal import Decimal as D, localcontext

import numpy as np

PREC = 60


def _pi() -> D:
    with localcontext() as ctx:
        ctx.prec = 80

        def atan_inv(k: int) -> D:
            x = D(1) / k
            x2, s, term, n = x * x, x, x, 1
            while True:
                term, n = -term * x2, n + 2
                if abs(term / n) < D(10) ** -85:
                    return s
                s += term / n
        return 4 * (4 * atan_inv(5) - atan_inv(239))


PI = _pi()
with localcontext() as _ctx:
    _ctx.prec = 80
    SQRT_PI = PI.sqrt()


def erf_series(a: D) -> D:
    """erf by its Taylor series (fine for |a| < 4 at 100 digits: the terms peak near e^(a^2))."""
    with localcontext() as ctx:
        ctx.prec = 100
        a2, term, s, n = a * a, a, a, 0
        while True:
            n += 1
            term = -term * a2 / n
            d = term / (2 * n + 1)
            s += d
            if abs(d) < D(10) ** -95:
                return 2 * s / SQRT_PI


def erfc(a: D) -> D:
    """erfc(a) for a >= 0."""
    if a < 4:
        with localcontext() as ctx:
            ctx.prec = 100
            r = 1 - erf_series(a)
        return +r
    with localcontext() as ctx:
        ctx.prec = 70
        f = a
        for k in range(400, 0, -1):
            f = a + (D(k) / 2) / f
        return (-(a * a)).exp() / SQRT_PI / f


def _erfc_any(a: D) -> D:
    if a < 0:
        return 2 - _erfc_any(-a)
    return D(0) if a > 30 else erfc(a)


def _sig_times(x: D, u: D) -> D:
    return x * u.exp() if u < -800 else x / (1 + (-u).exp())


def _tanh(x: D) -> D:
    if abs(x) > 40:
        return D(1).copy_sign(x)
    if abs(x) < D("1e-6"):
        return x - x ** 3 / 3 + 2 * x ** 5 / 15
    e = (2 * x).exp()
    return (e - 1) / (e + 1)


def _erf(x: D) -> D:
    if not x:
        return x
    return erf_series(x) if abs(x) < 3 else (1 - _erfc_any(abs(x))).copy_sign(x)


def _gelu_tanh(x: D) -> D:
    u = 2 * (2 / PI).sqrt() * (x + D("0.044715") * x ** 3)
    return x if u > 2000 else D(0) if u < -2000 else _sig_times(x, u)


def _gelu_erf(x: D) -> D:
    return D("0.5") * x * _erfc_any(-x / D(2).sqrt())


REFERENCES = {"exp": lambda x: x.exp(), "tanh": _tanh, "erf": _erf, "silu": lambda x: _sig_times(x, x),
              "gelu_tanh": _gelu_tanh, "gelu_erf": _gelu_erf}


def functions() -> dict:
    import tessera as ts
    return {"exp": ts.ops.exp, "tanh": ts.ops.tanh, "erf": ts.ops.erf, "silu": ts.ops.silu,
            "gelu_tanh": lambda x: ts.ops.gelu(x, "tanh"), "gelu_erf": lambda x: ts.ops.gelu(x, "erf")}


def pow10(u: np.ndarray) -> np.ndarray:
    """10^u correctly rounded (decimal arithmetic), so samples are the same on every host: numpy's
    vectorised power differs in the last bit between CPUs (with AVX-512 or without), which moved the
    mean errors in docs/numerics.md."""
    with localcontext() as ctx:
        ctx.prec = 40
        return np.array([float(D(10) ** D(float(v))) for v in u])


def sample(name: str, rng: np.random.Generator, n: int = 600) -> np.ndarray:
    """Inputs for ``name``: its range, its tails and edges, and tiny magnitudes."""
    tiny = pow10(rng.uniform(-300, 0, n // 4))
    u = rng.uniform
    parts = {
        "exp": [u(-745.2, 709.78, 2 * n), u(-1, 1, n // 2), u(-745.2, -700, n // 2)],
        "tanh": [u(-20, 20, n), u(-0.7, 0.7, n), tiny, -tiny],
        "erf": [u(-7, 7, 3 * n // 2), u(-0.7, 0.7, n // 2), tiny, -tiny],
        "silu": [u(-760, 40, n), u(-40, 40, n), tiny],
        "gelu_tanh": [u(-30, 30, n), u(-4, 4, n), tiny],
        "gelu_erf": [u(-40, 10, 3 * n // 2), u(-2, 2, n), tiny],
    }[name]
    return np.concatenate(parts)


def ulp_errors(got: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    """|got - exact| in ULPs of the exact value rounded to float64 (subnormal ULPs below 2^-1022)."""
    ref = REFERENCES[name]
    out = np.empty(len(x))
    with localcontext() as ctx:
        ctx.prec = PREC
        for i, (g, v) in enumerate(zip(got, x)):
            r = ref(D(float(v)))
            rf = float(r)
            if math.isinf(rf) or math.isinf(g):   # past float64's range: only the rounded inf is right
                out[i] = 0.0 if g == rf else math.inf
                continue
            out[i] = float(abs(D(float(g)) - r) / D(float(np.spacing(abs(rf))) if rf else 5e-324))
    return out


def measure(seed: int = 64, n: int = 600, arch: str = "avx2") -> dict[str, dict]:
    """Errors on the seeded samples, compiled for ``arch`` (the f64 math has one code path on every
    ISA; the width is pinned so the doc does not depend on the host)."""
    import tessera as ts
    out = {}
    for name, fn in functions().items():
        x = sample(name, np.random.default_rng([seed, len(name)]), n)
        with np.errstate(all="ignore"):
            got = ts.jit(fn, arch=arch)(x)
        e = ulp_errors(got, x, name)
        worst = int(np.argmax(e))
        out[name] = {"max_ulp": float(e.max()), "mean_ulp": float(e.mean()), "worst_input": float(x[worst]),
                     "points": int(x.size)}
    return out


def section() -> str:
    rows = measure()
    out = ["### float64 (every vector ISA: one code path)\n\n",
           "Algorithms: `tessera/codegen/x86_math64.py` (no library calls); coefficients: exact Taylor terms and "
           "`tools/fit_math64.py`; compiled with `arch=avx2` (4 lanes; the AVX-512 form, 8 lanes, runs the same code per lane).  Error in float64 ULPs against 60-digit references (`tessera/tools/numerics64.py`) "
           "on a fixed sample per function (its range, tails, edges and magnitudes down to 1e-300).  "
           "`tests/test_f64.py` holds each to its bound (`ULP_BOUND` there) on fresh random samples of the same "
           "kind.  The composites keep these bounds in their tails: gelu_tanh forms 2y in double-double "
           "arithmetic, gelu_erf carries x / sqrt(2) to 106 bits, and results that are subnormal are scaled "
           "into place last (one rounding).\n\n"
           "A kernel that touches float64 computes in f64 registers.  Elementwise f64 ops (add, sub, mul, div, "
           "maximum, neg, relu, sqrt), casts and copies are correctly rounded, so they equal numpy bit for bit; "
           "sums (reductions, softmax and norm rows, GEMM with `vfmadd231pd`) accumulate in f64 and differ from "
           "numpy's only in the order of the additions.  A narrower value such a kernel goes on computing with "
           "is rounded in registers to what numpy holds (`round_f32` / `round_bf16` / `round_f16`: a cast to its "
           "type, any f32 / bf16 / f16 op to f32); a row op (softmax, layer_norm, rms_norm) on such a value runs in "
           "f64, its result rounded only by the ops after it or by its store (closer to the exact value than an "
           "f32 kernel's).\n\n",
           "| function | max ULP | mean ULP | worst input | points |\n|---|---:|---:|---:|---:|\n"]
    for name, r in rows.items():
        out.append(f"| {name} | {r['max_ulp']:.2f} | {r['mean_ulp']:.3f} | {r['worst_input']:.6g} | {r['points']} |\n")
    return "".join(out)
