"""Compute the coefficients of tessera/codegen/x86_math64.py (the float64 vector math) in
exact or 70-digit arithmetic, each rounded once to float64.  Reproduce with:

    .venv/bin/python tools/fit_math64.py

- ``TANH64_P``: tanh's Taylor coefficients (from Bernoulli numbers, exact fractions),
  tanh x = x + x^3 P(x^2) for |x| < 0.55;
- ``ERF64_P``: erf's Taylor coefficients 2/sqrt(pi) (-1)^n / (n! (2n+1)), erf z = z P(z^2)
  for |z| < 0.5;
- ``ERFC64_MAP``, ``ERFC64_H``: H(a) = a erfc(a) exp(a^2) on a in [0.5, 30] as a power series
  in s = (alpha a - beta) / (a + 3) in [-1, 1] (Chebyshev interpolation at 64 nodes, truncated
  where the terms fall below 2^-58 of min H, then converted to powers of s);
- ``GELU_K0``, ``GELU_K1``, ``LN2``, ``RSQRT2``: 2 sqrt(2/pi), 2 sqrt(2/pi) 0.044715, ln 2 and
  1/sqrt(2) as (high, low) pairs; ``TWO_OVER_SQRT_PI``.

erfc itself is ``tessera.tools.numerics64.erfc`` (the tests' reference): its Taylor series (a < 4,
100 digits) or Laplace's continued fraction (a >= 4, 400 terms).  ``tests/test_f64.py`` checks that the module's tuples are these.
"""
from __future__ import annotations

from decimal import Decimal as D, getcontext
from fractions import Fraction
from math import comb, factorial

from tessera.tools import numerics64 as N64

getcontext().prec = 70
TANH_TERMS = 18
ERF_TERMS = 14
ERFC_CENTER, ERFC_LO, ERFC_HI = 3, D("0.5"), D(30)
ERFC_NODES = 64


PI, SQRT_PI = N64.PI, N64.SQRT_PI


def bernoulli(n: int) -> list[Fraction]:
    """B_0..B_n (B_1 = -1/2)."""
    b = [Fraction(0)] * (n + 1)
    for m in range(n + 1):
        b[m] = Fraction(1) if m == 0 else -sum(comb(m + 1, k) * b[k] for k in range(m)) / (m + 1)
    return b


def tanh_coeffs(terms: int = TANH_TERMS) -> tuple[float, ...]:
    """Coefficients of x^3, x^5, ... (P(x^2) in tanh x = x + x^3 P(x^2))."""
    b = bernoulli(2 * terms + 2)
    out = []
    for n in range(2, terms + 2):
        a = Fraction(2 ** (2 * n) * (2 ** (2 * n) - 1)) * b[2 * n] / factorial(2 * n)
        out.append(float(a))
    return tuple(out)


def erf_coeffs(terms: int = ERF_TERMS) -> tuple[float, ...]:
    two = 2 / SQRT_PI
    return tuple(float(two * (-1) ** n / (factorial(n) * (2 * n + 1))) for n in range(terms))


erfc = N64.erfc


def erfc_scaled(a: D) -> D:
    """G(a) = erfc(a) exp(a^2)."""
    return erfc(a) * (a * a).exp()


def _cos(x: D) -> D:
    x2, term, s, n = x * x, D(1), D(1), 0
    while True:
        n += 2
        term = -term * x2 / (n * (n - 1))
        s += term
        if abs(term) < D(10) ** -75:
            return s


def _cospi(m: int, n: int, cache: dict) -> D:
    """cos(pi m / n) for integers m, n (reduced first: the series loses digits for large x)."""
    m %= 2 * n
    if m > n:
        m = 2 * n - m
    if (m, n) not in cache:
        cache[(m, n)] = _cos(PI * m / n)
    return cache[(m, n)]


def erfc_map() -> tuple[float, float]:
    """(alpha, beta) of s = (alpha a - beta) / (a + 3), rounded to float64 (the fit uses these
    exact values, so the compiled map has no error of its own): s(0.5) = -1, s(30) = 1."""
    alpha = float(D("36.5") / D("29.5"))
    return alpha, float(D(alpha) * D("0.5") + D("3.5"))


def _monomial(cheb: list[D]) -> list[D]:
    """Chebyshev series -> power series coefficients (exact integer T_k coefficients)."""
    polys = [[1], [0, 1]]
    while len(polys) < len(cheb):
        prev, pp = polys[-1], polys[-2]
        new = [0] + [2 * c for c in prev]
        for i, c in enumerate(pp):
            new[i] -= c
        polys.append(new)
    out = [D(0)] * len(cheb)
    for ck, tk in zip(cheb, polys):
        for i, c in enumerate(tk):
            out[i] += ck * c
    return out


def erfc_poly(nodes: int = ERFC_NODES) -> tuple[float, ...]:
    """Power series in s of H(a) = a erfc(a) exp(a^2) on a in [0.5, 30] (H runs from 0.31 to
    0.56: Horner's rule keeps its relative error small, where G = H / a falls to 0.019 and
    cancels): Chebyshev interpolation at ``nodes`` points, truncated where the terms fall below
    2^-58 of min H, converted to powers of s exactly and rounded once each."""
    alpha, beta = (D(v) for v in erfc_map())
    cache: dict = {}
    xs = [_cospi(2 * j + 1, 2 * nodes, cache) for j in range(nodes)]
    fs = []
    for sv in xs:
        a = (beta + 3 * sv) / (alpha - sv)
        fs.append(a * erfc_scaled(a))
    cs = []
    for k in range(nodes):
        c = sum(fs[j] * _cospi(k * (2 * j + 1), 2 * nodes, cache) for j in range(nodes)) * 2 / nodes
        cs.append(c / 2 if k == 0 else c)
    floor = min(fs) * D(2) ** -58
    last = max(k for k, c in enumerate(cs) if abs(c) > floor)
    return tuple(float(c) for c in _monomial(cs[:last + 1]))


def split(v: D) -> tuple[float, float]:
    """v as (high, low) float64s: high = v rounded, low = the rest rounded (106 bits in all)."""
    hi = float(v)
    return hi, float(v - D(hi))


def constants() -> dict[str, tuple[float, ...]]:
    k0 = 2 * (2 / PI).sqrt()
    return {"TANH64_P": tanh_coeffs(), "ERF64_P": erf_coeffs(), "ERFC64_MAP": erfc_map(), "ERFC64_H": erfc_poly(),
            "GELU_K0": split(k0), "GELU_K1": split(k0 * D("0.044715")), "LN2": split(D(2).ln()),
            "RSQRT2": split(1 / D(2).sqrt()), "TWO_OVER_SQRT_PI": (float(2 / SQRT_PI),)}


if __name__ == "__main__":
    for name, vals in constants().items():
        print(f"{name} = {vals!r}")
