"""ONNX RotaryEmbedding (version 23) replayed through ``tessera.ops``: the cos / sin rows gathered
by ``position_ids`` (``take``) or given per position, each head's first ``rotary_embedding_dim``
features rotated in pairs — the two halves, or (``interleaved``) the even and odd features —
and the rest passed through.  Input [B, H, S, D], or [B, S, H*D] with ``num_heads``."""
from __future__ import annotations

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import cast, op


@op("RotaryEmbedding", inputs=(3, 4), attrs=("interleaved", "num_heads", "rotary_embedding_dim"))
def _rotary(ctx, ins):
    x = ctx.t(ins[0])
    if dt.kind(x.dtype) != "f":
        raise ctx.refuse(f"a float input is needed, got {dt.name(x.dtype)}")
    shape = tuple(x.shape)
    if x.ndim == 4:
        x = ops.transpose(x, (0, 2, 1, 3))                       # [B, S, H, D]
    elif x.ndim == 3:
        h = int(ctx.a("num_heads", 0))
        if h < 1 or shape[2] % h:
            raise ctx.refuse(f"a 3-D input needs num_heads dividing its {shape[2]} features, got {h}")
        x = ops.reshape(x, (shape[0], shape[1], h, shape[2] // h))
    else:
        raise ctx.refuse(f"the input must be 3-D or 4-D, got shape {shape}")
    b, s, _, d = x.shape
    rd = int(ctx.a("rotary_embedding_dim", 0)) or d
    if rd % 2 or rd > d:
        raise ctx.refuse(f"rotary_embedding_dim {rd} must be even and at most the head size {d}")
    half = rd // 2
    cos, sin = (cast(ctx.t(v), x.dtype) for v in ins[1:3])
    if len(ins) > 3 and ins[3] is not None:
        pos = ctx.t(ins[3])
        if dt.kind(pos.dtype) != "i" or tuple(pos.shape) != (b, s) or cos.ndim != 2:
            raise ctx.refuse(f"position_ids {pos.shape} ({dt.name(pos.dtype)}) and caches {cos.shape} do not fit "
                             f"batch {b}, sequence {s}")
        cos, sin = ops.take(cos, pos, axis=0), ops.take(sin, pos, axis=0)
    for nm, c in (("cos_cache", cos), ("sin_cache", sin)):
        if tuple(c.shape) != (b, s, half):
            raise ctx.refuse(f"{nm} gives {tuple(c.shape)} per position, expected {(b, s, half)}")
    cos, sin = ops.reshape(cos, (b, s, 1, half)), ops.reshape(sin, (b, s, 1, half))
    rot = x[..., :rd] if rd < d else x
    if ctx.a("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if ctx.a("interleaved", 0):
        rot = ops.reshape(ops.stack([real, imag], axis=-1), tuple(rot.shape))
    else:
        rot = ops.concatenate([real, imag], axis=-1)
    y = ops.concatenate([rot, x[..., rd:]], axis=-1) if rd < d else rot
    return [ops.transpose(y, (0, 2, 1, 3)) if len(shape) == 4 else ops.reshape(y, shape)]
