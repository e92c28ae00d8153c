"""A sampling step as users write it: embedding lookup of the token ids, a final RMSNorm of the
last position, logits against the tied embedding table divided by a temperature (a runtime
value: one compile serves every temperature), then greedy argmax and the top-k candidates.

Run: ./dev python examples/models/sampler.py [small|large]
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tessera as ts  # noqa: E402
from models import common as C  # noqa: E402

SIZES = {"small": dict(batch=8, seq=64, vocab=8192, dim=512, k=40),
         "large": dict(batch=16, seq=128, vocab=32000, dim=1024, k=50)}


def make(rng, batch, seq, vocab, dim, k):
    ids = rng.integers(0, vocab, size=(batch, seq)).astype(np.int64)
    return [ids, C.param(rng, vocab, dim, scale=0.05), C.gain(rng, dim), 0.8], {"k": k}


@ts.jit(static_argnames="k")
def forward(ids, table, norm_g, temperature, *, k):
    h = ts.ops.take(table, ids[:, -1], axis=0)            # the last position's embeddings [B, D]
    logits = ts.ops.rms_norm(h, norm_g) @ table.T / temperature
    values, indices = ts.ops.top_k(logits, k)
    return ts.ops.argmax(logits, axis=-1), values, indices


def reference(ids, table, norm_g, temperature, xp_dtype=np.float64, *, k):
    table, norm_g = table.astype(xp_dtype), norm_g.astype(xp_dtype)
    logits = C.rms_norm(table[ids[:, -1]], norm_g) @ table.T / temperature
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return np.argmax(logits, -1), np.take_along_axis(logits, order, -1), order


def torch_forward(ids, table, norm_g, temperature, *, k):
    import torch
    h = table[ids[:, -1]]
    logits = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_g) @ table.T / temperature
    values, indices = torch.topk(logits, k)
    return logits.argmax(-1), values, indices


def jax_forward(ids, table, norm_g, temperature, *, k):
    import jax
    h = table[ids[:, -1]]
    logits = (h * jax.lax.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6) * norm_g) @ table.T / temperature
    values, indices = jax.lax.top_k(logits, k)
    return logits.argmax(-1), values, indices


if __name__ == "__main__":
    C.main(sys.modules[__name__])
