"""tessera.optim.adamw: against AdamW written in float64 numpy (and torch.optim.AdamW where torch
is installed), one compile for every learning rate and step, one elementwise pass per parameter,
and a small MLP trained by a jitted value_and_grad + adamw step matched against float64 numpy.
Plants (no bias correction; moments not fused into the update) are caught."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import optim
from tessera.errors import ArgumentError

O = ts.ops


def adamw64(p, g, m, v, t, lr, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2):
    """torch.optim.AdamW's update in float64 numpy."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps
    return p - lr / (1 - b1 ** t) * m / denom, m, v


def _tree(rng, dtype):
    shapes = {"w": (7, 5), "b": (5,), "deep": [(3, 2, 4), (1,)]}
    mk = lambda s: rng.standard_normal(s).astype(dtype)   # noqa: E731
    return {"w": mk(shapes["w"]), "b": mk(shapes["b"]), "deep": [mk(s) for s in shapes["deep"]]}


def _leaves(t):
    return [t["w"], t["b"], *t["deep"]]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_adamw_matches_float64_numpy_over_steps_and_learning_rates(rng, dtype, tol):
    params = _tree(rng, dtype)
    m = {k: (np.zeros_like(x) if k != "deep" else [np.zeros_like(y) for y in x]) for k, x in params.items()}
    v = {k: (np.zeros_like(x) if k != "deep" else [np.zeros_like(y) for y in x]) for k, x in params.items()}
    ref = [(x.astype(np.float64), np.zeros(x.shape), np.zeros(x.shape)) for x in _leaves(params)]
    for t, lr in enumerate((1e-2, 3e-3, 5e-2, 1e-3), start=1):
        grads = _tree(rng, dtype)
        params, m, v = optim.adamw(params, grads, m, v, t, lr=lr, weight_decay=0.05)
        ref = [adamw64(p, g.astype(np.float64), mm, vv, t, lr, wd=0.05)
               for (p, mm, vv), g in zip(ref, _leaves(grads))]
    assert isinstance(params, dict) and isinstance(params["deep"], list)
    for got, (p, mm, vv) in zip(zip(_leaves(params), _leaves(m), _leaves(v)), ref):
        for a, b in zip(got, (p, mm, vv)):
            assert a.dtype == dtype
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    # one compile per dtype (the other parametrization may share the program), none per step or rate
    assert len(optim._JITTED[(4, False)].compiles) <= 2
    assert not any("read as a Python value" in c for c in optim._JITTED[(4, False)].compiles)


def test_matches_torch_adamw(rng):
    torch = pytest.importorskip("torch")
    P = [rng.standard_normal((6, 4)), rng.standard_normal(4)]
    tp = [torch.tensor(p.copy(), requires_grad=True) for p in P]
    opt = torch.optim.AdamW(tp, lr=2e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    M, V = [np.zeros_like(p) for p in P], [np.zeros_like(p) for p in P]
    for t in range(1, 4):
        G = [rng.standard_normal(p.shape) for p in P]
        P, M, V = optim.adamw(P, G, M, V, t, lr=2e-2, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1)
        for x, g in zip(tp, G):
            x.grad = torch.tensor(g)
        opt.step()
    for a, b in zip(P, tp):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-12, atol=1e-12)


def _args(rng, n=2):
    P = [rng.standard_normal((33, 17)) for _ in range(n)]
    G = [rng.standard_normal((33, 17)) for _ in range(n)]
    return P, G, [np.zeros_like(p) for p in P], [rng.random((33, 17)) for _ in P]


def test_one_elementwise_pass_per_parameter(rng):
    """Each parameter's update is one group writing p', m' and v', and every parameter's group runs
    in one kernel (fuse-multi-tensor), beside one kernel of the 0-d scalar coefficients."""
    P, G, M, V = _args(rng)
    optim.adamw(P, G, M, V, 1)
    rep = optim._JITTED[(2, False)].explain(*P, *G, *M, *V, 1.0, 1e-3, 0.9, 0.999, 1e-8, 1e-2)
    full = [k for k in rep.kernels if "tessera.sqrt" in k["ops"] and k["ops"].count("tessera.add") == 2 * 3]
    assert len(full) == 1 and len(rep.kernels) == 2, [k["ops"] for k in rep.kernels]


