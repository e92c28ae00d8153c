"""``torch.compile(model, backend="tessera")`` (issue 29): AOTAutograd graphs mapped to Tessera.

A torch.nn transformer block and a small CNN run forward and backward through the backend and
match float64 eager torch; the explain table lists what stayed ATen (a deliberately unmapped
op among them); a planted wrong mapping (add -> sub) is caught by the backend's own first-call
check and by the comparison with eager; a subgraph Tessera refuses falls back to ATen, recorded.
"""
from __future__ import annotations

import copy
import importlib
import pkgutil
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from oracle import assert_close
from tessera.errors import ArgumentError, TorchBackendMismatchError, UnsupportedConstructError
from tessera.frontend import torch_aten, torch_backend

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

ROOT = Path(__file__).resolve().parent.parent


class Block(nn.Module):
    """Pre-norm transformer block: LayerNorm, Linear q/k/v, attention as matmul/softmax, GELU MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (u.view(b, t, self.h, d // self.h).transpose(1, 2) for u in self.qkv(self.ln1(x)).chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-2, -1) / (d // self.h) ** 0.5, dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        x = F.avg_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def _init(model, rng):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)) * 0.3))
    return model


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _train_step_matches_eager(model, x, tol):
    """Forward and backward through the backend (float32) against float64 eager torch."""
    ref = copy.deepcopy(model).double()
    xr = x.detach().double().requires_grad_()
    want = ref(xr)
    (want * want).sum().backward()
    be = ts.torch.TesseraBackend()
    before = len(ts.lane_log.entries)
    xc = x.detach().clone().requires_grad_()
    got = torch.compile(model, backend=be)(xc)
    (got * got).sum().backward()
    assert_close(got.detach().numpy(), want.detach().numpy(), tol, "forward")
    assert_close(xc.grad.numpy(), xr.grad.numpy(), tol, "input grad")
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if np.abs(q.grad.numpy()).max() < 1e-9:   # zero in exact arithmetic (a conv bias before BatchNorm):
            assert np.abs(p.grad.numpy()).max() < 1e-4, name   # float32 rounding noise, no relative error
            continue
        assert_close(p.grad.numpy(), q.grad.numpy(), tol, f"grad {name}")
    for (name, b), c in zip(model.named_buffers(), ref.buffers(), strict=True):   # BatchNorm's running statistics
        assert_close(b.double().numpy(), c.numpy(), tol, f"buffer {name}")
    ran = {e.function.split("_")[1] for e in ts.lane_log.entries[before:] if e.function.startswith("torch_")
           and e.lane == "cpu-x86"}
    assert ran == {"forward", "backward"}, ran   # Tessera kernels ran both graphs
    return be.table


def test_transformer_block_forward_and_backward(rng):
    table = _train_step_matches_eager(_init(Block(), rng), torch.from_numpy(
        rng.standard_normal((2, 5, 16)).astype(np.float32)), 1e-4)
    assert not table.rows, str(table)   # every node of both graphs mapped
    assert [g.split()[0] for g, *_ in table.partitions] == ["forward", "backward"]


def test_cnn_forward_backward_and_explain(rng):
    # 17 x 17: the max-pool's windows leave a row and a column unread (its backward pads them)
    table = _train_step_matches_eager(_init(CNN(), rng), torch.from_numpy(
        rng.standard_normal((2, 3, 17, 17)).astype(np.float32)), 1e-4)
    left = {r.op: r.reason for r in table.rows}
    # max-pool's indices are saved for backward (Tessera's kernel makes none): it stays ATen; its
    # backward maps (routed by torch's saved indices, so ties after the ReLU go where torch sent them);
    # BatchNorm's num_batches_tracked += 1 is an int64 add
    assert set(left) == {"aten.max_pool2d_with_indices.default", "aten.add.Tensor"}, str(table)
    assert "used" in left["aten.max_pool2d_with_indices.default"] and "int64" in left["aten.add.Tensor"]
    assert "max_pool2d_with_indices" in str(table)
    assert any("aten.max_pool2d_with_indices_backward.default" in ops for *_, ops in table.partitions)


class Attend(nn.Module):
    """torch's fused attention (F.scaled_dot_product_attention, causal): its CPU flash op, its logsumexp
    saved for backward, and its backward op all map."""

    def forward(self, x):
        return F.scaled_dot_product_attention(x, x * 0.5, x, is_causal=True)


def test_scaled_dot_product_attention_forward_and_backward(rng):
    table = _train_step_matches_eager(_init(Attend(), rng), torch.from_numpy(
        rng.standard_normal((2, 2, 5, 8)).astype(np.float32)), 1e-4)
    assert not table.rows, str(table)
    assert any("flash_attention_for_cpu_backward" in op for *_, ops in table.partitions for op in ops)


@pytest.mark.parametrize("model, size", [
    ("conv_block", dict(batch=1, channels=4, size=8)),
    pytest.param("gpt2_block", dict(batch=1, seq=8, dim=16, heads=2), marks=pytest.mark.slow)])
def test_real_program_models_map_whole(rng, model, size):
    """The models' own torch forward (examples/models: F.conv2d padding="same" + residual + max-pool;
    layer_norm, fused causal attention, GELU MLP) compile whole and match float64 eager."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        mod = importlib.import_module(f"models.{model}")
    finally:
        sys.path.remove(str(ROOT / "examples"))
    args, extra = mod.make(rng, **size)
    ta = [torch.from_numpy(a) for a in args]
    be = ts.torch.TesseraBackend()
    with torch.no_grad():
        got = torch.compile(lambda *a: mod.torch_forward(*a, **extra), backend=be, dynamic=False)(*ta)
        want = mod.torch_forward(*[t.double() for t in ta], **extra)
    assert not be.table.rows and len(be.table.partitions) == 1, str(be.table)
    assert_close(got.numpy(), want.numpy(), 1e-5, model)


