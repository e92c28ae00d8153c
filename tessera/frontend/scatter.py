"""``scatter_add`` (``x.at[idx].add(u)`` along an axis) and ``index_add`` (torch's argument order).

``scatter_add(x, indices, updates, axis=0)`` returns ``x`` with ``updates`` added at ``indices``
along ``axis``: ``updates`` has the shape ``take(x, indices, axis)`` would have, and every
position k of ``indices`` adds its slice ``updates[..., k, ...]`` into the slice of the result it
names.  ``x`` may be a shape tuple instead of a tensor: the result then starts from zeros of the
updates' dtype (the gradient of ``take``).  Duplicate indices are summed, in index order (the CPU
kernel gives the same bits for any thread count).  Runtime index values follow the gathers'
policy (``frontend/gather.py``): in [-n, n) numpy's meaning, outside clamped into the axis (so
scatter_add is exactly take's adjoint; jax's ``.at[].add`` drops out-of-range updates instead).
Indices are int32 / int64 tensors; the scattered axis is compiled in.
"""
from __future__ import annotations

from tessera import dtypes as dt
from tessera.errors import DtypeError, RankMismatchError, ShapeMismatchError
from tessera.frontend import ops
from tessera.frontend.gather import index_array
from tessera.frontend.trace import Tensor, _err, add_node, normalize_axis, require_float


def _target(x, updates: Tensor):
    """(base tensor or None, result shape) of ``x``: a float tensor, or a shape tuple (zeros)."""
    if isinstance(x, (tuple, list)):
        shape = tuple(x)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise _err(ShapeMismatchError, f"scatter_add: a target shape is a tuple of sizes >= 0, got {x!r}")
        return None, shape
    base = ops._t(x, "scatter_add")
    require_float(base, "scatter_add")
    if base.dtype != updates.dtype:
        raise _err(DtypeError, f"scatter_add: target dtype {dt.name(base.dtype)} and updates dtype "
                               f"{dt.name(updates.dtype)} differ (cast one)")
    return base, base._node.shape


def scatter_add(x, indices, updates, axis: int = 0) -> Tensor:
    """``x`` plus ``updates`` added at ``indices`` along ``axis`` (``jnp``'s ``x.at[idx].add(u)``
    for one index array; ``x`` a shape tuple: from zeros).  ``updates.shape`` must be
    ``x.shape[:axis] + indices.shape + x.shape[axis + 1:]``; duplicates are summed in order,
    indices outside [-n, n) are clamped into the axis (as take reads them)."""
    upd = ops._t(updates, "scatter_add: updates")
    require_float(upd, "scatter_add: updates")
    idx = index_array(indices, "scatter_add: indices")
    base, shape = _target(x, upd)
    rank = len(shape)
    if rank == 0:
        raise _err(RankMismatchError, "scatter_add: a zero-dimensional target has no axis to scatter along")
    ax = normalize_axis(axis, rank, "scatter_add")
    if shape[ax] == 0:
        raise _err(ShapeMismatchError, f"scatter_add: cannot scatter into axis {ax} of size 0")
    want = shape[:ax] + idx._node.shape + shape[ax + 1:]
    if upd.ndim != len(want):
        raise _err(RankMismatchError, f"scatter_add: updates of rank {upd.ndim}, expected {len(want)} (the "
                                      f"target's rank {rank} with axis {ax} replaced by the indices' "
                                      f"{idx.ndim} dims)")
    if upd._node.shape != want:
        raise _err(ShapeMismatchError, f"scatter_add: updates of shape {upd._node.shape}, expected {want} "
                                       "(take(target, indices, axis)'s shape)")
    if base is not None:
        base._node.observed.add(ax)   # the axis' size bounds every index: compiled in
    inputs = [idx._node, upd._node] + ([base._node] if base is not None else [])
    return add_node("scatter_add", inputs, {"axis": ax, "based": base is not None}, shape, upd.dtype, weak=False)


def index_add(x, axis: int, indices, updates) -> Tensor:
    """``torch.index_add(x, dim, index, source)``: ``scatter_add(x, indices, updates, axis)``."""
    return scatter_add(x, indices, updates, axis)


__all__ = ["scatter_add", "index_add"]
