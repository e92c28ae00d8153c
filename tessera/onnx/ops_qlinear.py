"""ONNX MatMulInteger / QLinearMatMul / ConvInteger / QLinearConv: integer products of int8 /
uint8 tensors, replayed exactly through Tessera's float GEMM and conv2d.

The integer products are computed on ``(a - a_zero_point)`` and ``(b - b_zero_point)`` held as
floats: each factor is an integer of magnitude at most 255 (128 for int8 without a zero point,
255 for uint8), so each product is at most 255 * 255 = 65025 and every partial sum of K of them
at most K * 65025.  A float holds such sums exactly while they stay below 2^24 (float32) or 2^53
(float64), whatever order the kernel adds them in: float32 is used where ``K * bound < 2^24``
(K <= 258 with zero points), float64 beyond, so the int32 result is exact.  ONNX accumulates in
int32, which wraps past 2^31: a K with ``K * bound >= 2^31`` (K > 33025 with zero points) is
refused rather than given a saturated sum where ONNX's would wrap.

QLinearMatMul / QLinearConv then requantise as ONNX's reference does: the multiplier
``a_scale * b_scale / y_scale`` in the scales' dtype (rounded to it after each operation), the
exact integer result times it in float64, plus the output zero point, rounded half to even and
saturated to int8 / uint8.  Zero points and scales: per tensor, or per row of A / per column of
B (per output channel of W); other shapes are refused by name."""
from __future__ import annotations

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import cast, op
from tessera.onnx.ops_nn import _conv, _conv_check
from tessera.onnx.ops_quant import RANGES, q_type, saturate_round

EXACT_F32 = 2 ** 24       # float32 holds every integer below this exactly
INT32_WRAP = 2 ** 31      # ONNX's int32 accumulator wraps here


def _magnitude(d, has_zp: bool) -> int:
    """The largest |v - zero_point| of a ``d`` value."""
    return 255 if has_zp or d == dt.uint8 else 128


def work_dtype(ctx, k: int, a_d, a_zp: bool, b_d, b_zp: bool):
    """float32 where every partial sum of ``k`` products is below 2^24, else float64; refused where
    ONNX's int32 accumulator could wrap."""
    bound = k * _magnitude(a_d, a_zp) * _magnitude(b_d, b_zp)
    if bound >= INT32_WRAP:
        raise ctx.refuse(f"a reduction over {k} products of up to {bound // k} each can pass 2^31, where ONNX's "
                         "int32 accumulator wraps (Tessera sums exactly and would not wrap); not mapped")
    return dt.float32 if bound < EXACT_F32 else dt.float64


def _int_in(ctx, v, what: str):
    v = ctx.t(v)
    q_type(ctx, v, what)
    return v


def _zero_point(ctx, zp, like, what: str, shape):
    """A zero point as a float tensor that broadcasts against the operand: ``shape`` says how a
    1-D one lies (None: only per tensor)."""
    if zp is None:
        return None
    if zp.dtype != like.dtype:
        raise ctx.refuse(f"{what} is {dt.name(zp.dtype) if zp.dtype in dt._NAME else zp.dtype}, the input "
                         f"{dt.name(like.dtype)} (they must match)")
    return _broadcast(ctx, zp, what, shape)


def _broadcast(ctx, v, what: str, shape):
    """A per-tensor value as is; a 1-D one of ``shape[0]`` elements reshaped to ``shape[1]``; an
    N-D one that broadcasts as is (ONNX's [D1, D2, M, 1] / [D1, D2, 1, N] forms)."""
    n = len(v.shape)
    if n == 0 or (n == 1 and v.shape[0] == 1):
        return ctx.t(v) if n == 0 else ops.reshape(ctx.t(v), ())
    if shape is not None and n == 1 and int(v.shape[0]) == shape[0]:
        return ops.reshape(ctx.t(v), shape[1])
    if shape is not None and n == len(shape[1]) and all(int(s) in (1, int(t)) for s, t in zip(v.shape, shape[2])):
        return ctx.t(v)
    want = "a scalar" if shape is None else f"a scalar or {shape[0]} elements"
    raise ctx.refuse(f"{what} has shape {tuple(v.shape)}; {want} is mapped")


def _shifted(v, zp, work):
    f = cast(v, work)
    return f if zp is None else f - cast(zp, work)


def integer_matmul(ctx, a, b, azp_in, bzp_in, names=("a_zero_point", "b_zero_point")):
    """``(a - azp) @ (b - bzp)`` exactly, as a float tensor of integer values (float32 or float64)."""
    if a.ndim < 2 or b.ndim < 2:
        raise ctx.refuse(f"A and B of rank >= 2 are mapped, got {a.shape} and {b.shape}")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    azp = _zero_point(ctx, azp_in, a, names[0], (m, (m, 1), a.shape[:-1] + (1,)))
    bzp = _zero_point(ctx, bzp_in, b, names[1], (n, (n,), b.shape[:-2] + (1, n)))
    work = work_dtype(ctx, k, a.dtype, azp is not None, b.dtype, bzp is not None)
    return ops.matmul(_shifted(a, azp, work), _shifted(b, bzp, work))


@op("MatMulInteger", inputs=(2, 4))
def _matmul_integer(ctx, ins):
    a, b = _int_in(ctx, ins[0], "A"), _int_in(ctx, ins[1], "B")
    at = lambda i: ins[i] if len(ins) > i else None  # noqa: E731
    return [ops.cast(integer_matmul(ctx, a, b, at(2), at(3)), dt.int32)]