def _mlp(x, w, b):
    return ts.ops.gelu(x @ w + b)


MLP_OP = ts.torch.op(_mlp, name="tessera_backend_tests::mlp")


def test_tessera_op_inlines_into_the_subgraph_with_its_backward(rng):
    """A tessera.torch.op (and its _vjp op) in a graph the backend compiles is traced inline; the
    loss is a 0-d result of the subgraph."""
    x, w, b = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((6, 5), (5, 7), (7,)))
    w.requires_grad_(), b.requires_grad_()
    be = ts.torch.TesseraBackend()
    loss = torch.compile(lambda x, w, b: (torch.relu(MLP_OP(x, w, b)) * x.sum(1, keepdim=True)).sum(),
                         backend=be)(x, w, b)
    loss.backward()
    assert not be.table.rows, str(be.table)
    ops_seen = {op for *_, ops in be.table.partitions for op in ops}
    assert {"tessera_backend_tests.mlp.default", "tessera_backend_tests.mlp_vjp.default"} <= ops_seen
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    want = (torch.relu(F.gelu(xr @ wr + br, approximate="tanh")) * xr.sum(1, keepdim=True)).sum()
    want.backward()
    assert loss.shape == () and abs(loss.item() - want.item()) <= 1e-5 * abs(want.item())
    assert_close(w.grad.numpy(), wr.grad.numpy(), 1e-5, "w grad")
    assert_close(b.grad.numpy(), br.grad.numpy(), 1e-5, "b grad")


def _slices(x):
    return (x[:, 1:4] * 2).sum() + (x[:, -1] ** 2).sum() + x[2:, :9999].sum()


def test_slice_and_select_backward(rng):
    x = torch.from_numpy(rng.standard_normal((5, 6)).astype(np.float32)).requires_grad_()
    be = ts.torch.TesseraBackend()
    torch.compile(_slices, backend=be)(x).backward()
    xr = x.detach().double().requires_grad_()
    _slices(xr).backward()
    assert not be.table.rows, str(be.table)
    assert_close(x.grad.numpy(), xr.grad.numpy(), 1e-6, "slice/select backward")


def _mlp_sort(x, w, b):
    return torch.relu(torch.sort(x @ w + b, dim=1).values) * 2.0


def test_explain_table_lists_unmapped_op_and_result_is_right(rng):
    x, w, b = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((4, 6), (6, 5), (5,)))
    table = ts.torch.explain_backend(_mlp_sort, x, w, b)
    assert [(r.op, r.reason) for r in table.rows] == [("aten.sort.default", "no mapping to tessera.ops")]
    assert len(table.partitions) == 2   # the matmul before it and the relu/mul after it
    assert "aten.sort.default" in str(table)
    got = torch.compile(_mlp_sort, backend=ts.torch.TesseraBackend())(x, w, b)
    a = [t.double().numpy() for t in (x, w, b)]
    assert_close(got.numpy(), np.maximum(np.sort(a[0] @ a[1] + a[2], axis=1), 0) * 2, 1e-5, "sort mlp")


def _resid(x, w):
    return torch.tanh(x @ w) + x


def test_planted_wrong_mapping_is_caught(rng, monkeypatch):
    x, w = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((4, 4), (4, 4)))
    a = [t.double().numpy() for t in (x, w)]
    want = np.tanh(a[0] @ a[1]) + a[0]
    ok = torch.compile(_resid, backend=ts.torch.TesseraBackend(check="off"))(x, w)
    assert_close(ok.numpy(), want, 1e-5, "right mapping")
    monkeypatch.setitem(torch_aten.TABLE, "aten.add.Tensor", lambda node, a, b, alpha=1: a - b)
    torch._dynamo.reset()
    bad = torch.compile(_resid, backend=ts.torch.TesseraBackend(check="off"))(x, w)
    with pytest.raises(AssertionError):
        assert_close(bad.numpy(), want, 1e-5, "planted add -> sub")   # the comparison with eager has teeth
    torch._dynamo.reset()
    with pytest.raises(TorchBackendMismatchError, match="aten.add.Tensor"):
        torch.compile(_resid, backend=ts.torch.TesseraBackend())(x, w)   # the default check catches it itself


