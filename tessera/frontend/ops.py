"""``tessera.ops``: the Graph IR op set, usable on traced tensors.

Each function checks shapes and dtypes at trace time (errors carry the caller's
line) and records one node.  Semantics follow numpy: broadcasting, matmul batch
rules (1-D operands included), ``axis``/``keepdims`` on reductions.
"""
from __future__ import annotations

import builtins
import difflib
import math
import numbers

import numpy as np

from tessera import dtypes as dt
from tessera.errors import DtypeError, RankMismatchError, ShapeMismatchError, UnknownNameError
from tessera.ir import opset
from tessera.frontend.trace import (
    Tensor,
    _err,
    add_node,
    as_tensor,
    broadcast_shapes,
    normalize_axis,
    promote_pair,
    require_float,
    require_int,
    require_number,
    same_dtype,
)

GELU_APPROXIMATIONS = ("tanh", "erf")


def _t(x, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise _err(DtypeError, f"{what} expects a traced tensor, got {type(x).__name__}")
    return x


def _binary(op: str, a, b) -> Tensor:
    if not isinstance(a, Tensor) and isinstance(b, Tensor):
        a = as_tensor(a, b, op)
    a = _t(a, op)
    b = as_tensor(b, a, op)
    if opset.takes_int(op):   # integer arithmetic wraps around, as numpy's
        if a.dtype == dt.bool_ and b.dtype == dt.bool_:   # one bool beside a number promotes to it
            require_number(a, op)
    elif op == "div" and dt.kind(a.dtype) != "f" and dt.kind(b.dtype) != "f" and not (a._node.weak and b._node.weak):
        require_number(a, op)   # int / int is float32, as JAX's true division
        require_number(b, op)
        a, b = (x if x._node.weak else cast(x, dt.DEFAULT_FLOAT) for x in (a, b))
    else:
        require_float(a, op)
        require_float(b, op)
    a, b = promote_pair(a, b, op)
    return add_node(op, [a._node, b._node], {}, broadcast_shapes(a.shape, b.shape, op), a.dtype)


def add(a, b) -> Tensor:
    return _binary("add", a, b)


def sub(a, b) -> Tensor:
    return _binary("sub", a, b)


def mul(a, b) -> Tensor:
    return _binary("mul", a, b)


def div(a, b) -> Tensor:
    return _binary("div", a, b)


def maximum(a, b) -> Tensor:
    return _binary("maximum", a, b)


def _unary(op: str, x, **attrs) -> Tensor:
    x = _t(x, op)
    if opset.takes_int(op):
        require_number(x, op)
    else:
        require_float(x, op)
    return add_node(op, [x._node], attrs, x.shape, x.dtype)


def neg(x) -> Tensor:
    return _unary("neg", x)


def exp(x) -> Tensor:
    return _unary("exp", x)


def tanh(x) -> Tensor:
    return _unary("tanh", x)


def erf(x) -> Tensor:
    return _unary("erf", x)


def relu(x) -> Tensor:
    return _unary("relu", x)


def silu(x) -> Tensor:
    return _unary("silu", x)


def sqrt(x) -> Tensor:
    return _unary("sqrt", x)


def log(x) -> Tensor:
    """natural logarithm (NaN below 0, -inf at 0)."""
    return _unary("log", x)


def log1p(x) -> Tensor:
    """log(1 + x), accurate near 0."""
    return _unary("log1p", x)


def exp2(x) -> Tensor:
    """2 ** x."""
    return _unary("exp2", x)


def expm1(x) -> Tensor:
    """exp(x) - 1, accurate near 0."""
    return _unary("expm1", x)


def sin(x) -> Tensor:
    """sine (radians)."""
    return _unary("sin", x)


def cos(x) -> Tensor:
    """cosine (radians)."""
    return _unary("cos", x)


def sigmoid(x) -> Tensor:
    """1 / (1 + exp(-x)), no overflow."""
    return _unary("sigmoid", x)


def abs(x) -> Tensor:
    """|x|."""
    return _unary("abs", x)


def sign(x) -> Tensor:
    """-1, 0 or 1 (signed zero and NaN kept)."""
    return _unary("sign", x)


def rsqrt(x) -> Tensor:
    """1 / sqrt(x)."""
    return _unary("rsqrt", x)


def reciprocal(x) -> Tensor:
    """1 / x."""
    return _unary("reciprocal", x)


def floor(x) -> Tensor:
    """largest integer <= x."""
    return _unary("floor", x)


def ceil(x) -> Tensor:
    """smallest integer >= x."""
    return _unary("ceil", x)


def round(x) -> Tensor:
    """nearest integer, ties to even (numpy's round/rint)."""
    return _unary("round", x)


def square(x) -> Tensor:
    """x * x."""
    return _unary("square", x)


def minimum(a, b) -> Tensor:
    """Elementwise minimum (a NaN in either operand gives NaN, as numpy's)."""
    return _binary("minimum", a, b)


def clip(x, lo=None, hi=None) -> Tensor:
    """numpy's ``clip``: ``minimum(maximum(x, lo), hi)``, either bound optional (a Python number
    or a tensor)."""
    x = _t(x, "clip")
    require_number(x, "clip")
    if lo is None and hi is None:
        raise _err(DtypeError, "clip: give lo, hi or both")
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x


def gelu(x, approximate: str = "tanh") -> Tensor:
    if approximate not in GELU_APPROXIMATIONS:
        raise _err(DtypeError, f"gelu approximate={approximate!r}; legal: {', '.join(GELU_APPROXIMATIONS)}")
    return _unary("gelu", x, approximate=approximate)


def softmax(x, axis: int = -1) -> Tensor:
    x = _t(x, "softmax")
    require_float(x, "softmax")
    if x.ndim == 0:
        raise _err(RankMismatchError, "softmax needs rank >= 1")
    axis = normalize_axis(axis, x.ndim, "softmax")
    return add_node("softmax", [x._node], {"axis": axis}, x.shape, x.dtype)


def _norm(op: str, x, vecs: list, eps: float) -> Tensor:
    x = _t(x, op)
    require_float(x, op)
    if x.ndim == 0:
        raise _err(RankMismatchError, f"{op} needs rank >= 1")
    inputs = [x._node]
    present = []
    for name, v in vecs:
        if v is None:
            present.append(False)
            continue
        v = _t(v, op)
        same_dtype(x, v, f"{op} {name}")
        if v.shape != (x.shape[-1],):
            raise _err(ShapeMismatchError, f"{op}: {name} must have shape ({x.shape[-1]},), got {v.shape}")
        inputs.append(v._node)
        present.append(True)
    return add_node(op, inputs, {"eps": float(eps), "present": tuple(present)}, x.shape, x.dtype)


def layer_norm(x, scale=None, bias=None, eps: float = 1e-5) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis."""
    return _norm("layer_norm", x, [("scale", scale), ("bias", bias)], eps)


def rms_norm(x, scale=None, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(mean(x**2) + eps) * scale`` over the last axis."""
    return _norm("rms_norm", x, [("scale", scale)], eps)


def _reduce(op: str, x, axis, keepdims: bool) -> Tensor:
    x = _t(x, op)
    require_float(x, op)
    if axis is None:
        axes = tuple(range(x.ndim))
    elif not isinstance(axis, (tuple, list)):
        axes = (normalize_axis(axis, x.ndim, op),)
    else:
        axes = tuple(normalize_axis(a, x.ndim, op) for a in axis)
        if len(set(axes)) != len(axes):
            raise _err(RankMismatchError, f"{op}: repeated axis in {axis}")
    if not axes:
        return x
    if op == "reduce_max" and builtins.any(x.shape[a] == 0 for a in axes):
        raise _err(ShapeMismatchError, f"{op}: zero-size reduction has no identity (numpy raises too)")
    shape = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keepdims or i not in axes)
    return add_node(op, [x._node], {"axes": tuple(sorted(axes)), "keepdims": bool(keepdims)}, shape, x.dtype)


