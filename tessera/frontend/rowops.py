"""Reductions, scans and log-row ops of ``tessera.ops`` (re-exported there): ``logsumexp``,
``log_softmax``, ``cumsum``, ``cumprod``, ``prod``, ``argmax``, ``argmin``.

Each is one Graph IR op (``ir/graph_rows.py``) with its float64 numpy reference here
(``REFERENCE``, read by ``frontend/reference.py``); Graph IR generation builds them from the
registry (``frontend/graphgen.py``, shape rules in ``frontend/dim_rules.py``).  ``logsumexp`` / ``log_softmax`` over an axis other than the last
are traced between transposes (a copy kernel moves the axis last, then the row kernel runs);
a scan walks its axis in place.
"""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError, DtypeError, RankMismatchError, ShapeMismatchError
from tessera.frontend import ops
from tessera.frontend.layout import expand_dims, moveaxis, swapaxes
from tessera.frontend.trace import Tensor, _err, add_node, normalize_axis, require_float, require_int
from tessera.ir import graph as g


def _row_op_input(x, what: str) -> Tensor:
    x = ops._t(x, what)
    require_float(x, what)
    if x.ndim == 0:
        raise _err(RankMismatchError, f"{what} needs rank >= 1")
    return x


def logsumexp(x, axis: int = -1, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x), axis))`` without overflow: ``m + log(sum(exp(x - m)))``, m the maximum
    along ``axis`` (0 where that is +-inf or NaN, as ``scipy.special.logsumexp``: an all -inf
    row gives -inf, a +inf entry +inf, a NaN NaN).  One row kernel over the last axis (elementwise
    producers fused as it reads); another axis is moved last by a copy first."""
    x = _row_op_input(x, "logsumexp")
    if isinstance(axis, (tuple, list)):
        raise _err(RankMismatchError, "logsumexp: axis must be one integer (a tuple of axes is not supported)")
    ax = normalize_axis(axis, x.ndim, "logsumexp")
    if ax != x.ndim - 1:
        x = moveaxis(x, ax, -1)
    r = add_node("logsumexp", [x._node], {"keepdims": False}, x.shape[:-1], x.dtype)
    return expand_dims(r, ax) if keepdims else r


def log_softmax(x, axis: int = -1) -> Tensor:
    """``x - logsumexp(x, axis, keepdims=True)`` as one row kernel (max, sum of exp(x - max), then
    x - max - log(sum) as the row is written, with its elementwise consumers fused).  An all -inf
    row gives NaN, as scipy's and torch's."""
    x = _row_op_input(x, "log_softmax")
    ax = normalize_axis(axis, x.ndim, "log_softmax")
    if ax != x.ndim - 1:
        return swapaxes(log_softmax(swapaxes(x, ax, -1)), ax, -1)
    return add_node("log_softmax", [x._node], {}, x.shape, x.dtype)


def _scan(op: str, x, axis) -> Tensor:
    x = _row_op_input(x, op)
    if axis is None:   # numpy: the flattened array
        x = ops.reshape(x, (x.size,))
        axis = 0
    ax = normalize_axis(axis, x.ndim, op)
    return add_node(op, [x._node], {"axis": ax}, x.shape, x.dtype)


def cumsum(x, axis=None) -> Tensor:
    """Running sum along ``axis`` (None: of the flattened array, as numpy), in order along the axis.
    bf16/f16 accumulate in f32 registers and round each output once; f32 in f32 (numpy's order, so
    numpy's result), f64 in f64."""
    return _scan("cumsum", x, axis)


def cumprod(x, axis=None) -> Tensor:
    """Running product along ``axis``; accumulation as ``cumsum``."""
    return _scan("cumprod", x, axis)


def prod(x, axis=None, keepdims: bool = False) -> Tensor:
    """Product over ``axis`` (None: all axes); an empty product is 1.  Accumulates in f32 for
    bf16/f16 (per-lane partial products combined in a fixed tree, like ``reduce_sum``)."""
    return ops._reduce("reduce_prod", x, axis, keepdims)


def _logical(op: str, x, axis, keepdims: bool) -> Tensor:
    x = ops._t(x, op)
    if x.dtype != dt.bool_ and np.dtype(x.dtype).kind not in "iu":
        require_float(x, op)
    if axis is None:
        axes = tuple(range(x.ndim))
    else:
        axes = tuple(normalize_axis(a, x.ndim, op) for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
        if len(set(axes)) != len(axes):
            raise _err(RankMismatchError, f"{op}: repeated axis in {axis}")
    if not axes:
        return ops.cast(x, dt.bool_)
    shape = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keepdims or i not in axes)
    return add_node(op, [x._node], {"axes": tuple(sorted(axes)), "keepdims": bool(keepdims)}, shape, dt.bool_)


def any(x, axis=None, keepdims: bool = False) -> Tensor:   # noqa: A001 - numpy's name
    """Whether any element over ``axis`` (None: all) is nonzero -- NaN is nonzero, as numpy's --
    as a bool tensor.  Float or bool input; the reduce kernel (an empty reduction is False)."""
    return _logical("reduce_any", x, axis, keepdims)


def all(x, axis=None, keepdims: bool = False) -> Tensor:   # noqa: A001 - numpy's name
    """Whether every element over ``axis`` is nonzero (an empty reduction is True); as ``any``."""
    return _logical("reduce_all", x, axis, keepdims)


def _arg(op: str, x, axis, keepdims: bool) -> Tensor:
    x = _row_op_input(x, op)
    if x.size == 0:
        raise _err(ShapeMismatchError, f"{op}: an empty array has no {op[3:]} (numpy raises too)")
    if axis is None:   # numpy: the index into the flattened array
        r = add_node(op, [ops.reshape(x, (x.size,))._node], {"keepdims": False}, (), g.INDEX_ELEM_NP)
        return ops.reshape(r, (1,) * x.ndim) if keepdims else r
    if isinstance(axis, (tuple, list)):
        raise _err(RankMismatchError, f"{op}: axis must be one integer or None")
    ax = normalize_axis(axis, x.ndim, op)
    if ax != x.ndim - 1:
        x = moveaxis(x, ax, -1)
    r = add_node(op, [x._node], {"keepdims": False}, x.shape[:-1], g.INDEX_ELEM_NP)
    return expand_dims(r, ax) if keepdims else r


def argmax(x, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the first maximum along ``axis`` (None: of the flattened array), as numpy: a NaN is
    the maximum (the first NaN's index).  A row kernel over the last axis with the elementwise
    producers fused (another axis is moved last by a copy first).  Indices are int64 (computed in
    f32 registers: exact below 2^24 elements per row; f64 ones for f64 inputs)."""
    return _arg("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the first minimum along ``axis``; as ``argmax``."""
    return _arg("argmin", x, axis, keepdims)


def top_k(x, k, axis: int = -1) -> tuple[Tensor, Tensor]:
    """``(values, indices)`` of the ``k`` largest entries along ``axis``, in descending order; equal
    values by lower index first (a stable sort); a NaN ranks above +inf (torch.topk's order).  ``k``
    is static: 1 <= k <= the axis' size (that size is compiled in), else ``SHAPE_MISMATCH``.  One
    row kernel over the last axis (k selection passes over the cached row: O(k n) per row) with
    the elementwise producers fused; another axis is moved last by a copy.  Indices are int64."""
    x = _row_op_input(x, "top_k")
    k = require_int(k, "top_k: k")
    ax = normalize_axis(axis, x.ndim, "top_k")
    n = x.shape[ax]
    if not 1 <= k <= n:
        raise _err(ShapeMismatchError, f"top_k: k = {k} is out of range for an axis of size {n} (1 <= k <= {n})")
    x._node.observed.add(ax)            # k <= n was checked on this size: specialise on it
    if ax != x.ndim - 1:
        x = moveaxis(x, ax, -1)
    shape = x.shape[:-1] + (k,)
    vals = add_node("top_k", [x._node], {"k": k}, shape, x.dtype)
    idx = add_node("top_k_indices", [vals._node, x._node], {}, shape, g.INDEX_ELEM_NP)
    if ax != x.ndim - 1:
        vals, idx = moveaxis(vals, -1, ax), moveaxis(idx, -1, ax)
    return vals, idx


REDUCTIONS = ("mean", "sum", "none")


def cross_entropy(logits, labels, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """Softmax cross-entropy of ``logits`` [..., C] against integer class ``labels`` [...] (the class
    axis last): per row ``logsumexp(row) - row[label]``, one row kernel (a max pass that also picks
    the labelled logit, a sum-of-exp pass; no one-hot, no softmax in memory) with the logits'
    elementwise producers fused.  ``reduction``: "mean" (over the rows whose label is not
    ``ignore_index``, as torch: NaN when every row is ignored), "sum", or "none" (per row, 0 for an
    ignored row).  Labels are read in the kernel (f32 holds them exactly below 2^24 classes).  Computed in f32 (f64 for f64 logits), returned in the logits' dtype.  A label
    outside [0, C) other than ``ignore_index`` reads no memory and gives a loss of +inf."""
    logits = _row_op_input(logits, "cross_entropy")
    labels = ops._t(labels, "cross_entropy labels")
    if np.dtype(labels.dtype).kind not in "iu":
        raise _err(DtypeError, f"cross_entropy: labels must be an integer tensor (class indices), got "
                               f"{np.dtype(labels.dtype).name}")
    if labels.shape != logits.shape[:-1]:
        raise _err(ShapeMismatchError, f"cross_entropy: labels of shape {labels.shape} must have the logits' "
                                       f"leading shape {logits.shape[:-1]} (logits [..., classes])")
    if reduction not in REDUCTIONS:
        raise _err(ArgumentError, f"cross_entropy: reduction={reduction!r}; legal: {', '.join(REDUCTIONS)}")
    ignore = require_int(ignore_index, "cross_entropy: ignore_index", ArgumentError)
    reg = dt.float64 if logits.dtype == dt.float64 else dt.float32
    loss = add_node("cross_entropy", [logits._node, labels._node], {"ignore_index": ignore}, labels.shape, reg)
    if reduction == "none":
        out = loss
    else:
        out = ops.reduce_sum(loss)
        if reduction == "mean":
            valid = add_node("cross_entropy_valid", [loss._node, labels._node], {"ignore_index": ignore},
                             labels.shape, reg)
            out = out / ops.reduce_sum(valid)
    return ops.cast(out, logits.dtype) if out.dtype != logits.dtype else out


def _xent64(x: np.ndarray, y: np.ndarray, ignore: int) -> np.ndarray:
    """Per-row float64 loss: logsumexp - the labelled logit; 0 where ignored, +inf out of range."""
    lse = _lse64(x, False)
    yi = y.astype(np.int64)
    inside = (yi >= 0) & (yi < x.shape[-1])
    picked = np.take_along_axis(x, np.where(inside, yi, 0)[..., None], -1)[..., 0]
    loss = np.where(inside, lse - picked, np.inf)
    return np.where(yi == ignore, 0.0, loss)


def _top_k_order(v: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest along the last axis: NaN first, then descending, ties by index."""
    nan = np.isnan(v)
    neg = np.where(nan, 0.0, -v)
    idx = np.broadcast_to(np.arange(v.shape[-1]), v.shape)
    return np.lexsort((idx, neg, ~nan), axis=-1)[..., :k]


# numpy's array methods of the same names on traced tensors (x.argmax(-1), x.cumsum(0), x.any(), ...)
def _method(fn):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    method.__name__, method.__doc__ = fn.__name__, fn.__doc__
    return method


for _fn in (argmax, argmin, cumsum, cumprod, prod, any, all):
    setattr(Tensor, _fn.__name__, _method(_fn))


# ----------------------------------------------------------------------------- float64 references
def _lse64(v: np.ndarray, keepdims: bool) -> np.ndarray:
    with np.errstate(all="ignore"):
        m = np.max(v, axis=-1, keepdims=True) if v.shape[-1] else np.zeros(v.shape[:-1] + (1,))
        m = np.where(np.isfinite(m), m, 0.0)
        r = np.log(np.sum(np.exp(v - m), axis=-1, keepdims=True)) + m
    return r if keepdims else r[..., 0]


def _log_softmax64(v: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        m = np.max(v, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        return (v - m) - np.log(np.sum(np.exp(v - m), axis=-1, keepdims=True))


REFERENCE = {
    "logsumexp": lambda x, n: _lse64(x[0], n.attrs["keepdims"]),
    "log_softmax": lambda x, n: _log_softmax64(x[0]),
    "cumsum": lambda x, n: np.cumsum(x[0], axis=n.attrs["axis"]),
    "cumprod": lambda x, n: np.cumprod(x[0], axis=n.attrs["axis"]),
    "reduce_prod": lambda x, n: np.prod(x[0], axis=n.attrs["axes"], keepdims=n.attrs["keepdims"]),
    "argmax": lambda x, n: np.argmax(x[0], axis=-1, keepdims=n.attrs["keepdims"]),
    "argmin": lambda x, n: np.argmin(x[0], axis=-1, keepdims=n.attrs["keepdims"]),
    "reduce_any": lambda x, n: np.any(x[0], axis=n.attrs["axes"], keepdims=n.attrs["keepdims"]),
    "reduce_all": lambda x, n: np.all(x[0], axis=n.attrs["axes"], keepdims=n.attrs["keepdims"]),
    "cross_entropy": lambda x, n: _xent64(x[0], x[1], n.attrs["ignore_index"]),
    "cross_entropy_valid": lambda x, n: (np.asarray(x[1]) != n.attrs["ignore_index"]).astype(np.float64),
    "top_k": lambda x, n: np.take_along_axis(x[0], _top_k_order(x[0], n.attrs["k"]), -1),
    "top_k_indices": lambda x, n: _top_k_order(x[1], n.shape[-1]),
}


__all__ = ["logsumexp", "log_softmax", "cumsum", "cumprod", "prod", "argmax", "argmin", "top_k", "any", "all", "cross_entropy"]
