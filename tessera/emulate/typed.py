"""The emulator's semantics of the typed lanes of ``tessera_gpu.math`` (int32 / int64 / bool
registers), written from numpy's definitions independently of the LLVM translation
(:mod:`tessera.codegen.gpu_typed`): each operand is first read as its declared element type.

numpy leaves a few corners undefined (or warns); the GPU lanes define them as the CPU lane does:
a zero divisor gives 0 for int floor division and modulo, INT_MIN // -1 wraps to INT_MIN, a shift
count outside [0, width) gives 0 (a right shift of a negative value: -1), float -> int truncates
and saturates with NaN -> 0, and anything nonzero (NaN included) converts to True.
"""
from __future__ import annotations

import numpy as np


def cvt(a: np.ndarray, to: np.dtype) -> np.ndarray:
    if to == np.bool_:
        return a != 0
    if a.dtype == np.bool_:
        return a.astype(to)
    if to.kind == "i" and a.dtype.kind == "f":
        info = np.iinfo(to)
        lim = 2.0 ** (info.bits - 1)
        w = np.where(np.isnan(a), 0.0, np.trunc(a.astype(np.float64)))
        inside = (w < lim) & (w >= -lim)
        res = np.where(w >= lim, info.max, info.min).astype(to)
        res[inside] = w[inside].astype(to)
        return res
    return a.astype(to)


def _floordiv_mod(a, b, fn):
    if a.dtype.kind == "f":
        with np.errstate(all="ignore"):
            w = (np.floor_divide if fn == "floordiv" else np.remainder)(a.astype(np.float64), b.astype(np.float64))
        return w.astype(a.dtype)
    zero = b == 0
    mone = b == -1
    safe = np.where(zero | mone, 1, b).astype(a.dtype)
    with np.errstate(all="ignore"):
        q = np.floor_divide(a, safe)
        r = np.remainder(a, safe)
    if fn == "floordiv":       # x // -1 = -x, wrapping at INT_MIN
        return np.where(zero, 0, np.where(mone, (np.zeros_like(a) - a), q)).astype(a.dtype)
    return np.where(zero | mone, 0, r).astype(a.dtype)


def _shift(a, c, fn):
    bits = np.iinfo(a.dtype).bits
    ok = (c >= 0) & (c < bits)
    cs = np.where(ok, c, 0).astype(a.dtype)
    if fn == "shl":
        return np.where(ok, np.left_shift(a, cs), 0).astype(a.dtype)
    return np.where(ok, np.right_shift(a, cs), np.where(a < 0, -1, 0)).astype(a.dtype)


def run(fn: str, args: list[np.ndarray], out: np.dtype) -> np.ndarray:
    """The result of typed ``fn`` on ``args`` (each already of its declared dtype), as ``out``."""
    with np.errstate(all="ignore"):
        a = args[0]
        if fn == "cvt":
            return cvt(a, out)
        if fn == "select":
            return np.where(a, args[1], args[2]).astype(out)
        if fn == "isnan":
            return np.isnan(a)
        if fn == "isinf":
            return np.isinf(a)
        if fn == "isfinite":
            return np.isfinite(a)
        if fn == "not":
            return np.invert(a)
        if fn == "neg":
            return (np.zeros_like(a) - a).astype(out)
        if fn == "abs":
            return np.where(a < 0, np.zeros_like(a) - a, a).astype(out)
        c = args[1]
        cmp = {"cmp_eq": np.equal, "cmp_ne": np.not_equal, "cmp_lt": np.less, "cmp_le": np.less_equal,
               "cmp_gt": np.greater, "cmp_ge": np.greater_equal}
        if fn in cmp:
            return cmp[fn](a, c)
        if fn in ("and", "or", "xor"):
            return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[fn](a, c)
        if fn in ("add", "sub", "mul"):
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[fn](a, c).astype(out)
        if fn in ("max", "min"):
            return (np.maximum if fn == "max" else np.minimum)(a, c).astype(out)
        if fn in ("shl", "shr"):
            return _shift(a, c, fn)
        if fn in ("floordiv", "mod"):
            return _floordiv_mod(a, c, fn)
        if fn == "pow":        # numpy's power (C99's special cases), rounded once from float64
            return np.power(a.astype(np.float64), c.astype(np.float64)).astype(out)
    raise KeyError(fn)


__all__ = ["run", "cvt"]
