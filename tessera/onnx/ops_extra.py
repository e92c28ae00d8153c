"""More ONNX ops replayed through ``tessera.ops``: activations and unary math, variadic and bitwise
ops, the remaining reductions and arg/scan ops, Trilu, Range, OneHot, GatherElements, global
pooling, RMSNormalization, CastLike, Size, Tile, Hardmax.  Each is checked by ONNX's own node tests
(``tools/onnx_conformance.py``, ``docs/onnx.md``).  Opset 13..21 semantics (RMSNormalization: 23)."""
from __future__ import annotations

import math

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.trace import constant
from tessera.frontend.vjp_rules import broadcast_to
from tessera.onnx.convert import cast, ints, norm_axis, op, shape_of, small
from tessera.onnx.ops_math import argmax_check, axes_of, cumulative


# ---------------------------------------------------------------------------- unary math, activations
def _f(ctx, v):
    x = ctx.t(v)
    if dt.kind(x.dtype) != "f":
        raise ctx.refuse(f"a float tensor is needed, got {dt.name(x.dtype)}")
    return x


_SIMPLE = {"Ceil": ops.ceil, "Floor": ops.floor, "Round": ops.round, "Reciprocal": ops.reciprocal,
           "Sign": ops.sign, "Sin": ops.sin, "Cos": ops.cos, "IsNaN": ops.isnan}
for _n, _fn in _SIMPLE.items():
    op(_n)(lambda ctx, ins, _fn=_fn: [_fn(ctx.t(ins[0]))])


@op("Tan")
def _tan(ctx, ins):
    x = _f(ctx, ins[0])
    return [ops.sin(x) / ops.cos(x)]


@op(("Sinh", "Cosh"))
def _hyperbolic(ctx, ins):
    x = _f(ctx, ins[0])
    e, r = ops.exp(x), ops.exp(-x)
    return [(e - r) * 0.5 if ctx.node.op_type == "Sinh" else (e + r) * 0.5]


@op("IsInf", attrs=("detect_negative", "detect_positive"))
def _isinf(ctx, ins):
    x = ctx.t(ins[0])
    neg, pos = ctx.a("detect_negative", 1), ctx.a("detect_positive", 1)
    if neg and pos:
        return [ops.isinf(x)]
    if not neg and not pos:
        return [ops.logical_and(ops.isinf(x), ops.isnan(x))]   # all false
    return [ops.equal(x, math.inf if pos else -math.inf)]


def softplus(x):
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    return ops.maximum(x, 0.0) + ops.log1p(ops.exp(-ops.abs(x)))


@op("Softplus")
def _softplus(ctx, ins):
    return [softplus(_f(ctx, ins[0]))]


@op("Softsign")
def _softsign(ctx, ins):
    x = _f(ctx, ins[0])
    return [x / (ops.abs(x) + 1.0)]


@op("Mish")
def _mish(ctx, ins):
    x = _f(ctx, ins[0])
    return [x * ops.tanh(softplus(x))]


@op("Elu", attrs=("alpha",))
def _elu(ctx, ins):
    x = _f(ctx, ins[0])
    return [ops.where(ops.greater(x, 0.0), x, ops.expm1(x) * float(ctx.a("alpha", 1.0)))]


@op("Celu", attrs=("alpha",))
def _celu(ctx, ins):
    x = _f(ctx, ins[0])
    a = float(ctx.a("alpha", 1.0))
    return [ops.maximum(x, 0.0) + ops.minimum(ops.expm1(x / a) * a, 0.0)]


@op("Selu", attrs=("alpha", "gamma"))
def _selu(ctx, ins):
    x = _f(ctx, ins[0])
    a, g = float(ctx.a("alpha", 1.67326319217681884765625)), float(ctx.a("gamma", 1.05070102214813232421875))
    return [ops.where(ops.greater(x, 0.0), x * g, ops.expm1(x) * (a * g))]


@op("LeakyRelu", attrs=("alpha",))
def _leaky_relu(ctx, ins):
    x = _f(ctx, ins[0])
    return [ops.where(ops.less(x, 0.0), x * float(ctx.a("alpha", 0.01)), x)]


@op("ThresholdedRelu", attrs=("alpha",))
def _thresholded_relu(ctx, ins):
    x = _f(ctx, ins[0])
    return [ops.where(ops.greater(x, float(ctx.a("alpha", 1.0))), x, 0.0)]


