"""The float64 oracles of gelu (tests/oracle.py) and the reference lane's gelu and silu are
checked against 60- to 100-digit evaluations of the same functions, in the tail too: written as
0.5 x (1 + tanh y) or 0.5 x (1 + erf z), float64 keeps only a few bits of the sum for x << 0
(at x = -7.1, -6.2e-16 for -3.9e-16), which failed a one-element kernel test at random."""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import oracle as O
import pytest

import tessera as ts
from tessera.frontend.reference import evaluate
from tessera.frontend.trace import trace

C_TANH = math.sqrt(2 / math.pi)   # the float64 constants the functions are defined with
XS = np.concatenate([np.linspace(-12.0, 6.0, 181), np.linspace(-7.3, -6.3, 41), [-0.0, 1e-30, -1e-30]])


def gelu_tanh_exact(x: float) -> float:
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(x)
        y = Decimal(C_TANH) * (d + Decimal(0.044715) * d ** 3)
        return float(d / (1 + (-2 * y).exp()))


def erf_exact(z: Decimal) -> Decimal:
    """erf by its Maclaurin series at 100 digits (terms reach about e^(z^2) before they fall)."""
    with localcontext() as ctx:
        ctx.prec = 100
        total, term, n = Decimal(0), z, 0
        while True:
            add = term / (2 * n + 1)
            total += add
            if abs(add) < Decimal(10) ** -90 and n > z * z:
                break
            n += 1
            term = -term * z * z / n
        return total * 2 / _sqrt_pi()


def _sqrt_pi() -> Decimal:
    # pi to 100 digits by Machin's formula: pi = 16 atan(1/5) - 4 atan(1/239)
    def atan_inv(k: int) -> Decimal:
        x, total, n, sign = Decimal(1) / k, Decimal(0), 1, 1
        term = x
        while term > Decimal(10) ** -105:
            total += sign * term / n
            term *= x * x
            n += 2
            sign = -sign
        return total
    return (16 * atan_inv(5) - 4 * atan_inv(239)).sqrt()


def gelu_erf_exact(x: float) -> float:
    with localcontext() as ctx:
        ctx.prec = 100
        d = Decimal(x)
        return float(d / 2 * (1 + erf_exact(d / Decimal(2).sqrt())))


def silu_exact(x: float) -> float:
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(x)
        return float(d / (1 + (-d).exp()))


EXACT = {"gelu_tanh": gelu_tanh_exact, "gelu_erf": gelu_erf_exact, "silu": silu_exact}
TEXTBOOK = {  # the forms that cancel: the teeth
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(C_TANH * (x + 0.044715 * x ** 3))),
    "gelu_erf": lambda x: 0.5 * x * (1 + O.erf(x / math.sqrt(2))),
}


def max_rel(got: np.ndarray, name: str) -> float:
    want = np.array([EXACT[name](float(v)) for v in XS])
    nz = want != 0
    assert np.all(got[~nz] == 0)
    return float(np.max(np.abs(got[nz] - want[nz]) / np.abs(want[nz])))


@pytest.mark.parametrize("name", ["gelu_tanh", "gelu_erf"])
def test_gelu_oracles_hold_in_the_tail(name):
    assert max_rel(getattr(O, name)(XS), name) < 1e-12
    # teeth: the textbook form of the same function fails the same check
    assert max_rel(TEXTBOOK[name](XS), name) > 1e-3


def reference_lane_ulps(name: str) -> float:
    """The reference lane's worst error against the exact value, in float32 ulps (its results are
    float32: float64 arithmetic rounded once)."""
    fn = {"gelu_tanh": lambda v: ts.ops.gelu(v, "tanh"), "gelu_erf": lambda v: ts.ops.gelu(v, "erf"),
          "silu": ts.ops.silu}[name]
    x = XS.astype(np.float32)
    got = evaluate(trace(fn, [x], [True]), [x])[0].astype(np.float64)
    want = np.array([EXACT[name](float(v)) for v in x])
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(got - want) / ulp))


@pytest.mark.parametrize("name", ["gelu_tanh", "gelu_erf", "silu"])
def test_reference_lane_holds_in_the_tail(name):
    assert reference_lane_ulps(name) <= 0.5 + 1e-6   # float32's rounding of a value exact to float64


def test_reference_lane_tail_check_has_teeth(monkeypatch):
    from tessera.frontend import reference
    monkeypatch.setattr(reference, "sigmoid64", lambda y: 0.5 * (1 + np.tanh(y / 2)))   # cancels for y << 0
    assert reference_lane_ulps("gelu_tanh") > 1000
