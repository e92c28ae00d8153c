"""Backward row kernels: cross-entropy's gradient is ONE row kernel (softmax, the label mask from
the column index, the subtraction and the row scale), with no one-hot tensor built; values against
float64 numpy (mean reduction, ignore_index, rank 3); a plant that keeps the mask out of the row
kernel is caught."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.passes.graph import fuse_rowwise

O = ts.ops
XENT_GRAD = ts.jit(ts.grad(lambda z, y: O.cross_entropy(z, y, ignore_index=2)))


def oracle(z, y, ignore=2):
    z2, y2 = z.reshape(-1, z.shape[-1]).astype(np.float64), y.reshape(-1)
    p = np.exp(z2 - z2.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y2)), y2] -= 1
    keep = y2 != ignore
    return (p * keep[:, None] / max(keep.sum(), 1)).reshape(z.shape)


def _backward_row_kernels(rep):
    return [k for k in rep.kernels if k["kind"] == "rowwise" and "tessera.softmax" in k["ops"]]


def test_cross_entropy_backward_is_one_row_kernel(rng):
    z = rng.standard_normal((3, 7, 41)).astype(np.float32)
    y = rng.integers(0, 41, (3, 7))
    y[0, :3] = 2   # ignored rows
    got = XENT_GRAD(z, y)
    assert np.abs(got - oracle(z, y)).max() < 1e-7
    rep = ts.explain(XENT_GRAD, z, y)
    rows = _backward_row_kernels(rep)
    assert len(rows) == 1 and {"tessera.iota", "tessera.equal", "tessera.sub"} <= set(rows[0]["ops"])
    assert not any("tessera.one_hot" in k["ops"] for k in rep.kernels)


def test_plant_mask_outside_the_row_kernel_is_caught(rng, monkeypatch):
    """Teeth: the former epilogue rule (the mask's tree left outside) fails the kernel check."""
    real = fuse_rowwise._epilogue
    monkeypatch.setattr(fuse_rowwise, "_epilogue", lambda v, group, trees=False: real(v, group, False))
    z = rng.standard_normal((5, 19)).astype(np.float32)   # (another shape: a fresh compile)
    y = rng.integers(0, 19, (5,))
    f = ts.jit(ts.grad(lambda z, y: O.cross_entropy(z, y)))
    rows = _backward_row_kernels(ts.explain(f, z, y))
    assert not (len(rows) == 1 and "tessera.iota" in rows[0]["ops"])


def _norm64(x, g, b, centred):
    x = x.astype(np.float64)
    xc = x - x.mean(-1, keepdims=True) if centred else x
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5) * g + (b if b is not None else 0.0)


def _fd_grads(f, args, eps=1e-6):
    """Central differences of the float64 function ``f`` in every argument."""
    out = []
    for i, a in enumerate(args):
        d = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            hi, lo = [x.copy() for x in args], [x.copy() for x in args]
            hi[i][idx] += eps
            lo[i][idx] -= eps
            d[idx] = (f(*hi) - f(*lo)) / (2 * eps)
        out.append(d)
    return out


@pytest.mark.parametrize("all_args", [True, False], ids=["with-w", "without-w"])
@pytest.mark.parametrize("centred", [True, False], ids=["layer_norm", "rms_norm"])
def test_norm_gradient_seeded_through_the_row_kernel(rng, centred, all_args):
    """grad of sum(norm(x, g[, b]) * w) in x, g, b (and w): without w's gradient, the gradient's seed
    constant stood before the norm in the fused row kernel, which then read the norm's input as a
    prologue value and failed (KeyError in lower-schedule-to-tile)."""
    x, w = rng.standard_normal((2, 6, 13)), rng.standard_normal((2, 6, 13))
    g, b = rng.standard_normal(13), rng.standard_normal(13)
    if centred:
        args = (x, g, b, w)
        f = lambda x, g, b, w: (O.layer_norm(x, g, b) * w).sum()         # noqa: E731
        f64 = lambda x, g, b, w: (_norm64(x, g, b, True) * w).sum()      # noqa: E731
    else:
        args = (x, g, w)
        f = lambda x, g, w: (O.rms_norm(x, g) * w).sum()                 # noqa: E731
        f64 = lambda x, g, w: (_norm64(x, g, None, False) * w).sum()     # noqa: E731
    args32 = [a.astype(np.float32) for a in args]
    n = len(args) if all_args else len(args) - 1
    got = ts.jit(ts.grad(f, argnums=tuple(range(n))))(*args32)
    want = _fd_grads(f64, [a.astype(np.float64) for a in args32])[:n]
    for i, (gv, wv) in enumerate(zip(got, want)):
        assert np.abs(gv - wv).max() <= 1e-4 * (1 + np.abs(wv).max()), i