def test_refused_subgraph_falls_back_to_aten_recorded(rng, monkeypatch):
    def refuse(node, x):
        raise UnsupportedConstructError("planted refusal")
    monkeypatch.setitem(torch_aten.TABLE, "aten.tanh.default", refuse)
    x, w = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((4, 4), (4, 4)))
    be = ts.torch.TesseraBackend()
    with pytest.warns(UserWarning, match="left to ATen"):
        got = torch.compile(_resid, backend=be)(x, w)
    a = [t.double().numpy() for t in (x, w)]
    assert_close(got.numpy(), np.tanh(a[0] @ a[1]) + a[0], 1e-5, "fallback")
    assert any("planted refusal" in r.reason and "UNSUPPORTED_CONSTRUCT" in r.reason for r in be.table.rows)


def test_dynamic_shapes_specialise_per_shape(rng):
    """A second size makes Dynamo compile with symbolic sizes: the backend traces that graph again at
    each concrete shape and compiles it through Tessera (forward and backward), one entry per shape."""
    be = ts.torch.TesseraBackend()
    f = torch.compile(_resid, backend=be)
    w = torch.from_numpy(rng.standard_normal((4, 4)).astype(np.float32)).requires_grad_()
    before = len(ts.lane_log.entries)
    for n in (3, 5, 6):
        x = torch.from_numpy(rng.standard_normal((n, 4)).astype(np.float32))
        w.grad = None
        y = f(x, w)
        (y * y).sum().backward()
        xr, wr = x.double(), w.detach().double().requires_grad_()
        want = _resid(xr, wr)
        (want * want).sum().backward()
        assert_close(y.detach().numpy(), want.detach().numpy(), 1e-5, f"rows={n}")
        assert_close(w.grad.numpy(), wr.grad.numpy(), 1e-5, f"rows={n} grad")
    assert not be.table.rows, str(be.table)
    graphs = [g for g, *_ in be.table.partitions]
    # the first shape static; the symbolic graphs specialised at 5 and 6 rows, forward and backward
    assert len(graphs) == 6 and sum(" [" in g for g in graphs) == 4, graphs
    ran = [e.function for e in ts.lane_log.entries[before:] if e.function.startswith("torch_")]
    assert len(set(ran)) == 6 and all(e.lane == "cpu-x86" for e in ts.lane_log.entries[before:]
                                      if e.function.startswith("torch_"))


def test_registered_by_name_and_entry_point(rng, tmp_path, monkeypatch):
    ts.torch.register_backend()
    ts.torch.register_backend()   # twice: no error
    x, w = (torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in ((3, 4), (4, 4)))
    got = torch.compile(_resid, backend="tessera")(x, w)
    a = [t.double().numpy() for t in (x, w)]
    assert_close(got.numpy(), np.tanh(a[0] @ a[1]) + a[0], 1e-5, "by name")
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["torch_dynamo_backends"]
    assert pkgutil.resolve_name(eps["tessera"]) is torch_backend.tessera_backend
    assert importlib.import_module("tessera.torch").TesseraBackend is torch_backend.TesseraBackend
    with pytest.raises(ArgumentError):
        ts.torch.TesseraBackend(check="sometimes")
    # the entry point as torch reads it (importlib.metadata): a probe dist-info naming pyproject's target
    # under another name, resolved by torch's own lookup (entry_points -> load -> register)
    from torch._dynamo.backends import registry
    info = tmp_path / "tessera_ep_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tessera-ep-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[torch_dynamo_backends]\ntessera_ep_probe = {eps['tessera']}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    monkeypatch.setattr(registry, "_COMPILER_FNS", dict(registry._COMPILER_FNS))
    registry._discover_entrypoint_backends.cache_clear()
    try:
        registry._discover_entrypoint_backends()   # what torch's (cached) first lookup in a process runs
        assert registry.lookup_backend("tessera_ep_probe") is torch_backend.tessera_backend
    finally:
        registry._discover_entrypoint_backends.cache_clear()


def test_check_comparison_rules():
    """The first-call check: equal infinities and NaN at the same places agree; the rest within
    1e-3 of the largest finite |ATen| value; any shape, dtype, inf or NaN difference fails."""
    a = torch.tensor([1.0, float("inf"), float("nan"), 3.0])
    assert torch_backend._close(a.clone(), a)[0]
    near, far, inf, nan = (a.clone() for _ in range(4))
    near[3], far[3], inf[1], nan[2] = 3.0001, 3.1, 5.0, 5.0
    assert torch_backend._close(near, a)[0]
    assert not any(torch_backend._close(b, a)[0] for b in (far, inf, nan))
    assert not torch_backend._close(torch.zeros(()), torch.zeros(1))[0]          # a 0-d result made 1-d
    assert not torch_backend._close(a.double(), a)[0]
    tiny = torch.tensor([1e-7, -2e-7])   # a sum that cancels (a bias gradient through a norm): noise vs noise
    assert torch_backend._close(tiny * 5, tiny, in_scale=1.0)[0] and not torch_backend._close(tiny * 5, tiny)[0]
    assert not torch_backend._close(tiny + 1e-3, tiny, in_scale=1.0)[0]
