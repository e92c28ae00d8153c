"""``tessera.ops``: comparisons, ``where``, logical and bitwise ops, ``isnan`` / ``isinf`` /
``isfinite``, floor division, modulo, shifts, ``pow``, and the index generators ``arange`` /
``iota`` with ``tril`` / ``triu`` built on them.  Semantics are numpy's, dtypes promote as JAX's
(``dtypes.promote``); the corners numpy leaves undefined are defined (docs/architecture.md)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from tessera import dtypes as dt
from tessera.errors import DtypeError, RankMismatchError, ShapeMismatchError, UnsupportedConstructError
from tessera.frontend import reference_ints as R
from tessera.ir import opset
from tessera.frontend.trace import (Tensor, _err, add_node, as_tensor, broadcast_shapes, constant, normalize_axis,
                                    promote_pair, require_int)

_CMP = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
        "greater": np.greater, "greater_equal": np.greater_equal}


def _pair(op: str, a, b) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise _err(DtypeError, f"{op} expects a traced tensor, got {type(a).__name__} and {type(b).__name__}")
    if not isinstance(a, Tensor):
        a = as_tensor(a, b, op)
    b = as_tensor(b, a, op)
    return promote_pair(a, b, op)


def _bin(op: str, a, b, bool_result: bool = False) -> Tensor:
    a, b = _pair(op, a, b)
    k, kinds = dt.kind(a.dtype), opset.kinds(op)   # the operand kinds the registry allows
    if k not in kinds:
        raise _err(DtypeError, f"{op}: dtype {dt.name(a.dtype)} is not supported ({op} takes "
                               f"{' or '.join(opset.KIND_NAMES[c] for c in kinds)} tensors)")
    return add_node(op, [a._node, b._node], {}, broadcast_shapes(a.shape, b.shape, op),
                    dt.bool_ if bool_result else a.dtype)


def equal(a, b) -> Tensor:
    """``a == b`` -> bool (NaN is unequal to everything)."""
    return _bin("equal", a, b, True)


def not_equal(a, b) -> Tensor:
    """``a != b`` -> bool (true for NaN)."""
    return _bin("not_equal", a, b, True)


def less(a, b) -> Tensor:
    return _bin("less", a, b, True)


def less_equal(a, b) -> Tensor:
    return _bin("less_equal", a, b, True)


def greater(a, b) -> Tensor:
    return _bin("greater", a, b, True)


def greater_equal(a, b) -> Tensor:
    return _bin("greater_equal", a, b, True)


def bitwise_and(a, b) -> Tensor:
    """``a & b`` on bool (logical) or int tensors."""
    return _bin("bitwise_and", a, b)


def bitwise_or(a, b) -> Tensor:
    return _bin("bitwise_or", a, b)


def bitwise_xor(a, b) -> Tensor:
    return _bin("bitwise_xor", a, b)


def bitwise_not(x) -> Tensor:
    """``~x``: logical not on bool, bitwise on ints."""
    x = _tensor(x, "bitwise_not")
    if dt.kind(x.dtype) == "f":
        raise _err(DtypeError, f"bitwise_not: dtype {dt.name(x.dtype)} is not supported (int or bool tensors)")
    return add_node("bitwise_not", [x._node], {}, x.shape, x.dtype)


def _truth(x, op: str) -> Tensor:
    x = _tensor(x, op)
    return x if x.dtype == dt.bool_ else not_equal(x, 0)


def logical_and(a, b) -> Tensor:
    """numpy's logical_and: nonzero is true; the result is bool."""
    return bitwise_and(_truth(a, "logical_and"), _truth(b, "logical_and"))


def logical_or(a, b) -> Tensor:
    return bitwise_or(_truth(a, "logical_or"), _truth(b, "logical_or"))


def logical_xor(a, b) -> Tensor:
    return bitwise_xor(_truth(a, "logical_xor"), _truth(b, "logical_xor"))


def logical_not(x) -> Tensor:
    return bitwise_not(_truth(x, "logical_not"))


