"""A Llama block as users write it: RMSNorm, rotary embeddings computed in the graph (rotate-half
with slices and a join, sin and cos of the positions), grouped-query attention (fewer key/value
heads), a SwiGLU MLP, residuals.

Run: ./dev python examples/models/llama_block.py [small|large]
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tessera as ts  # noqa: E402
from models import common as C  # noqa: E402

SIZES = {"small": dict(batch=1, seq=256, dim=512, heads=8, kv_heads=2, hidden=1408),
         "large": dict(batch=1, seq=1024, dim=1024, heads=16, kv_heads=4, hidden=2816)}


def make(rng, batch, seq, dim, heads, kv_heads, hidden):
    dh = dim // heads
    x = rng.standard_normal((batch, seq, dim)).astype(np.float32)
    inv_freq = (1.0 / 10000 ** (np.arange(0, dh, 2) / dh)).astype(np.float32)
    pos = np.arange(seq, dtype=np.float32)
    args = [x, pos, inv_freq, C.gain(rng, dim), C.param(rng, dim, dim), C.param(rng, dim, kv_heads * dh),
            C.param(rng, dim, kv_heads * dh), C.param(rng, dim, dim), C.gain(rng, dim), C.param(rng, dim, hidden),
            C.param(rng, dim, hidden), C.param(rng, hidden, dim)]
    return args, {"n_head": heads, "n_kv": kv_heads}


def rotate_half(t):
    h = t.shape[-1] // 2
    return ts.ops.concatenate([-t[..., h:], t[..., :h]], axis=-1)


@ts.jit(static_argnames=("n_head", "n_kv"))
def forward(x, pos, inv_freq, attn_g, wq, wk, wv, wo, mlp_g, w1, w3, w2, *, n_head, n_kv):
    B, S, D = x.shape
    dh = D // n_head
    freqs = pos[:, None] * inv_freq[None, :]                       # [S, dh/2]
    emb = ts.ops.concatenate([freqs, freqs], axis=-1)               # [S, dh]
    cos, sin = ts.ops.cos(emb), ts.ops.sin(emb)
    h = ts.ops.rms_norm(x, attn_g, eps=1e-6)
    q = (h @ wq).reshape(B, S, n_head, dh).transpose(0, 2, 1, 3)
    k = (h @ wk).reshape(B, S, n_kv, dh).transpose(0, 2, 1, 3)
    v = (h @ wv).reshape(B, S, n_kv, dh).transpose(0, 2, 1, 3)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    y = ts.ops.attention(q, k, v, causal=True)                      # grouped-query: n_head / n_kv per kv head
    x = x + y.transpose(0, 2, 1, 3).reshape(B, S, D) @ wo
    h = ts.ops.rms_norm(x, mlp_g, eps=1e-6)
    return x + (ts.ops.silu(h @ w1) * (h @ w3)) @ w2


def reference(*args, xp_dtype=np.float64, n_head, n_kv):
    x, pos, inv_freq, attn_g, wq, wk, wv, wo, mlp_g, w1, w3, w2 = C.cast_all(args, xp_dtype)
    B, S, D = x.shape
    dh = D // n_head
    emb = np.concatenate([np.outer(pos, inv_freq)] * 2, -1)
    cos, sin = np.cos(emb), np.sin(emb)

    def rot(t):
        return np.concatenate([-t[..., dh // 2:], t[..., :dh // 2]], -1)
    h = C.rms_norm(x, attn_g)
    q = (h @ wq).reshape(B, S, n_head, dh).transpose(0, 2, 1, 3)
    k = (h @ wk).reshape(B, S, n_kv, dh).transpose(0, 2, 1, 3)
    v = (h @ wv).reshape(B, S, n_kv, dh).transpose(0, 2, 1, 3)
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    k, v = np.repeat(k, n_head // n_kv, 1), np.repeat(v, n_head // n_kv, 1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(dh)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    x = x + (C.softmax(s) @ v).transpose(0, 2, 1, 3).reshape(B, S, D) @ wo
    h = C.rms_norm(x, mlp_g)
    return x + (C.silu(h @ w1) * (h @ w3)) @ w2


def torch_forward(x, pos, inv_freq, attn_g, wq, wk, wv, wo, mlp_g, w1, w3, w2, *, n_head, n_kv):
    import torch
    import torch.nn.functional as F
    B, S, D = x.shape
    dh = D // n_head
    emb = torch.cat([torch.outer(pos, inv_freq)] * 2, -1)
    cos, sin = emb.cos(), emb.sin()

    def rot(t):
        return torch.cat([-t[..., dh // 2:], t[..., :dh // 2]], -1)

    def rms(t, g):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * g
    h = rms(x, attn_g)
    q = (h @ wq).view(B, S, n_head, dh).transpose(1, 2)
    k = (h @ wk).view(B, S, n_kv, dh).transpose(1, 2)
    v = (h @ wv).view(B, S, n_kv, dh).transpose(1, 2)
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + y.transpose(1, 2).reshape(B, S, D) @ wo
    h = rms(x, mlp_g)
    return x + (F.silu(h @ w1) * (h @ w3)) @ w2


def jax_forward(x, pos, inv_freq, attn_g, wq, wk, wv, wo, mlp_g, w1, w3, w2, *, n_head, n_kv):
    import jax
    import jax.numpy as jnp
    B, S, D = x.shape
    dh = D // n_head
    emb = jnp.concatenate([jnp.outer(pos, inv_freq)] * 2, -1)
    cos, sin = jnp.cos(emb)[:, None, :], jnp.sin(emb)[:, None, :]

    def rot(t):
        return jnp.concatenate([-t[..., dh // 2:], t[..., :dh // 2]], -1)

    def rms(t, g):
        return t * jax.lax.rsqrt((t * t).mean(-1, keepdims=True) + 1e-6) * g
    h = rms(x, attn_g)
    q = (h @ wq).reshape(B, S, n_head, dh)
    k = (h @ wk).reshape(B, S, n_kv, dh)
    v = (h @ wv).reshape(B, S, n_kv, dh)
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    x = x + y.reshape(B, S, D) @ wo
    h = rms(x, mlp_g)
    return x + (jax.nn.silu(h @ w1) * (h @ w3)) @ w2


if __name__ == "__main__":
    C.main(sys.modules[__name__])
