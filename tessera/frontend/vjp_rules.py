"""vjp rules of the elementwise, reduction, scan and view ops (``differentiate.py`` applies them).

A rule is ``rule(node, g, need) -> [cotangent or None per input]``: ``node`` is the traced node
(its inputs are nodes too; ``T(n)`` wraps one as a Tensor), ``g`` the cotangent of its output (a
Tensor of the node's shape and dtype), ``need[i]`` whether input ``i`` wants one.  Rules emit the
backward graph through the ordinary ``tessera.ops`` functions, so shape checks, dtype promotion,
fusion and scheduling apply to it as to any traced code.  A cotangent a rule returns may have a
broadcastable shape; ``differentiate`` sums it down to (or broadcasts it up to) the input's shape.

Which ops are differentiable is declared in ``tessera/ir/opset_grad.py`` (rules here, in
``vjp_rules_nn.py``, or a declared reason why not); ``tests/test_grad_rules.py`` checks the
three agree with the registry.
"""
from __future__ import annotations

import math
import weakref

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.trace import Node, Tensor

RULES: dict = {}
# the identity reshapes stop_gradient recorded: they pass no cotangent
STOPPED: "weakref.WeakSet[Node]" = weakref.WeakSet()


def rule(*names: str):
    def reg(fn):
        for n in names:
            assert n not in RULES, n
            RULES[n] = fn
        return fn
    return reg


def T(n: Node) -> Tensor:
    return Tensor(n)


# --------------------------------------------------------------------------- shape helpers
def broadcast_to(t: Tensor, shape: tuple, like: Tensor | None = None) -> Tensor:
    """``t`` broadcast to ``shape`` (the op set has no broadcast op of its own): ``where(c, t, t)``
    over a condition of that shape, computed in the kernel that reads it.  The condition is
    ``isnan(like)`` where a float tensor of the shape is at hand (its sizes stay symbolic), else an
    always-true iota (static sizes)."""
    shape = tuple(shape)
    if t._node.shape == shape:
        return t
    if not shape or 0 in shape:
        return ops.reshape(t, shape) if math.prod(t._node.shape) == math.prod(shape) else t
    if like is not None and like._node.shape == shape and dt.kind(like.dtype) == "f":
        cond = ops.isnan(like)
    else:
        cond = ops.greater_equal(ops.iota(shape, 0), 0)
    return ops.where(cond, t, t)


def reshape(t: Tensor, shape: tuple) -> Tensor:
    """``ops.reshape``, except that a bare constant (a seed) is broadcast instead: the CPU lane
    has no view of a constant."""
    if t._node.op == "constant" and tuple(shape) != t._node.shape:
        return broadcast_to(t, shape)
    return ops.reshape(t, shape)


def unbroadcast(g: Tensor, shape: tuple, like: Tensor | None = None) -> Tensor:
    """``g`` summed over the axes numpy broadcasting added or stretched to reach its shape."""
    shape = tuple(shape)
    gs = g._node.shape
    if gs == shape:
        return g
    lead = len(gs) - len(shape)
    if lead < 0:
        return broadcast_to(g, shape, like)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and gs[lead + i] != 1)
    r = ops.reduce_sum(g, axes) if axes else g
    if r._node.shape != shape:
        r = reshape(r, shape)
    return broadcast_to(r, shape, like)


def keep_reduced(g: Tensor, in_shape: tuple, axes, keepdims: bool) -> Tensor:
    """A reduction's output cotangent with the reduced axes kept (size 1)."""
    if keepdims or g._node.op == "constant":   # a scalar seed broadcasts as it is
        return g
    return reshape(g, tuple(1 if i in axes else s for i, s in enumerate(in_shape)))


def flip(t: Tensor, axis: int) -> Tensor:
    idx = [slice(None)] * t.ndim
    idx[axis] = slice(None, None, -1)
    return t[tuple(idx)]


# --------------------------------------------------------------------------- elementwise, one operand
def _unary(name: str, deriv):
    """A rule ``g * deriv(x, y)``."""
    @rule(name)
    def r(n, g, need):
        return [ops.mul(g, deriv(T(n.inputs[0]), T(n)))]
    r.__name__ = f"vjp_{name}"
    return r


_unary("exp", lambda x, y: y)
_unary("exp2", lambda x, y: y * math.log(2.0))
_unary("expm1", lambda x, y: y + 1.0)
_unary("log1p", lambda x, y: ops.reciprocal(x + 1.0))
_unary("tanh", lambda x, y: 1.0 - y * y)
_unary("erf", lambda x, y: ops.exp(-(x * x)) * (2.0 / math.sqrt(math.pi)))
_unary("sigmoid", lambda x, y: y * (1.0 - y))
_unary("sqrt", lambda x, y: ops.reciprocal(y) * 0.5)
_unary("rsqrt", lambda x, y: y * y * y * -0.5)
_unary("reciprocal", lambda x, y: -(y * y))
_unary("square", lambda x, y: x * 2.0)
_unary("sin", lambda x, y: ops.cos(x))
_unary("cos", lambda x, y: -ops.sin(x))
_unary("abs", lambda x, y: ops.sign(x))


