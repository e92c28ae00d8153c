"""vjp rules of matmul, the row ops, attention, the gathers and top_k (see ``vjp_rules.py`` for the form).

Most are composite: each backward is written with ``tessera.ops`` (GEMMs, row reductions,
elementwise chains), so it is fused and scheduled as any traced code.  Attention's backward is
an op of its own (``tessera.attention_grad``, the flash-attention backward kernel) where it
applies; its rule says where the composed form (an S x S intermediate) remains.
"""
from __future__ import annotations

import math

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.attention_grad import fits, saved_lse
from tessera.frontend.vjp_rules import T, reshape, rule, unbroadcast


def _swap(t):
    return ops.swapaxes(t, -1, -2)


@rule("matmul")
def vjp_matmul(n, g, need):
    """dA = dC B^T, dB = A^T dC, each summed over the batch axes its operand was broadcast on."""
    a, b = T(n.inputs[0]), T(n.inputs[1])
    if need[1] and n.inputs[0].op == "conv_patches":   # a GEMM reads patches only as its A operand
        a = _patches(n.inputs[0])
    if g.dtype != a.dtype:   # bf16/f16 inputs with out_dtype f32: the backward GEMMs take the inputs' dtype
        g = ops.cast(g, a.dtype)
    ga = unbroadcast(ops.matmul(g, _swap(b)), a._node.shape) if need[0] else None
    gb = unbroadcast(ops.matmul(_swap(a), g), b._node.shape) if need[1] else None
    return [ga, gb]


def _patches(p):
    """conv_patches written out (an im2col buffer: the weight gradient reads it transposed, which
    the implicit-GEMM A operand cannot): the taps' strided windows side by side."""
    (kh, kw), (sh, sw), (dh, dw), (c0, cg) = (p.attrs[k] for k in ("kernel", "stride", "dilation", "channels"))
    _, ho, wo, _ = p.shape
    xp = T(p.inputs[0])
    wins = [xp[:, a * dh:a * dh + (ho - 1) * sh + 1:sh, b * dw:b * dw + (wo - 1) * sw + 1:sw, c0:c0 + cg]
            for a in range(kh) for b in range(kw)]
    return wins[0] if len(wins) == 1 else ops.concatenate(wins, axis=-1)


# --------------------------------------------------------------------------- row ops
@rule("softmax")
def vjp_softmax(n, g, need):
    """dx = y * (g - sum(g * y))."""
    y, ax = T(n), n.attrs["axis"]
    return [ops.mul(y, ops.sub(g, ops.reduce_sum(ops.mul(g, y), ax, keepdims=True)))]


@rule("log_softmax")
def vjp_log_softmax(n, g, need):
    """dx = g - exp(y) * sum(g), along the last axis."""
    return [ops.sub(g, ops.mul(ops.exp(T(n)), ops.reduce_sum(g, -1, keepdims=True)))]


@rule("logsumexp")
def vjp_logsumexp(n, g, need):
    """dx = g * exp(x - y), along the last axis (the node keeps no axis)."""
    x = T(n.inputs[0])
    y = ops.expand_dims(T(n), -1)
    return [ops.mul(ops.expand_dims(g, -1), ops.exp(ops.sub(x, y)))]


def _rows(x, eps, centred: bool):
    """(x - mean) or x, and the reciprocal standard deviation, over the last axis (kept)."""
    xc = ops.sub(x, ops.reduce_mean(x, -1, keepdims=True)) if centred else x
    return xc, ops.rsqrt(ops.add(ops.reduce_mean(ops.mul(xc, xc), -1, keepdims=True), eps))


def _sum_rows(t):
    """Summed over every axis but the last (a scale's or bias's cotangent)."""
    return ops.reduce_sum(t, tuple(range(t.ndim - 1))) if t.ndim > 1 else t


