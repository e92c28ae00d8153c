"""ONNX shape and layout ops replayed through ``tessera.ops``: Transpose, Reshape, Flatten,
Squeeze/Unsqueeze, Concat, Split, Slice, Gather, Cast, Constant, ConstantOfShape, Shape,
Expand.  Over numpy arrays (shapes, axes) they fold with numpy."""
from __future__ import annotations

import math

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import ONNX_DTYPES, ONNX_TYPE_NAMES, cast, ints, norm_axis, op, small


def _shape(v) -> tuple[int, ...]:
    return tuple(int(s) for s in v.shape)


def _reshape(v, shape):
    return v.reshape(shape) if isinstance(v, np.ndarray) else ops.reshape(v, shape)


@op("Transpose", attrs=("perm",))
def _transpose(ctx, ins):
    x = ins[0]
    perm = ctx.a("perm")
    perm = list(reversed(range(x.ndim))) if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(x.ndim)):
        raise ctx.refuse(f"perm {perm} is not a permutation of rank {x.ndim}")
    if small(ins):
        return [np.transpose(x, perm)]
    return [ops.transpose(ctx.t(x), tuple(perm))]


@op("Reshape", inputs=(2, 2), attrs=("allowzero",), static=(1,))
def _reshape_op(ctx, ins):
    x, spec = ins[0], ints(ctx.const(ins[1], "shape"))
    src = _shape(x)
    allowzero = bool(ctx.a("allowzero", 0))
    if allowzero and 0 in spec and -1 in spec:
        raise ctx.refuse("allowzero=1 with both 0 and -1 in the shape (invalid in ONNX)")
    out = []
    for i, s in enumerate(spec):
        if s == 0 and not allowzero:
            if i >= len(src):
                raise ctx.refuse(f"shape {spec}: 0 at position {i} copies a dimension the input (rank {len(src)}) "
                                 "lacks")
            s = src[i]
        out.append(s)
    if out.count(-1) > 1:
        raise ctx.refuse(f"shape {spec}: more than one -1")
    if -1 in out:
        known = math.prod(s for s in out if s != -1)
        if known == 0 or math.prod(src) % known:
            raise ctx.refuse(f"cannot reshape {src} into {spec}")
        out = [math.prod(src) // known if s == -1 else s for s in out]
    if math.prod(out) != math.prod(src) or any(s < 0 for s in out):
        raise ctx.refuse(f"cannot reshape {src} into {spec}")
    return [_reshape(x, tuple(out))]


@op("Flatten", attrs=("axis",))
def _flatten(ctx, ins):
    x = ins[0]
    s = _shape(x)
    ax = int(ctx.a("axis", 1))
    ax = ax + len(s) if ax < 0 else ax
    if not 0 <= ax <= len(s):
        raise ctx.refuse(f"axis {ctx.a('axis')} is out of range for rank {len(s)}")
    return [_reshape(x, (math.prod(s[:ax]), math.prod(s[ax:])))]


@op("Squeeze", inputs=(1, 2), static=(1,))
def _squeeze(ctx, ins):
    x = ins[0]
    s = _shape(x)
    if len(ins) > 1 and ins[1] is not None:
        axes = {norm_axis(ctx, a, len(s), "axes") for a in ints(ctx.const(ins[1], "axes"))}
        bad = [a for a in axes if s[a] != 1]
        if bad:
            raise ctx.refuse(f"cannot squeeze axes {bad} of shape {s} (size is not 1)")
    else:
        axes = {i for i, n in enumerate(s) if n == 1}
    return [_reshape(x, tuple(n for i, n in enumerate(s) if i not in axes))]


@op("Unsqueeze", inputs=(2, 2), static=(1,))
def _unsqueeze(ctx, ins):
    x = ins[0]
    s = _shape(x)
    rank = len(s) + len(ints(ins[1]))
    axes = sorted({norm_axis(ctx, a, rank, "axes") for a in ints(ctx.const(ins[1], "axes"))})
    if len(axes) != len(ints(ins[1])):
        raise ctx.refuse(f"repeated axes {ints(ins[1])}")
    it = iter(s)
    return [_reshape(x, tuple(1 if i in axes else next(it) for i in range(rank)))]


@op("Concat", inputs=(1, 1 << 16), attrs=("axis",))
def _concat(ctx, ins):
    xs = [v for v in ins if v is not None]
    ax = norm_axis(ctx, int(ctx.a("axis", 0)), xs[0].ndim)
    if small(xs):
        return [np.concatenate(xs, axis=ax)]
    xs = [ctx.t(v) for v in xs if _shape(v)[ax] != 0]
    return [xs[0] if len(xs) == 1 else ops.concatenate(xs, axis=ax)]


@op("Split", inputs=(1, 2), attrs=("axis", "num_outputs"), static=(1,), outputs=1 << 16)
def _split(ctx, ins):
    x = ins[0]
    ax = norm_axis(ctx, int(ctx.a("axis", 0)), x.ndim)
    n = _shape(x)[ax]
    if len(ins) > 1 and ins[1] is not None:
        sizes = ints(ctx.const(ins[1], "split"))
        if sum(sizes) != n:
            raise ctx.refuse(f"split sizes {sizes} do not add up to axis {ax} of size {n}")
    else:
        k = int(ctx.a("num_outputs", ctx.n_outputs))
        part = -(-n // k)
        sizes = [min(part, n - i * part) for i in range(k)]
        if any(s < 0 for s in sizes):
            raise ctx.refuse(f"cannot split axis {ax} of size {n} into {k} outputs")
    out, at = [], 0
    for s in sizes:
        item = (slice(None),) * ax + (slice(at, at + s),)
        out.append(x[item])
        at += s
    return out


@op("Slice", inputs=(3, 5), static=(1, 2, 3, 4))
def _slice(ctx, ins):
    x = ins[0]
    starts, ends = ints(ctx.const(ins[1], "starts")), ints(ctx.const(ins[2], "ends"))
    axes = ints(ctx.const(ins[3], "axes")) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = ints(ctx.const(ins[4], "steps")) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.refuse("starts, ends, axes and steps differ in length")
    item = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ctx.refuse("a step of 0")
        a = norm_axis(ctx, a, x.ndim, "axes")
        item[a] = slice(s, e, st)          # Python's slice clamps exactly as ONNX's Slice does
    return [x[tuple(item)]]


@op("Gather", inputs=(2, 2), attrs=("axis",))
def _gather(ctx, ins):
    x, idx = ins
    ax = norm_axis(ctx, int(ctx.a("axis", 0)), x.ndim)
    n = _shape(x)[ax]
    if isinstance(idx, np.ndarray):
        idx = idx.astype(np.int64)
        if ((idx < -n) | (idx >= n)).any():
            raise ctx.refuse(f"an index out of range for axis {ax} of size {n}")
        idx = np.where(idx < 0, idx + n, idx)
        if isinstance(x, np.ndarray):
            return [np.take(x, idx, axis=ax)]
        if idx.ndim == 0:
            return [x[(slice(None),) * ax + (int(idx),)]]
        tidx = ctx.t(idx.astype(np.int32) if n < 2 ** 31 else idx)
    else:
        if dt.kind(idx.dtype) != "i":
            raise ctx.refuse(f"indices must be integers, got {dt.name(idx.dtype)}")
        tidx = ops.where(ops.less(idx, 0), idx + n, idx)       # ONNX: a negative index counts from the end
    return [ops.take(ctx.t(x), tidx, axis=ax)]


def _to(ctx, code: int):
    if code not in ONNX_DTYPES:
        raise ctx.refuse(f"element type {ONNX_TYPE_NAMES.get(code, code)} is not supported "
                         f"(supported: {', '.join(ONNX_TYPE_NAMES[c] for c in ONNX_DTYPES)})")
    return ONNX_DTYPES[code]


def _cast_check(attrs, opset):
    if attrs.get("to") not in ONNX_DTYPES:
        return f"to={ONNX_TYPE_NAMES.get(attrs.get('to'), attrs.get('to'))} is not a supported element type"


@op("Cast", attrs=("to", "saturate"), check=_cast_check)
def _cast(ctx, ins):
    return [cast(ins[0], _to(ctx, ctx.a("to")))]


def _constant_check(attrs, opset):
    given = [k for k in attrs if k in ("value", "value_float", "value_floats", "value_int", "value_ints")]
    if len(given) != 1:
        return "exactly one of value, value_float(s), value_int(s) (sparse and string values are not mapped)"


@op("Constant", inputs=(0, 0), attrs=("value", "value_float", "value_floats", "value_int", "value_ints"),
    check=_constant_check)
def _constant(ctx, ins):
    for k, d in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                 ("value_int", np.int64), ("value_ints", np.int64)):
        if k in ctx.attrs:
            v = np.asarray(ctx.attrs[k], dtype=d)
            _to(ctx, {np.dtype(t): c for c, t in ONNX_DTYPES.items()}.get(v.dtype, 0))
            return [v]


@op("ConstantOfShape", static=(0,), attrs=("value",))
def _constant_of_shape(ctx, ins):
    shape = ints(ctx.const(ins[0], "shape"))
    v = np.asarray(ctx.a("value", np.zeros(1, np.float32)))
    if v.size != 1:
        raise ctx.refuse("value must have one element")
    return [np.full(shape, v.reshape(-1)[0], dtype=v.dtype)]


@op("Shape", attrs=("start", "end"))
def _shape_op(ctx, ins):
    s = _shape(ins[0])
    start, end = ctx.a("start", 0), ctx.a("end", None)
    return [np.asarray(s[slice(start, end)], dtype=np.int64)]


@op("Expand", inputs=(2, 2), static=(1,))
def _expand(ctx, ins):
    x, shape = ins[0], ints(ctx.const(ins[1], "shape"))
    try:
        out = np.broadcast_shapes(_shape(x), tuple(shape))
    except ValueError:
        raise ctx.refuse(f"shape {shape} does not broadcast with {_shape(x)}") from None
    if isinstance(x, np.ndarray):
        return [np.broadcast_to(x, out).copy()]
    if out == _shape(x):
        return [x]
    everywhere = ops.greater_equal(ops.iota(out, 0, dt.int32), 0)
    return [ops.where(everywhere, x, x)]

