"""Float64 numpy oracles and closeness checks used by the numeric tests."""
from __future__ import annotations

import math

import numpy as np

from tessera.frontend.reference import sigmoid64

try:
    from scipy.special import erf as _erf, erfc as _erfc
except ImportError:  # pragma: no cover - scipy is in the test extra
    _erf, _erfc = np.vectorize(math.erf), np.vectorize(math.erfc)


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def rel_err(actual, expected) -> float:
    a, e = f64(actual), f64(expected)
    assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
    if e.size == 0:
        return 0.0
    num = np.linalg.norm((a - e).ravel())
    den = np.linalg.norm(e.ravel())
    return float(num / den) if den > 0 else float(num)


def gate(actual, expected, tol: float) -> bool:
    """The numeric gate: relative Frobenius error below tol (NaN fails)."""
    return bool(rel_err(actual, expected) < tol)


def assert_close(actual, expected, tol: float, what: str = "") -> None:
    err = rel_err(actual, expected)
    assert err < tol, f"{what}: relative error {err:.3e} >= {tol:.0e}"


def erf(x):
    return _erf(f64(x))


def gelu_tanh(x):
    """0.5 x (1 + tanh(y)) as x sigmoid(2 y), the same function without the cancellation of
    1 + tanh(y) for x << 0 (in float64 at x = -7.1 that sum keeps about 3 bits: -6.2e-16 for
    -3.9e-16, which failed a one-element test at random)."""
    x = f64(x)
    return x * sigmoid64(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))


def gelu_erf(x):
    """0.5 x (1 + erf(x / sqrt 2)) as 0.5 x erfc(-x / sqrt 2) (no cancellation for x << 0)."""
    x = f64(x)
    return 0.5 * x * _erfc(-x / math.sqrt(2))


def silu(x):
    x = f64(x)
    return x / (1 + np.exp(-x))


def softmax(x, axis=-1):
    x = f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, scale=None, bias=None, eps=1e-5):
    x = f64(x)
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    if scale is not None:
        y = y * f64(scale)
    if bias is not None:
        y = y + f64(bias)
    return y


def rms_norm(x, scale=None, eps=1e-6):
    x = f64(x)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * f64(scale) if scale is not None else y