@op("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(ctx, ins):
    x = _f(ctx, ins[0])
    return [ops.clip(x * float(ctx.a("alpha", 0.2)) + float(ctx.a("beta", 0.5)), 0.0, 1.0)]


@op("HardSwish")
def _hard_swish(ctx, ins):
    x = _f(ctx, ins[0])
    return [x * ops.clip(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)]


@op("Swish", attrs=("alpha",))
def _swish(ctx, ins):
    x = _f(ctx, ins[0])
    a = float(ctx.a("alpha", 1.0))
    return [x * ops.sigmoid(x if a == 1.0 else x * a)]


@op("PRelu", inputs=(2, 2))
def _prelu(ctx, ins):
    x, slope = _f(ctx, ins[0]), ctx.t(ins[1])
    return [ops.where(ops.less(x, 0.0), x * cast(slope, x.dtype), x)]


# ---------------------------------------------------------------------------- variadic, comparisons, bits
def _fold(fn, ts):
    out = ts[0]
    for t in ts[1:]:
        out = fn(out, t)
    return out


@op(("Max", "Min", "Sum", "Mean"), inputs=(1, 64))
def _variadic(ctx, ins):
    kind = ctx.node.op_type
    if small(ins):
        fn = {"Max": np.maximum, "Min": np.minimum, "Sum": np.add, "Mean": np.add}[kind]
        r = _fold(fn, [np.asarray(v) for v in ins])
        return [(r / len(ins)).astype(r.dtype) if kind == "Mean" else r]
    ts = [ctx.t(v) for v in ins]
    fn = {"Max": ops.maximum, "Min": ops.minimum, "Sum": ops.add, "Mean": ops.add}[kind]
    r = _fold(fn, ts)
    return [r * (1.0 / len(ts)) if kind == "Mean" else r]


_COMPARE = {"GreaterOrEqual": ops.greater_equal, "LessOrEqual": ops.less_equal, "Xor": ops.logical_xor,
            "BitwiseAnd": ops.bitwise_and, "BitwiseOr": ops.bitwise_or, "BitwiseXor": ops.bitwise_xor}
for _n, _fn in _COMPARE.items():
    op(_n, inputs=(2, 2))(lambda ctx, ins, _fn=_fn: [_fn(ctx.t(ins[0]), ctx.t(ins[1]))])
op("BitwiseNot")(lambda ctx, ins: [ops.bitwise_not(ctx.t(ins[0]))])


def _bitshift_check(attrs, opset):
    if attrs.get("direction") not in (b"LEFT", b"RIGHT", "LEFT", "RIGHT"):
        return f"direction={attrs.get('direction')!r}"


@op("BitShift", inputs=(2, 2), attrs=("direction",), check=_bitshift_check)
def _bitshift(ctx, ins):
    d = ctx.a("direction")
    d = d.decode() if isinstance(d, bytes) else d
    return [(ops.left_shift if d == "LEFT" else ops.right_shift)(ctx.t(ins[0]), ctx.t(ins[1]))]


@op("Mod", inputs=(2, 2), attrs=("fmod",))
def _mod(ctx, ins):
    a, b = ctx.t(ins[0]), ctx.t(ins[1])
    if not ctx.a("fmod", 0):          # the divisor's sign (Python's %, numpy's mod)
        return [ops.mod(a, b)]
    if dt.kind(a.dtype) != "f":    # C's fmod on ints: the dividend's sign
        m = ops.mod(a, b)
        fix = ops.logical_and(ops.not_equal(m, 0), ops.not_equal(ops.less(a, 0), ops.less(b, 0)))
        return [ops.where(fix, m - b, m)]
    q = a / b
    t = ops.where(ops.less(q, 0.0), ops.ceil(q), ops.floor(q))
    return [a - t * b]


# ---------------------------------------------------------------------------- reductions, arg, scans
def _min(x, axis, keepdims):
    return ops.neg(ops.reduce_max(ops.neg(x), axis=axis, keepdims=keepdims))


_REDUCE = {"ReduceMin": _min, "ReduceProd": ops.prod,
           "ReduceL1": lambda x, axis, keepdims: ops.reduce_sum(ops.abs(x), axis=axis, keepdims=keepdims),
           "ReduceL2": lambda x, axis, keepdims: ops.sqrt(ops.reduce_sum(x * x, axis=axis, keepdims=keepdims)),
           "ReduceSumSquare": lambda x, axis, keepdims: ops.reduce_sum(x * x, axis=axis, keepdims=keepdims),
           "ReduceLogSum": lambda x, axis, keepdims: ops.log(ops.reduce_sum(x, axis=axis, keepdims=keepdims)),
           "ReduceLogSumExp": lambda x, axis, keepdims: _logsumexp(x, axis, keepdims)}


def _logsumexp(x, axis, keepdims):
    m = ops.reduce_max(x, axis=axis, keepdims=True)
    m = ops.where(ops.isfinite(m), m, 0.0)
    r = ops.log(ops.reduce_sum(ops.exp(x - m), axis=axis, keepdims=True)) + m
    return r if keepdims else ops.reshape(r, tuple(d for i, d in enumerate(x.shape) if i not in axis))


def _reduce_handler(fn):
    def h(ctx, ins):
        x = ctx.t(ins[0])
        axes, keep = axes_of(ctx, ins, x)
        if axes is None:
            return [x]
        if fn is _min and dt.kind(x.dtype) != "f":
            raise ctx.refuse(f"ReduceMin of {dt.name(x.dtype)} (float tensors map)")
        return [fn(x, tuple(axes), keep)]
    return h


for _n, _fn in _REDUCE.items():
    op(_n, inputs=(1, 2), attrs=("axes", "keepdims", "noop_with_empty_axes"), static=(1,))(_reduce_handler(_fn))


@op("ArgMin", attrs=("axis", "keepdims", "select_last_index"), check=argmax_check)
def _argmin(ctx, ins):
    x = ctx.t(ins[0])
    ax = norm_axis(ctx, int(ctx.a("axis", 0)), x.ndim)
    return [cast(ops.argmin(x, axis=ax, keepdims=bool(ctx.a("keepdims", 1))), dt.int64)]


op("CumProd", inputs=(2, 2), attrs=("exclusive", "reverse"), static=(1,))(cumulative(ops.cumprod, 1.0))


@op(("GlobalAveragePool", "GlobalMaxPool"))
def _global_pool(ctx, ins):
    x = _f(ctx, ins[0])
    if x.ndim < 3:
        raise ctx.refuse(f"input of rank {x.ndim} (N, C, spatial... expected)")
    fn = ops.reduce_mean if ctx.node.op_type == "GlobalAveragePool" else ops.reduce_max
    return [fn(x, axis=tuple(range(2, x.ndim)), keepdims=True)]


@op("Hardmax", attrs=("axis",))
def _hardmax(ctx, ins):
    x = _f(ctx, ins[0])
    ax = norm_axis(ctx, int(ctx.a("axis", -1)), x.ndim)
    xm = ops.moveaxis(x, ax, -1) if ax != x.ndim - 1 else x
    hot = ops.one_hot(ops.argmax(xm, axis=-1), x.shape[ax], x.dtype)
    return [ops.moveaxis(hot, -1, ax) if ax != x.ndim - 1 else hot]


# ---------------------------------------------------------------------------- shapes and indices
@op("Trilu", inputs=(1, 2), attrs=("upper",), static=(1,))
def _trilu(ctx, ins):
    x = ctx.t(ins[0])
    k = ints(ctx.const(ins[1], "k"))[0] if len(ins) > 1 and ins[1] is not None else 0
    if x.ndim < 2:
        raise ctx.refuse(f"input of rank {x.ndim} (at least 2)")
    return [(ops.triu if ctx.a("upper", 1) else ops.tril)(x, k)]


def _range_args(ctx, ins):
    start, limit, delta = (np.asarray(ctx.const(v, n)).reshape(()) for v, n in zip(ins, ("start", "limit", "delta")))
    n = max(int(math.ceil((limit.item() - start.item()) / delta.item())), 0)
    if n == 0:
        raise ctx.refuse("an empty Range (no elements)")
    return start, delta, n


def _range_fold(ctx, ins):
    """At load, over constants: numpy's (an exported graph's Range of constant bounds feeds axes)."""
    start, delta, n = _range_args(ctx, ins)
    return [(start + delta * np.arange(n)).astype(start.dtype)]


@op("Range", inputs=(3, 3), static=(0, 1, 2), fold=_range_fold)
def _range(ctx, ins):
    start, delta, n = _range_args(ctx, ins)
    d = start.dtype
    idx = ops.iota((n,), 0, dt.int64 if d.kind in "iu" else dt.as_dtype(d))
    return [cast(idx * delta.item() + start.item() if (delta.item() != 1 or start.item() != 0) else idx, d)]


@op("OneHot", inputs=(3, 3), attrs=("axis",), static=(1, 2))
def _one_hot(ctx, ins):
    idx, depth = ctx.t(ins[0]), ints(ctx.const(ins[1], "depth"))[0]
    values = np.asarray(ctx.const(ins[2], "values")).reshape(-1)
    if values.size != 2:
        raise ctx.refuse("values must be [off, on]")
    if dt.kind(idx.dtype) == "f":
        idx = ops.cast(ops.floor(idx), dt.int64)
    idx = ops.where(ops.less(idx, 0), idx + depth, idx)   # negative: counted from the end
    vd = dt.as_dtype(values.dtype)
    hot = ops.one_hot(idx, depth, dt.float32 if dt.kind(vd) != "f" else vd)
    off, on = values[0].item(), values[1].item()
    out = hot * (on - off) + off if (off, on) != (0, 1) else hot
    out = cast(out, vd)
    ax = ctx.a("axis", -1)
    ax = ax % (idx.ndim + 1)
    return [ops.moveaxis(out, -1, ax) if ax != idx.ndim else out]


@op("GatherElements", inputs=(2, 2), attrs=("axis",))
def _gather_elements(ctx, ins):
    x, idx = ctx.t(ins[0]), ctx.t(ins[1])
    ax = norm_axis(ctx, int(ctx.a("axis", 0)), x.ndim)
    if tuple(idx.shape) != tuple(x.shape):   # ONNX lets the index be smaller off the axis
        x = x[tuple(slice(0, n) if i != ax else slice(None) for i, n in enumerate(idx.shape))]
    idx = ops.where(ops.less(idx, 0), idx + x.shape[ax], idx)
    return [ops.take_along_axis(x, idx, ax)]


@op("CastLike", inputs=(2, 2), attrs=("saturate",))
def _cast_like(ctx, ins):
    d = ins[1].dtype
    return [cast(ins[0], d) if isinstance(ins[0], np.ndarray) else cast(ctx.t(ins[0]), d)]


@op("Size")
def _size(ctx, ins):
    return [np.array(int(np.prod(shape_of(ins[0]))), np.int64)]


@op("Tile", inputs=(2, 2), static=(1,))
def _tile(ctx, ins):
    x = ctx.t(ins[0])
    reps = ints(ctx.const(ins[1], "repeats"))
    if len(reps) != x.ndim or any(r < 1 for r in reps):
        raise ctx.refuse(f"repeats {reps} for an input of rank {x.ndim} (one >= 1 per axis)")
    for ax, r in enumerate(reps):
        if r > 1:
            x = ops.concatenate([x] * r, axis=ax)
    return [x]


# ---------------------------------------------------------------------------- normalisation
def _rms_check(attrs, opset):
    if attrs.get("stash_type", 1) != 1:
        return f"stash_type={attrs['stash_type']} (only 1, statistics in float32)"


@op("RMSNormalization", inputs=(2, 2), attrs=("axis", "epsilon", "stash_type"), check=_rms_check)
def _rms_norm(ctx, ins):
    x, scale = _f(ctx, ins[0]), ctx.t(ins[1])
    ax = norm_axis(ctx, int(ctx.a("axis", -1)), x.ndim)
    eps = float(ctx.a("epsilon", 1e-5))
    tail = x.shape[ax:]
    n = int(np.prod(tail))
    flat = x if len(tail) == 1 else ops.reshape(x, x.shape[:ax] + (n,))
    if tuple(scale.shape) == tuple(tail):
        y = ops.rms_norm(flat, ops.reshape(scale, (n,)) if len(tail) > 1 else scale, eps=eps)
        return [y if len(tail) == 1 else ops.reshape(y, x.shape)]
    one = broadcast_to(constant(1.0, x.dtype), (n,))
    y = ops.rms_norm(flat, one, eps=eps)
    return [(y if len(tail) == 1 else ops.reshape(y, x.shape)) * scale]
