"""ONNX math ops replayed through ``tessera.ops``: elementwise, MatMul/Gemm, normalisation,
softmax, reductions, arg/top-k, cumulative sums.  Opset 13..21 semantics."""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.trace import Tensor, constant
from tessera.frontend.vjp_rules import broadcast_to
from tessera.onnx.convert import cast, ints, norm_axis, op, small

# ---------------------------------------------------------------------------- elementwise
_UNARY = {"Sqrt": (ops.sqrt, np.sqrt), "Exp": (ops.exp, np.exp), "Log": (ops.log, np.log),
          "Tanh": (ops.tanh, np.tanh), "Erf": (ops.erf, None), "Sigmoid": (ops.sigmoid, None),
          "Relu": (ops.relu, lambda x: np.maximum(x, 0).astype(x.dtype)), "Neg": (ops.neg, np.negative),
          "Abs": (ops.abs, np.abs), "Not": (ops.logical_not, np.logical_not)}


def _trunc_div(a, b):
    if a.dtype.kind in "iu":
        return (np.trunc(a.astype(np.float64) / b.astype(np.float64))).astype(a.dtype)
    return (a / b).astype(a.dtype)


_BINARY = {"Add": (ops.add, np.add), "Sub": (ops.sub, np.subtract), "Mul": (ops.mul, np.multiply),
           "Div": (ops.div, _trunc_div), "Equal": (ops.equal, np.equal), "Less": (ops.less, np.less),
           "Greater": (ops.greater, np.greater), "And": (ops.logical_and, np.logical_and),
           "Or": (ops.logical_or, np.logical_or)}


def _unary_handler(name):
    tfn, nfn = _UNARY[name]

    def h(ctx, ins):
        x = ins[0]
        if nfn is not None and small(ins):
            return [np.asarray(nfn(x)).astype(x.dtype) if name != "Not" else np.logical_not(x)]
        return [tfn(ctx.t(x))]
    return h


def _binary_handler(name):
    tfn, nfn = _BINARY[name]

    def h(ctx, ins):
        a, b = ins
        if small(ins):
            return [np.asarray(nfn(a, b))]
        ta, tb = ctx.t(a), ctx.t(b)
        if name in ("And", "Or") and (ta.dtype != dt.bool_ or tb.dtype != dt.bool_):
            raise ctx.refuse("And/Or take bool tensors")
        r = tfn(ta, tb)
        if name == "Div" and dt.kind(ta.dtype) != "f":      # ONNX int division truncates toward zero
            r = ops.cast(r, ta.dtype)
        return [r]
    return h


for _n in _UNARY:
    op(_n)(_unary_handler(_n))
for _n in _BINARY:
    op(_n, inputs=(2, 2))(_binary_handler(_n))


@op("Pow", inputs=(2, 2))
def _pow(ctx, ins):
    x, y = ins
    if isinstance(y, np.ndarray) and y.size == 1:        # x ** 2.0 is a multiply, x ** 0.5 a sqrt
        v = float(y.reshape(-1)[0])
        r = ops.pow(ctx.t(x), int(v) if v.is_integer() else v)
        want = np.broadcast_shapes(tuple(r.shape), y.shape)
        return [r if tuple(r.shape) == want else ops.reshape(r, want)]
    tx = ctx.t(x)
    return [ops.pow(tx, cast(ctx.t(y), tx.dtype))]


def _gelu_check(attrs, opset):
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"approximate={attrs['approximate']!r} (legal: 'none', 'tanh')"


@op("Gelu", attrs=("approximate",), check=_gelu_check)
def _gelu(ctx, ins):
    return [ops.gelu(ctx.t(ins[0]), approximate="erf" if ctx.a("approximate", "none") == "none" else "tanh")]


@op("Where", inputs=(3, 3))
def _where(ctx, ins):
    c, a, b = ins
    if small(ins):
        return [np.where(c, a, b)]
    return [ops.where(ctx.t(c), ctx.t(a), ctx.t(b))]


