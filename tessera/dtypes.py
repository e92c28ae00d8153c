"""Element types: numpy / ml_dtypes <-> IR types <-> short names."""
from __future__ import annotations

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import (BFloat16Type, Float8E4M3FNType, Float8E5M2Type, Float16Type, Float32Type,
                                   Float64Type, IntegerType, Signedness)
from xdsl.ir import Attribute

from tessera.errors import DtypeError

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float64 = np.dtype(np.float64)
# OCP fp8 (ml_dtypes): matmul operands only (tessera.ops.matmul / scaled_matmul), widened exactly
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
FP8 = (float8_e4m3fn, float8_e5m2)

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
# the one unsigned dtype (quantised tensors' asymmetric zero points): ``ui8`` in the IR, so every
# layer down to the x86 codegen sees its signedness (zext, uitofp, unsigned compares and division)
uint8 = np.dtype(np.uint8)

_BY_NAME = {"f32": float32, "f16": float16, "bf16": bfloat16, "f64": float64, "bool": bool_,
            "i8": int8, "u8": uint8, "i32": int32, "i64": int64, "f8e4m3fn": float8_e4m3fn, "f8e5m2": float8_e5m2}
_NAME = {v: k for k, v in _BY_NAME.items()}
SUPPORTED = tuple(_BY_NAME)


def as_dtype(d) -> np.dtype:
    """numpy dtype from a numpy/ml_dtypes dtype, a type, or a name ('f32', 'bfloat16', ...)."""
    if isinstance(d, str) and d in _BY_NAME:
        return _BY_NAME[d]
    try:
        dt = np.dtype(d)
    except TypeError:
        raise DtypeError(f"unknown dtype {d!r}; supported: {', '.join(SUPPORTED)}") from None
    if dt not in _NAME:
        raise DtypeError(f"dtype {dt} is not supported; supported: {', '.join(SUPPORTED)}")
    return dt


# Type promotion, as JAX's lattice (jax.numpy.promote_types, without x64 surprises):
#   bool < int8 < int32 < int64 < (every float);  bool < uint8 < int32;  bf16 and f16 each below
#   f32 (their join is f32), f32 below f64.  uint8 with int8 is int32 (JAX and numpy give int16,
#   which Tessera has no dtype for; the values are the same).
# So int with int is the wider int, int with float is the float, bool with anything is the other.
# A Python number is weak (frontend/trace): a weak int takes the dtype of an int or float array it
# meets (int32 beside a bool array, JAX's default int); a weak float takes a float array's dtype and
# gives float32 (JAX's default float) beside an int or bool array.
_FLOAT_RANK = {bfloat16: 1, float16: 1, float32: 2, float64: 3}
_INT_RANK = {int8: 1, uint8: 1, int32: 2, int64: 3}
INTS = (int8, uint8, int32, int64)
FLOATS = (float32, float16, bfloat16, float64)
DEFAULT_INT, DEFAULT_FLOAT = int32, float32


def kind(d) -> str:
    """'b' (bool), 'i' (int, signed or uint8) or 'f' (float)."""
    d = np.dtype(d)
    return "b" if d == bool_ else "i" if d in _INT_RANK else "f"


def promote(a, b) -> np.dtype | None:
    """The dtype two operands of these dtypes compute in (JAX's lattice above), or None for a
    dtype outside it."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    if a not in _NAME or b not in _NAME or a in FP8 or b in FP8:
        return None     # fp8 never promotes: matmul takes it as it is, other ops refuse it
    ka, kb = kind(a), kind(b)
    if ka != kb:   # bool < int < float: the higher kind wins whole
        order = "bif"
        return a if order.index(ka) > order.index(kb) else b
    if ka == "i":
        if _INT_RANK[a] == _INT_RANK[b]:   # int8 with uint8: the narrowest int of ours holding both
            return int32
        return a if _INT_RANK[a] > _INT_RANK[b] else b
    ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
    if ra == rb:   # bf16 with f16
        return float32
    return a if ra > rb else b


def promote_weak(strong, weak_kind: str) -> np.dtype:
    """The dtype an array of dtype ``strong`` and a weak Python number of kind ``weak_kind``
    ('i' for int, 'f' for float) compute in: the array's where its kind is at least the number's,
    else the number kind's default (int32, float32), as JAX's weak types."""
    strong = np.dtype(strong)
    ks = kind(strong)
    if weak_kind == "f" and ks != "f":
        return DEFAULT_FLOAT
    if weak_kind == "i" and ks == "b":
        return DEFAULT_INT
    return strong


def name(d) -> str:
    return _NAME[as_dtype(d)]


def ir_type(d) -> Attribute:
    dt = as_dtype(d)
    if dt == bool_:
        return IntegerType(1)
    if dt == uint8:
        return IntegerType(8, Signedness.UNSIGNED)
    if dt in _INT_RANK:
        return IntegerType(dt.itemsize * 8)
    return {float32: Float32Type(), float16: Float16Type(), bfloat16: BFloat16Type(), float64: Float64Type(),
            float8_e4m3fn: Float8E4M3FNType(), float8_e5m2: Float8E5M2Type()}[dt]


def from_ir(t: Attribute) -> np.dtype:
    for cls, dt in ((Float32Type, float32), (Float16Type, float16), (BFloat16Type, bfloat16),
                    (Float64Type, float64), (Float8E4M3FNType, float8_e4m3fn), (Float8E5M2Type, float8_e5m2)):
        if isinstance(t, cls):
            return dt
    if isinstance(t, IntegerType):
        return bool_ if t.width.data == 1 else np.dtype(f"{'u' if is_unsigned(t) else ''}int{t.width.data}")
    raise DtypeError(f"no numpy dtype for IR type {t}")


def is_unsigned(t) -> bool:
    """An unsigned IR integer type (``ui8``), or a vector / tile / tensor type of one."""
    e = getattr(t, "element_type", t)
    return isinstance(e, IntegerType) and e.signedness.data == Signedness.UNSIGNED
