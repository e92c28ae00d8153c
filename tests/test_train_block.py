"""A GPT-2-style block trained for 10 steps by ONE jitted program per step (forward, backward,
AdamW; ``tools/train_workloads.tessera_step``) follows the float64 trajectory of the same block
(forward and backward written out by hand in numpy, ``block_loss_and_grads64`` / ``adamw64``):
every parameter within 0.05 learning rates after 10 steps (typically 1e-4; an element whose
gradient is near zero can reach a few 1e-3, as AdamW divides by the gradient's size), the loss
falling as it does there; a planted wrong backward (attention's gradient without its row-sum term)
leaves the trajectory by ~20 learning rates.

The one exception is the key bias: attention's softmax is unchanged by adding the same amount to
every key's score, so the key bias's exact gradient is zero; float64 gives ~1e-17 and float32
~1e-9, and AdamW, which divides by the gradient's own size, turns either into steps of +-lr.  Its
third of ``b_qkv`` is left out of the comparison."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.passes.tile.kernels import attention_backward
from tessera.tools import train_workloads as T

DIM, HEADS, STEPS, LR = 32, 2, 10, 3e-3


def _train(rng):
    w = T.make_step(rng, 2, 16, DIM, HEADS, oracle=False)
    x, y, p0 = w["x"], w["y"], w["params"]
    n = len(p0)
    a = dict(T.ADAMW, lr=LR)
    P, M, V = [p.copy() for p in p0], [np.zeros_like(p) for p in p0], [np.zeros_like(p) for p in p0]
    P64 = [p.astype(np.float64) for p in p0]
    M64, V64 = [np.zeros_like(p) for p in P64], [np.zeros_like(p) for p in P64]
    fn = T.tessera_step(HEADS)
    losses, losses64 = [], []
    for t in range(1, STEPS + 1):
        out = fn(x, y, *P, *M, *V, float(t), a["lr"], a["b1"], a["b2"], a["eps"], a["wd"])
        losses.append(float(out[0]))
        P, M, V = list(out[1:1 + n]), list(out[1 + n:1 + 2 * n]), list(out[1 + 2 * n:])
        loss64, g64 = T.block_loss_and_grads64(x.astype(np.float64), y.astype(np.float64), P64, HEADS)
        losses64.append(loss64)
        new = [T.adamw64(p, g, m, v, t, a["lr"], a["b1"], a["b2"], a["eps"], a["wd"])
               for p, g, m, v in zip(P64, g64, M64, V64)]
        P64, M64, V64 = [q[0] for q in new], [q[1] for q in new], [q[2] for q in new]
    return P, P64, losses, losses64


def _distance_in_lr(P, P64) -> float:
    worst = 0.0
    for name, p, q in zip(T.NAMES, P, P64):
        d = np.abs(p - q)
        if name == "b_qkv":
            d = np.concatenate([d[:DIM], d[2 * DIM:]])   # the key bias: see the module docstring
        worst = max(worst, float(d.max()) / LR)
    return worst


def test_ten_steps_follow_the_float64_trajectory(rng):
    P, P64, losses, losses64 = _train(rng)
    assert _distance_in_lr(P, P64) < 5e-2
    assert np.allclose(losses, losses64, rtol=1e-4)
    assert losses[-1] < 0.6 * losses[0]


@pytest.mark.slow   # a second cold compile of the whole step
def test_planted_wrong_attention_backward_leaves_the_trajectory(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(T, "_TS_STEP", {})
    real = attention_backward.dscores
    monkeypatch.setattr(attention_backward, "dscores", lambda b, p, dpt, delta, sc: real(
        b, p, dpt, attention_backward.tile_const(b, 0.0, p.type.element_type), sc))   # no row-sum term
    P, P64, _, _ = _train(rng)
    assert _distance_in_lr(P, P64) > 1.0
