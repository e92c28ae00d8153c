"""Layout and statistics ops written with the Graph IR ops that exist: views made of reshapes and
transposes (``expand_dims``, ``squeeze``, ``swapaxes``, ``moveaxis``, indexing with ``None`` /
``...`` / ``:``) and ``var`` / ``std`` from means.  Numpy's semantics; they fuse like the ops
they are made of (reshapes and transposes become strides, the means reduction kernels)."""
from __future__ import annotations

import math

import numpy as np

from tessera import dtypes as dt
from tessera.errors import RankMismatchError, ShapeMismatchError, UnsupportedConstructError
from tessera.frontend import ops
from tessera.frontend.trace import Tensor, _err, add_node, normalize_axis, require_float, require_int


def _axes(axis, rank: int, what: str) -> tuple[int, ...]:
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out = tuple(normalize_axis(a, rank, what) for a in axes)
    if len(set(out)) != len(out):
        raise _err(RankMismatchError, f"{what}: repeated axis in {axis}")
    return out


def expand_dims(x, axis) -> Tensor:
    """``x`` with a size-1 axis inserted at each of ``axis`` (positions in the result)."""
    x = ops._t(x, "expand_dims")
    rank = x.ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    axes = _axes(axis, rank, "expand_dims")
    it = iter(x._node.shape)
    return ops.reshape(x, tuple(1 if i in axes else next(it) for i in range(rank)))


def squeeze(x, axis=None) -> Tensor:
    """``x`` without its size-1 axes (``axis``: only those, each of which must be 1)."""
    x = ops._t(x, "squeeze")
    shape = x._node.shape
    if axis is None:
        axes = tuple(i for i, n in enumerate(shape) if n == 1)
    else:
        axes = _axes(axis, x.ndim, "squeeze")
        for a in axes:
            if shape[a] != 1:
                raise _err(ShapeMismatchError, f"squeeze: axis {a} has size {shape[a]}, not 1")
    return ops.reshape(x, tuple(n for i, n in enumerate(shape) if i not in axes))


def swapaxes(x, axis1, axis2) -> Tensor:
    x = ops._t(x, "swapaxes")
    a, b = normalize_axis(axis1, x.ndim, "swapaxes"), normalize_axis(axis2, x.ndim, "swapaxes")
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return ops.transpose(x, tuple(perm))


def moveaxis(x, source, destination) -> Tensor:
    x = ops._t(x, "moveaxis")
    src, dst = _axes(source, x.ndim, "moveaxis"), _axes(destination, x.ndim, "moveaxis")
    if len(src) != len(dst):
        raise _err(RankMismatchError, f"moveaxis: {len(src)} source axes but {len(dst)} destinations")
    rest = [i for i in range(x.ndim) if i not in src]
    perm = [0] * x.ndim
    placed = dict(zip(dst, src))
    for i in range(x.ndim):
        perm[i] = placed[i] if i in placed else rest.pop(0)
    return ops.transpose(x, tuple(perm))


