"""The ATen -> Tessera op table of the ``torch.compile`` backend (``torch_backend.py``).

Each entry maps one ATen overload (``str(node.target)``, e.g. ``"aten.addmm.default"``) to a
function that replays the node on traced Tessera tensors: ``fn(node, *args, **kwargs)`` where
the arguments are the node's own, with every FX input replaced by its traced value.  An entry may
carry a ``check(node)`` that returns why this particular use cannot map (a reason string), or
None.  What is not in the table stays an ATen node and is listed in the explain table with the
reason "no mapping".  Importing this module does not import torch.
"""
from __future__ import annotations

import math

from tessera.frontend import ops
from tessera.frontend.vjp_rules import broadcast_to

TABLE: dict[str, object] = {}
CHECKS: dict[str, object] = {}
# argument positions that may be integer tensors (indices); every other tensor must be float
INDEX_ARGS: dict[str, set[int]] = {"aten.max_pool2d_with_indices_backward.default": {7}}
# ops whose results may be integer tensors (argmax, topk's indices); views pass integers through
INDEX_RESULTS: set[str] = set()

# ops that compute nothing (views and identities): a run of covered nodes made of these alone
# is left to ATen (no kernel to build)
VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.t.default",
         "aten.permute.default", "aten.transpose.int", "aten.expand.default", "aten.clone.default",
         "aten.detach.default", "aten.alias.default", "aten.unsqueeze.default", "aten.squeeze.dim",
         "aten.squeeze.dims", "aten.squeeze.default", "aten.slice.Tensor", "aten.select.int",
         "aten.split.Tensor", "aten.split_with_sizes.default", "aten.lift_fresh_copy.default",
         "_operator.getitem"}


def aten(*names, check=None):
    def reg(fn):
        for n in names:
            TABLE[n] = fn
            if check is not None:
                CHECKS[n] = check
        return fn
    return reg


def _unused_outputs(*idx):
    """A check: the node's outputs at positions ``idx`` must have no user."""
    def check(node):
        for u in node.users:
            if u.args[1] in idx:
                return f"its output {u.args[1]} is used (saved for backward?): Tessera's kernel does not produce it"
        return None
    return check


def _all_axes(dims, ndim):
    return tuple(range(ndim)) if dims is None or len(dims) == 0 else tuple(int(d) % ndim for d in dims)


# ------------------------------------------------------------------------------- elementwise
@aten("aten.add.Tensor", "aten.add.Scalar")
def _add(node, a, b, alpha=1):
    return a + (b if alpha == 1 else b * alpha)


