"""A BERT encoder block as users write it: separate q/k/v projections, a padding mask turned
into an additive bias, post-LayerNorm, erf-GELU MLP.

Run: ./dev python examples/models/bert_block.py [small|large]
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tessera as ts  # noqa: E402
from models import common as C  # noqa: E402

SIZES = {"small": dict(batch=4, seq=256, dim=512, heads=8), "large": dict(batch=4, seq=512, dim=1024, heads=16)}


def make(rng, batch, seq, dim, heads):
    x = rng.standard_normal((batch, seq, dim)).astype(np.float32)
    lengths = rng.integers(seq // 2, seq + 1, size=batch)
    keep = np.arange(seq)[None, :] < lengths[:, None]
    mask_bias = np.where(keep, 0.0, -1e9).astype(np.float32)[:, None, None, :]   # [B, 1, 1, S], as HF does
    args = [x, mask_bias, C.param(rng, dim, dim), C.bias(rng, dim), C.param(rng, dim, dim), C.bias(rng, dim),
            C.param(rng, dim, dim), C.bias(rng, dim), C.param(rng, dim, dim), C.bias(rng, dim),
            C.gain(rng, dim), C.bias(rng, dim), C.param(rng, dim, 4 * dim), C.bias(rng, 4 * dim),
            C.param(rng, 4 * dim, dim), C.bias(rng, dim), C.gain(rng, dim), C.bias(rng, dim)]
    return args, {"n_head": heads}


@ts.jit(static_argnames="n_head")
def forward(x, mask_bias, wq, bq, wk, bk, wv, bv, wo, bo, ln1_g, ln1_b, w1, b1, w2, b2, ln2_g, ln2_b, *, n_head):
    B, S, D = x.shape
    dh = D // n_head

    def heads(t):
        return t.reshape(B, S, n_head, dh).transpose(0, 2, 1, 3)
    q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
    att = ts.ops.softmax((q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(dh)) + mask_bias)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
    x = ts.ops.layer_norm(x + (y @ wo + bo), ln1_g, ln1_b, eps=1e-12)
    h = ts.ops.gelu(x @ w1 + b1, approximate="erf")
    return ts.ops.layer_norm(x + (h @ w2 + b2), ln2_g, ln2_b, eps=1e-12)


def reference(*args, xp_dtype=np.float64, n_head):
    x, mb, wq, bq, wk, bk, wv, bv, wo, bo, g1, c1, w1, b1, w2, b2, g2, c2 = C.cast_all(args, xp_dtype)
    B, S, D = x.shape

    def heads(t):
        return t.reshape(B, S, n_head, -1).transpose(0, 2, 1, 3)
    q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)
    p = C.softmax(q @ k.swapaxes(-1, -2) / math.sqrt(D // n_head) + mb)
    y = (p @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
    x = C.layer_norm(x + y @ wo + bo, g1, c1, 1e-12)
    return C.layer_norm(x + C.gelu_erf(x @ w1 + b1) @ w2 + b2, g2, c2, 1e-12)


def torch_forward(x, mb, wq, bq, wk, bk, wv, bv, wo, bo, g1, c1, w1, b1, w2, b2, g2, c2, *, n_head):
    import torch.nn.functional as F
    B, S, D = x.shape

    def heads(t):
        return t.view(B, S, n_head, D // n_head).transpose(1, 2)
    y = F.scaled_dot_product_attention(heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv), attn_mask=mb)
    x = F.layer_norm(x + y.transpose(1, 2).reshape(B, S, D) @ wo + bo, (D,), g1, c1, 1e-12)
    return F.layer_norm(x + F.gelu(x @ w1 + b1) @ w2 + b2, (D,), g2, c2, 1e-12)


def jax_forward(x, mb, wq, bq, wk, bk, wv, bv, wo, bo, g1, c1, w1, b1, w2, b2, g2, c2, *, n_head):
    import jax
    B, S, D = x.shape

    def ln(t, g, b):
        m = t.mean(-1, keepdims=True)
        return (t - m) * jax.lax.rsqrt(((t - m) ** 2).mean(-1, keepdims=True) + 1e-12) * g + b

    def heads(t):
        return t.reshape(B, S, n_head, D // n_head)
    y = jax.nn.dot_product_attention(heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv), bias=mb)
    x = ln(x + y.reshape(B, S, D) @ wo + bo, g1, c1)
    return ln(x + jax.nn.gelu(x @ w1 + b1, approximate=False) @ w2 + b2, g2, c2)


if __name__ == "__main__":
    C.main(sys.modules[__name__])
