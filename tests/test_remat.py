"""Rematerialisation (frontend/remat.py): the save / recompute rule of a gradient's backward and
``tessera.checkpoint``.  Values against a hand-written float64 numpy backward; what the lane report
says is saved, and its bytes; plants (a checkpoint that recomputes nothing, a recompute of the
wrong op) caught."""
from __future__ import annotations

import numpy as np

import tessera as ts
from tessera.frontend import reference, remat
from tessera.frontend.trace import ARRAY, trace

O = ts.ops


def block(x, w1, w2):
    return O.tanh(O.silu(x @ w1) @ w2) * 2.0 + x


def loss(x, w1, w2):
    return O.reduce_sum(O.square(block(x, w1, w2)))


def loss_ckpt(x, w1, w2):
    return O.reduce_sum(O.square(ts.checkpoint(block)(x, w1, w2)))


PLAIN = ts.jit(ts.value_and_grad(loss, argnums=(0, 1, 2)))
CKPT = ts.jit(ts.value_and_grad(loss_ckpt, argnums=(0, 1, 2)))


def oracle(x, w1, w2):
    """float64 numpy: the loss and its gradients, backward written by hand."""
    z1 = x @ w1
    s = 1 / (1 + np.exp(-z1))
    h = z1 * s
    t = np.tanh(h @ w2)
    y = 2 * t + x
    dy = 2 * y
    dz2 = 2 * dy * (1 - t * t)
    dh = dz2 @ w2.T
    dz1 = dh * s * (1 + z1 * (1 - s))
    return float((y * y).sum()), (dz1 @ w1.T + dy, x.T @ dz1, h.T @ dz2)


def _args(rng, b=5, d=6, f=7):
    return rng.standard_normal((b, d)), rng.standard_normal((d, f)) * 0.5, rng.standard_normal((f, d)) * 0.5


def _traced(fn, args):
    """The trace of ``value_and_grad(fn)`` (no compile: what is saved is known from the trace)."""
    return trace(ts.value_and_grad(fn, argnums=tuple(range(len(args)))), list(args), [ARRAY] * len(args))


def _check(fn, args) -> float:
    val, grads = fn(*args)
    want_v, want_g = oracle(*args)
    err = abs(float(val) - want_v) / max(1.0, abs(want_v))
    for g, w in zip(grads, want_g):
        err = max(err, float(np.abs(g - w).max() / max(1.0, np.abs(w).max())))
    return err


def test_checkpoint_keeps_values(rng):
    args = _args(rng)
    assert _check(PLAIN, args) < 1e-12
    assert _check(CKPT, args) < 1e-12


def test_explain_shows_what_is_saved_and_checkpoint_saves_less(rng):
    x, w1, w2 = _args(rng)
    plain, ck = ts.explain(PLAIN, x, w1, w2), ts.explain(CKPT, x, w1, w2)
    # the rule: both GEMM outputs saved (silu and tanh are recomputed from them), 8 bytes each
    assert plain.saved_bytes == (5 * 7 + 5 * 6) * 8
    assert "saved" in str(plain) and "matmul [5, 7] float64: 280 B" in str(plain)
    assert not any(w in s for s in plain.saved for w in ("silu", "tanh"))
    # checkpoint: the region's inputs are arguments, so nothing is kept from the forward
    assert ck.saved_bytes == 0 < plain.saved_bytes


def test_checkpoint_of_an_inner_region_keeps_its_inputs(rng):
    """A region whose input is a forward GEMM output keeps that input (and recomputes the rest)."""
    def f(x, w1, w2):
        a = x @ w1                                   # saved: the region's input
        return O.reduce_sum(ts.checkpoint(lambda u: O.tanh(u @ w2))(O.relu(a)))
    assert remat.saved_bytes(_traced(f, _args(rng))) == 5 * 7 * 8


def test_plant_a_checkpoint_that_recomputes_nothing_is_caught(rng, monkeypatch):
    monkeypatch.setattr(remat, "_regions", lambda graph: [])
    assert remat.saved_bytes(_traced(loss_ckpt, _args(rng))) > 0


def test_plant_a_wrong_recompute_is_caught(rng, monkeypatch):
    """A recompute that clones tanh as sigmoid changes the gradient; the oracle sees it (the traced
    program run by the float64 reference lane)."""
    real = remat._clone

    def wrong(n):
        c = real(n)
        if getattr(c, "op", None) == "tanh":
            c.op = "sigmoid"
        return c
    args = _args(rng)
    ok = reference.evaluate(_traced(loss_ckpt, args), list(args))
    assert _check(lambda *a: (ok[0], ok[1:]), args) < 1e-12
    monkeypatch.setattr(remat, "_clone", wrong)
    bad = reference.evaluate(_traced(loss_ckpt, args), list(args))
    assert _check(lambda *a: (bad[0], bad[1:]), args) > 1e-3


def test_checkpoint_outside_a_gradient_is_the_function(rng):
    x, w1, w2 = _args(rng)
    got = ts.jit(lambda a, b, c: ts.checkpoint(block)(a, b, c))(x, w1, w2)
    z1 = x @ w1
    np.testing.assert_allclose(got, np.tanh((z1 / (1 + np.exp(-z1))) @ w2) * 2 + x, rtol=1e-12, atol=1e-12)
    assert ts.checkpoint(lambda v: v + 1)(2) == 3


def test_grad_of_grad_through_recomputed_values(rng):
    """A second sweep runs over the first's backward, recomputed clones included."""
    f = ts.jit(ts.grad(lambda x: O.reduce_sum(ts.grad(lambda y: O.reduce_sum(O.tanh(y) ** 3))(x))))
    x = rng.standard_normal((3, 4))
    t = np.tanh(x)
    # d/dx of sum(3 t^2 (1 - t^2)) = (6 t - 12 t^3)(1 - t^2)
    np.testing.assert_allclose(f(x), (6 * t - 12 * t ** 3) * (1 - t * t), rtol=1e-12, atol=1e-12)
