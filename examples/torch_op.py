"""Tessera functions as torch custom ops (``tessera.torch.op``).

    python examples/torch_op.py

Each op runs Tessera's compiled CPU kernel on the tensors (read in place), has a fake
implementation from Graph IR shape inference, an autograd formula from ``tessera.vjp``,
passes ``torch.library.opcheck`` and works inside ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import torch

import tessera as ts


def mlp(x, w, b):
    return ts.ops.gelu(x @ w + b)


def scale(x, s: float):
    return x * s


def moments(x):
    return x.mean(axis=1), (x * x).mean(axis=1)


mlp_op = ts.torch.op(mlp, name="tessera_examples::mlp")
scale_op = ts.torch.op(scale, name="tessera_examples::scale")
moments_op = ts.torch.op(moments, name="tessera_examples::moments", outputs=2)


if __name__ == "__main__":
    x, w, b = torch.randn(64, 32), torch.randn(32, 48), torch.randn(48)
    print("opcheck:", torch.library.opcheck(mlp_op, (x, w, b)))
    model = torch.compile(lambda x: torch.relu(mlp_op(x, w, b)).sum(dim=1), fullgraph=True)
    want = torch.relu(torch.nn.functional.gelu(x @ w + b, approximate="tanh")).sum(dim=1)
    print("torch.compile(fullgraph=True) max |diff|:", (model(x) - want).abs().max().item())
    w.requires_grad_()
    (mlp_op(x, w, b) ** 2).sum().backward()      # the gradient comes from tessera.vjp
    wr = w.detach().clone().requires_grad_()
    (torch.nn.functional.gelu(x @ wr + b, approximate="tanh") ** 2).sum().backward()
    print("dL/dw max |diff| vs torch:", (w.grad - wr.grad).abs().max().item())
