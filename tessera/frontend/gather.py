"""Gathers: ``take`` (the embedding lookup ``table[ids]``), ``take_along_axis``, ``one_hot`` and
``x[idx]`` with one integer-array index (numpy's semantics for a single advanced index).

Index arrays are int32 or int64 tensors (traced arguments or computed values); the gathered
tensor is a float or an int8 / int32 / int64 one (integers are copied exactly).  Runtime
index values follow one policy, the Graph IR's (``ir/graph_index.py``): in [-n, n) they mean
what numpy means, outside they are clamped into the axis (as jax.numpy's indexing); no read
leaves the array.  ``one_hot`` gives a row of zeros for a label outside [0, num_classes).
The gathered axis is compiled in (its size is specialised on).
"""
from __future__ import annotations

import math

import numpy as np

from tessera import dtypes as dt
from tessera.errors import DtypeError, RankMismatchError, ShapeMismatchError, UnsupportedConstructError
from tessera.frontend import ops
from tessera.frontend.trace import Tensor, _err, add_node, normalize_axis, require_float, require_int

INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def is_array_index(i) -> bool:
    """An item of ``x[...]`` that is an index array (not a Python-number argument used as an
    integer, which basic indexing specialises on)."""
    return isinstance(i, Tensor) and not (i._node.scalar_of is not None and i.ndim == 0)


def index_array(i, what: str) -> Tensor:
    """``i`` checked as an index array: an int32 / int64 tensor."""
    if isinstance(i, (list, tuple, np.ndarray)):
        raise _err(UnsupportedConstructError, f"{what}: a constant index array ({type(i).__name__}) is not "
                                              "supported; pass the indices as an int32/int64 argument")
    if not isinstance(i, Tensor):
        raise _err(DtypeError, f"{what}: expects an int32/int64 index tensor, got {type(i).__name__}")
    if i.dtype == dt.bool_:
        raise _err(DtypeError, f"{what}: a bool index array is a mask in numpy (boolean indexing), which is not "
                               "supported; use an int32/int64 index array, or where() for a masked value")
    if i.dtype not in INDEX_DTYPES:
        raise _err(DtypeError, f"{what}: index arrays must be int32 or int64, got {i.dtype}")
    return i


def _require_table(x: Tensor, what: str) -> None:
    """A gather copies floats and int8 / int32 / int64 values (exactly); bool is refused."""
    if x.dtype not in dt.INTS:
        require_float(x, what)


def _gathered_axis(x: Tensor, axis, what: str) -> int:
    ax = normalize_axis(axis, x.ndim, what) if x.ndim else None
    if ax is None:
        raise _err(RankMismatchError, f"{what}: a zero-dimensional tensor has no axis to gather along")
    if x._node.shape[ax] == 0:
        raise _err(ShapeMismatchError, f"{what}: cannot gather from axis {ax} of size 0")
    x._node.observed.add(ax)   # the axis' size bounds every index: compiled in
    return ax


def take(x, indices, axis: int | None = 0) -> Tensor:
    """``numpy.take(x, indices, axis)``: axis ``axis`` of ``x`` replaced by the indices' shape
    (``axis=None``: of ``x`` flattened).  ``take(table, ids)`` with table [V, D] and ids [B, S]
    is the embedding lookup [B, S, D]: one table row copied per id."""
    x = ops._t(x, "take")
    _require_table(x, "take")
    idx = index_array(indices, "take: indices")
    if axis is None:
        x = ops.reshape(x, (math.prod(x._node.shape),))
        axis = 0
    ax = _gathered_axis(x, axis, "take")
    s = x._node.shape
    return add_node("take", [x._node, idx._node], {"axis": ax}, s[:ax] + idx._node.shape + s[ax + 1:], x.dtype,
                    weak=False)


def take_along_axis(x, indices, axis: int) -> Tensor:
    """``numpy.take_along_axis``: indices of x's rank; off ``axis`` the two broadcast, along it
    each index picks an element (e.g. the logit at each label: ``take_along_axis(z, y[:, None], -1)``)."""
    x = ops._t(x, "take_along_axis")
    _require_table(x, "take_along_axis")
    idx = index_array(indices, "take_along_axis: indices")
    if axis is None:
        raise _err(UnsupportedConstructError, "take_along_axis: axis=None (flattened) is not supported; give an axis")
    if idx.ndim != x.ndim:
        raise _err(RankMismatchError, f"take_along_axis: indices of rank {idx.ndim} for an input of rank {x.ndim} "
                                      "(they must match)")
    ax = _gathered_axis(x, axis, "take_along_axis")
    shape = []
    for k, (a, b) in enumerate(zip(x._node.shape, idx._node.shape)):
        if k == ax or a == b or a == 1 or b == 1:
            shape.append(b if k == ax or a == 1 else a)
        else:
            raise _err(ShapeMismatchError, f"take_along_axis: input {x._node.shape} and indices {idx._node.shape} "
                                           f"do not broadcast off axis {ax}")
    return add_node("take_along_axis", [x._node, idx._node], {"axis": ax}, tuple(shape), x.dtype, weak=False)


def one_hot(labels, num_classes: int, dtype=dt.float32) -> Tensor:
    """``labels[..., None] == arange(num_classes)`` as ``dtype`` (a float type): a 1 at each label,
    zeros elsewhere; a label outside [0, num_classes) gives a row of zeros (as jax.nn.one_hot)."""
    lab = index_array(labels, "one_hot: labels")
    c = require_int(num_classes, "one_hot: num_classes")
    if c < 0:
        raise _err(ShapeMismatchError, f"one_hot: num_classes must be >= 0, got {c}")
    to = dt.as_dtype(dtype)
    if to not in (dt.float32, dt.float64, dt.bfloat16, dt.float16):
        raise _err(DtypeError, f"one_hot: dtype {to} is not supported (a float type)")
    return add_node("one_hot", [lab._node], {"num_classes": c}, lab._node.shape + (c,), to, weak=False)


def index_with_array(x: Tensor, items: tuple, basic) -> Tensor:
    """``x[items]`` where exactly one item is an index array: the basic indexing of the other
    items (``basic``, with the array's place taken whole), then a take along that axis.  As
    numpy places a single advanced index: its dims replace the axis in place, unless an integer
    index is separated from it by a slice, None or ..., when they go first."""
    pos = next(k for k, i in enumerate(items) if is_array_index(i))
    idx = index_array(items[pos], f"x[{_show(items)}]: an index array")
    taken = sum(i is not None and i is not Ellipsis for i in items)
    axis = 0
    for i in items[:pos]:
        if i is Ellipsis:
            axis += x.ndim - taken
        elif i is None or isinstance(i, slice):
            axis += 1
    y = basic(x, items[:pos] + (slice(None),) + items[pos + 1:])
    out = take(y, idx, axis)
    adv = [k for k, i in enumerate(items) if k == pos or not (i is None or i is Ellipsis or isinstance(i, slice))]
    if axis and adv[-1] - adv[0] + 1 != len(adv):   # advanced indices apart: their dims go first
        m = idx.ndim
        perm = list(range(axis, axis + m)) + [k for k in range(out.ndim) if not axis <= k < axis + m]
        out = ops.transpose(out, tuple(perm))
    return out


def _show(items: tuple) -> str:
    from tessera.frontend.layout import _show as show
    return show(items)


__all__ = ["take", "take_along_axis", "one_hot"]
