"""ONNX QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear (tessera/onnx/ops_quant.py) for
int8 and uint8, per tensor and per axis, on fresh random data (with exact .5 ties and values past
the quantised range) against float64 numpy oracles written here and onnxruntime; planted bugs (the
zero point dropped, round half up instead of to even, a symmetric -127..127 range, a signed
saturation for uint8) fail.  ONNX's own node tests for them: tests/test_onnx_qlinear.py."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

import tessera as ts  # noqa: E402
from tessera.errors import OnnxUnsupportedError  # noqa: E402
from tessera.onnx import convert, ops_quant  # noqa: E402

SHAPE = (3, 4, 5)


def _model(op, xt, yt, scale, zp, opset=13, **attrs):
    inits = [nh.from_array(scale, "s")] + ([nh.from_array(zp, "z")] if zp is not None else [])
    g = h.make_graph([h.make_node(op, ["x", "s"] + (["z"] if zp is not None else []), ["y"], name="q", **attrs)],
                     "g", [h.make_tensor_value_info("x", xt, list(SHAPE))],
                     [h.make_tensor_value_info("y", yt, list(SHAPE))], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _bcast(v, axis):
    if v.ndim == 0:
        return v.astype(np.float64)
    shape = [1] * len(SHAPE)
    shape[axis] = v.shape[0]
    return v.astype(np.float64).reshape(shape)


def quant_ref(x, scale, zp, axis, qd=np.int8):
    # the division in float32 as ONNX (and onnxruntime) do it, the rest in float64; rint: half to even
    q = np.rint((x / _bcast(scale, axis).astype(np.float32)).astype(np.float64))
    if zp is not None:
        q = q + _bcast(zp, axis)
    info = np.iinfo(qd)
    return np.clip(q, info.min, info.max).astype(qd)


def dequant_ref(x, scale, zp, axis):
    y = x.astype(np.float64) - (_bcast(zp, axis) if zp is not None else 0.0)
    return y * _bcast(scale, axis)


def _case(rng, per_axis, axis, qd=np.int8):
    n = SHAPE[axis]
    # dyadic scales (m / 256) so that the planted (k + 0.5) * scale ties divide back exactly
    scale = ((rng.integers(5, 26, n) if per_axis else np.array(rng.integers(5, 26))) / 256).astype(np.float32)
    lo, hi = (-20, 20) if qd == np.int8 else (100, 150)      # uint8: an asymmetric zero point mid-range
    zp = (rng.integers(lo, hi, n) if per_axis else np.array(rng.integers(lo, hi))).astype(qd)
    x = rng.standard_normal(SHAPE).astype(np.float32) * 6            # past +-128 * scale: saturates
    # exact ties: k + 0.5 steps of the scale (both parities of k)
    flat = x.reshape(-1)
    sb = np.broadcast_to(_bcast(scale, axis), SHAPE).reshape(-1).astype(np.float32)
    k = rng.integers(-6, 6, 12)
    flat[:12] = ((k + 0.5) * sb[:12]).astype(np.float32)
    return x, scale, zp


def _ort(m, x):
    ort = pytest.importorskip("onnxruntime")
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


@pytest.mark.parametrize("per_axis, axis, with_zp", [(False, 1, True), (True, 1, True), (True, 2, True),
                                                     (True, 0, True), (False, 1, False)])
def test_quantize_int8(per_axis, axis, with_zp, rng):
    x, scale, zp = _case(rng, per_axis, axis)
    zp = zp if with_zp else None
    if zp is None:   # without a zero point ONNX's output is uint8: int8 is asked for by output_dtype (opset 21)
        m = _model("QuantizeLinear", T.FLOAT, T.INT8, scale, None, opset=21, axis=axis, output_dtype=T.INT8)
    else:
        m = _model("QuantizeLinear", T.FLOAT, T.INT8, scale, zp, axis=axis)
    got = ts.onnx.load(m)(x)
    want = quant_ref(x, scale, zp, axis)
    assert got.dtype == np.int8 and np.array_equal(got, want)
    assert (want == 127).any() and (want == -128).any()               # saturation exercised
    ratio = (x / _bcast(scale, axis).astype(np.float32)).astype(np.float64)
    assert (ratio % 1 == 0.5).sum() >= 4                              # ties exercised
    assert np.array_equal(got, _ort(m, x))


@pytest.mark.parametrize("per_axis, axis", [(False, 1), (True, 1), (True, 2)])
def test_dequantize_int8(per_axis, axis, rng):
    _, scale, zp = _case(rng, per_axis, axis)
    x = rng.integers(-128, 128, SHAPE).astype(np.int8)
    m = _model("DequantizeLinear", T.INT8, T.FLOAT, scale, zp, axis=axis)
    got = ts.onnx.load(m)(x)
    want = dequant_ref(x, scale, zp, axis)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, _ort(m, x), rtol=1e-6, atol=1e-7)


def test_round_trip_in_one_graph(rng):
    """Q then DQ (the fake-quant pattern of quantised models) in one compiled graph."""
    x, scale, zp = _case(rng, True, 1)
    inits = [nh.from_array(scale, "s"), nh.from_array(zp, "z")]
    g = h.make_graph([h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
                      h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, list(SHAPE))],
                     [h.make_tensor_value_info("y", T.FLOAT, list(SHAPE))], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    got = ts.onnx.load(m)(x)
    want = dequant_ref(quant_ref(x, scale, zp, 1), scale, zp, 1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, _ort(m, x), rtol=1e-6, atol=1e-7)


def _planted(monkeypatch, name, fn):
    spec = convert.OPS[name]
    monkeypatch.setitem(convert.OPS, name, convert.Spec(fn, spec.inputs, spec.attrs, spec.static, spec.fold,
                                                        spec.check, spec.outputs))


def test_planted_dequantize_without_zero_point_fails(rng, monkeypatch):
    _, scale, zp = _case(rng, True, 1)
    x = rng.integers(-128, 128, SHAPE).astype(np.int8)
    m = _model("DequantizeLinear", T.INT8, T.FLOAT, scale, zp, axis=1)
    real = ops_quant._dequantize
    _planted(monkeypatch, "DequantizeLinear", lambda ctx, ins: real(ctx, ins[:2]))
    got = ts.onnx.load(m)(x)
    assert not np.allclose(got, dequant_ref(x, scale, zp, 1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bug", ["half_up", "symmetric_range"])
def test_planted_rounding_and_saturation_bugs_fail(bug, rng, monkeypatch):
    from tessera.frontend import ops
    x, scale, zp = _case(rng, False, 1)
    m = _model("QuantizeLinear", T.FLOAT, T.INT8, scale, zp, axis=1)
    if bug == "half_up":
        monkeypatch.setattr(ops_quant.ops, "round", lambda v: ops.floor(v + 0.5))
    else:
        monkeypatch.setitem(ops_quant.RANGES, np.dtype(np.int8), (-127.0, 127.0))   # -128 must be reachable
    got = ts.onnx.load(m)(x)
    assert not np.array_equal(got, quant_ref(x, scale, zp, 1))


@pytest.mark.parametrize("per_axis, axis, with_zp", [(False, 1, True), (True, 2, True), (True, 0, True),
                                                     (False, 1, False)])
def test_quantize_uint8(per_axis, axis, with_zp, rng):
    x, scale, zp = _case(rng, per_axis, axis, np.uint8)
    zp = zp if with_zp else None               # no zero point: ONNX's default output type is uint8
    x.flat[-2:] = [-1e3, 1e3]                  # past both ends, whatever the scale
    m = _model("QuantizeLinear", T.FLOAT, T.UINT8, scale, zp, axis=axis)
    got = ts.onnx.load(m)(x)
    want = quant_ref(x, scale, zp, axis, np.uint8)
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    assert (want == 255).any() and (want == 0).any()                 # saturation at both ends
    assert np.array_equal(got, _ort(m, x))


@pytest.mark.parametrize("per_axis, axis", [(False, 1), (True, 2)])
def test_dequantize_uint8(per_axis, axis, rng):
    _, scale, zp = _case(rng, per_axis, axis, np.uint8)
    x = rng.integers(0, 256, SHAPE).astype(np.uint8)
    m = _model("DequantizeLinear", T.UINT8, T.FLOAT, scale, zp, axis=axis)
    got = ts.onnx.load(m)(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, dequant_ref(x, scale, zp, axis), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, _ort(m, x), rtol=1e-6, atol=1e-7)


def test_planted_signed_uint8_saturation_fails(rng, monkeypatch):
    """teeth: uint8 saturated as int8 (-128..127) must fail."""
    x, scale, zp = _case(rng, False, 1, np.uint8)
    m = _model("QuantizeLinear", T.FLOAT, T.UINT8, scale, zp, axis=1)
    monkeypatch.setitem(ops_quant.RANGES, np.dtype(np.uint8), (-128.0, 127.0))
    assert not np.array_equal(ts.onnx.load(m)(x), quant_ref(x, scale, zp, 1, np.uint8))


def dynamic_ref(x):
    """ONNX's DynamicQuantizeLinear formula, in float32 as its reference (rint: half to even)."""
    hi, lo = np.float32(max(0.0, x.max())), np.float32(min(0.0, x.min()))
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.clip(np.rint(x / scale).astype(np.float64) + zp, 0, 255).astype(np.uint8)
    return y, np.float32(scale), np.uint8(zp)


