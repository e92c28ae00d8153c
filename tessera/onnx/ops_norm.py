"""ONNX normalisations beyond LayerNormalization / BatchNormalization, replayed through
``tessera.ops``: InstanceNormalization and GroupNormalization 21 (the input reshaped so that each
instance / group is one row of ``layer_norm``, then the per-channel affine), MeanVariance-
Normalization, LpNormalization (p = 1, 2; a zero vector stays zero), LRN (the channel window summed from shifted slices of
the zero-padded squares); and the DepthToSpace / SpaceToDepth rearrangements and Shrink."""
from __future__ import annotations

import math

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import cast, norm_axis, op


def _float(ctx, v, rank_min=1):
    x = ctx.t(v)
    if dt.kind(x.dtype) != "f":
        raise ctx.refuse(f"a float input is needed, got {dt.name(x.dtype)}")
    if x.ndim < rank_min:
        raise ctx.refuse(f"the input needs rank >= {rank_min}, got shape {x.shape}")
    return x


def _per_channel(ctx, v, x, c, what):
    t = cast(ctx.t(v), x.dtype)
    if tuple(t.shape) != (c,):
        raise ctx.refuse(f"{what} has shape {tuple(t.shape)}, expected ({c},)")
    return ops.reshape(t, (1, c) + (1,) * (x.ndim - 2))


def _rows_normalised(x, rows, eps):
    """``x`` with each of ``rows`` rows (of its elements in order) normalised to mean 0, variance 1."""
    flat = ops.reshape(x, (rows, math.prod(x.shape) // rows))
    return ops.reshape(ops.layer_norm(flat, eps=eps), x.shape)


@op("InstanceNormalization", inputs=(3, 3), attrs=("epsilon",))
def _instance_norm(ctx, ins):
    x = _float(ctx, ins[0], 3)
    n, c = x.shape[:2]
    y = _rows_normalised(x, n * c, float(ctx.a("epsilon", 1e-5)))
    return [y * _per_channel(ctx, ins[1], x, c, "scale") + _per_channel(ctx, ins[2], x, c, "B")]


def _group_check(attrs, opset):
    if opset < 21:
        return ("GroupNormalization version 18 (opsets 18..20: scale and bias per group; deprecated, onnx.checker "
                "refuses it) is not mapped; version 21 is")
    if "num_groups" not in attrs:
        return "num_groups is required"
    if attrs.get("stash_type", 1) != 1:
        return f"stash_type={attrs['stash_type']} (float32 statistics only)"
    return None


@op("GroupNormalization", inputs=(3, 3), attrs=("epsilon", "num_groups", "stash_type"), check=_group_check)
def _group_norm(ctx, ins):
    """Version 21: scale and bias per channel."""
    x = _float(ctx, ins[0], 3)
    n, c = x.shape[:2]
    g = int(ctx.a("num_groups"))
    if g < 1 or c % g:
        raise ctx.refuse(f"num_groups={g} does not divide the {c} channels")
    y = _rows_normalised(x, n * g, float(ctx.a("epsilon", 1e-5)))
    return [y * _per_channel(ctx, ins[1], x, c, "scale") + _per_channel(ctx, ins[2], x, c, "bias")]


@op("MeanVarianceNormalization", attrs=("axes",))
def _mvn(ctx, ins):
    """(x - mean) / (sqrt(var) + 1e-9) over ``axes`` (ONNX's function body adds that epsilon)."""
    x = _float(ctx, ins[0])
    axes = tuple(sorted({norm_axis(ctx, int(a), x.ndim, "axes") for a in ctx.a("axes", [0, 2, 3])}))
    d = x - ops.reduce_mean(x, axis=axes, keepdims=True)
    return [d / (ops.sqrt(ops.reduce_mean(d * d, axis=axes, keepdims=True)) + 1e-9)]


@op("LpNormalization", attrs=("axis", "p"))
def _lp_norm(ctx, ins):
    x = _float(ctx, ins[0])
    ax = norm_axis(ctx, int(ctx.a("axis", -1)), x.ndim)
    p = int(ctx.a("p", 2))
    if p not in (1, 2):
        raise ctx.refuse(f"p={p} (legal: 1, 2)")
    norm = (ops.reduce_sum(ops.abs(x), axis=ax, keepdims=True) if p == 1 else
            ops.sqrt(ops.reduce_sum(x * x, axis=ax, keepdims=True)))
    return [x / ops.where(ops.equal(norm, 0.0), norm + 1.0, norm)]    # a zero vector stays zero (ONNX's reference)


@op("LRN", attrs=("alpha", "beta", "bias", "size"))
def _lrn(ctx, ins):
    x = _float(ctx, ins[0], 3)
    size = int(ctx.a("size"))
    if size < 1:
        raise ctx.refuse(f"size={size}")
    alpha, beta, bias = float(ctx.a("alpha", 1e-4)), float(ctx.a("beta", 0.75)), float(ctx.a("bias", 1.0))
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = ops.pad(x * x, ((0, 0), (lo, hi)) + ((0, 0),) * (x.ndim - 2))
    total = sq[:, 0:c]
    for k in range(1, size):
        total = total + sq[:, k:k + c]
    return [x / ops.pow(total * (alpha / size) + bias, beta)]


def _block(ctx, x):
    b = int(ctx.a("blocksize", 0))
    if b < 1:
        raise ctx.refuse(f"blocksize={b}")
    if x.ndim != 4:
        raise ctx.refuse(f"a rank-4 NCHW input is needed, got shape {x.shape}")
    return b


@op("DepthToSpace", attrs=("blocksize", "mode"))
def _depth_to_space(ctx, ins):
    x = ctx.t(ins[0])
    b = _block(ctx, x)
    n, c, h, w = x.shape
    if c % (b * b):
        raise ctx.refuse(f"{c} channels are not a multiple of blocksize^2 = {b * b}")
    mode = ctx.a("mode", "DCR")
    if mode == "DCR":
        y = ops.transpose(ops.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = ops.transpose(ops.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise ctx.refuse(f"mode={mode!r} (legal: DCR, CRD)")
    return [ops.reshape(y, (n, c // (b * b), h * b, w * b))]


@op("SpaceToDepth", attrs=("blocksize",))
def _space_to_depth(ctx, ins):
    x = ctx.t(ins[0])
    b = _block(ctx, x)
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ctx.refuse(f"H, W = {h}, {w} are not multiples of blocksize {b}")
    y = ops.transpose(ops.reshape(x, (n, c, h // b, b, w // b, b)), (0, 3, 5, 1, 2, 4))
    return [ops.reshape(y, (n, c * b * b, h // b, w // b))]


@op("Shrink", attrs=("bias", "lambd"))
def _shrink(ctx, ins):
    x = _float(ctx, ins[0], 0)
    lambd, bias = float(ctx.a("lambd", 0.5)), float(ctx.a("bias", 0.0))
    zero = x * 0.0
    return [ops.where(ops.less(x, -lambd), x + bias, ops.where(ops.greater(x, lambd), x - bias, zero))]
