"""The ONNX ops mapped for exported models (tessera/onnx/ops_spatial.py, ops_einsum.py, and
BatchNormalization in ops_nn.py) on fresh random inputs against float64 numpy oracles written here
(np.pad, np.einsum, a scatter-form transposed convolution), with planted bugs that fail; plus
their ONNX node-test cases (Resize: tests/test_onnx_resize.py)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

import tessera as ts  # noqa: E402
from oracle import rel_err  # noqa: E402
from tessera.errors import OnnxUnsupportedError  # noqa: E402
from tessera.onnx import ops_spatial  # noqa: E402
from tessera.tools import onnx_conformance as oc  # noqa: E402

F = np.float32
TOL = 1e-5


def _model(nodes, inputs, outputs, inits=(), opset=20):
    g = h.make_graph(nodes, "g", inputs, outputs, [nh.from_array(np.asarray(v), k) for k, v in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _vi(name, shape, t=T.FLOAT):
    return h.make_tensor_value_info(name, t, shape)


def _out(rank, t=T.FLOAT):
    return h.make_tensor_value_info("y", t, [f"d{i}" for i in range(rank)])


def _i64(*v):
    return np.asarray(v, np.int64)


# ---------------------------------------------------------------------------- Pad
def pad_model(shape, pads, mode, value=None, axes=None, t=T.FLOAT, opset=20):
    inits = [("pads", _i64(*pads))]
    ins = ["x", "pads"]
    if value is not None or axes is not None:
        ins.append("cv" if value is not None else "")
        if value is not None:
            inits.append(("cv", np.asarray(value, F if t == T.FLOAT else np.int32)))
    if axes is not None:
        ins.append("axes")
        inits.append(("axes", _i64(*axes)))
    return _model([h.make_node("Pad", ins, ["y"], name="pad", mode=mode)], [_vi("x", list(shape), t)],
                  [_out(len(shape), t)], inits, opset)


def pad_ref(x, pads, mode, value=0.0, axes=None):
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in axes]
    k = len(axes)
    item, widths = [slice(None)] * x.ndim, [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        lo, hi = pads[i], pads[i + k]
        item[a] = slice(max(-lo, 0), x.shape[a] - max(-hi, 0))
        widths[a] = (max(lo, 0), max(hi, 0))
    x = x[tuple(item)]
    return np.pad(x, widths, mode=mode, constant_values=value) if mode == "constant" else np.pad(x, widths, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("kind", ["float32", "int32"])
def test_pad_modes_against_numpy(mode, kind, rng):
    shape = (2, 5, 6)
    x = (rng.standard_normal(shape) * 10).astype(kind)
    t = T.FLOAT if kind == "float32" else T.INT32
    pads = [0, 2, 3, 0, 3, -1] if mode != "wrap" else [0, 7, 1, 0, 2, 8]   # wrap: wider than the axis
    value = 1.5 if mode == "constant" and kind == "float32" else (7 if mode == "constant" else None)
    got = ts.onnx.load(pad_model(shape, pads, mode, value, t=t))(x)
    want = pad_ref(x.astype(np.float64), pads, mode, value or 0)
    assert got.dtype == x.dtype and got.shape == want.shape and np.array_equal(got.astype(np.float64), want)
    # opset 18's axes input: pad two axes given in reverse, one negative
    got = ts.onnx.load(pad_model(shape, [1, 0, 2, 2], mode, axes=[-1, 1], t=t))(x)
    assert np.array_equal(got.astype(np.float64), pad_ref(x.astype(np.float64), [1, 0, 2, 2], mode, axes=[-1, 1]))


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_leading_axis_with_a_dynamic_batch(mode, rng):
    """A leading axis padded, the last not, the batch dynamic (ops.pad's kernel fails to compile there:
    the handler concatenates slices instead)."""
    m = _model([h.make_node("Pad", ["x", "pads"], ["y"], name="pad", mode=mode)], [_vi("x", ["N", 2, 6, 5])],
               [_out(4)], [("pads", _i64(0, 0, 2, 0, 0, 0, 1, 0))])
    fn = ts.onnx.load(m)
    for n in (3, 6):
        x = rng.standard_normal((n, 2, 6, 5)).astype(F)
        assert np.array_equal(fn(x), np.pad(x, ((0, 0), (0, 0), (2, 1), (0, 0)), mode=mode))


def test_pad_planted_mode_swap_fails(monkeypatch, rng):
    real = ops_spatial.ops.pad
    monkeypatch.setattr(ops_spatial.ops, "pad", lambda x, w, mode="constant", constant_values=0:
                        real(x, w, mode="edge" if mode == "reflect" else mode, constant_values=constant_values))
    x = rng.standard_normal((3, 6)).astype(F)
    got = ts.onnx.load(pad_model((3, 6), [1, 2, 1, 3], "reflect"))(x)
    assert not np.array_equal(got, pad_ref(x, [1, 2, 1, 3], "reflect"))


def test_pad_refusals():
    with pytest.raises(OnnxUnsupportedError, match="reflect pads .* must be smaller"):
        ts.onnx.load(pad_model((2, 3), [0, 3, 0, 0], "reflect", t=T.INT32))(np.ones((2, 3), np.int32))


# ---------------------------------------------------------------------------- ConvTranspose
def convt_ref(x, w, b, s, d, pads, outpad, g):
    """The transposed convolution by its definition: each input element scatters w times itself."""
    n, c, hh, ww = x.shape
    _, cpo, kh, kw = w.shape
    cpi = c // g
    hf, wf = (hh - 1) * s[0] + (kh - 1) * d[0] + 1 + outpad[0], (ww - 1) * s[1] + (kw - 1) * d[1] + 1 + outpad[1]
    y = np.zeros((n, g * cpo, hf, wf))
    for gi in range(g):
        xs, ws = x[:, gi * cpi:(gi + 1) * cpi], w[gi * cpi:(gi + 1) * cpi]
        for i in range(kh):
            for j in range(kw):
                y[:, gi * cpo:(gi + 1) * cpo, i * d[0]: i * d[0] + (hh - 1) * s[0] + 1: s[0],
                  j * d[1]: j * d[1] + (ww - 1) * s[1] + 1: s[1]] += np.einsum("nchw,co->nohw", xs, ws[:, :, i, j])
    y = y[:, :, pads[0]: hf - pads[2], pads[1]: wf - pads[3]]
    return y if b is None else y + b[None, :, None, None]


CONVT = [  # (x shape, w shape, strides, dilations, pads, output_padding, group, bias)
    ((2, 3, 5, 4), (3, 4, 3, 3), (1, 1), (1, 1), (0, 0, 0, 0), (0, 0), 1, True),
    ((1, 4, 4, 5), (4, 3, 3, 2), (2, 3), (1, 1), (1, 0, 2, 1), (1, 2), 1, True),
    ((2, 4, 3, 3), (4, 2, 2, 3), (2, 2), (2, 1), (0, 1, 1, 0), (0, 0), 2, False),
    ((1, 6, 4, 4), (6, 1, 3, 3), (3, 2), (1, 2), (2, 2, 2, 2), (2, 1), 3, True),
]


def convt_model(xs, w, b, **attrs):
    ins = ["x", "w"] + (["b"] if b is not None else [])
    return _model([h.make_node("ConvTranspose", ins, ["y"], name="ct", **attrs)], [_vi("x", list(xs))],
                  [_out(4)], [("w", w)] + ([("b", b)] if b is not None else []))


@pytest.mark.parametrize("case", range(len(CONVT)))
def test_conv_transpose_against_scatter_oracle(case, rng):
    xs, ws, s, d, pads, outpad, g, bias = CONVT[case]
    x, w = rng.standard_normal(xs).astype(F), rng.standard_normal(ws).astype(F)
    b = rng.standard_normal(ws[1] * g).astype(F) if bias else None
    m = convt_model(xs, w, b, strides=s, dilations=d, pads=pads, output_padding=outpad, group=g)
    got = ts.onnx.load(m)(x)
    want = convt_ref(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
                     s, d, pads, outpad, g)
    assert got.shape == want.shape and rel_err(got, want) < TOL


def test_conv_transpose_output_shape_and_same(rng):
    x, w = rng.standard_normal((1, 2, 3, 4)).astype(F), rng.standard_normal((2, 3, 3, 3)).astype(F)
    for attrs, pads, outpad in (({"output_shape": [8, 9]}, (0, 0, 0, 0), (1, 0)),     # 7x9 full, one more row
                                ({"auto_pad": "SAME_UPPER"}, (0, 0, 1, 1), (0, 0))):   # 6x8 of 7x9: cut at the end
        m = convt_model(x.shape, w, None, strides=[2, 2], **attrs)
        got = ts.onnx.load(m)(x)
        want = convt_ref(x.astype(np.float64), w.astype(np.float64), None, (2, 2), (1, 1), pads, outpad, 1)
        assert got.shape == want.shape and rel_err(got, want) < TOL, attrs


def test_conv_transpose_planted_unflipped_kernel_fails(monkeypatch, rng):
    monkeypatch.setattr(ops_spatial, "flip", lambda t, axis: t)
    xs, ws, s, d, pads, outpad, g, _ = CONVT[1]
    x, w = rng.standard_normal(xs).astype(F), rng.standard_normal(ws).astype(F)
    m = convt_model(xs, w, None, strides=s, pads=pads, output_padding=outpad)
    want = convt_ref(x.astype(np.float64), w.astype(np.float64), None, s, d, pads, outpad, g)
    assert rel_err(ts.onnx.load(m)(x), want) > 0.1


# ---------------------------------------------------------------------------- Einsum
EINSUM = [("ij,jk->ik", [(5, 6), (6, 7)]), ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
          ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]), ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
          ("bsd,df->bsf", [(2, 7, 8), (8, 3)]), ("ij,kj", [(4, 5), (6, 5)]), ("i,i", [(9,), (9,)]),
          ("ij->ji", [(3, 5)]), ("ijk->", [(2, 3, 4)]), ("bij->bj", [(2, 3, 4)]), ("ij,k->ikj", [(2, 3), (4,)]),
          ("abc,cd->dba", [(2, 3, 4), (4, 5)])]


@pytest.mark.parametrize("eq, shapes", EINSUM, ids=[e for e, _ in EINSUM])
def test_einsum_against_numpy(eq, shapes, rng):
    xs = [rng.standard_normal(s).astype(F) for s in shapes]
    names = [f"x{i}" for i in range(len(xs))]
    m = _model([h.make_node("Einsum", names, ["y"], name="e", equation=eq)],
               [_vi(n, list(s)) for n, s in zip(names, shapes)], [_out(np.einsum(eq, *xs).ndim)])
    got = ts.onnx.load(m)(*xs)
    want = np.einsum(eq, *[x.astype(np.float64) for x in xs])
    assert np.shape(got) == want.shape and rel_err(got, want) < TOL


def test_einsum_refusals():
    m = _model([h.make_node("Einsum", ["x"], ["y"], name="diag", equation="ii->i")], [_vi("x", [3, 3])],
               [_out(1)])
    with pytest.raises(OnnxUnsupportedError, match="repeats a letter"):
        ts.onnx.load(m)(np.ones((3, 3), F))


# ---------------------------------------------------------------------------- BatchNormalization
@pytest.mark.parametrize("shape", [(4, 5), (3, 5, 7), (2, 5, 3, 4)])
def test_batch_norm_inference_against_formula(shape, rng):
    c = shape[1]
    p = {"s": 1 + 0.3 * rng.standard_normal(c), "b": rng.standard_normal(c), "m": rng.standard_normal(c),
         "v": 0.5 + rng.random(c)}
    p = {k: v.astype(F) for k, v in p.items()}
    m = _model([h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", epsilon=1e-3)],
               [_vi("x", ["N"] + list(shape[1:]))], [_out(len(shape))], p.items())
    x = rng.standard_normal(shape).astype(F)
    k = (None, slice(None)) + (None,) * (len(shape) - 2)
    q = {n: v.astype(np.float64)[k] for n, v in p.items()}
    want = (x - q["m"]) / np.sqrt(q["v"] + 1e-3) * q["s"] + q["b"]
    assert rel_err(ts.onnx.load(m)(x), want) < TOL
    with pytest.raises(OnnxUnsupportedError, match="training_mode=1"):
        m.graph.node[0].attribute.append(h.make_attribute("training_mode", 1))
        ts.onnx.load(m)


# ---------------------------------------------------------------------------- ONNX's node tests
NODE_CASES = {"test_batchnorm_example", "test_constant_pad_axes", "test_wrap_pad", "test_convtranspose_pads",
              "test_einsum_batch_matmul"}


def test_node_cases_of_the_new_ops():
    cases = [c for c in oc.collect({"BatchNormalization", "Pad", "ConvTranspose", "Einsum"})
             if c.name in NODE_CASES]
    assert {c.name for c in cases} == NODE_CASES
    res = [oc.run_case(c) for c in cases]
    assert all(r.status == "passed" for r in res), res


@pytest.mark.slow
def test_all_node_cases_of_the_new_ops_pass_or_are_refused():
    res = [oc.run_case(c) for c in oc.collect({"BatchNormalization", "Pad", "ConvTranspose", "Einsum", "Resize"})]
    assert not [r for r in res if r.status not in ("passed", "refused")], res
    assert sum(r.status == "passed" for r in res) >= 60
