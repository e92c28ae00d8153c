"""A GPT-2 block as users write it: pre-LayerNorm, one fused qkv projection split into heads,
a causal mask built in the graph, tanh-GELU MLP, residuals.

Run: ./dev python examples/models/gpt2_block.py [small|large]
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tessera as ts  # noqa: E402
from models import common as C  # noqa: E402

SIZES = {"small": dict(batch=2, seq=256, dim=512, heads=8), "large": dict(batch=2, seq=1024, dim=1024, heads=16)}


def make(rng, batch, seq, dim, heads):
    x = rng.standard_normal((batch, seq, dim)).astype(np.float32)
    args = [x, C.gain(rng, dim), C.bias(rng, dim), C.param(rng, dim, 3 * dim), C.bias(rng, 3 * dim),
            C.param(rng, dim, dim), C.bias(rng, dim), C.gain(rng, dim), C.bias(rng, dim),
            C.param(rng, dim, 4 * dim), C.bias(rng, 4 * dim), C.param(rng, 4 * dim, dim), C.bias(rng, dim)]
    return args, {"n_head": heads}


@ts.jit(static_argnames="n_head")
def forward(x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj, *, n_head):
    B, S, D = x.shape
    dh = D // n_head
    qkv = ts.ops.layer_norm(x, ln1_g, ln1_b) @ w_qkv + b_qkv
    q, k, v = ts.ops.split(qkv, 3, axis=-1)
    q, k, v = (t.reshape(B, S, n_head, dh).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(dh))
    pos = ts.ops.arange(S)
    scores = ts.ops.where(pos[:, None] >= pos[None, :], scores, -np.inf)   # causal: key j <= query i
    y = (ts.ops.softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
    x = x + (y @ w_o + b_o)
    h = ts.ops.gelu(ts.ops.layer_norm(x, ln2_g, ln2_b) @ w_fc + b_fc)
    return x + (h @ w_proj + b_proj)


def reference(*args, xp_dtype=np.float64, n_head):
    x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj = C.cast_all(args, xp_dtype)
    B, S, D = x.shape
    qkv = C.layer_norm(x, ln1_g, ln1_b) @ w_qkv + b_qkv
    q, k, v = (t.reshape(B, S, n_head, -1).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
    s = q @ k.swapaxes(-1, -2) / math.sqrt(D // n_head)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    y = (C.softmax(s) @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
    x = x + y @ w_o + b_o
    return x + C.gelu_tanh(C.layer_norm(x, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj


def torch_forward(x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj, *, n_head):
    import torch.nn.functional as F
    B, S, D = x.shape
    q, k, v = (F.layer_norm(x, (D,), ln1_g, ln1_b) @ w_qkv + b_qkv).split(D, dim=-1)
    q, k, v = (t.view(B, S, n_head, D // n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
    x = x + y @ w_o + b_o
    return x + F.gelu(F.layer_norm(x, (D,), ln2_g, ln2_b) @ w_fc + b_fc, approximate="tanh") @ w_proj + b_proj


def jax_forward(x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj, *, n_head):
    import jax
    import jax.numpy as jnp

    def ln(t, g, b):
        m = t.mean(-1, keepdims=True)
        return (t - m) * jax.lax.rsqrt(((t - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    B, S, D = x.shape
    q, k, v = jnp.split(ln(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, axis=-1)
    q, k, v = (t.reshape(B, S, n_head, D // n_head) for t in (q, k, v))
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(B, S, D)
    x = x + y @ w_o + b_o
    return x + jax.nn.gelu(ln(x, ln2_g, ln2_b) @ w_fc + b_fc, approximate=True) @ w_proj + b_proj


if __name__ == "__main__":
    C.main(sys.modules[__name__])
