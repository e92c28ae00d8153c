"""ONNX ``Attention`` (opsets 23..25) replayed through ``tessera.ops.attention``.

Inputs Q, K, V (4-D ``[batch, heads, seq, head]``, or 3-D ``[batch, seq, heads * head]`` with
``q_num_heads`` / ``kv_num_heads``), an optional ``attn_mask`` (bool, True = attend, or an additive
float bias; shorter than the keys: padded with False / -inf), ``past_key`` / ``past_value``
(concatenated before K / V: the ``present_*`` outputs) and ``nonpad_kv_seqlen`` (opset 24: keys at
or past it masked, per batch).  ``is_causal`` aligns the causal edge bottom-right by the cache
length (``j <= i + offset``), ``left/right_window_size`` (opset 25) bound a sliding window the
same way.  Grouped-query heads as ``ops.attention`` takes them.  A query row whose every key is
masked gives zeros, as ONNX's reference and the kernel both do.

The fused kernel runs the common case (no ``softcap``, no ``qk_matmul_output`` asked for): with
plain top-left causality it gets ``causal=True`` (its blocks above the diagonal are skipped),
else one additive mask built from iota comparisons.  ``softcap`` or the QK output compose the
same computation from matmul / softmax instead.
"""
from __future__ import annotations

import math

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.vjp_rules import broadcast_to
from tessera.onnx.convert import cast, op

NEG_INF = float("-inf")