def var(x, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Mean squared deviation from the mean over ``axis`` (two passes: no cancellation of
    E[x^2] - E[x]^2); ``ddof`` divides by n - ddof, as numpy."""
    x = ops._t(x, "var")
    require_float(x, "var")
    ddof = require_int(ddof, "var: ddof")
    axes = tuple(range(x.ndim)) if axis is None else _axes(axis, x.ndim, "var")
    d = x - ops.reduce_mean(x, axes, keepdims=True)
    v = ops.reduce_mean(d * d, axes, keepdims=keepdims)
    if ddof:
        x._node.observed.update(axes)   # n is compiled in: those sizes are specialised on
        n = math.prod(x._node.shape[a] for a in axes)
        v = v * (n / (n - ddof) if n > ddof else math.inf)
    return v


def std(x, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    return ops.sqrt(var(x, axis, keepdims, ddof))


def index(x: Tensor, item) -> Tensor:
    """``x[item]`` with numpy's basic indexing: integers (negative from the end), slices with
    bounds and steps (a negative step walks backwards: a view with negative strides), ``None``
    (a new axis) and ``...``; one int32/int64 index array is a gather (``frontend/gather.py``).  A sliced or indexed axis is
    compiled in (its size is specialised on); the result is a ``slice`` node (a strided view of x)
    and a reshape for the axes integers drop and ``None`` adds."""
    from tessera.frontend import gather
    items = item if isinstance(item, tuple) else (item,)
    if sum(i is Ellipsis for i in items) > 1:
        raise _err(UnsupportedConstructError, "an index can only have one ellipsis ('...')")
    arrays = [i for i in items if gather.is_array_index(i)]
    if len(arrays) > 1:
        raise _err(UnsupportedConstructError, f"x[{_show(item)}]: {len(arrays)} index arrays: only one array "
                                              "index traces (numpy's broadcasting of several is not supported)")
    for i in items:
        if isinstance(i, Tensor) and i._node.scalar_of and i.ndim == 0:
            require_int(i, f"x[{_show(item)}]: an index")   # a Python-number argument: specialised on
        if isinstance(i, (list, bool, np.ndarray)):
            raise _err(UnsupportedConstructError,
                       f"x[{_show(item)}]: indexing with a constant array or a bool is not supported; an index "
                       "array traces as an int32/int64 argument (one per index)")
    if arrays:
        taken = sum(i is not None and i is not Ellipsis for i in items)
        if taken > x.ndim:
            raise _err(RankMismatchError, f"x[{_show(item)}]: {taken} indices for a rank-{x.ndim} tensor")
        return gather.index_with_array(x, items, index)
    taken = sum(i is not None and i is not Ellipsis for i in items)
    if taken > x.ndim:
        raise _err(RankMismatchError, f"x[{_show(item)}]: {taken} indices for a rank-{x.ndim} tensor")
    if Ellipsis not in items:
        items = items + (Ellipsis,)
    shape = x._node.shape
    starts, steps, sizes, final = [], [], [], []
    ax = 0
    for i in items:
        if i is None:
            final.append(1)
            continue
        if i is Ellipsis:
            for _ in range(x.ndim - taken):
                starts.append(0), steps.append(1), sizes.append(shape[ax]), final.append(shape[ax])
                ax += 1
            continue
        n = shape[ax]
        if isinstance(i, slice):
            bounds = [None if v is None else require_int(v, f"x[{_show(item)}]: a slice bound") for v in
                      (i.start, i.stop, i.step)]
            if bounds[2] == 0:
                raise _err(ShapeMismatchError, f"x[{_show(item)}]: slice step cannot be zero")
            a, stop, st = slice(*bounds).indices(n)
            m = len(range(a, stop, st))
            if not m:
                a, st = 0, 1
            starts.append(a), steps.append(st), sizes.append(m), final.append(m)
        else:
            k = require_int(i, f"x[{_show(item)}]: an index")
            if not -n <= k < n:
                raise _err(ShapeMismatchError, f"x[{_show(item)}]: index {k} is out of range for axis {ax} of "
                                               f"size {n}")
            starts.append(k % n), steps.append(1), sizes.append(1)
        ax += 1
    sliced = [a for a in range(x.ndim) if (starts[a], steps[a], sizes[a]) != (0, 1, shape[a])]
    y = x
    if sliced:
        x._node.observed.update(sliced)   # the window is compiled in: those sizes are specialised on
        y = add_node("slice", [x._node], {"starts": tuple(starts), "steps": tuple(steps)}, tuple(sizes), x.dtype)
    return ops.reshape(y, tuple(final))


def concatenate(xs, axis: int = 0) -> Tensor:
    """``xs`` joined along ``axis`` (numpy's rules; dtypes promote to their join).  The
    joined axis of each operand is compiled in (specialised on)."""
    if isinstance(xs, Tensor) or not isinstance(xs, (tuple, list)) or not xs:
        raise _err(RankMismatchError, "concatenate takes a non-empty list or tuple of tensors")
    xs = [ops._t(x, "concatenate") for x in xs]
    rank = xs[0].ndim
    if rank == 0:
        raise _err(RankMismatchError, "concatenate: zero-dimensional tensors cannot be concatenated")
    ax = normalize_axis(axis, rank, "concatenate")
    for i, x in enumerate(xs):
        if x.ndim != rank:
            raise _err(RankMismatchError, f"concatenate: operand {i} has rank {x.ndim}, operand 0 rank {rank}")
        if any(a != b for k, (a, b) in enumerate(zip(x._node.shape, xs[0]._node.shape)) if k != ax):
            raise _err(ShapeMismatchError, f"concatenate: operand {i} {x._node.shape} and operand 0 "
                                           f"{xs[0]._node.shape} differ off axis {ax}")
    to = xs[0].dtype
    for x in xs[1:]:
        to = dt.promote(to, x.dtype)
    xs = [x if x.dtype == to else ops.cast(x, to) for x in xs]
    if len(xs) == 1:
        return xs[0]
    for x in xs:
        x._node.observed.add(ax)   # each operand's extent along the axis is compiled in
    shape = list(xs[0]._node.shape)
    shape[ax] = sum(x._node.shape[ax] for x in xs)
    return add_node("concat", [x._node for x in xs], {"axis": ax}, tuple(shape), to)


def stack(xs, axis: int = 0) -> Tensor:
    """``xs`` (of one shape) joined along a new axis."""
    if isinstance(xs, Tensor) or not isinstance(xs, (tuple, list)) or not xs:
        raise _err(RankMismatchError, "stack takes a non-empty list or tuple of tensors")
    xs = [ops._t(x, "stack") for x in xs]
    if any(x._node.shape != xs[0]._node.shape for x in xs):
        raise _err(ShapeMismatchError, f"stack: shapes differ: {[x._node.shape for x in xs]}")
    ax = normalize_axis(axis, xs[0].ndim + 1, "stack")
    if ax < xs[0].ndim:   # row-major, joining along ax lays the parts out as stacking does: no copies first
        shape = list(xs[0]._node.shape)
        return ops.reshape(concatenate(xs, ax), tuple(shape[:ax] + [len(xs)] + shape[ax:]))
    return concatenate([expand_dims(x, ax) for x in xs], ax)


def split(x, indices_or_sections, axis: int = 0) -> list[Tensor]:
    """numpy's ``split``: an int cuts ``axis`` into that many equal parts (it must divide), a
    list of indices cuts at those positions; each part is a slice (a view where it can be)."""
    x = ops._t(x, "split")
    ax = normalize_axis(axis, x.ndim, "split")
    n = x._node.shape[ax]
    if isinstance(indices_or_sections, (tuple, list)):
        cuts = [require_int(c, "split: an index") for c in indices_or_sections]
    else:
        k = require_int(indices_or_sections, "split: sections")
        if k <= 0 or n % k:
            raise _err(ShapeMismatchError, f"split: {k} sections do not divide axis {ax} of size {n} equally "
                                           "(chunk allows a shorter last part)")
        cuts = [n // k * i for i in range(1, k)]
    bounds = [0] + [min(max(c + n if c < 0 else c, 0), n) for c in cuts] + [n]
    pre = (slice(None),) * ax
    return [index(x, pre + (slice(a, max(a, b_)),)) for a, b_ in zip(bounds, bounds[1:])]


def chunk(x, chunks: int, axis: int = 0) -> list[Tensor]:
    """torch's ``chunk``: parts of ceil(n / chunks) along ``axis``, the last shorter (fewer parts
    where they run out)."""
    x = ops._t(x, "chunk")
    ax = normalize_axis(axis, x.ndim, "chunk")
    k = require_int(chunks, "chunk: chunks")
    if k <= 0:
        raise _err(ShapeMismatchError, f"chunk: chunks must be positive, got {k}")
    n = x._node.shape[ax]
    step = -(-n // k) if n else 1
    return split(x, list(range(step, n, step)), ax)


def _show(item) -> str:
    items = item if isinstance(item, tuple) else (item,)
    return ", ".join("..." if i is Ellipsis else "<array>" if isinstance(i, Tensor) else ":" if isinstance(i, slice) and i == slice(None) else
                     (f"{'' if i.start is None else i.start}:{'' if i.stop is None else i.stop}"
                      + ("" if i.step is None else f":{i.step}")) if isinstance(i, slice) else repr(i)
                     for i in items)


__all__ = ["expand_dims", "squeeze", "swapaxes", "moveaxis", "var", "std", "concatenate", "stack", "split", "chunk"]
