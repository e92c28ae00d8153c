"""The reference lane's meaning of int / bool values and of the typed ops (comparisons, where,
logic, integer arithmetic, index generators): numpy in the value's own dtype, with the corners
numpy leaves undefined defined as the compiled lane defines them (tessera.codegen.x86_int_elem)."""
from __future__ import annotations

import numpy as np


def cast(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """``x.astype(to)``; float -> int truncates toward zero and saturates, NaN -> 0."""
    x = np.asarray(x)
    to = np.dtype(to)
    if to.kind in "iu" and x.dtype.kind in "fV":   # V: bfloat16
        info = np.iinfo(to)
        xf = x.astype(np.float64)
        with np.errstate(invalid="ignore"):
            t = np.trunc(np.where(np.isnan(xf), 0.0, xf))
            out = np.where(t <= info.min, info.min, np.where(t >= info.max, info.max, 0)).astype(to)
            inside = (t > info.min) & (t < info.max)
            out[inside] = t[inside].astype(to)
        return out
    if to.kind in "iu" and x.dtype.kind in "iu":
        return x.astype(to)   # wraps: keeps the low bits
    with np.errstate(all="ignore"):
        return x.astype(to)


def floor_divide(a, b):
    """numpy's floor division on ints, with a zero divisor giving 0 (numpy: 0 and a warning)."""
    with np.errstate(all="ignore"):
        return np.floor_divide(a, b)


def mod(a, b):
    with np.errstate(all="ignore"):
        return np.mod(a, b)


def shift(a, b, left: bool):
    """numpy's left_shift / right_shift: a count >= the width (or negative) gives 0 (right: the sign)."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    bits = a.dtype.itemsize * 8
    ok = (b >= 0) & (b < bits)
    sb = np.where(ok, b, 0).astype(a.dtype)
    if left:
        return np.where(ok, np.left_shift(a, sb), 0).astype(a.dtype)
    return np.where(ok, np.right_shift(a, sb), np.where(a < 0, -1, 0)).astype(a.dtype)


__all__ = ["cast", "floor_divide", "mod", "shift"]

# op name -> f(node, operand arrays): filled by the typed ops' module (frontend/ops_typed.py)
OPS: dict = {}


def power(a, b):
    with np.errstate(all="ignore"):
        return np.power(a, b)
