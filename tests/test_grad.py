"""tessera.grad / value_and_grad / vjp / stop_gradient: composition with jit, errors, an MLP step.

The per-op rules are checked in test_grad_rules.py; here the transformation around them.
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.errors import GradArgnumsError, GradDtypeError, GradNonScalarError
from tessera.frontend import differentiate as D
from tessera.frontend.trace import Tensor

torch = pytest.importorskip("torch")
O = ts.ops


def loss(x, w, b):
    return O.reduce_sum(O.tanh(x @ w + b) ** 2)


def loss_t(x, w, b):
    return (torch.tanh(x @ w + b) ** 2).sum()


def _torch_grads(fn, *arrays):
    ts_ = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts_)
    return float(out.detach()), [t.numpy() for t in torch.autograd.grad(out, ts_)]


GRAD_JIT = ts.jit(ts.grad(loss, argnums=(0, 1, 2)))
JIT_GRAD_OF_JIT = ts.grad(ts.jit(loss), argnums=(0, 1, 2))


def _xwb(rng):
    return rng.standard_normal((4, 6)), rng.standard_normal((6, 3)), rng.standard_normal(3)


def test_jit_grad_and_grad_jit_agree_with_torch(rng):
    x, w, b = _xwb(rng)
    _, want = _torch_grads(loss_t, x, w, b)
    for got in (GRAD_JIT(x, w, b), JIT_GRAD_OF_JIT(x, w, b)):
        assert len(got) == 3
        for g, t in zip(got, want):
            assert g.shape == t.shape
            np.testing.assert_allclose(g, t, rtol=1e-10, atol=1e-12)


def test_backward_is_one_program_through_the_lane(rng):
    """The lane report of jit(grad) lists the backward GEMMs (dX = dY W^T, dW = X^T dY) in the
    same compiled program as the forward GEMM."""
    x, w, b = _xwb(rng)
    rep = ts.explain(GRAD_JIT, x, w, b)
    gemms = [k for k in rep.kernels if k["kind"] == "gemm"]
    assert len(gemms) == 3, [(k["kernel"], k["kind"]) for k in rep.kernels]
    assert sum("tessera.transpose" in k["ops"] for k in gemms) == 2   # A^T, B^T read as strided views
    assert any("tessera.tanh" in k["ops"] for k in gemms)   # the forward's epilogue


def test_value_and_grad_with_aux(rng):
    x, w, b = _xwb(rng)

    def f(x, w, b):
        y = x @ w + b
        return O.reduce_sum(O.tanh(y) ** 2), O.reduce_max(y)

    (val, aux), (gx, gw) = ts.value_and_grad(f, argnums=(0, 1), has_aux=True)(x, w, b)
    want_val, (tx, tw, _) = _torch_grads(loss_t, x, w, b)
    np.testing.assert_allclose(val, want_val, rtol=1e-12)
    np.testing.assert_allclose(aux, (x @ w + b).max(), rtol=1e-12)
    np.testing.assert_allclose(gx, tx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw, tw, rtol=1e-10, atol=1e-12)
    # the same inside jit, argnums an int: one gradient, not a tuple
    (v2, a2), g2 = ts.jit(ts.value_and_grad(f, has_aux=True))(x, w, b)
    np.testing.assert_allclose(g2, tx, rtol=1e-10, atol=1e-12)
    assert float(v2) == pytest.approx(want_val) and float(a2) == pytest.approx(float(aux))


def test_vjp_matches_torch(rng):
    x, w = rng.standard_normal((3, 5)), rng.standard_normal((5, 4))
    ct = rng.standard_normal((3, 4))
    out, vjp_fn = ts.vjp(lambda x, w: O.softmax(x @ w), x, w)
    gx, gw = vjp_fn(ct)
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    tout = torch.softmax(tx @ tw, -1)
    want = torch.autograd.grad(tout, [tx, tw], torch.tensor(ct))
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(gx, want[0].numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw, want[1].numpy(), rtol=1e-10, atol=1e-12)


def test_vjp_inside_jit_skips_integer_primals(rng):
    x = rng.standard_normal((4, 5))
    y = rng.integers(0, 5, 4).astype(np.int64)

    @ts.jit
    def f(x, y, ct):
        out, back = ts.vjp(lambda x, y: O.cross_entropy(x, y, reduction="none"), x, y)
        gx, gy = back(ct)
        assert gy is None
        return out, gx

    ct = rng.standard_normal(4)
    out, gx = f(x, y, ct)
    tx = torch.tensor(x, requires_grad=True)
    tout = torch.nn.functional.cross_entropy(tx, torch.tensor(y), reduction="none")
    np.testing.assert_allclose(gx, torch.autograd.grad(tout, tx, torch.tensor(ct))[0].numpy(), rtol=1e-10,
                               atol=1e-12)


def test_stop_gradient_and_repeated_argument(rng):
    x = rng.standard_normal((3, 4))
    # d/dx sum(x * stop(x)) = stop(x) = x (not 2x)
    g = ts.grad(lambda x: O.reduce_sum(x * ts.stop_gradient(x)))(x)
    np.testing.assert_allclose(g, x, rtol=1e-14)
    # the same array for two argnums: each gradient counts only its own argument's uses
    ga, gb = ts.grad(lambda a, b: O.reduce_sum(a * a * b), argnums=(0, 1))(x, x)
    np.testing.assert_allclose(ga, 2 * x * x, rtol=1e-13)
    np.testing.assert_allclose(gb, x * x, rtol=1e-13)
    # an argument the output does not depend on: zeros (as JAX)
    gz = ts.grad(lambda a, b: O.reduce_sum(a * 2.0), argnums=1)(x, x[0])
    assert gz.shape == (4,) and not gz.any()
    assert ts.stop_gradient(x) is x   # on an array outside a trace


def test_grad_of_grad(rng):
    """A second sweep differentiates the first one's backward nodes: d2/dx2 sum(sin x) = -sin x."""
    x = rng.standard_normal(5)
    g2 = ts.grad(lambda x: O.reduce_sum(ts.grad(lambda x: O.reduce_sum(O.sin(x)))(x)))(x)
    np.testing.assert_allclose(g2, -np.sin(x), rtol=1e-12)


