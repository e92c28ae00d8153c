"""Backward row kernels: cross-entropy's gradient is ONE row kernel (softmax, the label mask from
the column index, the subtraction and the row scale), with no one-hot tensor built; values against
float64 numpy (mean reduction, ignore_index, rank 3); a plant that keeps the mask out of the row
kernel is caught."""
from __future__ import annotations

import numpy as np

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