@rule("layer_norm", "rms_norm")
def vjp_norm(n, g, need):
    """xhat = (x - mean) * r (layer_norm) or x * r (rms_norm), r = 1/sqrt(var + eps):
    dx = r * (gh - mean(gh) - xhat * mean(gh * xhat)) (no mean(gh) term for rms_norm), gh = g * scale;
    dscale = sum(g * xhat), dbias = sum(g) over the rows."""
    centred = n.op == "layer_norm"
    x = T(n.inputs[0])
    present = n.attrs["present"]
    vecs = iter(n.inputs[1:])
    scale = T(next(vecs)) if present[0] else None
    xc, r = _rows(x, n.attrs["eps"], centred)
    xhat = ops.mul(xc, r)
    gh = ops.mul(g, scale) if scale is not None else g
    inner = ops.sub(gh, ops.mul(xhat, ops.reduce_mean(ops.mul(gh, xhat), -1, keepdims=True)))
    if centred:
        inner = ops.sub(inner, ops.reduce_mean(gh, -1, keepdims=True))
    out = [ops.mul(r, inner) if need[0] else None]
    k = 1
    if present[0]:
        out.append(_sum_rows(ops.mul(g, xhat)) if need[k] else None)
        k += 1
    if len(present) > 1 and present[1]:
        out.append(_sum_rows(g) if need[k] else None)
    return out


@rule("cross_entropy")
def vjp_cross_entropy(n, g, need):
    """dlogits = (softmax(logits) - one_hot(label)) * g per row; 0 on ignored rows.  The one-hot is
    never built: ``iota == label`` is computed in the row kernel from its column index
    (fuse-rowwise takes it into the softmax's epilogue), so the backward is one row kernel."""
    logits, labels = T(n.inputs[0]), T(n.inputs[1])
    shape = logits._node.shape
    p = ops.softmax(logits if logits.dtype == n.dtype else ops.cast(logits, n.dtype), -1)
    cols = ops.iota((1,) * (len(shape) - 1) + shape[-1:], len(shape) - 1, dtype=labels.dtype)   # (sizes stay symbolic)
    hit = ops.equal(cols, ops.expand_dims(labels, -1))
    hot = ops.where(hit, 1.0, 0.0)
    keep = ops.not_equal(labels, n.attrs["ignore_index"])
    row = ops.where(keep, g, 0.0)
    d = ops.mul(ops.sub(p, hot), ops.expand_dims(row, -1))
    return [ops.cast(d, logits.dtype) if d.dtype != logits.dtype else d, None]


# --------------------------------------------------------------------------- attention
@rule("attention")
def vjp_attention(n, g, need):
    """The flash-attention backward kernel (``ops.attention_backward``: one
    ``tessera.attention_grad``, dQ, dK and dV recomputing the probabilities block by block from
    q, k, v, the saved output, the forward's saved log-sum-exp (its second result, ``saved_lse``)
    and g; no S x S tensor) wherever it applies: seq_q == seq_k and
    head dim == value dim (its packed result), any mask but an additive float one whose own
    gradient is asked for.  Otherwise (cross-attention shapes, or d(mask) wanted, which is dS
    itself, an S x S tensor by definition) the composed form below: recompute
    P = softmax(q k^T * scale + mask) (grouped-query heads as a broadcast batch axis), then
    dV = P^T g, dP = g V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K * scale,
    dK = dS^T Q * scale, each summed over the query heads sharing a key/value head."""
    q, k, v = (T(x) for x in n.inputs[:3])
    mask = T(n.inputs[3]) if n.attrs.get("mask") else None
    mask_grad = mask is not None and need[3] and mask.dtype != dt.bool_
    if fits(q._node.shape, k._node.shape, v._node.shape) and not mask_grad:
        gq = reshape(g, n.shape)
        grads = ops.attention_backward(q, k, v, T(n), gq if gq.dtype == q.dtype else ops.cast(gq, q.dtype),
                                       causal=n.attrs["causal"], scale=n.attrs["scale"], mask=mask,
                                       lse=saved_lse(n))
        return [x if wanted else None for x, wanted in zip(grads, need[:3])] + ([None] if mask is not None else [])
    return _vjp_attention_composed(n, g, need, q, k, v, mask)