def _silu_d(x, y):
    s = ops.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


_unary("silu", _silu_d)


@rule("neg")
def vjp_neg(n, g, need):
    return [ops.neg(g)]


@rule("log")
def vjp_log(n, g, need):
    return [ops.div(g, T(n.inputs[0]))]


@rule("relu")
def vjp_relu(n, g, need):
    return [ops.where(ops.greater(T(n.inputs[0]), 0.0), g, 0.0)]


@rule("gelu")
def vjp_gelu(n, g, need):
    x = T(n.inputs[0])
    if n.attrs.get("approximate", "tanh") == "tanh":
        c = math.sqrt(2.0 / math.pi)
        t = ops.tanh((x + x * x * x * 0.044715) * c)
        d = (t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * c * (1.0 + x * x * (3 * 0.044715))
    else:
        pdf = ops.exp(x * x * -0.5) * (1.0 / math.sqrt(2 * math.pi))
        d = (ops.erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5 + x * pdf
    return [ops.mul(g, d)]


@rule("cast")
def vjp_cast(n, g, need):
    x = n.inputs[0]
    return [ops.cast(g, x.dtype) if dt.kind(x.dtype) == "f" else None]


# --------------------------------------------------------------------------- elementwise, two operands
@rule("add")
def vjp_add(n, g, need):
    return [g, g]


@rule("sub")
def vjp_sub(n, g, need):
    return [g, ops.neg(g) if need[1] else None]


@rule("mul")
def vjp_mul(n, g, need):
    a, b = T(n.inputs[0]), T(n.inputs[1])
    return [ops.mul(g, b) if need[0] else None, ops.mul(g, a) if need[1] else None]


@rule("div")
def vjp_div(n, g, need):
    b = T(n.inputs[1])
    ga = ops.div(g, b)
    return [ga, ops.neg(ops.mul(ga, T(n))) if need[1] else None]


def _chooser(n, g, need, first_wins):
    """maximum/minimum: the cotangent goes to the operand chosen, split evenly on a tie (as JAX
    and torch)."""
    a, b = T(n.inputs[0]), T(n.inputs[1])
    win_a = first_wins(a, b)
    tie = ops.equal(a, b)
    half = ops.mul(g, 0.5)
    ga = ops.where(tie, half, ops.where(win_a, g, 0.0)) if need[0] else None
    gb = ops.where(tie, half, ops.where(win_a, 0.0, g)) if need[1] else None
    return [ga, gb]


@rule("maximum")
def vjp_maximum(n, g, need):
    return _chooser(n, g, need, ops.greater)


@rule("minimum")
def vjp_minimum(n, g, need):
    return _chooser(n, g, need, ops.less)


@rule("pow")
def vjp_pow(n, g, need):
    a, b = T(n.inputs[0]), T(n.inputs[1])
    ga = ops.mul(g, ops.mul(b, ops.pow(a, b - 1.0))) if need[0] else None
    gb = None
    if need[1]:   # d/db a**b = a**b log a; 0 where a == 0 (as JAX: the limit of b > 0)
        safe = ops.where(ops.equal(a, 0.0), 1.0, a)
        gb = ops.mul(g, ops.mul(T(n), ops.log(safe)))
    return [ga, gb]


@rule("mod")
def vjp_mod(n, g, need):
    a, b = T(n.inputs[0]), T(n.inputs[1])
    return [g, ops.neg(ops.mul(g, ops.floor(ops.div(a, b)))) if need[1] else None]


@rule("where")
def vjp_where(n, g, need):
    c = T(n.inputs[0])
    return [None, ops.where(c, g, 0.0) if need[1] else None, ops.where(c, 0.0, g) if need[2] else None]


# --------------------------------------------------------------------------- reductions and scans
@rule("reduce_sum")
def vjp_reduce_sum(n, g, need):
    x = n.inputs[0]
    return [broadcast_to(keep_reduced(g, x.shape, n.attrs["axes"], n.attrs["keepdims"]), x.shape, T(x))]


@rule("reduce_mean")
def vjp_reduce_mean(n, g, need):
    x = n.inputs[0]
    count = math.prod(x.shape[a] for a in n.attrs["axes"])
    gk = keep_reduced(g, x.shape, n.attrs["axes"], n.attrs["keepdims"])
    return [broadcast_to(ops.mul(gk, 1.0 / count if count else math.nan), x.shape, T(x))]


@rule("reduce_max")
def vjp_reduce_max(n, g, need):
    """The cotangent split evenly over the maxima (as JAX's and torch's amax)."""
    x = T(n.inputs[0])
    axes, keep = n.attrs["axes"], n.attrs["keepdims"]
    y = keep_reduced(T(n), x._node.shape, axes, keep)
    hit = ops.cast(ops.equal(x, y), x.dtype)
    count = ops.reduce_sum(hit, axes, keepdims=True)
    return [ops.mul(hit, ops.div(keep_reduced(g, x._node.shape, axes, keep), count))]


@rule("reduce_prod")
def vjp_reduce_prod(n, g, need):
    """prod / x: exact where no element is 0 (a 0 gives inf/NaN, never a silent wrong value)."""
    x = T(n.inputs[0])
    axes, keep = n.attrs["axes"], n.attrs["keepdims"]
    y = keep_reduced(T(n), x._node.shape, axes, keep)
    return [ops.div(ops.mul(keep_reduced(g, x._node.shape, axes, keep), y), x)]


@rule("cumsum")
def vjp_cumsum(n, g, need):
    ax = n.attrs["axis"]
    return [flip(ops.cumsum(flip(g, ax), ax), ax)]


@rule("cumprod")
def vjp_cumprod(n, g, need):
    """Reverse running sum of g * y, over x: exact where no element is 0 (as reduce_prod)."""
    ax = n.attrs["axis"]
    gy = ops.mul(g, T(n))
    return [ops.div(flip(ops.cumsum(flip(gy, ax), ax), ax), T(n.inputs[0]))]


# --------------------------------------------------------------------------- views
@rule("reshape")
def vjp_reshape(n, g, need):
    if n in STOPPED:
        return [None]
    return [reshape(g, n.inputs[0].shape)]


@rule("transpose")
def vjp_transpose(n, g, need):
    perm = n.attrs["perm"]
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return [ops.transpose(g, tuple(inv))]


def place(g: Tensor, shape: tuple, starts, steps) -> Tensor:
    """The vjp of a strided window: ``g`` (the window's cotangent) placed into zeros of ``shape``
    at ``starts`` with ``steps``.  Per axis, a negative step is flipped, a step k > 1 interleaves
    k - 1 zeros, then zeros pad to the full size."""
    pads = []
    for ax, (start, step, whole) in enumerate(zip(starts, steps, shape)):
        size = g._node.shape[ax]
        if size == 0:
            return broadcast_to(ops.mul(ops.reduce_sum(g), 0.0), shape)
        if step < 0:
            g = flip(g, ax)
            start, step = start + (size - 1) * step, -step
        if step > 1 and size > 1:
            s = g._node.shape
            g = ops.reshape(g, s[:ax + 1] + (1,) + s[ax + 1:])
            w = [(0, 0)] * g.ndim
            w[ax + 1] = (0, step - 1)
            g = ops.pad(g, w)
            g = ops.reshape(g, s[:ax] + (size * step,) + s[ax + 1:])
            idx = [slice(None)] * g.ndim
            idx[ax] = slice(0, (size - 1) * step + 1)
            g = g[tuple(idx)]
        span = (size - 1) * step + 1 if size > 1 else 1
        pads.append((start, whole - start - span))
    return ops.pad(g, pads) if any(p != (0, 0) for p in pads) else g


@rule("slice")
def vjp_slice(n, g, need):
    return [place(g, n.inputs[0].shape, n.attrs["starts"], n.attrs["steps"])]


@rule("conv_patches")
def vjp_conv_patches(n, g, need):
    """conv2d's patches are the taps' strided windows of the padded input side by side (channel
    blocks of the group): each block's cotangent is placed back at its window, and the taps summed."""
    (kh, kw), (sh, sw), (dh, dw), (c0, cg) = (n.attrs[k] for k in ("kernel", "stride", "dilation", "channels"))
    shape = n.inputs[0].shape
    total = None
    for t, (a, b) in enumerate((a, b) for a in range(kh) for b in range(kw)):
        block = g[..., t * cg:(t + 1) * cg]
        part = place(block, shape, (0, a * dh, b * dw, c0), (1, sh, sw, 1))
        total = part if total is None else ops.add(total, part)
    return [total]


@rule("concat")
def vjp_concat(n, g, need):
    ax = n.attrs["axis"]
    out, off = [], 0
    for x, wanted in zip(n.inputs, need):
        k = x.shape[ax]
        if wanted:
            idx = [slice(None)] * g.ndim
            idx[ax] = slice(off, off + k)
            out.append(ops.cast(g[tuple(idx)], x.dtype) if x.dtype != g.dtype else g[tuple(idx)])
        else:
            out.append(None)
        off += k
    return out


@rule("pad")
def vjp_pad(n, g, need):
    from tessera.errors import GradNoRuleError
    from tessera.frontend.trace import user_location
    if n.attrs["mode"] != "constant":
        raise GradNoRuleError(f"grad: pad(mode={n.attrs['mode']!r}) has no vjp rule (it needs a scatter-add); "
                              "mode='constant' has one", location=user_location())
    idx = tuple(slice(lo, lo + s) for (lo, _), s in zip(n.attrs["pads"], n.inputs[0].shape))
    return [g[idx]]
