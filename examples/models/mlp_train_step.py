"""An MLP training step as users write it before autodiff: forward, a cross-entropy loss from
logits and integer labels, the backward pass by hand (softmax minus one-hot, transposed GEMMs,
the ReLU's mask), and an SGD update with a runtime learning rate.

Run: ./dev python examples/models/mlp_train_step.py [small|large]
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tessera as ts  # noqa: E402
from models import common as C  # noqa: E402

SIZES = {"small": dict(batch=256, din=784, hidden=1024, classes=10),
         "large": dict(batch=1024, din=1024, hidden=4096, classes=1000)}


def make(rng, batch, din, hidden, classes):
    x = rng.standard_normal((batch, din)).astype(np.float32)
    labels = rng.integers(0, classes, size=batch).astype(np.int64)
    return [x, labels, C.param(rng, din, hidden), C.bias(rng, hidden), C.param(rng, hidden, classes),
            C.bias(rng, classes), 0.05], {}


@ts.jit
def forward(x, labels, w1, b1, w2, b2, lr):
    B, n_classes = x.shape[0], w2.shape[1]
    h = ts.ops.relu(x @ w1 + b1)
    logits = h @ w2 + b2
    loss = ts.ops.cross_entropy(logits, labels)
    dlogits = (ts.ops.softmax(logits) - ts.ops.one_hot(labels, n_classes)) / B
    dh = ts.ops.where(h > 0, dlogits @ w2.T, 0.0)
    return (loss, w1 - lr * (x.T @ dh), b1 - lr * dh.sum(0),
            w2 - lr * (h.T @ dlogits), b2 - lr * dlogits.sum(0))


def reference(x, labels, w1, b1, w2, b2, lr, xp_dtype=np.float64):
    x, w1, b1, w2, b2 = (a.astype(xp_dtype) for a in (x, w1, b1, w2, b2))
    B = x.shape[0]
    h = np.maximum(x @ w1 + b1, 0)
    logits = h @ w2 + b2
    m = logits.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(-1))
    loss = np.mean(lse - logits[np.arange(B), labels])
    onehot = np.eye(w2.shape[1], dtype=xp_dtype)[labels]
    dlogits = (C.softmax(logits) - onehot) / B
    dh = np.where(h > 0, dlogits @ w2.T, 0)
    return (loss, w1 - lr * (x.T @ dh), b1 - lr * dh.sum(0), w2 - lr * (h.T @ dlogits), b2 - lr * dlogits.sum(0))


def torch_forward(x, labels, w1, b1, w2, b2, lr):
    import torch
    import torch.nn.functional as F
    B = x.shape[0]
    h = torch.relu(x @ w1 + b1)
    logits = h @ w2 + b2
    loss = F.cross_entropy(logits, labels)
    dlogits = (torch.softmax(logits, -1) - F.one_hot(labels, w2.shape[1]).to(x.dtype)) / B
    dh = torch.where(h > 0, dlogits @ w2.T, 0.0)
    return loss, w1 - lr * (x.T @ dh), b1 - lr * dh.sum(0), w2 - lr * (h.T @ dlogits), b2 - lr * dlogits.sum(0)


def jax_forward(x, labels, w1, b1, w2, b2, lr):
    import jax
    import jax.numpy as jnp
    B = x.shape[0]
    h = jax.nn.relu(x @ w1 + b1)
    logits = h @ w2 + b2
    loss = jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])
    dlogits = (jax.nn.softmax(logits) - jax.nn.one_hot(labels, w2.shape[1])) / B
    dh = jnp.where(h > 0, dlogits @ w2.T, 0.0)
    return loss, w1 - lr * (x.T @ dh), b1 - lr * dh.sum(0), w2 - lr * (h.T @ dlogits), b2 - lr * dlogits.sum(0)


if __name__ == "__main__":
    C.main(sys.modules[__name__])