@op("Clip", inputs=(1, 3))
def _clip(ctx, ins):
    x = ctx.t(ins[0])
    bounds = []
    for v in (ins[1:] + [None, None])[:2]:
        if v is None:
            bounds.append(None)
        elif isinstance(v, np.ndarray):
            if v.size != 1:
                raise ctx.refuse(f"min/max must be scalars, got shape {v.shape}")
            bounds.append(v.reshape(-1)[0].item())
        else:
            bounds.append(v)
    if bounds == [None, None]:
        return [x]
    return [ops.clip(x, bounds[0], bounds[1])]


@op("Dropout", inputs=(1, 3), attrs=("seed",), outputs=2)
def _dropout(ctx, ins):
    training = ins[2] if len(ins) > 2 else None
    if isinstance(training, Tensor):
        raise ctx.refuse("training_mode must be a constant (inference: false)")
    if training is not None and bool(np.asarray(training).reshape(-1)[0]):
        raise ctx.refuse("training_mode=true (only inference Dropout, the identity, is mapped)")
    x = ctx.t(ins[0])
    out = [x]
    if ctx.n_outputs > 1:      # the mask: all true in inference
        out.append(ops.greater_equal(ops.iota(x.shape, 0, dt.int32), 0) if x.ndim else ops.equal(x, x))
    return out


@op("Identity")
def _identity(ctx, ins):
    return [ins[0]]


# ---------------------------------------------------------------------------- matmul
@op("MatMul", inputs=(2, 2))
def _matmul(ctx, ins):
    return [ops.matmul(ctx.t(ins[0]), ctx.t(ins[1]))]


@op("Gemm", inputs=(2, 3), attrs=("alpha", "beta", "transA", "transB"))
def _gemm(ctx, ins):
    a, b = ctx.t(ins[0]), ctx.t(ins[1])
    if a.ndim != 2 or b.ndim != 2:
        raise ctx.refuse(f"A and B must be 2-D, got {a.shape} and {b.shape}")
    if ctx.a("transA", 0):
        a = ops.transpose(a)
    if ctx.a("transB", 0):
        b = ops.transpose(b)
    alpha, beta = float(ctx.a("alpha", 1.0)), float(ctx.a("beta", 1.0))
    y = a @ b
    if alpha != 1.0:
        y = y * alpha
    c = ins[2] if len(ins) > 2 else None
    if c is not None and beta != 0.0:
        tc = ctx.t(c)
        y = y + (tc if beta == 1.0 else tc * beta)
    return [y]


# ---------------------------------------------------------------------------- rows
def _axis_op(tfn):
    def h(ctx, ins):
        x = ctx.t(ins[0])
        return [tfn(x, axis=norm_axis(ctx, int(ctx.a("axis", -1)), x.ndim))]
    return h


op("Softmax", attrs=("axis",))(_axis_op(ops.softmax))
op("LogSoftmax", attrs=("axis",))(_axis_op(ops.log_softmax))


def _ln_check(attrs, opset):
    if attrs.get("stash_type", 1) != 1:
        return f"stash_type={attrs['stash_type']} (only 1, statistics in float32)"