def _float_pred(op: str, x) -> Tensor:
    x = _tensor(x, op)
    if dt.kind(x.dtype) != "f":   # numpy: an int is never NaN / inf
        from tessera.frontend import ops
        z = ops.cast(x, dt.bool_)
        return bitwise_or(z, bitwise_not(z)) if op == "isfinite" else bitwise_and(z, bitwise_not(z))
    return add_node(op, [x._node], {}, x.shape, dt.bool_)


def isnan(x) -> Tensor:
    return _float_pred("isnan", x)


def isinf(x) -> Tensor:
    return _float_pred("isinf", x)


def isfinite(x) -> Tensor:
    return _float_pred("isfinite", x)


def floor_divide(a, b) -> Tensor:
    """``a // b``: numpy's floor division; an int divided by 0 is 0 (numpy: 0 and a warning)."""
    return _bin("floor_divide", a, b)


def mod(a, b) -> Tensor:
    """``a % b``: numpy's remainder (the divisor's sign); an int modulo 0 is 0."""
    return _bin("mod", a, b)


remainder = mod


def left_shift(a, b) -> Tensor:
    """``a << b`` on ints; a count >= the width or < 0 gives 0, as numpy's."""
    return _bin("left_shift", a, b)


def right_shift(a, b) -> Tensor:
    """``a >> b`` on ints (arithmetic); a count >= the width or < 0 gives 0, or -1 for a < 0."""
    return _bin("right_shift", a, b)


def pow(x, y) -> Tensor:   # noqa: A001 - numpy's name
    """``x ** y`` with a tensor exponent (numpy's float semantics: 0 ** 0 = 1, a negative base
    with an integer-valued exponent has that sign, otherwise NaN); an integer Python exponent
    is multiplications (``x ** 3``)."""
    if isinstance(y, Tensor) and y._node.scalar_of and y._node.pykind == "i":
        from tessera.frontend.trace import scalar_value_needed   # a Python int exponent: specialised on,
        scalar_value_needed(y, "an integer exponent")            # so it stays multiplications
    if isinstance(y, numbers.Real) and not isinstance(y, bool) and isinstance(x, Tensor):
        from tessera.frontend.trace import _power
        try:
            return _power(x, y)
        except UnsupportedConstructError:
            pass
    a, b = _pair("pow", x, y)
    if dt.kind(a.dtype) != "f":
        raise _err(DtypeError, f"pow: dtype {dt.name(a.dtype)} is not supported with a tensor exponent "
                               "(float tensors; an int base with a Python int exponent is multiplications)")
    return add_node("pow", [a._node, b._node], {}, broadcast_shapes(a.shape, b.shape, "pow"), a.dtype)


def where(cond, a, b) -> Tensor:
    """numpy's ``where(cond, a, b)``: ``a`` where ``cond`` is true (nonzero), else ``b``; the
    three broadcast together; ``a`` and ``b`` (tensors or Python numbers) promote as JAX's."""
    if not isinstance(cond, Tensor):
        raise _err(DtypeError, f"where: the condition must be a traced tensor, got {type(cond).__name__}")
    cond = _truth(cond, "where")
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):   # two Python numbers: JAX's defaults
        both_int = all(isinstance(v, numbers.Integral) for v in (a, b))
        a = constant(a, dt.DEFAULT_INT if both_int else dt.DEFAULT_FLOAT)
    a, b = _pair("where", a, b)
    shape = broadcast_shapes(broadcast_shapes(cond.shape, a.shape, "where"), b.shape, "where")
    return add_node("where", [cond._node, a._node, b._node], {}, shape, a.dtype)


def iota(shape, axis: int = 0, dtype=np.int32) -> Tensor:
    """An array of ``shape`` whose elements are their index along ``axis`` (``lax.iota`` /
    ``broadcasted_iota``).  Static sizes; inside a fused kernel it is computed, never stored."""
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    shape = tuple(require_int(s, f"iota: size {i} of {shape}") for i, s in enumerate(shape))
    if any(s < 0 for s in shape):
        raise _err(ShapeMismatchError, f"iota: negative size in {shape}")
    if not shape:
        raise _err(RankMismatchError, "iota needs rank >= 1")
    axis = normalize_axis(axis, len(shape), "iota")
    d = dt.as_dtype(dtype)
    if d == dt.bool_:
        raise _err(DtypeError, "iota: dtype bool is not supported (int or float)")
    return add_node("iota", [], {"axis": axis}, shape, d, weak=False)


