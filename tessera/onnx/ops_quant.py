"""ONNX QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear replayed through ``tessera.ops``
for int8 and uint8 (the asymmetric zero points of most quantised models).

QuantizeLinear: ``y = saturate(round_half_even(x / scale) + zero_point)``, per tensor (scalar
scale) or per axis (1-D scale along ``axis``); the output type is the zero point's, else
``output_dtype``'s, else uint8 (ONNX's default).  DequantizeLinear: ``y = (x - zero_point) *
scale`` for int8, uint8 or int32 ``x``.  DynamicQuantizeLinear: the uint8 scale and zero point
of ``x``'s range (widened to hold 0), then QuantizeLinear with them.  Blocked quantisation
(``block_size``), 16-bit, 4-bit and float8 zero points are refused by name; so are a float zero
point and a scale whose shape does not fit the input."""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import ONNX_DTYPES, ONNX_TYPE_NAMES, cast, norm_axis, op

# saturation bounds of the quantised types (floats, as the clip before the cast takes them)
RANGES = {dt.int8: (-128.0, 127.0), dt.uint8: (0.0, 255.0)}
_ONNX_UINT8 = 2


def q_type(ctx, zp, what: str = "zero point"):
    """The quantised dtype a zero point (or a quantised tensor) has: int8 or uint8, else refused."""
    d = zp.dtype
    if d not in RANGES:
        raise ctx.refuse(f"a {dt.name(d) if d in dt._NAME else d} {what} is not mapped (int8 or uint8)")
    return d


def per_axis(ctx, v, x_shape, what: str, axis=None):
    """A scale or zero point shaped to broadcast against the input: a scalar (or one element) as
    is, a 1-D vector along ``axis`` (whose length must be that axis' size)."""
    nd = len(v.shape)
    x_rank = len(x_shape)
    if nd == 0 or (nd == 1 and v.shape[0] == 1):
        return v if nd == 0 else (v.reshape(()) if isinstance(v, np.ndarray) else ops.reshape(v, ()))
    if nd != 1:
        raise ctx.refuse(f"{what} of shape {tuple(v.shape)} is blocked quantisation (block_size), not mapped")
    ax = norm_axis(ctx, int(ctx.a("axis", 1) if axis is None else axis), x_rank)
    if int(v.shape[0]) != int(x_shape[ax]):
        raise ctx.refuse(f"{what} has {v.shape[0]} elements, but axis {ax} of the input has {x_shape[ax]} "
                         f"(shape {tuple(x_shape)})")
    shape = tuple(int(v.shape[0]) if i == ax else 1 for i in range(x_rank))
    return np.reshape(v, shape) if isinstance(v, np.ndarray) else ops.reshape(v, shape)


def same_shape(ctx, scale, zp, names: str):
    if zp is not None and tuple(scale.shape) != tuple(zp.shape):
        raise ctx.refuse(f"{names}: the scale's shape {tuple(scale.shape)} differs from the zero point's "
                         f"{tuple(zp.shape)}")


def _check_block(ctx):
    if int(ctx.a("block_size", 0)):
        raise ctx.refuse(f"block_size {ctx.a('block_size')} (blocked quantisation) is not mapped")


def _float_in(ctx, v, what: str):
    if dt.kind(v.dtype) != "f":
        raise ctx.refuse(f"a float {what} is needed, got {dt.name(v.dtype)}")
    return v


def saturate_round(q, qd):
    """``q`` (float, integral after rounding) rounded half to even, clipped to ``qd``'s range, cast."""
    return ops.cast(ops.clip(ops.round(q), *RANGES[qd]), qd)