def _multiplier(ctx, scales, shapes):
    """``s0 * s1 / s2`` in the scales' dtype, rounded to it after each operation (as numpy on
    float16 scales), as a float64 tensor shaped to broadcast against the integer result."""
    sd = {s.dtype for s in scales}
    if len(sd) != 1 or next(iter(sd)) not in dt.FLOATS:
        raise ctx.refuse(f"the scales must share one float dtype, got {', '.join(sorted(str(d) for d in sd))}")
    sd = next(iter(sd))
    names = ("first scale", "second scale", "y_scale")
    vals = [_broadcast(ctx, s, nm, sh) for s, nm, sh in zip(scales, names, shapes)]
    if sd == dt.float64:
        return vals[0] * vals[1] / vals[2]

    def rounded(v):   # float32 arithmetic on 16-bit floats is exact for *, and / rounds once more harmlessly
        return v if sd == dt.float32 else cast(cast(v, sd), dt.float32)
    f = [cast(v, dt.float32) for v in vals]
    return cast(rounded(rounded(f[0] * f[1]) / f[2]), dt.float64)


def requantize(ctx, acc, mult, yzp, out_d):
    y = cast(acc, dt.float64) * mult
    if yzp is not None:
        y = y + cast(yzp, dt.float64)
    return saturate_round(y, out_d)


def _y_zero_point(ctx, yzp, fallback):
    if yzp is None:
        return None, fallback
    if len(yzp.shape) > 1 or (len(yzp.shape) == 1 and yzp.shape[0] != 1):
        raise ctx.refuse(f"y_zero_point has shape {tuple(yzp.shape)}; a scalar is mapped")
    d = q_type(ctx, yzp, "y_zero_point")
    return (ctx.t(yzp) if not yzp.shape else ops.reshape(ctx.t(yzp), ())), d


@op("QLinearMatMul", inputs=(8, 8))
def _qlinear_matmul(ctx, ins):
    a, a_s, azp, b, b_s, bzp, y_s, yzp = ins
    a, b = _int_in(ctx, a, "a"), _int_in(ctx, b, "b")
    acc = integer_matmul(ctx, a, b, azp, bzp)
    m, n = a.shape[-2], b.shape[-1]
    mult = _multiplier(ctx, [a_s, b_s, y_s], [(m, (m, 1), a.shape[:-1] + (1,)),
                                             (n, (n,), b.shape[:-2] + (1, n)), None])
    yzp_t, out_d = _y_zero_point(ctx, yzp, a.dtype)
    return [requantize(ctx, acc, mult, yzp_t, out_d)]


def integer_conv(ctx, x, w, xzp_in, wzp_in, bias=None):
    """conv(x - xzp, w - wzp) (+ an int32 bias) exactly, as a float tensor of integer values; the
    padding is zero after the shift (ONNX's reference: a padded element counts as the zero point)."""
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.refuse(f"only 2-D convolution (rank-4 X and W) is mapped, got X {x.shape} and W {w.shape}")
    xzp = _zero_point(ctx, xzp_in, x, "x_zero_point", None)
    c_out = w.shape[0]
    wzp = _zero_point(ctx, wzp_in, w, "w_zero_point", (c_out, (c_out, 1, 1, 1), (c_out, 1, 1, 1)))
    k = w.shape[1] * w.shape[2] * w.shape[3]
    work = work_dtype(ctx, k + (1 if bias is not None else 0), x.dtype, xzp is not None, w.dtype, wzp is not None)
    if bias is not None and work == dt.float32:
        work = dt.float64      # an int32 bias may be beyond 2^24 itself
    args = [_shifted(x, xzp, work), _shifted(w, wzp, work)]
    if bias is not None:
        args.append(cast(bias, work))
    return _conv(ctx, args)[0]


@op("ConvInteger", inputs=(2, 4), attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"),
    check=_conv_check)
def _conv_integer(ctx, ins):
    x, w = _int_in(ctx, ins[0], "x"), _int_in(ctx, ins[1], "w")
    at = lambda i: ins[i] if len(ins) > i else None  # noqa: E731
    return [ops.cast(integer_conv(ctx, x, w, at(2), at(3)), dt.int32)]


@op("QLinearConv", inputs=(8, 9), attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"),
    check=_conv_check)
def _qlinear_conv(ctx, ins):
    x, x_s, xzp, w, w_s, wzp, y_s, yzp = ins[:8]
    x, w = _int_in(ctx, x, "x"), _int_in(ctx, w, "w")
    bias = ctx.t(ins[8]) if len(ins) > 8 and ins[8] is not None else None
    if bias is not None and bias.dtype != dt.int32:
        raise ctx.refuse(f"the bias B must be int32, got {dt.name(bias.dtype)}")
    acc = integer_conv(ctx, x, w, xzp, wzp, bias)
    c_out = w.shape[0]
    mult = _multiplier(ctx, [x_s, w_s, y_s], [None, (c_out, (1, c_out, 1, 1), (1, c_out, 1, 1)), None])
    yzp_t, out_d = _y_zero_point(ctx, yzp, x.dtype)
    return [requantize(ctx, acc, mult, yzp_t, out_d)]


__all__ = ["EXACT_F32", "INT32_WRAP", "RANGES", "integer_conv", "integer_matmul", "requantize", "work_dtype"]