def arange(start, stop=None, step=1, dtype=None) -> Tensor:
    """numpy's ``arange`` with static bounds (Python numbers): ``start + step * iota``; the dtype
    is int32 for ints (JAX's default), float32 when a bound is a float, unless ``dtype`` says."""
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            if isinstance(v, Tensor):
                from tessera.frontend.trace import scalar_value_needed
                scalar_value_needed(v, f"arange {name}")
            raise _err(ShapeMismatchError, f"arange: {name} must be a Python number, got {type(v).__name__}")
    if step == 0:
        raise _err(ShapeMismatchError, "arange: step must not be 0")
    n = max(0, math.ceil((stop - start) / step))
    all_int = all(isinstance(v, numbers.Integral) for v in (start, stop, step))
    d = dt.as_dtype(dtype) if dtype is not None else (dt.DEFAULT_INT if all_int else dt.DEFAULT_FLOAT)
    if d == dt.bool_:
        raise _err(DtypeError, "arange: dtype bool is not supported")
    if dt.kind(d) == "i" and not all_int:
        raise _err(DtypeError, f"arange: float bounds with dtype {dt.name(d)}")
    x = iota((n,), 0, d)
    from tessera.frontend import ops
    if step != 1:
        x = ops.mul(x, step)
    if start != 0:
        x = ops.add(x, start)
    return x


def _tri(x, k: int, lower: bool) -> Tensor:
    op = "tril" if lower else "triu"
    x = _tensor(x, op)
    if x.ndim < 2:
        raise _err(RankMismatchError, f"{op} needs rank >= 2, got shape {x.shape}")
    k = require_int(k, f"{op}: k")
    n, m = x.shape[-2], x.shape[-1]
    rows, cols = iota((n, m), 0), iota((n, m), 1)
    keep = greater_equal(rows + k, cols) if lower else less_equal(rows + k, cols)
    return where(keep, x, 0)


def tril(x, k: int = 0) -> Tensor:
    """``x`` with the elements above the k-th diagonal zeroed (numpy's tril)."""
    return _tri(x, k, True)


def triu(x, k: int = 0) -> Tensor:
    """``x`` with the elements below the k-th diagonal zeroed (numpy's triu)."""
    return _tri(x, k, False)


def _tensor(x, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise _err(DtypeError, f"{what} expects a traced tensor, got {type(x).__name__}")
    return x


# the reference lane's meaning of each node (numpy in the node's dtype)
def _ref_iota(n, x):
    return np.broadcast_to(np.arange(n.shape[n.attrs["axis"]]).reshape(
        [-1 if i == n.attrs["axis"] else 1 for i in range(len(n.shape))]), n.shape).astype(n.dtype)


R.OPS.update({k: (lambda f: lambda n, x: f(x[0], x[1]))(f) for k, f in _CMP.items()})
R.OPS.update({
    "bitwise_and": lambda n, x: np.bitwise_and(x[0], x[1]), "bitwise_or": lambda n, x: np.bitwise_or(x[0], x[1]),
    "bitwise_xor": lambda n, x: np.bitwise_xor(x[0], x[1]), "bitwise_not": lambda n, x: np.invert(x[0]),
    "isnan": lambda n, x: np.isnan(x[0]), "isinf": lambda n, x: np.isinf(x[0]),
    "isfinite": lambda n, x: np.isfinite(x[0]), "where": lambda n, x: np.where(x[0], x[1], x[2]),
    "floor_divide": lambda n, x: R.floor_divide(x[0], x[1]), "mod": lambda n, x: R.mod(x[0], x[1]),
    "left_shift": lambda n, x: R.shift(x[0], x[1], True), "right_shift": lambda n, x: R.shift(x[0], x[1], False),
    "pow": lambda n, x: R.power(x[0], x[1]), "iota": _ref_iota,
})

__all__ = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "where", "logical_and",
           "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
           "isnan", "isinf", "isfinite", "floor_divide", "mod", "remainder", "left_shift", "right_shift", "pow",
           "arange", "iota", "tril", "triu"]