@op("LayerNormalization", inputs=(2, 3), attrs=("axis", "epsilon", "stash_type"), check=_ln_check, outputs=3)
def _layer_norm(ctx, ins):
    x = ctx.t(ins[0])
    ax = norm_axis(ctx, int(ctx.a("axis", -1)), x.ndim)
    eps = float(ctx.a("epsilon", 1e-5))
    lead, tail = x.shape[:ax], x.shape[ax:]
    scale = ctx.t(ins[1])
    bias = ctx.t(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    n = int(np.prod(tail))
    flat = x if len(tail) == 1 else ops.reshape(x, lead + (n,))
    fused = scale.shape == tail and (bias is None or bias.shape == tail)
    if fused:
        y = ops.layer_norm(flat, ops.reshape(scale, (n,)) if len(tail) > 1 else scale,
                           None if bias is None else (ops.reshape(bias, (n,)) if len(tail) > 1 else bias), eps=eps)
        y = y if len(tail) == 1 else ops.reshape(y, x.shape)
    else:       # scale / bias broadcast to the normalised shape: applied after
        y = ops.layer_norm(flat, eps=eps)
        y = (y if len(tail) == 1 else ops.reshape(y, x.shape)) * scale
        if bias is not None:
            y = y + bias
    out = [y]
    if ctx.n_outputs > 1:
        axes = tuple(range(ax, x.ndim))
        mean = ops.reduce_mean(x, axis=axes, keepdims=True)
        var = ops.reduce_mean(ops.square(x - mean), axis=axes, keepdims=True)
        out += [mean, ops.rsqrt(var + eps)]
    return out


# ---------------------------------------------------------------------------- reductions
_REDUCE = {"ReduceSum": ops.reduce_sum, "ReduceMean": ops.reduce_mean, "ReduceMax": ops.reduce_max}


def axes_of(ctx, ins, x) -> tuple[list[int] | None, bool]:
    """A Reduce* node's (sorted axes, keepdims): axes from the attribute or the second input
    (opset 18), every axis when none are given; None for ``noop_with_empty_axes`` with none."""
    if len(ins) > 1 and ins[1] is not None:
        if "axes" in ctx.attrs:
            raise ctx.refuse("axes given both as an attribute and as an input")
        axes = ints(ctx.const(ins[1], "axes"))
    else:
        axes = [int(a) for a in ctx.a("axes", [])]
    keep = bool(ctx.a("keepdims", 1))
    if not axes:
        if ctx.a("noop_with_empty_axes", 0):
            return None, keep
        axes = list(range(x.ndim))
    return sorted({norm_axis(ctx, a, x.ndim, "axes") for a in axes}), keep


def _reduce_handler(name):
    fn = _REDUCE[name]

    def h(ctx, ins):
        x = ctx.t(ins[0])
        axes, keep = axes_of(ctx, ins, x)
        if axes is None:
            return [x]
        return [fn(x, axis=tuple(axes), keepdims=keep)]
    return h


for _n in _REDUCE:
    op(_n, inputs=(1, 2), attrs=("axes", "keepdims", "noop_with_empty_axes"), static=(1,))(_reduce_handler(_n))


def argmax_check(attrs, opset):
    if attrs.get("select_last_index", 0):
        return "select_last_index=1 (the first maximum only)"


@op("ArgMax", attrs=("axis", "keepdims", "select_last_index"), check=argmax_check)
def _argmax(ctx, ins):
    x = ctx.t(ins[0])
    ax = norm_axis(ctx, int(ctx.a("axis", 0)), x.ndim)
    return [cast(ops.argmax(x, axis=ax, keepdims=bool(ctx.a("keepdims", 1))), dt.int64)]


@op("TopK", inputs=(2, 2), attrs=("axis", "largest", "sorted"), static=(1,), outputs=2)
def _topk(ctx, ins):
    x = ctx.t(ins[0])
    k = ints(ctx.const(ins[1], "K"))
    if len(k) != 1:
        raise ctx.refuse(f"K must have one element, got {len(k)}")
    ax = norm_axis(ctx, int(ctx.a("axis", -1)), x.ndim)
    largest = bool(ctx.a("largest", 1))
    vals, idx = ops.top_k(x if largest else ops.neg(x), k[0], axis=ax)
    return [vals if largest else ops.neg(vals), cast(idx, dt.int64)]


def cumulative(scan, identity: float):
    """A CumSum / CumProd handler: ``scan`` along the axis input, ``reverse`` by reading the axis
    backwards, ``exclusive`` by shifting the running result one place (``identity`` first)."""
    def h(ctx, ins):
        x = ctx.t(ins[0])
        a = ints(ctx.const(ins[1], "axis"))
        if len(a) != 1:
            raise ctx.refuse("axis must be one integer")
        ax = norm_axis(ctx, a[0], x.ndim)
        rev = (slice(None),) * ax + (slice(None, None, -1),)
        src = x[rev] if ctx.a("reverse", 0) else x
        y = scan(src, axis=ax)
        if ctx.a("exclusive", 0):
            lead = broadcast_to(cast(constant(identity, dt.float32), x.dtype), x.shape[:ax] + (1,) + x.shape[ax + 1:])
            y = ops.concatenate([lead, y[(slice(None),) * ax + (slice(0, -1),)]], axis=ax) if x.shape[ax] > 1 \
                else lead
        return [y[rev] if ctx.a("reverse", 0) else y]
    return h


op("CumSum", inputs=(2, 2), attrs=("exclusive", "reverse"), static=(1,))(cumulative(ops.cumsum, 0.0))
