"""ONNX Conv, MaxPool and AveragePool (2-D, NCHW) replayed through ``tessera.ops.conv2d`` and
``max_pool2d`` / ``avg_pool2d``; ``auto_pad`` and asymmetric ``pads`` become explicit pads.
BatchNormalization (inference) as a per-channel multiply-add."""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import cast, op

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _auto_pad(attrs) -> str:
    v = attrs.get("auto_pad", "NOTSET")
    return v.decode() if isinstance(v, bytes) else v


def _check_2d(attrs, what: str, allow_dilations: bool = True):
    ks = attrs.get("kernel_shape")
    if ks is not None and len(ks) != 2:
        return f"a {len(ks)}-D kernel (kernel_shape={list(ks)}); only 2-D {what} is mapped"
    if _auto_pad(attrs) not in AUTO_PADS:
        return f"auto_pad={_auto_pad(attrs)!r}"
    for k, n in (("strides", 2), ("dilations", 2), ("pads", 4)):
        if k in attrs and len(attrs[k]) != n:
            return f"{k}={list(attrs[k])} (2-D: {n} values)"
    if not allow_dilations and any(d != 1 for d in attrs.get("dilations", [1, 1])):
        return f"dilations={list(attrs['dilations'])} (only 1)"
    return None


def _pads(ctx, hw, k, s, d) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) from auto_pad or pads [top, left, bottom, right]."""
    mode = _auto_pad(ctx.attrs)
    if mode == "VALID":
        return (0, 0), (0, 0)
    if mode == "NOTSET":
        p = [int(v) for v in ctx.a("pads", [0, 0, 0, 0])]
        if min(p) < 0:
            raise ctx.refuse(f"negative pads {p}")
        return (p[0], p[2]), (p[1], p[3])
    out = []
    for n, kk, ss, dd in zip(hw, k, s, d):
        total = max((-(-n // ss) - 1) * ss + (kk - 1) * dd + 1 - n, 0)
        small, big = total // 2, total - total // 2
        out.append((small, big) if mode == "SAME_UPPER" else (big, small))
    return tuple(out)


def _conv_check(attrs, opset):
    return _check_2d(attrs, "Conv")


@op("Conv", inputs=(2, 3), attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"),
    check=_conv_check)
def _conv(ctx, ins):
    x, w = ctx.t(ins[0]), ctx.t(ins[1])
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.refuse(f"only 2-D convolution (rank-4 X and W) is mapped, got X {x.shape} and W {w.shape}")
    ks = ctx.a("kernel_shape")
    if ks is not None and tuple(int(k) for k in ks) != tuple(w.shape[2:]):
        raise ctx.refuse(f"kernel_shape {list(ks)} differs from W's spatial shape {w.shape[2:]}")
    s = tuple(int(v) for v in ctx.a("strides", [1, 1]))
    d = tuple(int(v) for v in ctx.a("dilations", [1, 1]))
    pads = _pads(ctx, x.shape[2:], w.shape[2:], s, d)
    b = ctx.t(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    return [ops.conv2d(x, w, b, stride=s, padding=pads, dilation=d, groups=int(ctx.a("group", 1)))]


def _pool_check(what):
    def check(attrs, opset):
        if attrs.get("ceil_mode", 0):
            return "ceil_mode=1 (floor mode only)"
        if attrs.get("storage_order", 0):
            return "storage_order=1"
        if "kernel_shape" not in attrs:
            return "kernel_shape is required"
        return _check_2d(attrs, what, allow_dilations=False)
    return check


def _pool_input(ctx, ins, fill):
    x = ctx.t(ins[0])
    if x.ndim != 4:
        raise ctx.refuse(f"only 2-D pooling (rank-4 NCHW input) is mapped, got {x.shape}")
    k = tuple(int(v) for v in ctx.a("kernel_shape"))
    s = tuple(int(v) for v in ctx.a("strides", [1, 1]))
    pads = _pads(ctx, x.shape[2:], k, s, (1, 1))
    if any(p != (0, 0) for p in pads):
        x = ops.pad(x, ((0, 0), (0, 0)) + pads, constant_values=fill)
    return x, k, s, pads


@op("MaxPool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"),
    check=_pool_check("MaxPool"))
def _max_pool(ctx, ins):
    if ctx.n_outputs > 1:
        raise ctx.refuse("the Indices output is not mapped")
    x, k, s, _ = _pool_input(ctx, ins, -np.inf)
    return [ops.max_pool2d(x, k, s)]


@op("AveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
                          "strides"), check=_pool_check("AveragePool"))
def _avg_pool(ctx, ins):
    xp, k, s, pads = _pool_input(ctx, ins, 0.0)
    y = ops.avg_pool2d(xp, k, s)
    if ctx.a("count_include_pad", 0) or all(p == (0, 0) for p in pads):
        return [y]
    # divide by the count of real (unpadded) elements of each window: the pool of a padded ones map
    h, w = xp.shape[2] - sum(pads[0]), xp.shape[3] - sum(pads[1])
    ones = ops.cast(ops.greater_equal(ops.iota((1, 1, h, w), 2, dt.int32), 0), xp.dtype)
    frac = ops.avg_pool2d(ops.pad(ones, ((0, 0), (0, 0)) + pads), k, s)
    return [y / frac]


def _bn_check(attrs, opset):
    if attrs.get("training_mode", 0):
        return "training_mode=1 (inference only: the running statistics are used)"
    return None


@op("BatchNormalization", inputs=(5, 5), attrs=("epsilon", "momentum", "training_mode"), check=_bn_check)
def _batch_norm(ctx, ins):
    """Inference: (x - mean) / sqrt(var + eps) * scale + B over channel dim 1, as one multiply-add
    per element (the per-channel factor and offset are computed on the C-vectors first);
    ``momentum`` only moves the running statistics in training and is read only to be accepted."""
    x = ctx.t(ins[0])
    if dt.kind(x.dtype) != "f":
        raise ctx.refuse(f"a float input is needed, got {dt.name(x.dtype)}")
    if x.ndim < 2:
        raise ctx.refuse(f"the input needs a channel dim (rank >= 2), got shape {x.shape}")
    c = x.shape[1]
    scale, bias, mean, var = (cast(ctx.t(v), x.dtype) for v in ins[1:])
    for nm, v in zip(("scale", "B", "input_mean", "input_var"), (scale, bias, mean, var)):
        if tuple(v.shape) != (c,):
            raise ctx.refuse(f"{nm} has shape {tuple(v.shape)}, expected ({c},) (the channels of X {x.shape})")
    factor = scale * ops.rsqrt(var + float(ctx.a("epsilon", 1e-5)))
    offset = bias - mean * factor
    per_c = (1, c) + (1,) * (x.ndim - 2)
    return [x * ops.reshape(factor, per_c) + ops.reshape(offset, per_c)]