def _vjp_attention_composed(n, g, need, q, k, v, mask):
    """The composed backward (see vjp_attention): an S x S probability tensor in the graph."""
    b, h, sq, d = q._node.shape
    hk, sk = k._node.shape[1], k._node.shape[2]
    grp = h // hk
    scale = n.attrs["scale"] if n.attrs["scale"] is not None else 1.0 / math.sqrt(d)
    f32 = dt.float64 if q.dtype == dt.float64 else dt.float32
    q5 = ops.cast(ops.reshape(q, (b, hk, grp, sq, d)), f32)
    k5 = ops.cast(ops.reshape(k, (b, hk, 1, sk, d)), f32)
    v5 = ops.cast(ops.reshape(v, (b, hk, 1, sk, v._node.shape[-1])), f32)
    g5 = ops.cast(reshape(g, (b, hk, grp, sq, g._node.shape[-1])), f32)
    s = ops.mul(ops.matmul(q5, _swap(k5)), scale)
    ok = None
    if mask is not None:
        m = mask
        m = ops.reshape(m, (1,) * (4 - m.ndim) + m._node.shape)
        mb, mh = m._node.shape[:2]
        m5 = ops.reshape(m, (mb, hk if mh != 1 else 1, grp if mh != 1 else 1) + m._node.shape[2:])
        if m.dtype == dt.bool_:
            ok = m5
        else:
            s = ops.add(s, ops.cast(m5, f32))
    if n.attrs["causal"]:
        causal = ops.greater_equal(ops.iota((sq, sk), 0), ops.iota((sq, sk), 1))
        ok = causal if ok is None else ops.logical_and(ok, causal)
    if ok is not None:
        s = ops.where(ok, s, -math.inf)
    p = ops.softmax(s, -1)
    p = ops.where(ops.isnan(p), 0.0, p)   # a row with every key masked: zeros, as the forward
    out = []
    dp = ops.matmul(g5, _swap(v5))
    ds = ops.mul(p, ops.sub(dp, ops.reduce_sum(ops.mul(dp, p), -1, keepdims=True)))
    if need[0]:
        out.append(ops.cast(ops.reshape(ops.mul(ops.matmul(ds, k5), scale), q._node.shape), q.dtype))
    else:
        out.append(None)
    for t, wanted, make in ((k, need[1], lambda: ops.mul(ops.matmul(_swap(ds), q5), scale)),
                            (v, need[2], lambda: ops.matmul(_swap(p), g5))):
        if wanted:
            full = ops.reduce_sum(make(), 2)
            out.append(ops.cast(ops.reshape(full, t._node.shape), t.dtype))
        else:
            out.append(None)
    if mask is not None:
        if need[3] and mask.dtype != dt.bool_:
            out.append(ops.cast(unbroadcast(ops.reshape(ds, (b, h, sq, sk)), mask._node.shape), mask.dtype))
        else:
            out.append(None)
    return out


# --------------------------------------------------------------------------- gathers
@rule("take")
def vjp_take(n, g, need):
    """dx[.., v, ..] = sum of g over the positions that read row v: ``scatter_add`` of g into
    zeros, take's exact adjoint (the same index bounding; duplicates summed in index order, the
    same bits for any thread count; the former one_hot(ids)^T @ g GEMM cost ids x rows x width
    multiplies and sent negative ids to row 0)."""
    x, idx = n.inputs
    dx = ops.scatter_add(x.shape, T(idx), reshape(g, n.shape), axis=n.attrs["axis"])
    return [dx, None]


@rule("scatter_add")
def vjp_scatter_add(n, g, need):
    """d updates = take(g, indices, axis) (the same bounding), d target = g."""
    idx = n.inputs[0]
    gu = ops.take(g, T(idx), axis=n.attrs["axis"]) if need[1] else None
    return [None, gu] + ([g] if n.attrs["based"] else [])


@rule("take_along_axis")
def vjp_take_along_axis(n, g, need):
    """dx = sum over the gathered positions k of g[k] * (idx[k] == c): a one-hot contraction."""
    x, idx = n.inputs
    ax = n.attrs["axis"]
    c = x.shape[ax]
    gm = ops.moveaxis(g, ax, -1)          # [..., k]
    im = ops.moveaxis(ops.clip(T(idx), 0, c - 1), ax, -1)
    hot = ops.one_hot(im, c, dtype=g.dtype)   # [..., k, c]
    dx = ops.reduce_sum(ops.mul(ops.expand_dims(gm, -1), hot), -2)   # [..., c]
    dx = ops.moveaxis(dx, -1, ax)
    return [unbroadcast(dx, x.shape), None]


@rule("top_k")
def vjp_top_k(n, g, need):
    """dx = sum over the k picks of g * one_hot(index), along the last axis (the indices are the
    trace's own top_k_indices node where one exists, else recomputed)."""
    from tessera.frontend.trace import _graph
    x = T(n.inputs[0])
    idx = next((T(m) for m in _graph().nodes if m.op == "top_k_indices" and m.inputs[0] is n), None)
    if idx is None:
        idx = ops.top_k(x, n.attrs["k"])[1]
    hot = ops.one_hot(idx, x._node.shape[-1], dtype=g.dtype)   # [..., k, n]
    return [ops.reduce_sum(ops.mul(ops.expand_dims(g, -1), hot), -2)]
