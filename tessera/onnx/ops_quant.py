"""ONNX QuantizeLinear / DequantizeLinear replayed through ``tessera.ops`` for int8 (the frontend
has no uint8: a uint8 tensor or zero point is refused by name where the model is read).

QuantizeLinear: ``y = saturate(round_half_even(x / scale) + zero_point)``, per tensor (scalar
scale) or per axis (1-D scale along ``axis``); blocked quantisation (``block_size``) and output
types other than int8 are refused.  DequantizeLinear: ``y = (x - zero_point) * scale``, for int8
or int32 ``x``."""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import cast, norm_axis, op

_INT8_RANGE = (-128.0, 127.0)
_ONNX_INT8 = 3


def _per_axis(ctx, v, x_rank: int, what: str):
    """A scale or zero point shaped to broadcast against the input: a scalar as is, a 1-D
    vector along ``axis``."""
    nd = len(v.shape)
    if nd == 0 or (nd == 1 and v.shape[0] == 1 and x_rank == 0):
        return v
    if nd != 1:
        raise ctx.refuse(f"{what} of shape {tuple(v.shape)} is blocked quantisation (block_size), not mapped")
    ax = norm_axis(ctx, int(ctx.a("axis", 1)), x_rank)
    shape = tuple(int(v.shape[0]) if i == ax else 1 for i in range(x_rank))
    return np.reshape(v, shape) if isinstance(v, np.ndarray) else ops.reshape(v, shape)


def _check_block(ctx):
    if int(ctx.a("block_size", 0)):
        raise ctx.refuse(f"block_size {ctx.a('block_size')} (blocked quantisation) is not mapped")


@op("QuantizeLinear", inputs=(2, 3), attrs=("axis", "block_size", "output_dtype", "saturate", "precision"))
def _quantize(ctx, ins):
    _check_block(ctx)
    if int(ctx.a("precision", 0)) not in (0, 1):
        raise ctx.refuse(f"precision {ctx.a('precision')} is not mapped (the division runs in float32)")
    x = ctx.t(ins[0])
    if dt.kind(x.dtype) != "f":
        raise ctx.refuse(f"a float input is needed, got {dt.name(x.dtype)}")
    zp = ins[2] if len(ins) > 2 else None
    out_code = int(ctx.a("output_dtype", 0))
    if zp is None and out_code in (0, 2):
        raise ctx.refuse("without a zero point the output is uint8, which Tessera has no dtype for")
    if out_code not in (0, _ONNX_INT8):
        raise ctx.refuse(f"output_dtype {out_code} is not mapped (int8 only)")
    if zp is not None and zp.dtype != dt.int8:
        raise ctx.refuse(f"a {dt.name(zp.dtype)} zero point is not mapped (int8 only)")
    work = dt.float32 if x.dtype != dt.float64 else dt.float64
    scale = cast(ctx.t(_per_axis(ctx, ins[1], x.ndim, "y_scale")), work)
    q = ops.round(cast(x, work) / scale)
    if zp is not None:
        q = q + cast(ctx.t(_per_axis(ctx, zp, x.ndim, "y_zero_point")), work)
    return [ops.cast(ops.clip(q, *_INT8_RANGE), dt.int8)]


@op("DequantizeLinear", inputs=(2, 3), attrs=("axis", "block_size", "output_dtype"))
def _dequantize(ctx, ins):
    _check_block(ctx)
    x = ctx.t(ins[0])
    if x.dtype not in (dt.int8, dt.int32):
        raise ctx.refuse(f"a {dt.name(x.dtype)} input is not mapped (int8 or int32)")
    out_code = int(ctx.a("output_dtype", 0))
    if out_code:
        raise ctx.refuse(f"output_dtype {out_code} is not mapped (the scale's dtype is used)")
    s = ins[1]
    sd = s.dtype
    work = dt.float32 if sd != dt.float64 else dt.float64
    xf = cast(x, work)
    zp = ins[2] if len(ins) > 2 else None
    if zp is not None:
        if zp.dtype != x.dtype:
            raise ctx.refuse(f"zero point {dt.name(zp.dtype)} differs from the input {dt.name(x.dtype)}")
        xf = xf - cast(ctx.t(_per_axis(ctx, zp, x.ndim, "x_zero_point")), work)
    y = xf * cast(ctx.t(_per_axis(ctx, s, x.ndim, "x_scale")), work)
    return [cast(y, sd)]
