"""tessera.onnx.load: ONNX models built with onnx.helper, replayed through tessera.ops, against
float64 numpy oracles written here (and onnx's ReferenceEvaluator for the MLP)."""
from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

import tessera as ts  # noqa: E402
from tessera.errors import OnnxImportError, OnnxUnsupportedError  # noqa: E402

F = np.float32


def _model(nodes, inputs, outputs, inits=(), opset=17, name="g"):
    g = h.make_graph(nodes, name, inputs, outputs, [nh.from_array(v, k) for k, v in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _vi(name, shape, t=T.FLOAT):
    return h.make_tensor_value_info(name, t, shape)


def _i64(*v):
    return np.asarray(v, np.int64)


def _close(got, want, tol=2e-4):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return np.allclose(got, want, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------- the MLP (Gemm + Relu)
W = np.random.default_rng(29).standard_normal
MLP_W = {"w1": W((8, 16)).astype(F), "b1": W(16).astype(F), "w2": W((16, 16)).astype(F), "b2": W(16).astype(F)}


def mlp_model():
    nodes = [h.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             h.make_node("Relu", ["h"], ["r"], name="relu"),
             h.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2", transB=1, alpha=0.5, beta=2.0)]
    return _model(nodes, [_vi("x", ["N", 8])], [_vi("y", ["N", 16])], MLP_W.items(), name="mlp")


def mlp_ref(x):
    w = {k: v.astype(np.float64) for k, v in MLP_W.items()}
    return 0.5 * np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"].T + 2 * w["b2"]


@pytest.fixture(scope="module")
def mlp():
    return ts.onnx.load(mlp_model())


def test_mlp_dynamic_batch(mlp, rng):
    assert mlp.input_names == ["x"] and mlp.output_names == ["y"] and set(mlp.weights) == set(MLP_W)
    for n in (3, 21):                   # two buckets of the dim_param N
        x = rng.standard_normal((n, 8)).astype(F)
        assert _close(mlp(x), mlp_ref(x.astype(np.float64)))
    assert _close(mlp(x=x), mlp_ref(x.astype(np.float64)))          # by ONNX name
    assert mlp.dynamic == {0: {0: "N"}} and mlp.dynamic_fallback is None
    from onnx.reference import ReferenceEvaluator
    ref = ReferenceEvaluator(mlp_model()).run(None, {"x": x})[0]
    assert _close(mlp(x), ref.astype(np.float64))


def test_mlp_bad_calls(mlp, rng):
    with pytest.raises(ts.TesseraError) as e:
        mlp(rng.standard_normal((3, 8)), rng.standard_normal((3, 8)))
    assert e.value.code == "BAD_ARGUMENT" and "takes 1 inputs" in str(e.value)
    with pytest.raises(ts.TesseraError) as e:
        mlp(rng.standard_normal((3, 8)))                           # float64 into a FLOAT input
    assert e.value.code == "DTYPE_UNSUPPORTED"
    with pytest.raises(ts.TesseraError) as e:
        mlp(rng.standard_normal((3, 9)).astype(F))
    assert e.value.code == "SHAPE_MISMATCH" and "'x'" in str(e.value)


def test_planted_transb_bug_is_caught(monkeypatch, rng):
    """Teeth: a Gemm that ignores transB (square weights: still runs) fails the oracle."""
    from tessera.onnx import convert, model  # noqa: F401 - model imports the op modules
    spec = convert.OPS["Gemm"]

    def wrong(ctx, ins):
        attrs = {k: v for k, v in ctx.attrs.items() if k != "transB"}
        return spec.fn(convert.Ctx(ctx.node, attrs, ctx.opset, ctx.n_outputs), ins)
    monkeypatch.setitem(convert.OPS, "Gemm", convert.Spec(wrong, spec.inputs, spec.attrs, spec.static))
    x = rng.standard_normal((5, 8)).astype(F)
    assert not _close(ts.onnx.load(mlp_model())(x), mlp_ref(x.astype(np.float64)))


# ---------------------------------------------------------------------------- a transformer block
B, S, D, H = 2, 8, 16, 2
TW = {"ln1_s": 1 + 0.1 * W(D).astype(F), "ln1_b": 0.1 * W(D).astype(F), "wqkv": (W((D, 3 * D)) / 4).astype(F),
      "bqkv": W(3 * D).astype(F) * 0.1, "wo": (W((D, D)) / 4).astype(F), "ln2_s": 1 + 0.1 * W(D).astype(F),
      "ln2_b": 0.1 * W(D).astype(F), "w1": (W((D, 4 * D)) / 4).astype(F), "w2": (W((4 * D, D)) / 8).astype(F),
      "split": _i64(D, D, D), "heads": _i64(0, 0, H, D // H), "merge": _i64(0, 0, -1),
      "scale": np.asarray(1 / math.sqrt(D // H), F), "half": np.asarray(0.5, F), "one": np.asarray(1.0, F),
      "rt2": np.asarray(math.sqrt(2), F)}


def block_model():
    n = h.make_node
    nodes = [n("LayerNormalization", ["x", "ln1_s", "ln1_b"], ["a"], name="ln1", epsilon=1e-5),
             n("MatMul", ["a", "wqkv"], ["qkv0"], name="qkv"), n("Add", ["qkv0", "bqkv"], ["qkv"], name="qkv_b"),
             n("Split", ["qkv", "split"], ["q0", "k0", "v0"], name="split", axis=-1)]
    for t in "qkv":
        nodes += [n("Reshape", [f"{t}0", "heads"], [f"{t}1"], name=f"{t}_heads"),
                  n("Transpose", [f"{t}1"], [t], name=f"{t}_t", perm=[0, 2, 1, 3])]
    nodes += [n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
              n("MatMul", ["q", "kt"], ["s0"], name="scores"), n("Mul", ["s0", "scale"], ["s"], name="scale"),
              n("Softmax", ["s"], ["p"], name="softmax", axis=-1), n("MatMul", ["p", "v"], ["o0"], name="pv"),
              n("Transpose", ["o0"], ["o1"], name="o_t", perm=[0, 2, 1, 3]),
              n("Reshape", ["o1", "merge"], ["o2"], name="merge"), n("MatMul", ["o2", "wo"], ["o"], name="proj"),
              n("Add", ["x", "o"], ["r1"], name="res1"),
              n("LayerNormalization", ["r1", "ln2_s", "ln2_b"], ["c"], name="ln2", epsilon=1e-5),
              n("MatMul", ["c", "w1"], ["u"], name="up"), n("Gelu", ["u"], ["g"], name="gelu"),
              n("MatMul", ["g", "w2"], ["dn"], name="down"), n("Add", ["r1", "dn"], ["y"], name="res2"),
              # the erf spelling of GELU that older exporters write
              n("Div", ["u", "rt2"], ["e0"], name="e_div"), n("Erf", ["e0"], ["e1"], name="erf"),
              n("Add", ["e1", "one"], ["e2"], name="e_add"), n("Mul", ["u", "e2"], ["e3"], name="e_mul"),
              n("Mul", ["e3", "half"], ["y2"], name="e_half")]
    return _model(nodes, [_vi("x", [B, S, D])], [_vi("y", [B, S, D]), _vi("y2", [B, S, 4 * D])], TW.items(),
                  opset=20, name="block")


def _ln(x, s, b):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * s + b


def block_ref(x):
    erf = np.vectorize(math.erf)
    w = {k: v.astype(np.float64) for k, v in TW.items() if v.dtype == F}
    qkv = _ln(x, w["ln1_s"], w["ln1_b"]) @ w["wqkv"] + w["bqkv"]
    q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, S, H, D // H).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D // H)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    r1 = x + (p @ v).transpose(0, 2, 1, 3).reshape(B, S, D) @ w["wo"]
    u = _ln(r1, w["ln2_s"], w["ln2_b"]) @ w["w1"]
    g = u * 0.5 * (1 + erf(u / math.sqrt(2)))
    return r1 + g @ w["w2"], g


def test_transformer_block(rng):
    fn = ts.onnx.load(block_model())
    assert "scale" not in fn.weights and "heads" not in fn.weights and "wqkv" in fn.weights
    x = rng.standard_normal((B, S, D)).astype(F)
    y, y2 = fn(x)
    want, want2 = block_ref(x.astype(np.float64))
    assert _close(y, want) and _close(y2, want2)


# ---------------------------------------------------------------------------- a small CNN
CW = {"c1": (W((4, 3, 3, 3)) / 3).astype(F), "cb1": W(4).astype(F) * 0.1, "c2": (W((6, 2, 3, 3)) / 3).astype(F),
      "fw": (W((6 * 2 * 2, 5)) / 4).astype(F), "fb": W(5).astype(F)}


def cnn_model():
    n = h.make_node
    nodes = [n("Conv", ["x", "c1", "cb1"], ["a"], name="conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             n("Relu", ["a"], ["b"], name="relu1"),
             n("MaxPool", ["b"], ["c"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["c", "c2"], ["d"], name="conv2", group=2, auto_pad="SAME_UPPER", strides=[2, 2]),
             n("AveragePool", ["d"], ["e"], name="pool2", kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]),
             n("Flatten", ["e"], ["f"], name="flat", axis=1), n("Gemm", ["f", "fw", "fb"], ["y"], name="fc")]
    return _model(nodes, [_vi("x", [2, 3, 8, 8])], [_vi("y", [2, 5])], CW.items(), name="cnn")


def _conv_ref(x, w, b, stride, pads, group):
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, c, hh, ww = x.shape
    o, cg, kh, kw = w.shape
    ho, wo = (hh - kh) // stride + 1, (ww - kw) // stride + 1
    y = np.zeros((n, o, ho, wo))
    og = o // group
    for g in range(group):
        xs = x[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                win = xs[:, :, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", win, w[g * og:(g + 1) * og, :, i, j])
    return y if b is None else y + b[:, None, None]


def cnn_ref(x):
    w = {k: v.astype(np.float64) for k, v in CW.items()}
    a = np.maximum(_conv_ref(x, w["c1"], w["cb1"], 1, (1, 1, 1, 1), 1), 0)
    c = a.reshape(2, 4, 4, 2, 4, 2).max(axis=(3, 5))
    d = _conv_ref(c, w["c2"], None, 2, (0, 0, 1, 1), 2)                  # SAME_UPPER: extra pad after
    dp = np.pad(d, ((0, 0), (0, 0), (0, 1), (0, 1)))
    ones = np.pad(np.ones(d.shape[2:]), ((0, 1), (0, 1)))
    win = lambda v: sum(v[..., i:i + 2, j:j + 2] for i in range(2) for j in range(2))   # noqa: E731
    e = win(dp) / win(ones)                                              # count_include_pad=0
    return e.reshape(2, -1) @ w["fw"] + w["fb"]


def test_small_cnn(rng):
    fn = ts.onnx.load(cnn_model())
    x = rng.standard_normal((2, 3, 8, 8)).astype(F)
    assert _close(fn(x), cnn_ref(x.astype(np.float64)))


# ---------------------------------------------------------------------------- slicing, gather, concat, the rest
EMB = W((10, 6)).astype(F)


def misc_model():
    n = h.make_node
    c = {"st": _i64(1, -1), "en": _i64(4, -100), "ax": _i64(0, 1), "sp": _i64(1, -2), "r1": _i64(1),
         "zero": np.asarray(0.0, F), "lo": np.asarray(-0.5, F), "two": np.asarray(2.0, F), "k": _i64(2),
         "i0": np.asarray(0, np.int64), "i1": np.asarray(1, np.int64), "u0": _i64(0), "ex": _i64(2, 3, 6), "emb": EMB}
    nodes = [n("Slice", ["x", "st", "en", "ax", "sp"], ["sl"], name="slice"),                  # [3, 5]
             n("Gather", ["emb", "ids"], ["em"], name="embed"),                                # [3, 6]
             n("Concat", ["sl", "em"], ["cat"], name="cat", axis=1),                           # [3, 11]
             n("Shape", ["cat"], ["shp"], name="shape"), n("Gather", ["shp", "i0"], ["rows"], name="rows"),
             n("Unsqueeze", ["rows", "u0"], ["rows1"], name="rows1"),
             n("Concat", ["rows1", "r1", "shp"], ["nshape"], name="nshape", axis=0),
             n("Slice", ["nshape", "u0", "k"], ["nshape2"], name="nshape2"),                  # [3, 1]
             n("ReduceSum", ["cat", "r1"], ["rs"], name="rsum", keepdims=1),                   # [3, 1]
             n("Reshape", ["rs", "nshape2"], ["rs2"], name="rs2"),
             n("ReduceMax", ["cat"], ["rm"], name="rmax", axes=[1], keepdims=0),               # [3]
             n("ReduceMean", ["cat"], ["rmean"], name="rmean", axes=[0, 1], keepdims=0),
             n("Unsqueeze", ["rm", "r1"], ["rm1"], name="rm1"),
             n("Sub", ["cat", "rm1"], ["cen"], name="center"),
             n("LogSoftmax", ["cat"], ["ls"], name="lsm", axis=0),
             n("CumSum", ["cat", "r1"], ["cs"], name="cumsum", reverse=1),
             n("Greater", ["cat", "zero"], ["pos"], name="gt"), n("Not", ["pos"], ["neg"], name="not"),
             n("Less", ["cat", "lo"], ["low"], name="lt"), n("Or", ["low", "pos"], ["lp"], name="or"),
             n("And", ["lp", "neg"], ["onlylow"], name="and"),
             n("Where", ["onlylow", "cat", "cen"], ["w"], name="where"),
             n("Clip", ["w", "lo", "two"], ["cl"], name="clip"),
             n("Abs", ["cat"], ["ab"], name="abs"), n("Sqrt", ["ab"], ["sq"], name="sqrt"),
             n("Pow", ["sq", "two"], ["pw"], name="pow"), n("Log", ["pw"], ["lg"], name="log"),
             n("Tanh", ["cat"], ["th"], name="tanh"), n("Sigmoid", ["cat"], ["sg"], name="sigmoid"),
             n("Exp", ["th"], ["ep"], name="exp"), n("Neg", ["sg"], ["ng"], name="neg"),
             n("Div", ["ep", "two"], ["dv"], name="div"), n("Equal", ["cat", "cat"], ["eq"], name="eq"),
             n("Cast", ["eq"], ["eqf"], name="cast", to=T.FLOAT),
             n("Add", ["dv", "ng"], ["mix0"], name="mix0"), n("Mul", ["mix0", "eqf"], ["mix"], name="mix"),
             n("ArgMax", ["cat"], ["am"], name="argmax", axis=1, keepdims=0),
             n("TopK", ["cat", "k"], ["tv", "ti"], name="topk", axis=1),
             n("Squeeze", ["rs", "r1"], ["rsq"], name="squeeze"),
             n("Expand", ["rs", "ex"], ["rex0"], name="expand0"),                            # [2, 3, 6]
             n("ConstantOfShape", ["ex"], ["ones"], name="cos", value=nh.from_array(np.asarray([1.5], F))),
             n("Mul", ["rex0", "ones"], ["rex"], name="expand"),
             n("Dropout", ["lg"], ["dr"], name="dropout"), n("Identity", ["dr"], ["idn"], name="identity"),
             n("Constant", [], ["cst"], name="const", value_float=0.25),
             n("Add", ["idn", "cst"], ["lg2"], name="lg2")]
    outs = [_vi("rs2", [3, 1]), _vi("rmean", []), _vi("ls", [3, 11]), _vi("cs", [3, 11]), _vi("cl", [3, 11]),
            _vi("lg2", [3, 11]), _vi("mix", [3, 11]), _vi("am", [3], T.INT64), _vi("tv", [3, 2]),
            _vi("ti", [3, 2], T.INT64), _vi("rex", [2, 3, 6]), _vi("pw", [3, 11]), _vi("rsq", [3])]
    return _model(nodes, [_vi("x", [4, 8]), _vi("ids", [3], T.INT64)], outs, c.items(), opset=17, name="misc")


def misc_ref(x, ids):
    sl = x[1:4][:, ::-2]
    cat = np.concatenate([sl, EMB.astype(np.float64)[np.where(ids < 0, ids + 10, ids)]], axis=1)
    rs = cat.sum(1, keepdims=True)
    rm = cat.max(1)
    cen = cat - rm[:, None]
    ls = cat - np.log(np.exp(cat).sum(0, keepdims=True))
    cs = np.cumsum(cat[:, ::-1], axis=1)[:, ::-1]
    w = np.where((cat < -0.5) & ~(cat > 0), cat, cen)
    pw = np.abs(cat)
    lg2 = np.log(pw) + 0.25
    mix = np.exp(np.tanh(cat)) / 2 - 1 / (1 + np.exp(-cat))
    order = np.argsort(-cat, axis=1, kind="stable")[:, :2]
    rex = np.broadcast_to(rs, (2, 3, 6)) * 1.5
    return [rs, np.asarray(cat.mean()), ls, cs, np.clip(w, -0.5, 2.0), lg2, mix, cat.argmax(1),
            np.take_along_axis(cat, order, 1), order, rex, pw, rs[:, 0]]


def test_slicing_gather_concat_and_elementwise(rng):
    fn = ts.onnx.load(misc_model())
    assert set(fn.weights) == {"emb"}          # shapes, axes and scalars are constants, not arguments
    x = rng.standard_normal((4, 8)).astype(F)
    ids = rng.integers(-10, 10, 3).astype(np.int64)
    got = fn(x, ids)
    want = misc_ref(x.astype(np.float64), ids)
    names = ["rs2", "rmean", "ls", "cs", "cl", "lg2", "mix", "am", "tv", "ti", "rex", "pw", "rsq"]
    for name, g, w in zip(names, got, want):
        if w.dtype.kind == "i":
            assert np.array_equal(g, w), name
        else:
            assert _close(g, w), name


# ---------------------------------------------------------------------------- refusals
def test_unsupported_nodes_listed_at_once():
    n = h.make_node
    nodes = [n("Relu", ["x"], ["a"], name="ok"), n("Det", ["a"], ["b"], name="det1"),
             n("Conv", ["x5", "w5"], ["c"], name="conv3d", kernel_shape=[2, 2, 2]),
             n("Gemm", ["x", "x", "x2", "x2"], ["d"], name="gemm4"),
             n("Softmax", ["a"], ["e"], name="sm", axis=0)]
    g = h.make_graph(nodes, "bad", [_vi("x", [2, 2]), _vi("x2", [2, 2]), _vi("x5", [1, 1, 3, 3, 3]),
                                    _vi("w5", [1, 1, 2, 2, 2])], [_vi("b", []), _vi("c", None), _vi("d", [2, 2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(OnnxUnsupportedError) as e:
        ts.onnx.load(m)
    msg = str(e.value)
    assert e.value.code == "ONNX_UNSUPPORTED" and "3 node(s)" in msg, msg
    assert "'det1' (Det): op type not mapped" in msg
    assert "'conv3d' (Conv): a 3-D kernel" in msg
    assert "'gemm4' (Gemm): 4 inputs (takes 2..3)" in msg and "'sm'" not in msg


def test_bad_files_and_opsets(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x08\x07garbage that is not a protobuf \xff\xff")
    with pytest.raises(OnnxImportError) as e:
        ts.onnx.load(str(p))
    assert e.value.code == "ONNX_IMPORT"
    old = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "o", [_vi("x", [2])], [_vi("y", [2])]),
                       opset_imports=[h.make_opsetid("", 11)])
    with pytest.raises(OnnxImportError, match="opset 11 is not supported"):
        ts.onnx.load(old.SerializeToString())
    m = _model([h.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [_vi("x", [2, 3])], [_vi("y", [3, 4])],
               [("s", _i64(3, 4))])
    with pytest.raises(ts.TesseraError) as e:
        ts.onnx.load(m)(np.ones((2, 3), F))
    assert e.value.code == "ONNX_UNSUPPORTED" and "'rs' (Reshape)" in str(e.value)


def test_dynamic_dim_that_cannot_bucket_is_specialised(rng):
    """A Flatten that merges the dim_param axis cannot be bucketed: DYNAMIC_SHAPE, then one
    compile per shape (fn.dynamic_fallback says why), still correct."""
    m = _model([h.make_node("Flatten", ["x"], ["f"], name="flat", axis=0),
                h.make_node("Softmax", ["f"], ["y"], name="sm", axis=1)], [_vi("x", ["N", 3])], [_vi("y", [1, "M"])])
    fn = ts.onnx.load(m)
    for n in (2, 5):
        x = rng.standard_normal((n, 3)).astype(F)
        e = np.exp(x.astype(np.float64).reshape(1, -1))
        assert _close(fn(x), e / e.sum())
    assert fn.dynamic == {} and fn.dynamic_fallback, fn.dynamic_fallback


def test_opset18_forms_and_less_common_attributes(rng):
    """Split num_outputs, Reduce axes as an input (opset 18), LayerNormalization over two axes,
    TopK largest=0, Conv auto_pad SAME_LOWER with stride 2, exclusive CumSum."""
    n = h.make_node
    c = {"ax": _i64(-1), "k": _i64(2), "s": 1 + 0.1 * W(4).astype(F), "cw": W((2, 1, 3, 3)).astype(F)}
    nodes = [n("Split", ["x"], ["p0", "p1"], name="split", axis=1, num_outputs=2),               # [3,2,4] each
             n("ReduceMean", ["p0", "ax"], ["rm"], name="rmean", keepdims=0),                      # [3,2]
             n("LayerNormalization", ["x", "s"], ["ln"], name="ln", axis=1, epsilon=1e-3),  # [4, 4], scale bcast
             n("TopK", ["rm", "k"], ["tv", "ti"], name="topk", axis=1, largest=0),
             n("CumSum", ["p1", "ax"], ["cs"], name="cs", exclusive=1),
             n("Conv", ["img", "cw"], ["cv"], name="conv", auto_pad="SAME_LOWER", strides=[2, 2])]
    m = _model(nodes, [_vi("x", [3, 4, 4]), _vi("img", [1, 1, 5, 6])],
               [_vi("rm", [3, 2]), _vi("ln", [3, 4, 4]), _vi("tv", [3, 2]), _vi("ti", [3, 2], T.INT64),
                _vi("cs", [3, 2, 4]), _vi("cv", [1, 2, 3, 3])], c.items(), opset=18, name="o18")
    x = rng.standard_normal((3, 4, 4)).astype(F)
    img = rng.standard_normal((1, 1, 5, 6)).astype(F)
    rm, ln, tv, ti, cs, cv = ts.onnx.load(m)(x, img)
    xd = x.astype(np.float64)
    assert _close(rm, xd[:, :2].mean(-1))
    mu = xd.mean((1, 2), keepdims=True)
    want_ln = (xd - mu) / np.sqrt(((xd - mu) ** 2).mean((1, 2), keepdims=True) + 1e-3) * c["s"].astype(np.float64)
    assert _close(ln, want_ln)
    order = np.argsort(xd[:, :2].mean(-1), axis=1, kind="stable")[:, :2]
    assert np.array_equal(ti, order) and _close(tv, np.take_along_axis(xd[:, :2].mean(-1), order, 1))
    assert _close(cs, np.cumsum(xd[:, 2:], -1) - xd[:, 2:])
    # SAME_LOWER, stride 2: H 5 -> 3 (total pad 2: 1 before, 1 after), W 6 -> 3 (total 1: before)
    assert _close(cv, _conv_ref(img.astype(np.float64), c["cw"].astype(np.float64), None, 2, (1, 1, 1, 0), 1))
