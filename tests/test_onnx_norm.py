"""tessera/onnx/ops_norm.py: Instance/Group/MeanVariance/Lp normalisation, LRN, DepthToSpace,
SpaceToDepth and Shrink on fresh random inputs against float64 numpy oracles written here (the
rearrangements against onnx's ReferenceEvaluator, exactly), with planted bugs that fail."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

import tessera as ts  # noqa: E402
from oracle import rel_err  # noqa: E402
from tessera.errors import OnnxUnsupportedError  # noqa: E402
from tessera.onnx import ops_norm  # noqa: E402
from tessera.tools import onnx_conformance as oc  # noqa: E402

F = np.float32
TOL = 1e-5


def _model(op, x_shape, inits=(), opset=21, check=True, **attrs):
    names = ["x"] + [k for k, _ in inits]
    g = h.make_graph([h.make_node(op, names, ["y"], name="n", **attrs)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, list(x_shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, [f"d{i}" for i in range(len(x_shape))])],
                     [nh.from_array(np.asarray(v, F), k) for k, v in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    if check:
        onnx.checker.check_model(m)
    return m


def _normalise(x, axes, eps):
    mu = x.mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + eps)


def _chan(v, rank):
    return v.astype(np.float64).reshape((1, -1) + (1,) * (rank - 2))


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 4, 3, 5)])
def test_instance_norm(shape, rng):
    x = rng.standard_normal(shape).astype(F)
    s, b = (1 + 0.3 * rng.standard_normal(shape[1])).astype(F), rng.standard_normal(shape[1]).astype(F)
    got = ts.onnx.load(_model("InstanceNormalization", shape, [("s", s), ("b", b)], epsilon=1e-3))(x)
    want = _normalise(x.astype(np.float64), tuple(range(2, len(shape))), 1e-3) * _chan(s, len(shape)) + \
        _chan(b, len(shape))
    assert rel_err(got, want) < TOL


def group_ref(x, g, s, b, eps):
    n, c = x.shape[:2]
    return _normalise(x.reshape(n, g, -1), (2,), eps).reshape(x.shape) * _chan(s, x.ndim) + _chan(b, x.ndim)


def test_group_norm(rng):
    shape, g = (2, 6, 4, 3), 3
    x = rng.standard_normal(shape).astype(F)
    s, b = (1 + 0.3 * rng.standard_normal(6)).astype(F), rng.standard_normal(6).astype(F)
    got = ts.onnx.load(_model("GroupNormalization", shape, [("s", s), ("b", b)], num_groups=g, epsilon=1e-4))(x)
    assert rel_err(got, group_ref(x.astype(np.float64), g, s, b, 1e-4)) < TOL
    m = _model("GroupNormalization", shape, [("s", s[:3]), ("b", b[:3])], opset=18, check=False, num_groups=g)
    with pytest.raises(OnnxUnsupportedError, match="version 18"):      # per-group scale, deprecated
        ts.onnx.load(m)


def test_group_norm_planted_wrong_rows_fails(monkeypatch, rng):
    real = ops_norm._rows_normalised
    monkeypatch.setattr(ops_norm, "_rows_normalised", lambda x, rows, eps: real(x, x.shape[0], eps))  # per sample
    shape, g = (2, 6, 4, 3), 3
    x = rng.standard_normal(shape).astype(F)
    s, b = np.ones(6, F), np.zeros(6, F)
    got = ts.onnx.load(_model("GroupNormalization", shape, [("s", s), ("b", b)], num_groups=g))(x)
    assert rel_err(got, group_ref(x.astype(np.float64), g, s, b, 1e-5)) > 0.01


def test_mean_variance_normalization(rng):
    x = rng.standard_normal((3, 4, 2, 5)).astype(F)
    got = ts.onnx.load(_model("MeanVarianceNormalization", x.shape, opset=13, axes=[0, 2, 3]))(x)
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=(0, 2, 3), keepdims=True)
    assert rel_err(got, d / (np.sqrt((d * d).mean(axis=(0, 2, 3), keepdims=True)) + 1e-9)) < TOL


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_with_a_zero_row(p, rng):
    x = rng.standard_normal((4, 6)).astype(F)
    x[2] = 0
    got = ts.onnx.load(_model("LpNormalization", x.shape, opset=13, axis=1, p=p))(x)
    norm = np.linalg.norm(x.astype(np.float64), ord=p, axis=1, keepdims=True)
    want = x / np.where(norm == 0, 1, norm)
    assert not np.isnan(got).any() and rel_err(got, want) < TOL


def test_lrn(rng):
    x = rng.standard_normal((2, 7, 3, 4)).astype(F)
    size, alpha, beta, bias = 4, 2e-2, 0.6, 1.5
    got = ts.onnx.load(_model("LRN", x.shape, opset=13, size=size, alpha=alpha, beta=beta, bias=bias))(x)
    x64 = x.astype(np.float64)
    sq = np.zeros_like(x64)
    for c in range(7):       # the window [c - floor((size-1)/2), c + ceil((size-1)/2)], clipped
        sq[:, c] = (x64[:, max(0, c - (size - 1) // 2): min(7, c + -(-(size - 1) // 2) + 1)] ** 2).sum(axis=1)
    assert rel_err(got, x64 / (bias + alpha / size * sq) ** beta) < TOL


@pytest.mark.parametrize("op, attrs, shape", [("DepthToSpace", {"blocksize": 2, "mode": "DCR"}, (2, 8, 3, 2)),
                                              ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, (2, 8, 3, 2)),
                                              ("DepthToSpace", {"blocksize": 3}, (1, 9, 2, 2)),
                                              ("SpaceToDepth", {"blocksize": 2}, (2, 3, 4, 6))])
def test_depth_space_rearrangements(op, attrs, shape, rng):
    from onnx.reference import ReferenceEvaluator
    m = _model(op, shape, opset=13, **attrs)
    x = rng.standard_normal(shape).astype(F)
    assert np.array_equal(ts.onnx.load(m)(x), ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_depth_to_space_planted_mode_swap_fails(monkeypatch, rng):
    from onnx.reference import ReferenceEvaluator
    m = _model("DepthToSpace", (1, 8, 2, 2), opset=13, blocksize=2, mode="CRD")
    x = rng.standard_normal((1, 8, 2, 2)).astype(F)
    from tessera.onnx import convert
    spec = convert.OPS["DepthToSpace"]
    monkeypatch.setitem(convert.OPS, "DepthToSpace", convert.Spec(
        lambda ctx, ins: spec.fn(convert.Ctx(ctx.node, {**ctx.attrs, "mode": "DCR"}, ctx.opset, 1), ins),
        spec.inputs, spec.attrs, spec.static, spec.fold, spec.check))
    assert not np.array_equal(ts.onnx.load(m)(x), ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_shrink(rng):
    x = rng.standard_normal((5, 6)).astype(F) * 2
    got = ts.onnx.load(_model("Shrink", x.shape, opset=13, lambd=0.7, bias=0.3))(x)
    want = np.where(x < -0.7, x + 0.3, np.where(x > 0.7, x - 0.3, 0.0))
    assert rel_err(got, want) < TOL


def test_node_cases():
    names = {"test_instancenorm_example", "test_group_normalization_example", "test_mvn", "test_lrn",
             "test_l2normalization_axis_0", "test_depthtospace_crd_mode_example", "test_spacetodepth_example",
             "test_shrink_soft"}
    cases = [c for c in oc.collect({"InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization",
                                    "LRN", "LpNormalization", "DepthToSpace", "SpaceToDepth", "Shrink"})
             if c.name in names]
    assert {c.name for c in cases} == names
    res = [oc.run_case(c) for c in cases]
    assert all(r.status == "passed" for r in res), res