def _heads(x, n: int):
    """[B, S, n*d] -> [B, n, S, d]."""
    b, s, h = x.shape
    return ops.transpose(ops.reshape(x, (b, s, n, h // n)), (0, 2, 1, 3))


def _to_bias(mask, dtype):
    """A bool mask (True = attend) as 0 / -inf, a float one as itself, in ``dtype``."""
    if mask.dtype == dt.bool_:
        return ops.where(mask, 0.0, NEG_INF) if dtype == dt.float32 else cast(ops.where(mask, 0.0, NEG_INF), dtype)
    return cast(mask, dtype)


def _pad_keys(ctx, mask, kv: int):
    """ONNX pads a mask shorter than the keys with False / -inf."""
    short = kv - mask.shape[-1]
    if short <= 0:
        return mask
    tail_shape = tuple(mask.shape[:-1]) + (short,)
    fill = ops.less(ops.iota(tail_shape, len(tail_shape) - 1, dt.int32), 0)   # all False
    if mask.dtype != dt.bool_:
        fill = _to_bias(fill, mask.dtype)
    return ops.concatenate([mask, fill], axis=-1)


def _check(attrs, opset):
    if int(attrs.get("qk_matmul_output_mode", 0)) not in (0, 1, 2, 3):
        return f"qk_matmul_output_mode={attrs['qk_matmul_output_mode']}"
    return None


@op("Attention", inputs=(3, 7), outputs=4, check=_check,
    attrs=("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
           "softmax_precision", "left_window_size", "right_window_size"))
def _attention(ctx, ins):
    ins = list(ins) + [None] * (7 - len(ins))
    q, k, v = (ctx.t(x) for x in ins[:3])
    if dt.kind(q.dtype) != "f":
        raise ctx.refuse(f"Q of dtype {dt.name(q.dtype)} (float tensors map)")
    three_d = q.ndim == 3
    if three_d:
        qh, kvh = ctx.a("q_num_heads"), ctx.a("kv_num_heads")
        if not qh or not kvh:
            raise ctx.refuse("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _heads(q, int(qh)), _heads(k, int(kvh)), _heads(v, int(kvh))
    elif q.ndim != 4:
        raise ctx.refuse(f"Q of rank {q.ndim} (3 or 4)")
    past_k, past_v = ins[4], ins[5]
    if (past_k is None) != (past_v is None):
        raise ctx.refuse("past_key and past_value must come together")
    if past_k is not None:
        k = ops.concatenate([ctx.t(past_k), k], axis=2)
        v = ops.concatenate([ctx.t(past_v), v], axis=2)
    present_k, present_v = k, v
    sq, skv = q.shape[2], k.shape[2]
    nonpad = ctx.t(ins[6]) if ins[6] is not None else None
    if nonpad is not None and past_k is not None:
        raise ctx.refuse("nonpad_kv_seqlen with a past cache")
    causal = bool(ctx.a("is_causal", 0))
    left, right = int(ctx.a("left_window_size", -1)), int(ctx.a("right_window_size", -1))
    offset = past_k.shape[2] if past_k is not None else 0
    i = ops.iota((sq, skv), 0, dt.int32)
    j = ops.iota((sq, skv), 1, dt.int32)
    if nonpad is not None:    # per batch: [B, 1, 1, 1] offsets
        nb = ops.reshape(cast(nonpad, dt.int32), (nonpad.shape[0], 1, 1, 1))
        diff = ops.expand_dims(i, 0) - ops.expand_dims(j, 0) + (nb - sq)
        keep_pad = ops.less(ops.expand_dims(j, 0), nb)
    else:
        diff = i - j + offset if offset else i - j
        keep_pad = None
    allowed = []
    if causal and (offset or nonpad is not None or left >= 0 or right >= 0 or ins[3] is not None):
        allowed.append(ops.greater_equal(diff, 0))
    if left >= 0:
        allowed.append(ops.less_equal(diff, left))
    if right >= 0:
        allowed.append(ops.greater_equal(diff, -right))
    if keep_pad is not None:
        allowed.append(keep_pad)
    fused_causal = causal and not allowed
    bias = None
    if ins[3] is not None:
        bias = _to_bias(_pad_keys(ctx, ctx.t(ins[3]), skv), q.dtype)
    if allowed:
        a = allowed[0]
        for x in allowed[1:]:
            a = ops.logical_and(a, x)
        bias = _to_bias(a, q.dtype) if bias is None else ops.where(a, bias, NEG_INF)
    scale = ctx.a("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[3])
    softcap = float(ctx.a("softcap", 0.0) or 0.0)
    mode = int(ctx.a("qk_matmul_output_mode", 0))
    want_qk = ctx.n_outputs > 3
    if softcap > 0 or want_qk:
        y, qk = _composed(q, k, v, bias, scale, softcap, mode, fused_causal)
    else:
        if bias is not None and bias.ndim < 4:
            bias = ops.reshape(bias, (1,) * (4 - bias.ndim) + tuple(bias.shape))
        y, qk = ops.attention(q, k, v, causal=fused_causal, scale=scale, mask=bias), None
    if three_d:
        b, h, s, d = y.shape
        y = ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (b, s, h * d))
    return [y, present_k, present_v, qk][:max(1, ctx.n_outputs)]


def _composed(q, k, v, bias, scale, softcap, mode, causal):
    """softmax(softcap(q k^T scale) + bias) v from matmul and softmax, and the QK output of ``mode``."""
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:   # grouped-query: kv head h // (hq / hk) for query head h
        rep = hq // hk
        b, _, s, d = k.shape
        k = ops.reshape(broadcast_to(ops.expand_dims(k, 2), (b, hk, rep, s, d)), (b, hq, s, d))
        v = ops.reshape(broadcast_to(ops.expand_dims(v, 2), (b, hk, rep, s, v.shape[3])), (b, hq, s, v.shape[3]))
    s = ops.matmul(q, ops.swapaxes(k, -1, -2)) * scale
    if softcap > 0:
        s = ops.tanh(s * (1.0 / softcap)) * softcap
    qk = s
    if causal:
        sq, skv = s.shape[-2:]
        keep = ops.greater_equal(ops.iota((sq, skv), 0, dt.int32), ops.iota((sq, skv), 1, dt.int32))
        bias = _to_bias(keep, s.dtype) if bias is None else ops.where(keep, bias, NEG_INF)
    sb = s if bias is None else s + bias
    if mode == 2:
        qk = sb
    m = ops.reduce_max(sb, axis=-1, keepdims=True)
    dead = ops.isinf(m)                       # every key masked: zeros, as ONNX's reference
    p = ops.softmax(ops.where(dead, 0.0, sb))
    p = ops.where(dead, 0.0, p)
    if mode == 3:
        qk = p
    return ops.matmul(p, v), qk
