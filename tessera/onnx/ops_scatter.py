"""ONNX GatherND, ScatterND and ScatterElements replayed through ``take`` and ``scatter_add`` on
the data flattened over its indexed dims.

Each index tuple becomes one linear index into the flattened dims (negative components counted
from the end; batch dims and, for ScatterElements, the positions off the scattered axis from
``iota``), so each op is one gather or scatter along axis 0.  ScatterND / ScatterElements with
``reduction='none'`` replace: the updates scattered from zeros where a scattered count of ones is
positive, the data elsewhere (duplicate indices, which ONNX leaves undefined, are summed);
``'add'`` adds.  ``mul``, ``max`` and ``min`` are refused.  Runtime index values out of range
follow ``take``'s policy (clamped; ONNX leaves them undefined).
"""
from __future__ import annotations

import math

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.scatter import scatter_add
from tessera.frontend.trace import constant
from tessera.frontend.vjp_rules import broadcast_to
from tessera.onnx.convert import norm_axis, op


def _index(ctx, v):
    t = ctx.t(v)
    if dt.kind(t.dtype) != "i":
        raise ctx.refuse(f"indices must be integers, got {dt.name(t.dtype)}")
    return t


def _wrap(c, n):
    return ops.where(ops.less(c, 0), c + n, c)


def _strides(dims):
    return [math.prod(dims[j + 1:]) for j in range(len(dims))]


def _nd_linear(ctx, idx, dims, batch):
    """The linear index into ``dims`` (the batch dims then the k indexed ones) of each index
    tuple on the last axis of ``idx`` (shape lead + (k,))."""
    lead = tuple(idx.shape[:-1])
    st = _strides(dims)
    lin = None
    for j in range(batch):
        term = ops.iota(lead, j, idx.dtype) * st[j]
        lin = term if lin is None else lin + term
    for j in range(idx.shape[-1]):
        c = ops.reshape(idx[..., j:j + 1], lead)
        term = _wrap(c, dims[batch + j]) * st[batch + j]
        lin = term if lin is None else lin + term
    return lin


def _reduction_check(attrs, opset):
    red = attrs.get("reduction", "none")
    if red not in ("none", "add"):
        return f"reduction={red!r} (none and add are mapped)"
    return None


def _scatter(ctx, flat, lin, upd, red):
    """``flat`` (P, rest...) with the rows ``lin`` (M,) replaced by / added ``upd`` (M, rest...)."""
    if dt.kind(flat.dtype) != "f":
        raise ctx.refuse(f"float data only, got {dt.name(flat.dtype)}")
    upd = upd if upd.dtype == flat.dtype else ops.cast(upd, flat.dtype)
    if red == "add":
        return scatter_add(flat, lin, upd, axis=0)
    placed = scatter_add(tuple(flat.shape), lin, upd, axis=0)
    count = scatter_add(tuple(flat.shape), lin, broadcast_to(constant(1.0, flat.dtype), tuple(upd.shape)), axis=0)
    return ops.where(ops.greater(count, 0.0), placed, flat)


@op("GatherND", inputs=(2, 2), attrs=("batch_dims",))
def _gather_nd(ctx, ins):
    x, idx = ctx.t(ins[0]), _index(ctx, ins[1])
    b = int(ctx.a("batch_dims", 0))
    if idx.ndim < 1 or not 0 <= b < idx.ndim or idx.shape[:b] != x.shape[:b]:
        raise ctx.refuse(f"batch_dims={b} does not fit data {x.shape} and indices {idx.shape}")
    k = idx.shape[-1]
    if b + k > x.ndim:
        raise ctx.refuse(f"index tuples of {k} into data of rank {x.ndim} after {b} batch dims")
    dims = tuple(x.shape[:b + k])
    lin = _nd_linear(ctx, idx, dims, b)
    flat = ops.reshape(x, (math.prod(dims),) + tuple(x.shape[b + k:]))
    return [ops.take(flat, lin, axis=0)]


@op("ScatterND", inputs=(3, 3), attrs=("reduction",), check=_reduction_check)
def _scatter_nd(ctx, ins):
    x, idx, upd = ctx.t(ins[0]), _index(ctx, ins[1]), ctx.t(ins[2])
    k = idx.shape[-1] if idx.ndim else 0
    lead, rest = tuple(idx.shape[:-1]), tuple(x.shape[k:])
    if not 1 <= k <= x.ndim or tuple(upd.shape) != lead + rest:
        raise ctx.refuse(f"updates {upd.shape} do not fit data {x.shape} and indices {idx.shape}")
    dims = tuple(x.shape[:k])
    m = math.prod(lead)
    lin = ops.reshape(_nd_linear(ctx, idx, dims, 0), (m,))
    flat = ops.reshape(x, (math.prod(dims),) + rest)
    y = _scatter(ctx, flat, lin, ops.reshape(upd, (m,) + rest), ctx.a("reduction", "none"))
    return [ops.reshape(y, x.shape)]


@op("ScatterElements", inputs=(3, 3), attrs=("axis", "reduction"), check=_reduction_check)
def _scatter_elements(ctx, ins):
    x, idx, upd = ctx.t(ins[0]), _index(ctx, ins[1]), ctx.t(ins[2])
    ax = norm_axis(ctx, int(ctx.a("axis", 0)), x.ndim)
    if tuple(idx.shape) != tuple(upd.shape) or idx.ndim != x.ndim or \
            any(i > d for a, (i, d) in enumerate(zip(idx.shape, x.shape)) if a != ax):
        raise ctx.refuse(f"indices {idx.shape} and updates {upd.shape} do not fit data {x.shape} along axis {ax}")
    st = _strides(tuple(x.shape))
    lin = _wrap(idx, x.shape[ax]) * st[ax]
    for a in range(x.ndim):
        if a != ax:
            lin = lin + ops.iota(tuple(idx.shape), a, idx.dtype) * st[a]
    m, n = math.prod(idx.shape), math.prod(x.shape)
    y = _scatter(ctx, ops.reshape(x, (n,)), ops.reshape(lin, (m,)), ops.reshape(upd, (m,)),
                 ctx.a("reduction", "none"))
    return [ops.reshape(y, x.shape)]
