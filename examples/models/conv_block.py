"""A ResNet basic block as users write it: 3x3 convolution, bias and ReLU; a second 3x3
convolution, the residual, ReLU; then 2x2 max pooling (NCHW, "same" padding).

Run: ./dev python examples/models/conv_block.py [small|large]
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tessera as ts  # noqa: E402
from models import common as C  # noqa: E402

SIZES = {"small": dict(batch=4, channels=64, size=28), "large": dict(batch=8, channels=64, size=56)}


def make(rng, batch, channels, size):
    x = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
    fan = channels * 9
    w1 = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(fan)).astype(np.float32)
    w2 = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(fan)).astype(np.float32)
    return [x, w1, C.bias(rng, channels), w2, C.bias(rng, channels)], {}


@ts.jit
def forward(x, w1, b1, w2, b2):
    h = ts.ops.relu(ts.ops.conv2d(x, w1, b1, padding="same"))
    h = ts.ops.relu(ts.ops.conv2d(h, w2, b2, padding="same") + x)
    return ts.ops.max_pool2d(h, 2)


def _conv_same(x, w, b):
    N, Ci, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((N, w.shape[0], H, W), x.dtype)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + H, j:j + W], w[:, :, i, j])
    return out + b[None, :, None, None]


def reference(x, w1, b1, w2, b2, xp_dtype=np.float64):
    x, w1, b1, w2, b2 = (a.astype(xp_dtype) for a in (x, w1, b1, w2, b2))
    h = np.maximum(_conv_same(x, w1, b1), 0)
    h = np.maximum(_conv_same(h, w2, b2) + x, 0)
    N, Co, H, W = h.shape
    return h[:, :, :H // 2 * 2, :W // 2 * 2].reshape(N, Co, H // 2, 2, W // 2, 2).max((3, 5))


def torch_forward(x, w1, b1, w2, b2):
    import torch.nn.functional as F
    h = F.relu(F.conv2d(x, w1, b1, padding="same"))
    h = F.relu(F.conv2d(h, w2, b2, padding="same") + x)
    return F.max_pool2d(h, 2)


def jax_forward(x, w1, b1, w2, b2):
    import jax

    def conv(t, w, b):
        return jax.lax.conv_general_dilated(t, w, (1, 1), "SAME",
                                            dimension_numbers=("NCHW", "OIHW", "NCHW")) + b[None, :, None, None]
    h = jax.nn.relu(conv(x, w1, b1))
    h = jax.nn.relu(conv(h, w2, b2) + x)
    return jax.lax.reduce_window(h, -jax.numpy.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


if __name__ == "__main__":
    C.main(sys.modules[__name__])