@pytest.mark.parametrize("shift", [0.0, 3.0, -3.0])      # both signs, all positive, all negative
def test_dynamic_quantize(shift, rng):
    x = (rng.standard_normal(SHAPE) * 2 + shift).astype(np.float32)
    g = h.make_graph([h.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, list(SHAPE))],
                     [h.make_tensor_value_info("y", T.UINT8, list(SHAPE)), h.make_tensor_value_info("s", T.FLOAT, []),
                      h.make_tensor_value_info("z", T.UINT8, [])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    y, s, z = ts.onnx.load(m)(x)
    wy, ws, wz = dynamic_ref(x)
    assert y.dtype == np.uint8 and z.dtype == np.uint8 and s.dtype == np.float32
    assert s == ws and z == wz and np.array_equal(y, wy)
    assert (wy == 255).any() or (wy == 0).any()
    ort = pytest.importorskip("onnxruntime")
    oy, os_, oz = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.array_equal(y, oy) and s == os_ and z == oz


def _raw_model(op, inputs, inits, out_t, opset=13, out_shape=SHAPE, **attrs):
    """A one-node model whose inputs are (name, type, shape) and initializers numpy arrays."""
    g = h.make_graph([h.make_node(op, [n for n, _, _ in inputs] + list(inits), ["y"], name="q", **attrs)], "g",
                     [h.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
                     [h.make_tensor_value_info("y", out_t, list(out_shape))],
                     initializer=[nh.from_array(v, k) for k, v in inits.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


@pytest.mark.parametrize("what", ["blocked", "float_zero_point", "scale_length", "zp_shape", "int16_out",
                                  "uint16_input"])
def test_refusals_are_coded(what, rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    s = np.array(0.05, np.float32)
    if what == "blocked":
        m = _model("QuantizeLinear", T.FLOAT, T.INT8, np.full((3, 2, 5), 0.05, np.float32),
                   np.zeros((3, 2, 5), np.int8), opset=21, axis=1, block_size=2)
        msg = "block_size"
    elif what == "float_zero_point":
        m = _raw_model("QuantizeLinear", [("x", T.FLOAT, SHAPE)], {"s": s, "z": np.array(3.0, np.float32)}, T.UINT8)
        msg = "a f32 zero point is not mapped"
    elif what == "scale_length":      # 3 scales along axis 1 of size 4
        m = _raw_model("QuantizeLinear", [("x", T.FLOAT, SHAPE)],
                       {"s": np.full(3, 0.05, np.float32), "z": np.full(3, 9, np.uint8)}, T.UINT8, axis=1)
        msg = "y_scale has 3 elements, but axis 1 of the input has 4"
    elif what == "zp_shape":
        m = _raw_model("QuantizeLinear", [("x", T.FLOAT, SHAPE)],
                       {"s": np.full(4, 0.05, np.float32), "z": np.array(9, np.uint8)}, T.UINT8, axis=1)
        msg = "differs from the zero point"
    elif what == "int16_out":
        m = _raw_model("QuantizeLinear", [("x", T.FLOAT, SHAPE)], {"s": s}, T.INT16, opset=21,
                       output_dtype=T.INT16)
        msg = "output_dtype INT16 is not mapped"
    else:
        m = _raw_model("DequantizeLinear", [("x", T.UINT16, SHAPE)], {"s": s}, T.FLOAT, opset=21)
        msg = "element type UINT16"
    with pytest.raises(OnnxUnsupportedError, match=msg) as e:
        ts.onnx.load(m)(x)
    assert e.value.code == "ONNX_UNSUPPORTED"


def test_control_flow_and_data_dependent_shapes_refused_at_once():
    """If and NonZero in one model: one coded error names both, each with its reason."""
    then_g = h.make_graph([h.make_node("Identity", ["x"], ["t"])], "then", [],
                          [h.make_tensor_value_info("t", T.FLOAT, list(SHAPE))])
    g = h.make_graph([h.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=then_g),
                      h.make_node("NonZero", ["x"], ["nz"], name="nz")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, list(SHAPE)), h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, list(SHAPE)),
                      h.make_tensor_value_info("nz", T.INT64, [3, "n"])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    with pytest.raises(OnnxUnsupportedError) as e:
        ts.onnx.load(m)
    msg = str(e.value)
    assert "2 node(s)" in msg and "(If): control flow on runtime values" in msg
    assert "(NonZero): its output shape depends on the input's values" in msg