def test_planted_wrong_rule_fails_the_torch_check(rng, monkeypatch):
    """Teeth: tanh's rule without the square (g * (1 - y)) breaks the gradient the API returns."""
    def wrong(n, g, need):
        return [O.mul(g, 1.0 - Tensor(n))]
    monkeypatch.setitem(D.RULES, "tanh", wrong)
    x, w, b = _xwb(rng)
    got = ts.grad(loss)(x, w, b)
    _, want = _torch_grads(loss_t, x, w, b)
    assert not np.allclose(got, want[0], rtol=1e-6)


def test_bad_input_gets_coded_errors(rng):
    x, w, b = _xwb(rng)
    with pytest.raises(GradNonScalarError, match="float scalar"):
        ts.grad(lambda x: x * 2.0)(x)
    with pytest.raises(GradNonScalarError):
        ts.jit(ts.grad(lambda x: O.reduce_sum(x, 0)))(x)
    labels = rng.integers(0, 3, 4).astype(np.int32)
    with pytest.raises(GradDtypeError, match="argument 1 is i32"):
        ts.grad(lambda x, y: O.cross_entropy(x, y), argnums=1)(x[:, :3], labels)
    with pytest.raises(GradArgnumsError, match="out of range"):
        ts.grad(loss, argnums=3)(x, w, b)
    with pytest.raises(GradArgnumsError):
        ts.grad(loss, argnums=(0, "w"))
    with pytest.raises(GradArgnumsError):
        ts.grad(loss, argnums=True)
    assert GradNonScalarError.code == "GRAD_NON_SCALAR" and GradDtypeError.code == "GRAD_DTYPE"


# --------------------------------------------------------------------------- an MLP training step
def mlp_loss(x, labels, w1, b1, w2, b2):
    h = O.relu(x @ w1 + b1)
    return O.cross_entropy(h @ w2 + b2, labels)


def mlp_loss_t(x, labels, w1, b1, w2, b2):
    h = torch.relu(x @ w1 + b1)
    return torch.nn.functional.cross_entropy(h @ w2 + b2, labels)


@ts.jit
def sgd_step(x, labels, w1, b1, w2, b2, lr):
    loss, grads = ts.value_and_grad(mlp_loss, argnums=(2, 3, 4, 5))(x, labels, w1, b1, w2, b2)
    return (loss,) + tuple(p - lr * g for p, g in zip((w1, b1, w2, b2), grads))


def test_mlp_training_step_matches_torch_float64(rng):
    """The examples/models MLP (relu, cross-entropy from logits) trained by grad instead of the
    hand-written backward: loss and updated parameters match torch.autograd in float64, and
    three steps lower the loss."""
    b, din, hid, c = 16, 12, 20, 5
    x = rng.standard_normal((b, din))
    labels = rng.integers(0, c, b).astype(np.int64)
    params = [rng.standard_normal((din, hid)) / np.sqrt(din), 0.1 * rng.standard_normal(hid),
              rng.standard_normal((hid, c)) / np.sqrt(hid), 0.1 * rng.standard_normal(c)]
    tp = [torch.tensor(p, requires_grad=True) for p in params]
    tl = mlp_loss_t(torch.tensor(x), torch.tensor(labels), *tp)
    tg = torch.autograd.grad(tl, tp)
    loss, *new = sgd_step(x, labels, *params, 0.5)
    np.testing.assert_allclose(loss, float(tl.detach()), rtol=1e-12)
    for p, n, g in zip(params, new, tg):
        np.testing.assert_allclose(n, p - 0.5 * g.numpy(), rtol=1e-10, atol=1e-12)
    losses = [float(loss)]
    for _ in range(3):
        out = sgd_step(x, labels, *new, 0.5)
        losses.append(float(out[0]))
        new = out[1:]
    assert losses[-1] < losses[0] * 0.9, losses


GRAD_F32 = ts.jit(ts.grad(mlp_loss, argnums=(2, 3, 4, 5)))


def test_float32_gradients_serve_every_batch_size_from_one_compile(rng):
    """float32 gradients match torch float32; the backward keeps the batch size symbolic (the
    cotangent broadcasts are conditioned on a tensor of the shape, not a static iota)."""
    params = [(s * rng.standard_normal(shape)).astype(np.float32)
              for s, shape in ((0.3, (12, 20)), (0.1, (20,)), (0.3, (20, 5)), (0.1, (5,)))]
    for b in (8, 24):
        x = rng.standard_normal((b, 12)).astype(np.float32)
        labels = rng.integers(0, 5, b).astype(np.int64)
        got = GRAD_F32(x, labels, *params)
        tp = [torch.tensor(p, requires_grad=True) for p in params]
        want = torch.autograd.grad(mlp_loss_t(torch.tensor(x), torch.tensor(labels), *tp), tp)
        for g, t in zip(got, want):
            assert g.dtype == np.float32
            np.testing.assert_allclose(g, t.numpy(), rtol=1e-4, atol=1e-6)
    assert len(GRAD_F32.compiles) == 1, GRAD_F32.compiles
