"""ONNX MatMulInteger / QLinearMatMul / ConvInteger / QLinearConv (tessera/onnx/ops_qlinear.py) on
fresh random int8 / uint8 data against integer (int64) numpy oracles and ONNX's requantisation
formula in float64, and onnxruntime; ONNX's own node tests for every quantisation op; a small
quantised model (QuantizeLinear -> QLinearMatMul -> DequantizeLinear, and a MatMulInteger chain);
coded refusals; planted bugs (a float32 sum past 2^24, the zero point dropped, round half up) fail."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

import tessera as ts  # noqa: E402
from tessera import dtypes as dt  # noqa: E402
from tessera.errors import OnnxUnsupportedError  # noqa: E402
from tessera.onnx import model as _registry  # noqa: E402,F401 - registers the handlers
from tessera.onnx import ops_qlinear  # noqa: E402

ONNX_T = {np.dtype(np.uint8): T.UINT8, np.dtype(np.int8): T.INT8, np.dtype(np.float32): T.FLOAT,
          np.dtype(np.int32): T.INT32, np.dtype(np.float16): T.FLOAT16}


def _q(rng, d, shape, lo=None, hi=None):
    info = np.iinfo(d)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(d)


def _model(op, inputs: dict, out_t, out_shape, opset=13, inits=(), **attrs):
    """One node; ``inputs`` name -> array (graph inputs in order; names in ``inits`` become initializers)."""
    names = list(inputs)
    g = h.make_graph([h.make_node(op, names, ["y"], name="n", **attrs)], "g",
                     [h.make_tensor_value_info(n, ONNX_T[v.dtype], list(v.shape)) for n, v in inputs.items()
                      if n not in inits],
                     [h.make_tensor_value_info("y", out_t, list(out_shape))],
                     initializer=[nh.from_array(inputs[n], n) for n in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    feeds = {n: v for n, v in inputs.items() if n not in inits}
    return m, feeds


def _run(m, feeds):
    return ts.onnx.load(m)(**feeds)


def _ort(m, feeds):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def mmi_ref(a, b, azp, bzp):
    """int64 (a - azp) @ (b - bzp); per-row azp (M,) and per-column bzp (N,) broadcast."""
    A = a.astype(np.int64) - (np.asarray(azp, np.int64).reshape(-1, 1) if np.ndim(azp) == 1 else np.int64(azp))
    B = b.astype(np.int64) - np.asarray(bzp, np.int64)
    return A @ B


CASES = [  # a dtype, b dtype, K, per-row / per-column zero points
    (np.uint8, np.uint8, 37, False), (np.int8, np.int8, 29, False), (np.uint8, np.int8, 41, True),
    (np.uint8, np.uint8, 300, True),    # K * 255 * 255 > 2^24: the float64 path
]


@pytest.mark.parametrize("ad, bd, k, per_axis", CASES)
def test_matmul_integer(ad, bd, k, per_axis, rng):
    m_, n = 7, 5
    a, b = _q(rng, ad, (m_, k)), _q(rng, bd, (k, n))
    azp = _q(rng, ad, (m_,) if per_axis else (), 0, 100)
    bzp = _q(rng, bd, (n,) if per_axis else (), 0, 100)
    m, feeds = _model("MatMulInteger", {"a": a, "b": b, "az": azp, "bz": bzp}, T.INT32, (m_, n), opset=10,
                      inits=("az", "bz"))
    got = _run(m, feeds)
    want = mmi_ref(a, b, azp, bzp)
    assert got.dtype == np.int32 and np.array_equal(got, want)
    if not per_axis:   # onnxruntime takes only per-tensor zero points for MatMulInteger
        assert np.array_equal(got, _ort(m, feeds))
    assert ops_qlinear.work_dtype(None, k, dt.as_dtype(ad), True, dt.as_dtype(bd), True) == (
        dt.float32 if k * 255 * 255 < 2 ** 24 else dt.float64)


def test_matmul_integer_batched_and_no_zero_points(rng):
    a, b = _q(rng, np.uint8, (2, 3, 6, 19)), _q(rng, np.int8, (19, 4))
    m, feeds = _model("MatMulInteger", {"a": a, "b": b}, T.INT32, (2, 3, 6, 4), opset=10)
    got = _run(m, feeds)
    assert np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64))
    assert np.array_equal(got, _ort(m, feeds))


def test_planted_float32_sum_past_2_24_fails(rng, monkeypatch):
    """teeth: K = 2000 uint8 products near 255 * 255 sum past 2^24: float32 rounds them."""
    a, b = _q(rng, np.uint8, (6, 2000), 200), _q(rng, np.uint8, (2000, 3), 200)
    m, feeds = _model("MatMulInteger", {"a": a, "b": b}, T.INT32, (6, 3), opset=10)
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert np.array_equal(_run(m, feeds), want)                       # float64 chosen: exact
    monkeypatch.setattr(ops_qlinear, "work_dtype", lambda *args: dt.float32)
    assert not np.array_equal(_run(m, feeds), want)


def test_planted_dropped_zero_point_fails(rng, monkeypatch):
    a, b = _q(rng, np.uint8, (5, 23)), _q(rng, np.uint8, (23, 4))
    azp, bzp = np.uint8(128), np.uint8(77)
    m, feeds = _model("MatMulInteger", {"a": a, "b": b, "az": np.array(azp), "bz": np.array(bzp)}, T.INT32, (5, 4),
                      opset=10, inits=("az", "bz"))
    real = ops_qlinear.integer_matmul
    monkeypatch.setattr(ops_qlinear, "integer_matmul", lambda ctx, a, b, az, bz, **kw: real(ctx, a, b, None, bz))
    assert not np.array_equal(_run(m, feeds), mmi_ref(a, b, azp, bzp))


def qlinear_ref(acc, a_s, b_s, y_s, yzp, qd):
    """ONNX's reference: the multiplier in the scales' dtype, times the exact int sum in float64."""
    mult = (a_s * b_s / y_s)
    y = acc.astype(np.float64) * mult.astype(np.float64) + np.float64(yzp)
    info = np.iinfo(qd)
    return np.clip(np.rint(y), info.min, info.max).astype(qd)


@pytest.mark.parametrize("qd, sd, per_axis", [(np.uint8, np.float32, False), (np.int8, np.float32, True),
                                              (np.uint8, np.float16, True), (np.int8, np.float16, False)])
def test_qlinear_matmul(qd, sd, per_axis, rng):
    m_, k, n = 6, 33, 5
    a, b = _q(rng, qd, (m_, k)), _q(rng, qd, (k, n))
    lo, hi = (100, 150) if qd == np.uint8 else (-20, 20)
    azp, bzp, yzp = _q(rng, qd, (m_,) if per_axis else (), lo, hi), _q(rng, qd, (n,) if per_axis else (), lo, hi), \
        _q(rng, qd, (), lo, hi)
    a_s = rng.uniform(0.005, 0.02, (m_,) if per_axis else ()).astype(sd)
    b_s = rng.uniform(0.005, 0.02, (n,) if per_axis else ()).astype(sd)
    y_s = np.array(rng.uniform(0.02, 0.05), sd)
    ins = {"a": a, "as": a_s, "az": azp, "b": b, "bs": b_s, "bz": bzp, "ys": y_s, "yz": yzp}
    m, feeds = _model("QLinearMatMul", ins, ONNX_T[np.dtype(qd)], (m_, n), opset=21,
                      inits=("as", "az", "bs", "bz", "ys", "yz"))
    got = _run(m, feeds)
    acc = mmi_ref(a, b, azp, bzp)
    want = qlinear_ref(acc, a_s.reshape(-1, 1) if per_axis else a_s, b_s, y_s, yzp, qd)
    assert got.dtype == qd and np.array_equal(got, want), np.abs(got.astype(int) - want).max()
    info = np.iinfo(qd)
    assert ((want == info.min) | (want == info.max)).any() or len(np.unique(want)) > 10
    if sd == np.float32 and not per_axis:   # onnxruntime requantises in float32: within one unit
        assert np.abs(got.astype(np.int64) - _ort(m, feeds).astype(np.int64)).max() <= 1


def test_planted_round_half_up_fails(rng, monkeypatch):
    """teeth: ties (a multiplier of 0.5 on odd sums) rounded half up must fail."""
    from tessera.frontend import ops
    a, b = _q(rng, np.int8, (8, 17), -3, 3), _q(rng, np.int8, (17, 6), -3, 3)     # |sum| <= 153: no saturation
    ins = {"a": a, "as": np.array(0.25, np.float32), "az": np.array(0, np.int8), "b": b,
           "bs": np.array(0.5, np.float32), "bz": np.array(0, np.int8), "ys": np.array(0.25 * 0.5 / 0.5, np.float32),
           "yz": np.array(0, np.int8)}
    m, feeds = _model("QLinearMatMul", ins, T.INT8, (8, 6), opset=10, inits=tuple(ins)[1:3] + tuple(ins)[4:])
    acc = mmi_ref(a, b, 0, 0)
    want = qlinear_ref(acc, np.float32(0.25), np.float32(0.5), np.float32(0.25), 0, np.int8)
    assert np.array_equal(_run(m, feeds), want)
    assert (np.abs(acc * 0.5) % 1 == 0.5).any()
    from tessera.onnx import ops_quant
    monkeypatch.setattr(ops_quant.ops, "round", lambda v: ops.floor(v + 0.5))
    assert not np.array_equal(_run(m, feeds), want)


def conv_ref(x, w, pads, stride=1):
    """int64 NCHW convolution (group 1), zero padding of the (already shifted) input."""
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, c, hh, ww = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (hh - kh) // stride + 1, (ww - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


@pytest.mark.parametrize("qd", [np.uint8, np.int8])
def test_conv_integer_and_qlinear_conv(qd, rng):
    x, w = _q(rng, qd, (2, 3, 9, 8)), _q(rng, qd, (4, 3, 3, 3))
    lo, hi = (100, 150) if qd == np.uint8 else (-20, 20)
    xzp, wzp, yzp = _q(rng, qd, (), lo, hi), _q(rng, qd, (4,), lo, hi), _q(rng, qd, (), lo, hi)
    pads = [1, 0, 1, 2]
    acc = conv_ref(x.astype(np.int64) - np.int64(xzp), w.astype(np.int64) - wzp.astype(np.int64).reshape(4, 1, 1, 1),
                   pads)
    m, feeds = _model("ConvInteger", {"x": x, "w": w, "xz": xzp, "wz": wzp}, T.INT32, acc.shape, opset=10,
                      inits=("w", "xz", "wz"), pads=pads)
    got = _run(m, feeds)
    assert got.dtype == np.int32 and np.array_equal(got, acc)
    bias = rng.integers(-3000, 3000, 4).astype(np.int32)
    x_s, w_s, y_s = np.float32(0.02), rng.uniform(0.003, 0.01, 4).astype(np.float32), np.float32(0.1)
    ins = {"x": x, "xs": np.array(x_s), "xz": xzp, "w": w, "ws": w_s, "wz": wzp, "ys": np.array(y_s), "yz": yzp,
           "B": bias}
    m, feeds = _model("QLinearConv", ins, ONNX_T[np.dtype(qd)], acc.shape, opset=10, inits=tuple(ins)[1:], pads=pads)
    got = _run(m, feeds)
    mult = (x_s * w_s / y_s).astype(np.float64).reshape(1, 4, 1, 1)
    info = np.iinfo(qd)
    want = np.clip(np.rint((acc + bias.reshape(1, 4, 1, 1)) * mult + np.float64(yzp)), info.min, info.max).astype(qd)
    assert got.dtype == qd and np.array_equal(got, want)
    if qd == np.uint8:   # onnxruntime's QLinearConv takes uint8 activations with per-channel weights
        assert np.abs(got.astype(np.int64) - _ort(m, feeds).astype(np.int64)).max() <= 1


def test_quantised_model_q_qlinear_matmul_dq(rng):
    """Quantize(u8) -> QLinearMatMul(u8 weights) -> Dequantize, and a MatMulInteger chain, in one
    compiled graph, against numpy and onnxruntime."""
    k, n = 48, 16
    x = rng.standard_normal((10, k)).astype(np.float32)
    wq = _q(rng, np.uint8, (k, n))
    s_x, z_x = np.float32(0.03), np.uint8(128)
    s_w, z_w = np.float32(0.01), np.uint8(120)
    s_y, z_y = np.float32(0.08), np.uint8(118)
    inits = [nh.from_array(np.array(v), nm) for nm, v in
             (("sx", s_x), ("zx", z_x), ("w", wq), ("sw", s_w), ("zw", z_w), ("sy", s_y), ("zy", z_y))]
    g = h.make_graph([h.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
                      h.make_node("QLinearMatMul", ["xq", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["yq"]),
                      h.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
                      h.make_node("MatMulInteger", ["xq", "w", "zx", "zw"], ["acc"])], "qmodel",
                     [h.make_tensor_value_info("x", T.FLOAT, [10, k])],
                     [h.make_tensor_value_info("y", T.FLOAT, [10, n]), h.make_tensor_value_info("acc", T.INT32, [10, n])],
                     initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    y, acc = ts.onnx.load(m)(x)
    xq = np.clip(np.rint((x / s_x).astype(np.float64)) + 128, 0, 255).astype(np.uint8)
    want_acc = mmi_ref(xq, wq, z_x, z_w)
    yq = qlinear_ref(want_acc, s_x, s_w, s_y, z_y, np.uint8)
    want_y = (yq.astype(np.float64) - 118) * np.float64(s_y)
    assert np.array_equal(acc, want_acc)
    np.testing.assert_allclose(y, want_y, rtol=1e-6, atol=1e-7)
    ort = pytest.importorskip("onnxruntime")
    oy, oacc = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.array_equal(acc, oacc)
    assert np.abs(y - oy).max() <= s_y * 1.0001           # within one quantisation step of onnxruntime


@pytest.mark.parametrize("what", ["float_zero_point", "zp_dtype", "zp_shape", "scale_shape", "float_input",
                                  "int32_overflow"])
def test_refusals_are_coded(what, rng):
    a, b = _q(rng, np.uint8, (4, 6)), _q(rng, np.uint8, (6, 3))
    if what == "float_zero_point":
        ins, op, out, inits = {"a": a, "b": b, "az": np.array(3.0, np.float32)}, "MatMulInteger", T.INT32, ("az",)
        msg = "a_zero_point is f32"
    elif what == "zp_dtype":
        ins, op, out, inits = {"a": a, "b": b, "az": np.array(3, np.int8)}, "MatMulInteger", T.INT32, ("az",)
        msg = "a_zero_point is i8, the input u8"
    elif what == "zp_shape":
        ins, op, out, inits = {"a": a, "b": b, "az": np.full(5, 3, np.uint8)}, "MatMulInteger", T.INT32, ("az",)
        msg = r"a_zero_point has shape \(5,\); a scalar or 4 elements is mapped"
    elif what == "scale_shape":
        ins = {"a": a, "as": np.full(2, 0.1, np.float32), "az": np.array(1, np.uint8), "b": b,
               "bs": np.array(0.1, np.float32), "bz": np.array(1, np.uint8), "ys": np.array(0.1, np.float32),
               "yz": np.array(1, np.uint8)}
        op, out, inits = "QLinearMatMul", T.UINT8, tuple(ins)[1:3] + tuple(ins)[4:]
        msg = r"first scale has shape \(2,\)"
    elif what == "float_input":
        ins, op, out, inits = {"a": a.astype(np.float32), "b": b}, "MatMulInteger", T.INT32, ()
        msg = "a f32 A is not mapped"
    else:
        ins, op, out, inits = {"a": _q(rng, np.uint8, (1, 40000)), "b": _q(rng, np.uint8, (40000, 1)),
                               "az": np.array(1, np.uint8)}, "MatMulInteger", T.INT32, ("az",)
        msg = "can pass 2\\^31"
    opset = 10
    g = h.make_graph([h.make_node(op, list(ins), ["y"], name="n")], "g",
                     [h.make_tensor_value_info(nm, ONNX_T[v.dtype], list(v.shape)) for nm, v in ins.items()
                      if nm not in inits], [h.make_tensor_value_info("y", out, [4, 3] if what != "int32_overflow"
                                                                     else [1, 1])],
                     initializer=[nh.from_array(ins[nm], nm) for nm in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    with pytest.raises(OnnxUnsupportedError, match=msg) as e:
        ts.onnx.load(m)(**{nm: v for nm, v in ins.items() if nm not in inits})
    assert e.value.code == "ONNX_UNSUPPORTED"


QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearMatMul",
             "ConvInteger", "QLinearConv"}


def test_onnx_node_tests_of_the_quantisation_ops():
    """Every case of ONNX's node tests for these ops passes or is refused by name (float8, int4,
    16-bit and blocked quantisation); each op passes at least one."""
    from tessera.tools import onnx_conformance as oc
    res = [oc.run_case(c) for c in oc.collect(QUANT_OPS)]
    bad = [(r.op, r.name, r.status, r.detail) for r in res if r.status not in ("passed", "refused")]
    assert not bad, bad
    assert {r.op for r in res if r.status == "passed"} == QUANT_OPS
    refused = [r.detail for r in res if r.status == "refused"]
    assert all(any(w in d for w in ("FLOAT8", "FLOAT4", "INT4", "UINT4", "INT2", "UINT2", "INT16", "UINT16",
                                    "block_size")) for d in refused), refused
    assert sum(r.status == "passed" for r in res) >= 19
