"""``torch.compile(backend="tessera")`` on integer-indexed ops (issue 29): embedding and its dense
backward, ``F.cross_entropy`` (``_log_softmax`` + ``nll_loss`` forward/backward, class weights,
``ignore_index``), ``index_select`` / ``gather`` / ``cumsum``, and a sampler's ``argmax`` / ``topk``
with integer results — mapped whole, forward and backward, against float64 eager torch.  Teeth: a
planted nll_loss backward without the mean's division is caught by the comparison with eager and
by the backend's own first-call check.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

import tessera as ts
from oracle import assert_close
from tessera.errors import TorchBackendMismatchError
from tessera.frontend import torch_aten

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class TinyLM(nn.Module):
    """Embedding (with a padding row) -> LayerNorm -> tied-free head -> cross-entropy."""

    def __init__(self, vocab=11, d=8, padding_idx=3, weight=None, ignore_index=-100):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=padding_idx)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.weight, self.ignore = weight, ignore_index

    def forward(self, ids, labels):
        z = self.head(self.ln(self.emb(ids)))
        return F.cross_entropy(z.view(-1, z.shape[-1]), labels.view(-1), weight=self.weight,
                               ignore_index=self.ignore)


def _init(model, rng):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)) * 0.5))
    return model


def _lm_case(rng, weight=False, ignore_index=-100):
    vocab = 11
    w = torch.from_numpy(rng.uniform(0.5, 2.0, vocab).astype(np.float32)) if weight else None
    model = _init(TinyLM(vocab, weight=w, ignore_index=ignore_index), rng)
    ids = torch.from_numpy(rng.integers(0, vocab, (3, 5)))
    ids[0, 1] = 3                           # the padding row is looked up: it gets no gradient
    ids[1, :2] = 7                          # duplicate ids: their gradients sum
    labels = torch.from_numpy(rng.integers(0, vocab, (3, 5)))
    labels[2, 3] = ignore_index if ignore_index >= 0 else -100
    return model, ids, labels


def _lm_matches_eager(model, ids, labels, be, tol=2e-5):
    ref = copy.deepcopy(model).double()
    if ref.weight is not None:
        ref.weight = ref.weight.double()
    want = ref(ids, labels)
    want.backward()
    got = torch.compile(model, backend=be)(ids, labels)
    got.backward()
    assert got.shape == () and abs(got.item() - want.item()) <= tol * abs(want.item()), (got, want)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_close(p.grad.numpy(), q.grad.numpy(), tol, f"grad {name}")
    assert float(model.emb.weight.grad[3].abs().max()) == 0.0   # the padding row


@pytest.mark.parametrize("weight, ignore_index", [(False, -100), (True, 4)])
def test_embedding_cross_entropy_train_step(rng, weight, ignore_index):
    model, ids, labels = _lm_case(rng, weight, ignore_index)
    be = ts.torch.TesseraBackend()
    before = len(ts.lane_log.entries)
    _lm_matches_eager(model, ids, labels, be)
    assert not be.table.rows, str(be.table)   # nothing left to ATen
    ops_seen = {op for *_, ops in be.table.partitions for op in ops}
    assert {"aten.embedding.default", "aten.nll_loss_forward.default", "aten.nll_loss_backward.default",
            "aten.embedding_dense_backward.default"} <= ops_seen
    ran = {e.function.split("_")[1] for e in ts.lane_log.entries[before:] if e.function.startswith("torch_")
           and e.lane == "cpu-x86"}
    assert ran == {"forward", "backward"}, ran


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_nll_loss_reductions(rng, reduction):
    x = torch.from_numpy(rng.standard_normal((6, 5)).astype(np.float32)).requires_grad_()
    t = torch.from_numpy(rng.integers(0, 5, 6))
    t[2] = -100
    g = torch.from_numpy(rng.standard_normal(6).astype(np.float32))
    be = ts.torch.TesseraBackend()

    def f(x, t):
        return F.nll_loss(F.log_softmax(x * 1.5, -1), t, reduction=reduction)
    out = torch.compile(f, backend=be)(x, t)
    (out * g).sum().backward() if reduction == "none" else out.backward()
    xr = x.detach().double().requires_grad_()
    want = f(xr, t)
    (want * g.double()).sum().backward() if reduction == "none" else want.backward()
    assert not be.table.rows, str(be.table)
    assert_close(out.detach().numpy(), want.detach().numpy(), 1e-5, "loss")
    assert_close(x.grad.numpy(), xr.grad.numpy(), 1e-5, "dx")


def _picks(x, table, idx, cols):
    rows = torch.index_select(table, 0, idx)                     # [k, d]
    g = torch.gather(x, 1, cols)                                 # [n, m]
    return torch.cumsum(x @ rows.t(), dim=1).sum() + (g * g).sum()


def test_index_select_gather_cumsum_forward_backward(rng):
    x = torch.from_numpy(rng.standard_normal((4, 6)).astype(np.float32)).requires_grad_()
    table = torch.from_numpy(rng.standard_normal((9, 6)).astype(np.float32)).requires_grad_()
    idx = torch.from_numpy(np.array([2, 7, 2, 0]))
    cols = torch.from_numpy(rng.integers(0, 6, (4, 3)))
    be = ts.torch.TesseraBackend()
    torch.compile(_picks, backend=be)(x, table, idx, cols).backward()
    xr, tr = (t.detach().double().requires_grad_() for t in (x, table))
    _picks(xr, tr, idx, cols).backward()
    assert "aten.index_select.default" in {op for *_, ops in be.table.partitions for op in ops}
    assert_close(x.grad.numpy(), xr.grad.numpy(), 1e-5, "dx")
    assert_close(table.grad.numpy(), tr.grad.numpy(), 1e-5, "dtable (index_select's backward: index_add)")


def _sample(h, w, temp):
    logits = (h @ w) / temp
    vals, ids = torch.topk(logits, 3, dim=-1)
    return torch.argmax(logits, dim=-1), vals, ids


def test_sampler_argmax_topk_integer_results(rng):
    h = torch.from_numpy(rng.standard_normal((5, 8)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((8, 13)).astype(np.float32))
    be = ts.torch.TesseraBackend()
    with torch.no_grad():
        am, vals, ids = torch.compile(_sample, backend=be)(h, w, 0.7)
    assert not be.table.rows and len(be.table.partitions) == 1, str(be.table)
    z = (h.double().numpy() @ w.double().numpy()) / 0.7
    order = np.argsort(-z, axis=-1, kind="stable")[:, :3]
    assert am.dtype == torch.int64 and np.array_equal(am.numpy(), z.argmax(-1))
    assert np.array_equal(ids.numpy(), order)
    assert_close(vals.numpy(), np.take_along_axis(z, order, -1), 1e-5, "top-k values")


def test_planted_nll_backward_without_mean_division_is_caught(rng, monkeypatch):
    real = torch_aten.TABLE["aten.nll_loss_backward.default"]

    def planted(node, g, x, target, weight, reduction, ignore_index, total_weight):
        return real(node, g, x, target, weight, 2 if reduction == 1 else reduction, ignore_index, total_weight)
    monkeypatch.setitem(torch_aten.TABLE, "aten.nll_loss_backward.default", planted)
    model, ids, labels = _lm_case(rng)
    with pytest.raises(AssertionError):
        _lm_matches_eager(model, ids, labels, ts.torch.TesseraBackend(check="off"))
    torch._dynamo.reset()
    model, ids, labels = _lm_case(rng)
    with pytest.raises(TorchBackendMismatchError, match="nll_loss_backward|backward"):
        _lm_matches_eager(model, ids, labels, ts.torch.TesseraBackend())