def test_plant_unfused_moments_is_caught(rng, monkeypatch):
    """Teeth: without the returned-output fusion, m' and v' are kernels of their own."""
    from tessera.passes.graph import fuse_elementwise
    monkeypatch.setattr(fuse_elementwise, "returned_besides_one", lambda v: False)
    monkeypatch.setattr(optim, "_JITTED", {})
    P, G, M, V = _args(rng, 3)   # (another parameter count: not the cached program)
    optim.adamw(P, G, M, V, 1)
    rep = optim._JITTED[(3, False)].explain(*P, *G, *M, *V, 1.0, 1e-3, 0.9, 0.999, 1e-8, 1e-2)
    moments = [k for k in rep.kernels if "tessera.sqrt" not in k["ops"] and k["ops"].count("tessera.mul") >= 2]
    assert len(rep.kernels) > 2 and moments, [k["ops"] for k in rep.kernels]   # m', v' apart from p'


def test_plant_a_missing_bias_correction_is_caught(rng, monkeypatch):
    real = optim._coefficients

    def no_bc1(step, lr, b1, b2, eps, wd):
        co = list(real(step, lr, b1, b2, eps, wd))
        co[1] = lr * 1.0
        return tuple(co)
    monkeypatch.setattr(optim, "_coefficients", no_bc1)
    monkeypatch.setattr(optim, "_JITTED", {})
    P, G, M, V = _args(rng)
    got = optim.adamw(P, G, M, V, 2, lr=1e-2)[0]
    want = [adamw64(p, g, m, v, 2, 1e-2)[0] for p, g, m, v in zip(P, G, M, V)]
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, want)) > 1e-4


def test_bad_trees_are_refused(rng):
    P, G, M, V = _args(rng)
    with pytest.raises(ArgumentError) as e:
        optim.adamw(P, G[:1], M, V, 1)
    assert e.value.code == "BAD_ARGUMENT"
    with pytest.raises(ArgumentError):
        optim.adamw(P, [G[0], G[1][:3]], M, V, 1)


# ---------------------------------------------------------------------------- a training loop

def _mlp_loss(x, y, w1, b, w2):
    return O.reduce_mean(O.square(O.tanh(x @ w1 + b) @ w2 - y))


@ts.jit
def train_step(x, y, w1, b, w2, m1, mb, m2, v1, vb, v2, t, lr):
    loss, grads = ts.value_and_grad(_mlp_loss, argnums=(2, 3, 4))(x, y, w1, b, w2)
    params, m, v = optim.adamw([w1, b, w2], list(grads), [m1, mb, m2], [v1, vb, v2], t, lr=lr)
    return (loss, *params, *m, *v)


def _mlp64(x, y, w1, b, w2):
    """float64 numpy: the loss and its gradients (backward by hand)."""
    h = np.tanh(x @ w1 + b)
    r = h @ w2 - y
    loss = float((r * r).mean())
    dr = 2 * r / r.size
    dh = dr @ w2.T * (1 - h * h)
    return loss, (x.T @ dh, dh.sum(0), h.T @ dr)


def test_mlp_training_loop_reduces_loss_and_matches_float64(rng):
    x = rng.standard_normal((16, 8))
    y = np.sin(x[:, :3] * 2)
    params = [rng.standard_normal((8, 12)) * 0.5, rng.standard_normal(12) * 0.1, rng.standard_normal((12, 3)) * 0.5]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    ref = [p.copy() for p in params]
    rm, rv = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
    losses, ref_losses = [], []
    for t in range(1, 9):
        lr = 0.05 if t < 5 else 0.02
        out = train_step(x, y, *params, *m, *v, t, lr)
        losses.append(float(out[0]))
        params, m, v = list(out[1:4]), list(out[4:7]), list(out[7:10])
        loss, grads = _mlp64(x, y, *ref)
        ref_losses.append(loss)
        new = [adamw64(p, g, mm, vv, t, lr) for p, g, mm, vv in zip(ref, grads, rm, rv)]
        ref, rm, rv = [n[0] for n in new], [n[1] for n in new], [n[2] for n in new]
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    for a, b in zip(params, ref):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert losses[-1] < 0.6 * losses[0]
    assert len(train_step.compiles) == 1   # every step and learning rate from one compile
