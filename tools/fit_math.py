"""Fit the polynomial coefficients used by tessera/codegen/x86_math.py (float64 least
squares on Chebyshev nodes, relative-error weighting), and report each fit's error when
the polynomial is evaluated in float32 by Horner's rule.  Reproduce with:

    .venv/bin/python tools/fit_math.py

The printed tuples are the ones in x86_math.py; tests measure the compiled functions'
ULP error against float64 references, so a bad fit fails there.
"""
import math

import numpy as np


def cheb_nodes(a, b, n):
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos((2 * k + 1) * np.pi / (2 * n))


def lsq(z, target, degree):
    A = np.stack([z**i for i in range(degree + 1)], axis=1)
    w = 1 / np.abs(target)
    coef, *_ = np.linalg.lstsq(A * w[:, None], target * w, rcond=None)
    return coef


def horner32(coef, z):
    z = z.astype(np.float32)
    acc = np.float32(coef[-1]) * np.ones_like(z)
    for c in coef[-2::-1]:
        acc = (acc * z + np.float32(c)).astype(np.float32)
    return acc


def report(name, coef, z, target):
    e64 = np.max(np.abs(np.polyval(coef[::-1], z) / target - 1))
    e32 = np.max(np.abs(horner32(coef, z).astype(np.float64) / target - 1))
    print(f"{name} = {tuple(float(np.float32(c)) for c in coef)}  # rel err f64 {e64:.2e}, f32 Horner {e32:.2e}")


def lawson(z, target, degree, weight, rounds=30):
    """Weighted least squares, reweighted toward the minimax fit (Lawson's iteration):
    minimises max |weight * (P(z) - target)| approximately."""
    A = np.stack([z**i for i in range(degree + 1)], axis=1)
    ww = np.ones_like(z)
    for _ in range(rounds):
        coef, *_ = np.linalg.lstsq(A * (weight * ww)[:, None], target * weight * ww, rcond=None)
        err = np.abs((A @ coef - target) * weight)
        ww = ww * np.sqrt(err / err.max() + 1e-3)
        ww /= ww.max()
    return coef


def main():
    # exp(r) = 1 + r + r^2 * Q(r), |r| <= ln2 / 2 (a little wider: the reduction's rounding), error
    # relative to exp(r); the AVX2 short form evaluates Q's pairs in r, combines them in r^2 and
    # ends with Horner's steps for 1 + r (x86_math._exp_short_core)
    h = math.log(2) / 2 * 1.0005
    r = cheb_nodes(-h, h, 20000)
    q = (np.expm1(r) - r) / r**2
    coef = lawson(r, q, 4, r**2 / np.exp(r))
    e64 = np.max(np.abs((np.polyval(coef[::-1], r) * r**2 + 1 + r) / np.exp(r) - 1))
    print(f"EXP_Q = {tuple(float(np.float32(c)) for c in coef)}  # rel err of exp f64 {e64:.2e}")
    # tanh(x) = x + x^3 * P(x^2), |x| < 0.625
    xs = cheb_nodes(1e-3, 0.625, 4000)
    t = (np.tanh(xs) - xs) / xs**3
    report("TANH_P", lsq(xs * xs, t, 5), xs * xs, t)
    # erf(x) = x * P(x^2), |x| < 1
    xs = cheb_nodes(1e-3, 1.0, 4000)
    t = np.array([math.erf(v) for v in xs]) / xs
    report("ERF_P", lsq(xs * xs, t, 7), xs * xs, t)
    # erfc(a) * exp(a^2) = R(1/a - c), two pieces over a in [1, 10]
    for name, a0, a1 in (("ERFC_R1", 1.0, 2.5), ("ERFC_R2", 2.5, 10.0)):
        xs = cheb_nodes(a0, a1, 6000)
        t = np.array([math.erfc(v) * math.exp(v * v) for v in xs])
        c = (1 / a0 + 1 / a1) / 2
        print(f"{name}_CENTER = {c!r}")
        report(name, lsq(1 / xs - c, t, 9), 1 / xs - c, t)


if __name__ == "__main__":
    main()