@aten("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(node, a, b, alpha=1):
    return a - (b if alpha == 1 else b * alpha)


@aten("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(node, a, b, alpha=1):
    return b - (a if alpha == 1 else a * alpha)


@aten("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(node, a, b):
    return a * b


@aten("aten.div.Tensor", "aten.div.Scalar")
def _div(node, a, b):
    return a / b


aten("aten.maximum.default")(lambda node, a, b: ops.maximum(a, b))
aten("aten.minimum.default")(lambda node, a, b: ops.minimum(a, b))
aten("aten.where.self")(lambda node, c, a, b: ops.where(c, a, b))
aten("aten.pow.Tensor_Scalar")(lambda node, x, e: ops.pow(x, e))

for _name, _fn in (("relu", ops.relu), ("silu", ops.silu), ("tanh", ops.tanh), ("sigmoid", ops.sigmoid),
                   ("exp", ops.exp), ("log", ops.log), ("neg", ops.neg), ("sqrt", ops.sqrt), ("rsqrt", ops.rsqrt),
                   ("abs", ops.abs), ("erf", ops.erf), ("reciprocal", ops.reciprocal), ("log1p", ops.log1p),
                   ("expm1", ops.expm1), ("sin", ops.sin), ("cos", ops.cos)):
    aten(f"aten.{_name}.default")(lambda node, x, _f=_fn: _f(x))


def _gelu_check(node, pos=1):
    approx = node.kwargs.get("approximate", node.args[pos] if len(node.args) > pos else "none")
    return None if approx in ("none", "tanh") else f"approximate={approx!r}"


@aten("aten.gelu.default", check=_gelu_check)
def _gelu(node, x, approximate="none"):
    return ops.gelu(x, "erf" if approximate == "none" else "tanh")


def _softmax_check(node):
    return "half_to_float=True" if node.args[2] else None


aten("aten._softmax.default", check=_softmax_check)(lambda node, x, dim, half: ops.softmax(x, dim))
aten("aten._log_softmax.default", check=_softmax_check)(lambda node, x, dim, half: ops.log_softmax(x, dim))


@aten("aten._to_copy.default", check=lambda node: None if set(node.kwargs) <= {"dtype"} else
      f"arguments {sorted(set(node.kwargs) - {'dtype'})} (only a dtype change maps)")
def _to_copy(node, x, dtype=None):
    return x if dtype is None else ops.cast(x, _np_dtype(dtype))


def _np_dtype(tdtype):
    from tessera.frontend.torch_op import _torch_dtypes
    return _torch_dtypes()[tdtype]


# ------------------------------------------------------------------------------- backward elementwise
@aten("aten.threshold_backward.default")
def _threshold_backward(node, g, x, threshold):
    return ops.where(ops.greater(x, threshold), g, 0.0)


@aten("aten.gelu_backward.default", check=lambda node: _gelu_check(node, 2))
def _gelu_backward(node, g, x, approximate="none"):
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = ops.tanh(k * (x + 0.044715 * x * x * x))
        return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x))
    cdf = 0.5 * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = ops.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return g * (cdf + x * pdf)


aten("aten.tanh_backward.default")(lambda node, g, y: g * (1.0 - y * y))
aten("aten.sigmoid_backward.default")(lambda node, g, y: g * y * (1.0 - y))


@aten("aten.silu_backward.default")
def _silu_backward(node, g, x):
    s = ops.sigmoid(x)
    return g * s * (1.0 + x * (1.0 - s))


@aten("aten._softmax_backward_data.default")
def _softmax_backward(node, g, out, dim, input_dtype):
    return out * (g - ops.reduce_sum(g * out, dim, keepdims=True))


@aten("aten._log_softmax_backward_data.default")
def _log_softmax_backward(node, g, out, dim, input_dtype):
    return g - ops.exp(out) * ops.reduce_sum(g, dim, keepdims=True)


# ------------------------------------------------------------------------------- matmul family
aten("aten.mm.default", "aten.bmm.default", "aten.matmul.default")(lambda node, a, b: ops.matmul(a, b))


@aten("aten.addmm.default", "aten.baddbmm.default")
def _addmm(node, bias, a, b, beta=1, alpha=1):
    prod = ops.matmul(a, b)
    prod = prod if alpha == 1 else prod * alpha
    return prod + (bias if beta == 1 else bias * beta)


# ------------------------------------------------------------------------------- normalisation
@aten("aten.native_layer_norm.default")
def _native_layer_norm(node, x, shape, w, b, eps):
    k = len(shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    mean = ops.reduce_mean(x, axes, keepdims=True)
    var = ops.reduce_mean(ops.square(x - mean), axes, keepdims=True)
    rstd = ops.rsqrt(var + eps)
    if k == 1:
        out = ops.layer_norm(x, w, b, eps)   # the fused kernel
    else:
        out = (x - mean) * rstd
        out = out if w is None else out * w
        out = out if b is None else out + b
    return out, mean, rstd


@aten("aten.native_layer_norm_backward.default")
def _native_layer_norm_backward(node, g, x, shape, mean, rstd, w, b, mask):
    k = len(shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    xhat = (x - mean) * rstd
    gw = g if w is None else g * w
    dx = dw = db = None
    if mask[0]:
        dx = rstd * (gw - ops.reduce_mean(gw, axes, keepdims=True)
                     - xhat * ops.reduce_mean(gw * xhat, axes, keepdims=True))
    if mask[1] and w is not None:
        dw = ops.reduce_sum(g * xhat, lead) if lead else g * xhat
    if mask[2] and b is not None:
        db = ops.reduce_sum(g, lead) if lead else g
    return dx, dw, db


def _per_channel(v, x):
    """A [C] vector shaped to broadcast over x's channel axis (axis 1)."""
    return ops.reshape(v, (1, v.shape[0]) + (1,) * (x.ndim - 2))


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


@aten("aten._native_batch_norm_legit_functional.default",
      check=lambda node: None if node.args[5] else "training=False")
def _batch_norm_train(node, x, w, b, running_mean, running_var, training, momentum, eps):
    """Batch statistics over every axis but the channels; the running statistics' new values
    (torch's: the variance unbiased) are results too (AOTAutograd writes them back)."""
    axes = _bn_axes(x)
    mean = ops.reduce_mean(x, axes)
    centred = x - _per_channel(mean, x)
    var = ops.reduce_mean(ops.square(centred), axes)
    invstd = ops.rsqrt(var + eps)
    out = centred * _per_channel(invstd, x)
    out = out if w is None else out * _per_channel(w, x)
    out = out if b is None else out + _per_channel(b, x)
    n = math.prod(x.shape) // x.shape[1]
    new_mean = running_mean * (1.0 - momentum) + mean * momentum
    new_var = running_var * (1.0 - momentum) + var * (momentum * n / max(n - 1, 1))
    return out, mean, invstd, new_mean, new_var


@aten("aten._native_batch_norm_legit_no_training.default", check=_unused_outputs(1, 2))
def _batch_norm_eval(node, x, w, b, running_mean, running_var, momentum, eps):
    out = (x - _per_channel(running_mean, x)) * _per_channel(ops.rsqrt(running_var + eps), x)
    out = out if w is None else out * _per_channel(w, x)
    return (out if b is None else out + _per_channel(b, x)), None, None


@aten("aten.native_batch_norm_backward.default", check=lambda node: None if node.args[7] else "train=False")
def _batch_norm_backward(node, g, x, w, running_mean, running_var, save_mean, save_invstd, train, eps, mask):
    axes = _bn_axes(x)
    invstd = _per_channel(save_invstd, x)
    xhat = (x - _per_channel(save_mean, x)) * invstd
    gw = g if w is None else g * _per_channel(w, x)
    dx = dw = db = None
    if mask[0]:
        dx = invstd * (gw - ops.reduce_mean(gw, axes, keepdims=True)
                       - xhat * ops.reduce_mean(gw * xhat, axes, keepdims=True))
    if mask[1] and w is not None:
        dw = ops.reduce_sum(g * xhat, axes)
    if mask[2]:
        db = ops.reduce_sum(g, axes)
    return dx, dw, db


# ------------------------------------------------------------------------------- views
aten("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")(
    lambda node, x, shape: ops.reshape(x, tuple(shape)))
aten("aten.t.default")(lambda node, x: x if x.ndim < 2 else ops.transpose(x))
aten("aten.permute.default")(lambda node, x, dims: ops.transpose(x, tuple(dims)))
aten("aten.transpose.int")(lambda node, x, a, b: ops.swapaxes(x, a, b))
aten("aten.clone.default", "aten.detach.default", "aten.alias.default", "aten.lift_fresh_copy.default")(
    lambda node, x, **kw: x)
aten("aten.unsqueeze.default")(lambda node, x, dim: ops.expand_dims(x, dim))
aten("aten.squeeze.dim", "aten.squeeze.dims")(lambda node, x, dims: ops.reshape(x, tuple(node.meta["val"].shape)))
aten("aten.squeeze.default")(lambda node, x: ops.reshape(x, tuple(node.meta["val"].shape)))


@aten("aten.expand.default")
def _expand(node, x, sizes, implicit=False):
    target = tuple(int(s) for s in node.meta["val"].shape)
    if x.ndim < len(target):
        x = ops.reshape(x, (1,) * (len(target) - x.ndim) + tuple(x.shape))
    return broadcast_to(x, target)


@aten("aten.slice.Tensor")
def _slice(node, x, dim=0, start=None, end=None, step=1):
    dim %= x.ndim
    return x[(slice(None),) * dim + (slice(start, end, step),)]


@aten("aten.select.int")
def _select(node, x, dim, index):
    dim %= x.ndim
    return x[(slice(None),) * dim + (index,)]


def _zero_pad(g, dim, before, after):
    from tessera.frontend.nn import pad
    widths = [(0, 0)] * g.ndim
    widths[dim] = (before, after)
    return pad(g, tuple(widths)) if before or after else g


@aten("aten.slice_backward.default",
      check=lambda node: None if node.args[5] == 1 else f"step={node.args[5]} (only 1 maps)")
def _slice_backward(node, g, sizes, dim, start, end, step):
    dim %= len(sizes)
    a, b, _ = slice(start, end).indices(sizes[dim])
    return _zero_pad(g, dim, a, sizes[dim] - max(a, b))


@aten("aten.select_backward.default")
def _select_backward(node, g, sizes, dim, index):
    dim %= len(sizes)
    index %= sizes[dim]
    return _zero_pad(ops.expand_dims(g, dim), dim, index, sizes[dim] - index - 1)


aten("aten.cat.default")(lambda node, xs, dim=0: ops.concatenate(list(xs), dim))


@aten("aten.split.Tensor")
def _split(node, x, size, dim=0):
    dim %= x.ndim
    n = x.shape[dim]
    return [x[(slice(None),) * dim + (slice(i, min(i + size, n)),)] for i in range(0, n, size)]


@aten("aten.split_with_sizes.default")
def _split_sizes(node, x, sizes, dim=0):
    dim %= x.ndim
    out, at = [], 0
    for s in sizes:
        out.append(x[(slice(None),) * dim + (slice(at, at + s),)])
        at += s
    return out


# ------------------------------------------------------------------------------- reductions
def _no_dtype(node):
    return "a dtype= argument" if node.kwargs.get("dtype") is not None else None


@aten("aten.sum.dim_IntList", check=_no_dtype)
def _sum(node, x, dims, keepdim=False, dtype=None):
    return ops.reduce_sum(x, _all_axes(dims, x.ndim), keepdims=keepdim)


@aten("aten.mean.dim", check=_no_dtype)
def _mean(node, x, dims, keepdim=False, dtype=None):
    return ops.reduce_mean(x, _all_axes(dims, x.ndim), keepdims=keepdim)


aten("aten.sum.default", check=_no_dtype)(lambda node, x, dtype=None: ops.reduce_sum(x))
aten("aten.mean.default", check=_no_dtype)(lambda node, x, dtype=None: ops.reduce_mean(x))


@aten("aten.amax.default")
def _amax(node, x, dims=(), keepdim=False):
    return ops.reduce_max(x, _all_axes(dims, x.ndim), keepdims=keepdim)


# ------------------------------------------------------------------------------- convolution, pooling
def _conv_check(node):
    x, transposed, out_pad = node.args[0].meta["val"], node.args[6], node.args[7]
    if x.dim() != 4:
        return f"a {x.dim() - 2}-d convolution (only 2-d maps)"
    if transposed:
        return "a transposed convolution"
    return f"output_padding={list(out_pad)}" if any(out_pad) else None


@aten("aten.convolution.default", check=_conv_check)
def _convolution(node, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    return ops.conv2d(x, w, b, tuple(stride), tuple(padding), tuple(dilation), groups)


def _pool_args(node, x, k, stride, padding):
    k = (k[0], k[-1])
    stride = (stride[0], stride[-1]) if stride else k
    padding = (padding[0], padding[-1]) if isinstance(padding, (list, tuple)) else (padding, padding)
    return k, stride, padding


def _max_pool_args_reason(args) -> str | None:
    """max_pool2d_with_indices' arguments (x, kernel, stride, padding, dilation, ceil_mode)."""
    a = list(args) + [None] * 6
    dil, ceil = a[4] or [1], a[5] or False
    if any(d != 1 for d in dil):
        return f"dilation={list(dil)}"
    return "ceil_mode=True" if ceil else None


def _max_pool_check(node):
    return _max_pool_args_reason(node.args) or _unused_outputs(1)(node)


@aten("aten.max_pool2d_with_indices.default", check=_max_pool_check)
def _max_pool(node, x, k, stride=(), padding=0, dilation=1, ceil_mode=False):
    return ops.max_pool2d(x, *_pool_args(node, x, k, stride, padding)), None


def _avg_pool_check(node, first=0):
    """avg_pool2d's arguments from position ``first`` (1 in its backward, after the gradient)."""
    a = list(node.args[first:]) + [None] * 7
    if a[4]:
        return "ceil_mode=True"
    if a[5] is False:
        return "count_include_pad=False"
    return f"divisor_override={a[6]}" if a[6] is not None else None


def _max_pool_backward_check(node):
    k, stride, padding = node.args[2], node.args[3], node.args[4]
    k = (k[0], k[-1])
    if ((stride[0], stride[-1]) if stride else k) != k:
        return f"stride {list(stride)} != kernel {list(k)} (overlapping or gapped windows)"
    if any(padding if isinstance(padding, (list, tuple)) else [padding]):
        return f"padding={padding}"
    return _max_pool_args_reason(node.args[1:])


@aten("aten.max_pool2d_with_indices_backward.default", check=_max_pool_backward_check)
def _max_pool_backward(node, g, x, k, stride, padding, dilation, ceil_mode, indices):
    """Windows that tile the input (stride == kernel, no padding): each input element takes its
    window's gradient where torch's saved index names it (ties go where torch's forward chose)."""
    n, c, h, w = x.shape
    kh, kw = k[0], k[-1]
    ho, wo = g.shape[2], g.shape[3]
    up_shape = (n, c, ho, kh, wo, kw)

    def up(t):   # each window's value over the window's kh x kw elements
        return ops.reshape(broadcast_to(ops.reshape(t, (n, c, ho, 1, wo, 1)), up_shape), (n, c, ho * kh, wo * kw))
    pos = ops.iota((ho * kh, wo * kw), 0, dtype=indices.dtype) * w + ops.iota((ho * kh, wo * kw), 1,
                                                                             dtype=indices.dtype)
    dx = ops.where(ops.equal(up(indices), pos), up(g), 0.0)
    if ho * kh < h or wo * kw < w:   # rows / columns no window reads
        from tessera.frontend.nn import pad
        dx = pad(dx, ((0, 0), (0, 0), (0, h - ho * kh), (0, w - wo * kw)))
    return dx


@aten("aten.avg_pool2d.default", check=_avg_pool_check)
def _avg_pool(node, x, k, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return ops.avg_pool2d(x, *_pool_args(node, x, k, stride, padding))


@aten("aten._adaptive_avg_pool2d.default",
      check=lambda node: None if list(node.args[1]) == [1, 1] else f"output_size={list(node.args[1])} (only [1, 1])")
def _adaptive_avg_pool(node, x, size):
    return ops.reduce_mean(x, (x.ndim - 2, x.ndim - 1), keepdims=True)


# ------------------------------------------------------------------------------- attention
def _sdpa_check(node, first=0):
    """The flash-attention op's arguments from ``first`` (1 in its backward: after the output
    gradient; there q, k, v are followed by out and logsumexp)."""
    a = list(node.args[first:])
    extra = 2 if first else 0
    dropout = a[3 + extra] if len(a) > 3 + extra else 0.0
    if dropout:
        return f"dropout_p={dropout}"
    if node.kwargs.get("attn_mask") is not None:
        return "an attn_mask"
    q, k = a[0].meta["val"], a[1].meta["val"]
    if q.dim() != 4:
        return "q is not [batch, heads, seq, dim]"
    return None if q.shape[1] == k.shape[1] else "grouped-query heads"


def _scale(q, scale):
    return float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _lse(q, k, is_causal, scale):
    """The logsumexp over keys of the scaled scores (flash attention's second result)."""
    s = ops.matmul(q, ops.swapaxes(k, -2, -1)) * _scale(q, scale)
    if is_causal:
        sq, sk = q.shape[-2], k.shape[-2]
        s = ops.where(ops.less_equal(ops.iota((sq, sk), 1), ops.iota((sq, sk), 0)), s, -math.inf)
    return ops.logsumexp(s, -1)


@aten("aten._scaled_dot_product_flash_attention_for_cpu.default", check=_sdpa_check)
def _sdpa(node, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    out = ops.attention(q, k, v, causal=bool(is_causal), scale=scale)
    used = {u.args[1] for u in node.users}
    return out, (_lse(q, k, is_causal, scale) if 1 in used else None)


@aten("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", check=lambda node: _sdpa_check(node, 1))
def _sdpa_backward(node, g, q, k, v, out, lse, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    from tessera.frontend.autodiff import vjp
    _, back = vjp(lambda q, k, v: ops.attention(q, k, v, causal=bool(is_causal), scale=scale), q, k, v)
    return back(g)


# ------------------------------------------------------------------------------- backward of nn ops
# through tessera.vjp of the forward op, traced into the same program (the forward is recomputed
# there and shares its kernels' rules with tessera.grad)
def _conv_backward_check(node):
    if node.args[1].meta["val"].dim() != 4:
        return "not a 2-d convolution"
    if node.args[7]:
        return "a transposed convolution"
    return f"output_padding={list(node.args[8])}" if any(node.args[8]) else None


@aten("aten.convolution_backward.default", check=_conv_backward_check)
def _convolution_backward(node, g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, mask):
    from tessera.frontend.autodiff import vjp
    _, back = vjp(lambda x, w: ops.conv2d(x, w, None, tuple(stride), tuple(padding), tuple(dilation), groups), x, w)
    dx, dw = back(g)
    db = ops.reduce_sum(g, (0, 2, 3)) if mask[2] else None
    return (dx if mask[0] else None), (dw if mask[1] else None), db


@aten("aten.avg_pool2d_backward.default",
      check=lambda node: _avg_pool_check(node, 1))
def _avg_pool_backward(node, g, x, k, stride, padding, ceil_mode, count_include_pad, divisor_override):
    from tessera.frontend.autodiff import vjp
    _, back = vjp(lambda x: ops.avg_pool2d(x, *_pool_args(node, x, k, stride, padding)), x)
    return back(g)[0]


from tessera.frontend import torch_aten_index  # noqa: E402,F401  (adds the integer-indexed ops' entries)
