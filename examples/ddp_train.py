"""Data-parallel training on torch.distributed (DDP, gloo on the CPU) around a model whose blocks are
Tessera ops.

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/ddp_train.py --steps 5 --out build/ddp

Each block is a ``tessera.torch.op`` (its forward the compiled CPU kernel, its backward the
``tessera.vjp`` program, ``frontend/torch_op_grad.py``); the loss, the optimizer and every
collective are torch's: ``DistributedDataParallel`` all-reduces the gradients (averaged over the
ranks) after each backward.  Each rank trains on its own contiguous share of one global batch,
so after every step the parameters equal those of one process training on the whole batch
(``tests/test_distributed.py`` checks it).  Every rank writes its final parameters, losses and
the lanes its Tessera calls ran on (``tessera.lane_log``) to ``<out>/rank<r>.npz``.

``--fsdp`` shards the parameters with FSDP2 (``fully_shard``) instead: each rank keeps half of
every parameter, FSDP all-gathers them before the forward and the backward and reduce-scatters
the gradients; the Tessera ops see ordinary (unsharded) tensors.

``--no-ddp`` is the planted bug of the test: the same model without DDP (no gradient
all-reduce), so each rank fits its own share and the ranks drift apart.
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F

import tessera as ts


def dense_gelu(x, w, b):
    return ts.ops.gelu(x @ w + b)


def norm(x, g, b):
    return ts.ops.layer_norm(x, g, b)


def dense(x, w, b):
    return x @ w + b


dense_gelu_op = ts.torch.op(dense_gelu, name="tessera_ddp::dense_gelu")
norm_op = ts.torch.op(norm, name="tessera_ddp::norm")
dense_op = ts.torch.op(dense, name="tessera_ddp::dense")

PARAMS = ("w1", "b1", "g", "beta", "w2", "b2")


def init_params(d_in: int, d_hidden: int, d_out: int, seed: int = 0, dtype=torch.float32) -> dict:
    """The initial parameters: the same on every rank (DDP also broadcasts rank 0's at construction)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    p = {"w1": r(d_in, d_hidden) / d_in ** 0.5, "b1": 0.1 * r(d_hidden), "g": 1 + 0.1 * r(d_hidden),
         "beta": 0.1 * r(d_hidden), "w2": r(d_hidden, d_out) / d_hidden ** 0.5, "b2": 0.1 * r(d_out)}
    return {k: v.to(dtype) for k, v in p.items()}


class TesseraMLP(torch.nn.Module):
    """dense + GELU -> layer norm -> dense, each block a Tessera op."""

    def __init__(self, params: dict):
        super().__init__()
        for k in PARAMS:
            setattr(self, k, torch.nn.Parameter(params[k].clone()))

    def forward(self, x):
        h = dense_gelu_op(x, self.w1, self.b1)
        h = norm_op(h, self.g, self.beta)
        return dense_op(h, self.w2, self.b2)


class TorchMLP(TesseraMLP):
    """The same model in torch's own ops (the oracle, run in float64)."""

    def forward(self, x):
        h = F.gelu(x @ self.w1 + self.b1, approximate="tanh")
        h = F.layer_norm(h, h.shape[-1:], self.g, self.beta, eps=1e-5)
        return h @ self.w2 + self.b2


def batch(seed: int, n: int, d_in: int, d_out: int, dtype=torch.float32):
    """One global batch (x, y), fresh random data from ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in))
    y = np.tanh(x[:, :d_out]) + 0.1 * rng.standard_normal((n, d_out))
    return torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)


def train(model, x, y, steps: int, lr: float = 0.2, momentum: float = 0.9) -> list[float]:
    """``steps`` SGD steps of the mean squared error on (x, y); the losses seen."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def params_of(model) -> dict:
    m = getattr(model, "module", model)
    full = lambda p: p.full_tensor() if hasattr(p, "full_tensor") else p   # noqa: E731 - FSDP's shards
    return {k: full(getattr(m, k)).detach().numpy().copy() for k in PARAMS}


def main(argv=None):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=32, help="the global batch (split evenly across the ranks)")
    ap.add_argument("--dims", default="16,32,4", help="d_in,d_hidden,d_out")
    ap.add_argument("--out", default=None, help="folder for rank<r>.npz (final parameters and losses)")
    ap.add_argument("--fsdp", action="store_true", help="shard the parameters with FSDP2 (fully_shard) instead of DDP")
    ap.add_argument("--no-ddp", action="store_true", help="planted bug: no DDP, so no gradient all-reduce")
    a = ap.parse_args(argv)
    d_in, d_hidden, d_out = (int(v) for v in a.dims.split(","))

    dist.init_process_group("gloo")              # rank, world size, rendezvous from torch.distributed.run
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.batch % world:
        raise SystemExit(f"--batch {a.batch} does not split evenly over {world} ranks")
    x, y = batch(a.seed, a.batch, d_in, d_out)
    share = a.batch // world
    xl, yl = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
    model = TesseraMLP(init_params(d_in, d_hidden, d_out, seed=a.seed))
    if a.fsdp:
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)     # each parameter a DTensor shard; all-gathered around forward and backward
    elif not a.no_ddp:
        model = DistributedDataParallel(model)
    losses = train(model, xl, yl, a.steps)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        lanes = sorted({(e.function, e.lane) for e in ts.lane_log.entries})   # what ran the blocks here
        np.savez(os.path.join(a.out, f"rank{rank}.npz"), losses=np.array(losses), world=world,
                 lanes=np.array([f"{f}@{lane}" for f, lane in lanes]), **params_of(model))
    print(f"rank {rank}/{world}: losses " + " ".join(f"{v:.5f}" for v in losses))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
