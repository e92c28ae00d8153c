"""ONNX GatherND, ScatterND and ScatterElements (tessera/onnx/ops_scatter.py) with runtime int64
indices on fresh random data against numpy oracles written here, with planted bugs that fail."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h  # noqa: E402

import tessera as ts  # noqa: E402
from tessera.errors import OnnxUnsupportedError  # noqa: E402
from tessera.onnx import ops_scatter  # noqa: E402
from tessera.tools import onnx_conformance as oc  # noqa: E402

F = np.float32


def _model(op, shapes, types, out_rank, **attrs):
    names = ["data", "indices", "updates"][:len(shapes)]
    g = h.make_graph([h.make_node(op, names, ["y"], name="n", **attrs)], "g",
                     [h.make_tensor_value_info(n, t, list(s)) for n, s, t in zip(names, shapes, types)],
                     [h.make_tensor_value_info("y", types[0], [f"d{i}" for i in range(out_rank)])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
    onnx.checker.check_model(m)
    return m


def gather_nd_ref(x, idx, b):
    out = np.empty(idx.shape[:-1] + x.shape[b + idx.shape[-1]:], x.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        out[pos] = x[pos[:b] + tuple(idx[pos])]
    return out


@pytest.mark.parametrize("b, xs, lead, k, dtype", [(0, (4, 5, 3), (2, 3), 2, "float32"),
                                                    (0, (6, 4), (5,), 1, "int32"),
                                                    (1, (3, 4, 5, 2), (3, 2), 2, "float32")])
def test_gather_nd(b, xs, lead, k, dtype, rng):
    x = (rng.standard_normal(xs) * 10).astype(dtype)
    dims = xs[b:b + k]
    idx = np.stack([rng.integers(-d, d, lead) for d in dims], axis=-1).astype(np.int64)   # negatives too
    t = T.FLOAT if dtype == "float32" else T.INT32
    out_rank = len(lead) + len(xs) - b - k
    got = ts.onnx.load(_model("GatherND", [xs, idx.shape], [t, T.INT64], out_rank, batch_dims=b))(x, idx)
    assert np.array_equal(got, gather_nd_ref(x, idx, b))


def scatter_nd_ref(x, idx, upd, red):
    y = x.astype(np.float64).copy()
    for pos in np.ndindex(*idx.shape[:-1]):
        key = tuple(idx[pos])
        y[key] = y[key] + upd[pos] if red == "add" else upd[pos]
    return y


@pytest.mark.parametrize("red", ["none", "add"])
def test_scatter_nd(red, rng):
    xs = (5, 4, 3)
    x = rng.standard_normal(xs).astype(F)
    idx = rng.permutation(20)[:6].reshape(3, 2)              # distinct (i, j) pairs: 'none' is defined
    idx = np.stack([idx // 4, idx % 4], axis=-1).astype(np.int64)
    if red == "add":
        idx[1] = idx[0]                                      # a duplicate: both add
    upd = rng.standard_normal((3, 2, 3)).astype(F)
    m = _model("ScatterND", [xs, idx.shape, upd.shape], [T.FLOAT, T.INT64, T.FLOAT], 3, reduction=red)
    got = ts.onnx.load(m)(x, idx, upd)
    assert np.allclose(got, scatter_nd_ref(x, idx, upd, red), rtol=1e-6, atol=1e-6)


def scatter_elements_ref(x, idx, upd, axis, red):
    y = x.astype(np.float64).copy()
    for pos in np.ndindex(*idx.shape):
        key = list(pos)
        key[axis] = idx[pos]
        key = tuple(key)
        y[key] = y[key] + upd[pos] if red == "add" else upd[pos]
    return y


@pytest.mark.parametrize("axis, red", [(0, "none"), (1, "add"), (-1, "none")])
def test_scatter_elements(axis, red, rng):
    xs, us = (4, 6, 3), (3, 4, 2)
    x = rng.standard_normal(xs).astype(F)
    n = xs[axis]
    # distinct targets along the axis for each other position ('none'), drawn with negatives
    idx = np.argsort(rng.random(us[:axis % 3] + (n,) + us[axis % 3 + 1:]), axis=axis)
    idx = np.take(idx, np.arange(us[axis]), axis=axis).astype(np.int64)
    idx = np.where(rng.random(idx.shape) < 0.3, idx - n, idx)
    upd = rng.standard_normal(us).astype(F)
    m = _model("ScatterElements", [xs, us, us], [T.FLOAT, T.INT64, T.FLOAT], 3, axis=axis, reduction=red)
    got = ts.onnx.load(m)(x, idx, upd)
    want = scatter_elements_ref(x, np.where(idx < 0, idx + n, idx), upd, axis % 3, red)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)


def test_planted_negative_index_bug_fails(monkeypatch, rng):
    """Negative components not counted from the end (take alone would still wrap a negative
    *linear* index: only a negative inner component lands on the wrong element)."""
    monkeypatch.setattr(ops_scatter, "_wrap", lambda c, n: c)
    x = rng.standard_normal((6, 4)).astype(F)
    idx = np.array([[1, -1], [-3, -2], [2, 0]], np.int64)
    got = ts.onnx.load(_model("GatherND", [x.shape, idx.shape], [T.FLOAT, T.INT64], 1))(x, idx)
    assert not np.array_equal(got, gather_nd_ref(x, idx, 0))


def test_planted_replace_as_add_fails(monkeypatch, rng):
    real = ops_scatter._scatter
    monkeypatch.setattr(ops_scatter, "_scatter", lambda ctx, f, lin, u, red: real(ctx, f, lin, u, "add"))
    x = rng.standard_normal((5, 3)).astype(F)
    idx, upd = np.array([[4], [0]], np.int64), rng.standard_normal((2, 3)).astype(F)
    got = ts.onnx.load(_model("ScatterND", [x.shape, idx.shape, upd.shape], [T.FLOAT, T.INT64, T.FLOAT], 2))(
        x, idx, upd)
    assert not np.allclose(got, scatter_nd_ref(x, idx, upd, "none"))


def test_refusals():
    with pytest.raises(OnnxUnsupportedError, match="reduction='max'"):
        ts.onnx.load(_model("ScatterND", [(4, 3), (2, 1), (2, 3)], [T.FLOAT, T.INT64, T.FLOAT], 2, reduction="max"))


def test_node_cases():
    cases = [c for c in oc.collect({"GatherND", "ScatterND", "ScatterElements"})
             if c.name in {"test_gathernd_example_int32_batch_dim1", "test_scatternd",
                           "test_scatter_elements_with_negative_indices"}]
    res = [oc.run_case(c) for c in cases]
    assert len(res) == 3 and all(r.status == "passed" for r in res), res
