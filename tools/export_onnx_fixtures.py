"""Export the small torch models of ``tests/test_onnx_models.py`` to ``tests/data/onnx/*.onnx``.

The .onnx files are committed: the tests read them with ``onnx`` and need no torch.  Rerun this
script (torch 2.13 CPU and onnxscript on the path) to rebuild them:

    PYTHONPATH=/tmp/torch213:/tmp/onnxscript .venv/bin/python tools/export_onnx_fixtures.py [model ...]

Four models with fixed seeds (an MLP, a conv net, a transformer block, an upsampling decoder), each exported with torch's default (dynamo, onnxscript) exporter
at opset 20, where GELU and LayerNorm come out as ``Gelu`` and ``LayerNormalization``, and each also
through the legacy TorchScript exporter (``dynamo=False``, opset 17: GELU written out with ``Erf``);
the conv net also unoptimised (see ``VARIANTS``).  The batch dim is dynamic in each.  Parameters are drawn away from their defaults (BatchNorm's running
statistics and affine terms, LayerNorm's affine terms) so that a mapping that ignores one shows.
"""
from __future__ import annotations

import math
import os
import sys

import torch
from torch import nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "onnx")


class MLP(nn.Module):
    def __init__(self, d_in=16, hidden=32, d_out=8):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(self.norm(self.act(self.fc1(x))))


class ConvNet(nn.Module):
    def __init__(self, c_in=3, c=8, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.pool2 = nn.AvgPool2d(2)
        self.fc = nn.Linear(c * 2 * 2, classes)

    def forward(self, x):
        x = self.pool1(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool2(torch.relu(self.bn2(self.conv2(x))))
        return self.fc(torch.flatten(x, 1))


class Block(nn.Module):
    """A pre-norm transformer encoder block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, d=32, heads=4, hidden=64):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
        a = (w @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Decoder(nn.Module):
    """An upsampling decoder: reflect-padded conv, GroupNorm + SiLU, then a ConvTranspose branch and
    a bilinear-upsampling branch concatenated, a replicate-padded conv, plus the input upsampled
    nearest (exports Pad reflect/edge, InstanceNormalization, ConvTranspose, Resize linear/nearest)."""

    def __init__(self, c_in=3, c=8, c_out=2):
        super().__init__()
        self.conv_in = nn.Conv2d(c_in, c, 3, padding=1, padding_mode="reflect")
        self.norm = nn.GroupNorm(2, c)
        self.up = nn.ConvTranspose2d(c, c // 2, 2, stride=2)
        self.bilinear = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv_out = nn.Conv2d(c, c_out, 3)

    def forward(self, x):
        h = nn.functional.silu(self.norm(self.conv_in(x)))
        y = torch.cat([self.up(h), self.bilinear(h[:, : h.shape[1] // 2])], dim=1)
        y = self.conv_out(nn.functional.pad(y, (1, 1, 1, 1), mode="replicate"))
        return y + self.nearest(x[:, : y.shape[1]])


def _perturb(model: nn.Module) -> nn.Module:
    """Move the norms' parameters and buffers off their defaults (1, 0) and set eval mode."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.GroupNorm)):
                m.weight.copy_(1 + 0.3 * torch.randn_like(m.weight))
                m.bias.copy_(0.2 * torch.randn_like(m.bias))
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.5 * torch.randn_like(m.running_mean))
                m.running_var.copy_(0.5 + torch.rand_like(m.running_var))
    return model.eval()


MODELS = {   # name: (constructor, example input shape, dynamic batch)
    "mlp": (MLP, (4, 16), True),
    "convnet": (ConvNet, (2, 3, 8, 8), True),
    "block": (Block, (2, 8, 32), True),
    "decoder": (Decoder, (2, 3, 6, 6), True),
}
# the exports of each model: "" the default exporter (its optimiser folds BatchNorm into the Conv
# weights), "_unopt" the default exporter with optimize=False (BatchNormalization kept, the batch
# dim read with Shape/Expand/CastLike), "_legacy" the TorchScript exporter without constant folding
VARIANTS = {"mlp": ("", "_legacy"), "convnet": ("", "_unopt", "_legacy"), "block": ("", "_legacy"),
            "decoder": ("", "_unopt", "_legacy")}


def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    ctor, shape, _ = MODELS[name]
    torch.manual_seed(sum(map(ord, name)))
    model = _perturb(ctor())
    return model, torch.randn(*shape)


def export(name: str, variant: str = "") -> str:
    model, x = build(name)
    dyn = MODELS[name][2]
    path = os.path.join(OUT, f"{name}{variant}.onnx")
    if variant == "_legacy":
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, do_constant_folding=False,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}} if dyn else None)
    else:
        dynamic = ({"x": {0: torch.export.Dim("batch", min=1, max=1024)}} if dyn else None)
        prog = torch.onnx.export(model, (x,), dynamo=True, opset_version=20, input_names=["x"], output_names=["y"],
                                 dynamic_shapes=dynamic, optimize=variant != "_unopt", verbose=False)
        prog.save(path, external_data=False)
    return path


def main(names: list[str]) -> int:
    """Export the models named (all when none are)."""
    os.makedirs(OUT, exist_ok=True)
    import onnx
    for name in names or MODELS:
        for variant in VARIANTS[name]:
            path = export(name, variant)
            m = onnx.load(path)
            ops = sorted({n.op_type for n in m.graph.node})
            print(f"{os.path.relpath(path)}: {os.path.getsize(path)} bytes, opset "
                  f"{[o.version for o in m.opset_import if o.domain in ('', 'ai.onnx')]}, ops {ops}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