@op("QuantizeLinear", inputs=(2, 3), attrs=("axis", "block_size", "output_dtype", "saturate", "precision"))
def _quantize(ctx, ins):
    _check_block(ctx)
    if int(ctx.a("precision", 0)) not in (0, 1):
        raise ctx.refuse(f"precision {ctx.a('precision')} is not mapped (the division runs in float32)")
    x = _float_in(ctx, ctx.t(ins[0]), "input")
    _float_in(ctx, ins[1], "y_scale")
    zp = ins[2] if len(ins) > 2 else None
    out_code = int(ctx.a("output_dtype", 0))
    if out_code and (out_code not in ONNX_DTYPES or ONNX_DTYPES[out_code] not in RANGES):
        raise ctx.refuse(f"output_dtype {ONNX_TYPE_NAMES.get(out_code, out_code)} is not mapped (int8 or uint8)")
    if zp is not None:
        qd = q_type(ctx, zp)
        if out_code and ONNX_DTYPES[out_code] != qd:
            raise ctx.refuse(f"output_dtype {ONNX_TYPE_NAMES[out_code]} differs from the zero point's "
                             f"{dt.name(qd)}")
        same_shape(ctx, ins[1], zp, "y_scale / y_zero_point")
    else:
        qd = ONNX_DTYPES[out_code or _ONNX_UINT8]
    work = dt.float32 if x.dtype != dt.float64 else dt.float64
    scale = cast(ctx.t(per_axis(ctx, ins[1], x.shape, "y_scale")), work)
    q = ops.round(cast(x, work) / scale)
    if zp is not None:
        q = q + cast(ctx.t(per_axis(ctx, zp, x.shape, "y_zero_point")), work)
    return [ops.cast(ops.clip(q, *RANGES[qd]), qd)]


@op("DequantizeLinear", inputs=(2, 3), attrs=("axis", "block_size", "output_dtype"))
def _dequantize(ctx, ins):
    _check_block(ctx)
    x = ctx.t(ins[0])
    if x.dtype not in (dt.int8, dt.uint8, dt.int32):
        raise ctx.refuse(f"a {dt.name(x.dtype)} input is not mapped (int8, uint8 or int32)")
    out_code = int(ctx.a("output_dtype", 0))
    if out_code:
        raise ctx.refuse(f"output_dtype {out_code} is not mapped (the scale's dtype is used)")
    s = _float_in(ctx, ins[1], "x_scale")
    sd = s.dtype
    work = dt.float32 if sd != dt.float64 else dt.float64
    xf = cast(x, work)
    zp = ins[2] if len(ins) > 2 else None
    if zp is not None:
        if zp.dtype != x.dtype:
            raise ctx.refuse(f"zero point {dt.name(zp.dtype)} differs from the input {dt.name(x.dtype)}")
        same_shape(ctx, s, zp, "x_scale / x_zero_point")
        xf = xf - cast(ctx.t(per_axis(ctx, zp, x.shape, "x_zero_point")), work)
    y = xf * cast(ctx.t(per_axis(ctx, s, x.shape, "x_scale")), work)
    return [cast(y, sd)]


@op("DynamicQuantizeLinear", outputs=3)
def _dynamic_quantize(ctx, ins):
    """ONNX's formula, in float32: max = max(0, max x), min = min(0, min x); scale = (max - min) /
    255 (1 / 255 where max == min); zero point = round(saturate(0 - min / scale)); y as
    QuantizeLinear's with them.  Outputs y (uint8), the scale (f32 scalar) and the zero point
    (uint8 scalar)."""
    x = ctx.t(ins[0])
    if x.dtype != dt.float32:
        raise ctx.refuse(f"a float32 input is needed (ONNX's T1), got {dt.name(x.dtype)}")
    hi = ops.maximum(ops.reduce_max(x), 0.0)
    lo = ops.minimum(-ops.reduce_max(-x), 0.0)
    span = hi - lo
    scale = ops.where(ops.equal(span, 0.0), 1.0, span) / 255.0
    zpf = ops.round(ops.clip(0.0 - lo / scale, *RANGES[dt.uint8]))
    y = ops.cast(ops.clip(ops.round(x / scale) + zpf, *RANGES[dt.uint8]), dt.uint8)
    return [y, scale, ops.cast(zpf, dt.uint8)]