def reduce_sum(x, axis=None, keepdims: bool = False) -> Tensor:
    return _reduce("reduce_sum", x, axis, keepdims)


def reduce_max(x, axis=None, keepdims: bool = False) -> Tensor:
    return _reduce("reduce_max", x, axis, keepdims)


def reduce_mean(x, axis=None, keepdims: bool = False) -> Tensor:
    return _reduce("reduce_mean", x, axis, keepdims)


def transpose(x, axes=None) -> Tensor:
    x = _t(x, "transpose")
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(normalize_axis(a, x.ndim, "transpose")
                                                                     for a in axes)
    if sorted(perm) != list(range(x.ndim)):
        raise _err(RankMismatchError, f"transpose: {axes} is not a permutation of {x.ndim} axes")
    if perm == tuple(range(x.ndim)):
        return x
    return add_node("transpose", [x._node], {"perm": perm}, tuple(x.shape[p] for p in perm), x.dtype)


def reshape(x, shape) -> Tensor:
    x = _t(x, "reshape")
    if isinstance(shape, numbers.Number) or not isinstance(shape, (tuple, list)):
        shape = (shape,)
    shape = tuple(require_int(s, f"reshape: size {i} of {shape}") for i, s in enumerate(shape))
    if shape.count(-1) > 1:
        raise _err(ShapeMismatchError, "reshape: at most one -1")
    total = x.size
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or total % known:
            raise _err(ShapeMismatchError, f"reshape: cannot reshape {x.shape} into {shape}")
        shape = tuple(total // known if s == -1 else s for s in shape)
    if builtins.any(s < 0 for s in shape) or math.prod(shape) != total:
        raise _err(ShapeMismatchError, f"reshape: cannot reshape {x.shape} ({total} elements) into {shape}")
    if shape == x.shape:
        return x
    if x._node.op == "constant":   # a scalar constant given a shape of one element: a broadcast, built
        return where(greater_equal(iota(shape, 0), 0), x, x)   # in the kernel reading it (no input to view)
    return add_node("reshape", [x._node], {}, shape, x.dtype)


def cast(x, dtype) -> Tensor:
    """``x.astype(dtype)`` between f64/f32/f16/bf16/int8/int32/int64/bool.  float -> int truncates
    toward zero and saturates: NaN gives 0, values beyond the int's range its min / max (numpy
    leaves both undefined); int -> int wraps around (keeps the low bits); -> bool is ``x != 0``."""
    x = _t(x, "cast")
    d = dt.as_dtype(dtype)
    if (d in dt.FP8 or x.dtype in dt.FP8) and d != x.dtype:
        from tessera.errors import Fp8OperandError
        raise _err(Fp8OperandError, f"cast: {dt.name(x.dtype)} -> {dt.name(d)}: fp8 arrays are matmul operands "
                                    "only (convert on the host with ml_dtypes)")
    if d == x.dtype and not x._node.weak:
        return x
    return add_node("cast", [x._node], {}, x.shape, d, weak=False)   # a cast gives its dtype: not weak


def matmul(a, b, out_dtype=None) -> Tensor:
    """``a @ b`` with numpy rules; bf16/f16 inputs accumulate in f32 and give their own
    dtype unless ``out_dtype=np.float32``."""
    a, b = _t(a, "matmul"), _t(b, "matmul")
    if a.dtype in dt.FP8 or b.dtype in dt.FP8:
        from tessera.frontend.scaled import fp8_matmul
        return fp8_matmul(a, b, out_dtype, "matmul")
    require_float(a, "matmul")
    require_float(b, "matmul")
    a, b = promote_pair(a, b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise _err(RankMismatchError, "matmul: operands must have rank >= 1")   # (before out_dtype's check)
    out = dt.as_dtype(out_dtype) if out_dtype is not None else a.dtype
    if out != a.dtype and not (out == dt.float32 and a.dtype in (dt.bfloat16, dt.float16)):
        raise _err(DtypeError, f"matmul: out_dtype {dt.name(out)} is not allowed for {dt.name(a.dtype)} inputs "
                               "(same dtype, or float32 for bf16/f16)")
    return matmul_node(a, b, out, "matmul")


def matmul_node(a: Tensor, b: Tensor, out, what: str) -> Tensor:
    """The Graph IR matmul of checked operands with numpy's rank rules: a rank-1 operand gains
    the axis it lacks and the result loses it again; batch dimensions broadcast."""
    if a.ndim == 0 or b.ndim == 0:
        raise _err(RankMismatchError, f"{what}: operands must have rank >= 1")
    squeeze = []
    if a.ndim == 1:
        a = reshape(a, (1, a.shape[0]))
        squeeze.append(-2)
    if b.ndim == 1:
        b = reshape(b, (b.shape[0], 1))
        squeeze.append(-1)
    if a.shape[-1] != b.shape[-2]:
        raise _err(ShapeMismatchError, f"{what}: inner dimensions differ: {a.shape} @ {b.shape}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], f"{what} batch dimensions")
    shape = (*batch, a.shape[-2], b.shape[-1])
    y = add_node("matmul", [a._node, b._node], {}, shape, out)
    if squeeze:
        final = list(shape)
        for ax in sorted(squeeze):
            final[ax] = None
        y = reshape(y, tuple(s for s in final if s is not None))
    return y


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, mask=None) -> Tensor:
    """Scaled dot-product attention on [batch, heads, seq, dim] tensors.

    ``softmax(q @ k^T * scale + mask) @ v`` with f32 accumulation; ``scale`` defaults to
    1/sqrt(dim).  Grouped-query: k/v may have fewer heads (query head h reads kv head
    h // (heads_q // heads_kv)).  ``mask``: bool (True = attend) or additive float,
    broadcastable to [batch, heads, seq_q, seq_k].  ``causal``: key j is masked for query i
    when j > i (top-left alignment, like torch's ``scaled_dot_product_attention(is_causal=True)``
    when seq_q != seq_k).  A query row whose every key is masked returns zeros."""
    from tessera.errors import AttentionHeadDimError, AttentionHeadsError, AttentionMaskError, AttentionSeqError
    q, k, v = _t(q, "attention"), _t(k, "attention"), _t(v, "attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise _err(RankMismatchError, f"attention: {name} must be [batch, heads, seq, dim], got shape {t.shape}")
    require_float(q, "attention")
    same_dtype(q, k, "attention")
    same_dtype(q, v, "attention")
    (b, h, sq, d), (bk, hk, sk, dk), (bv, hv, sv, dv) = q.shape, k.shape, v.shape
    if d != dk:
        raise _err(AttentionHeadDimError, f"attention: q head dim {d} differs from k head dim {dk}")
    if (bk, hk, sk) != (bv, hv, sv):
        raise _err(AttentionSeqError, f"attention: k {k.shape} and v {v.shape} differ in batch, heads or sequence")
    if b != bk:
        raise _err(AttentionSeqError, f"attention: batch of q ({b}) and k ({bk}) differ")
    if hk == 0 or h % hk:
        raise _err(AttentionHeadsError, f"attention: {h} query heads are not a multiple of {hk} key/value heads")
    inputs = [q._node, k._node, v._node]
    if mask is not None:
        mask = _t(mask, "attention mask")
        if mask.dtype != dt.bool_ and mask.dtype != q.dtype:
            raise _err(AttentionMaskError, f"attention: mask dtype {mask.dtype}; use bool or {q.dtype}")
        try:
            out = broadcast_shapes(mask.shape, (b, h, sq, sk), "attention mask")
        except ShapeMismatchError:
            raise _err(AttentionMaskError, f"attention: mask {mask.shape} does not broadcast to {(b, h, sq, sk)}") \
                from None
        if out != (b, h, sq, sk) or mask.ndim > 4:
            raise _err(AttentionMaskError, f"attention: mask {mask.shape} does not broadcast to {(b, h, sq, sk)}")
        inputs.append(mask._node)
    s = float(scale) if scale is not None else None  # None: 1/sqrt(head dim), from the size at run time
    return add_node("attention", inputs, {"causal": bool(causal), "scale": s, "masked_rows": "zero",
                                          "mask": mask is not None}, (b, h, sq, dv), q.dtype)


# names users reach for that tessera.ops spells differently, or that are spelled as operators
_SPELLED = {"absolute": "abs(x)", "power": "pow(x, y) or x ** y", "sum": "reduce_sum or x.sum()",
            "mean": "reduce_mean or x.mean()", "max": "maximum (elementwise) or reduce_max / x.max()",
            "amax": "reduce_max", "negative": "neg or -x", "multiply": "mul or *", "subtract": "sub or -",
            "divide": "div or /", "true_divide": "div or /", "astype": "cast or x.astype()", "T": "transpose or x.T",
            "permute": "transpose", "view": "reshape", "concat": "concatenate", "cat": "concatenate",
            "unsqueeze": "expand_dims", "transpose_axes": "swapaxes"}


def __getattr__(name: str):
    """``tessera.ops.<name>`` that does not exist: the error names the nearest ops."""
    if name.startswith("__"):
        raise AttributeError(name)
    known = [n for n in __all__ if n != "np"]
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    msg = f"tessera.ops has no {name!r}"
    if name in _SPELLED:
        msg += f"; write {_SPELLED[name]}"
    elif near:
        msg += f"; nearest: {', '.join(near)}"
    raise _err(UnknownNameError, f"{msg} (ops: {', '.join(sorted(known))})")


__all__ = ["attention", "add", "sub", "mul", "div", "maximum", "minimum", "clip", "log", "log1p", "exp2", "expm1", "sin", "cos", "sigmoid", "abs", "sign", "rsqrt", "reciprocal", "floor", "ceil", "round", "square", "neg", "exp", "tanh", "erf", "relu", "silu", "sqrt", "gelu", "softmax",
           "layer_norm", "rms_norm", "reduce_sum", "reduce_max", "reduce_mean", "transpose", "reshape", "cast",
           "matmul", "np"]

# view and statistics ops made of the ops above (frontend/layout.py imports this module)
from tessera.frontend.layout import (  # noqa: E402
    chunk,
    concatenate,
    expand_dims,
    moveaxis,
    split,
    squeeze,
    stack,
    std,
    swapaxes,
    var,
)

__all__ += ["expand_dims", "squeeze", "swapaxes", "moveaxis", "var", "std", "concatenate", "stack", "split", "chunk"]

# reductions, scans and log-row ops (frontend/rowops.py imports this module)
from tessera.frontend.rowops import (  # noqa: E402
    all, any, argmax, argmin, cross_entropy, cumprod, cumsum, log_softmax, logsumexp, prod, top_k)

__all__ += ["logsumexp", "log_softmax", "cumsum", "cumprod", "prod", "argmax", "argmin", "top_k", "any", "all",
            "cross_entropy"]

# gathers (frontend/gather.py imports this module)
from tessera.frontend.gather import one_hot, take, take_along_axis  # noqa: E402

__all__ += ["take", "take_along_axis", "one_hot"]
# scatter_add, take's adjoint (frontend/scatter.py)
from tessera.frontend.scatter import index_add, scatter_add  # noqa: E402

__all__ += ["scatter_add", "index_add"]
# attention's backward kernel (frontend/attention_grad.py)
from tessera.frontend.attention_grad import attention_backward  # noqa: E402

__all__ += ["attention_backward"]

# comparisons, where, logic, integer ops, pow and index generators (frontend/ops_typed.py)
from tessera.frontend.ops_typed import (  # noqa: E402
    __all__ as _TYPED_ALL,
    arange,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    equal,
    floor_divide,
    greater,
    greater_equal,
    iota,
    isfinite,
    isinf,
    isnan,
    left_shift,
    less,
    less_equal,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    mod,
    not_equal,
    pow,
    remainder,
    right_shift,
    tril,
    triu,
    where,
)

__all__ += list(_TYPED_ALL)

# neural-network ops (frontend/nn.py imports this module)
from tessera.frontend.nn import avg_pool2d, conv2d, max_pool2d, pad  # noqa: E402

__all__ += ["pad", "conv2d", "max_pool2d", "avg_pool2d"]

from tessera.frontend.scaled import scaled_matmul  # noqa: E402

__all__ += ["scaled_matmul"]

# the Tensor operators and methods (frontend/trace.py) call these
from tessera.frontend import layout as _layout  # noqa: E402
from tessera.frontend.trace import publish as _publish  # noqa: E402

_publish({**{n: globals()[n] for n in __all__ if n != "np"}, "index": _layout.index})
