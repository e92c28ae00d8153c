"""One decoding step's attention as users write it: the new token's query heads against the KV
cache, grouped-query (heads query heads share each of kv_heads cache heads).  It runs as the
split-K decode kernel (kernels/attention_decode.py): the lane report names
``k0_attention_decode``.

Run: ./dev python examples/models/decode_attention.py [small|large]
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tessera as ts  # noqa: E402
from models import common as C  # noqa: E402

SIZES = {"small": dict(batch=1, heads=32, kv_heads=8, head_dim=128, seq=4096),
         "large": dict(batch=1, heads=32, kv_heads=8, head_dim=128, seq=32768)}


def make(rng, batch, heads, kv_heads, head_dim, seq):
    q = rng.standard_normal((batch, heads, 1, head_dim)).astype(np.float32)
    k_cache = rng.standard_normal((batch, kv_heads, seq, head_dim)).astype(np.float32)
    v_cache = rng.standard_normal((batch, kv_heads, seq, head_dim)).astype(np.float32)
    return [q, k_cache, v_cache], {}


@ts.jit
def forward(q, k_cache, v_cache):
    return ts.ops.attention(q, k_cache, v_cache)


def reference(q, k_cache, v_cache, xp_dtype=np.float64):
    q, k, v = C.cast_all([q, k_cache, v_cache], xp_dtype)
    B, H, S, D = q.shape
    g = H // k.shape[1]
    qg = q.reshape(B, k.shape[1], g * S, D)           # a kv head's query heads side by side
    p = C.softmax(qg @ k.swapaxes(-1, -2) / math.sqrt(D))
    return (p @ v).reshape(B, H, S, -1)


def torch_forward(q, k_cache, v_cache):
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)


def jax_forward(q, k_cache, v_cache):
    import jax
    import jax.numpy as jnp
    B, H, S, D = q.shape
    hk = k_cache.shape[1]
    qg = q.reshape(B, hk, H // hk * S, D)
    s = jnp.einsum("bhqd,bhkd->bhqk", qg, k_cache) / math.sqrt(D)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v_cache).reshape(B, H, S, -1)


if __name__ == "__main__":
    C.main(sys.modules[__name__])
