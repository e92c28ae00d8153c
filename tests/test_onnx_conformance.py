"""ONNX's backend node tests through ``tessera.onnx.load`` (``tessera/tools/onnx_conformance.py``),
the per-node opset rule (``tessera/onnx/versions.py``), and the harness's teeth.  The full sweep
renders ``docs/onnx.md`` (drift-tested under ``-m slow``: it compiles ~450 models)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import tessera as ts
from tessera.errors import OnnxUnsupportedError
from tessera.frontend import ops
from tessera.frontend.trace import constant
from tessera.onnx import convert, versions
from tessera.onnx import model as _registry  # noqa: F401 - it registers the handlers in convert.OPS
from tessera.tools import onnx_conformance as oc


@pytest.fixture(scope="module")
def few():
    return oc.collect(FEW)


FEW = {"Relu", "Gemm", "OneHot", "Hardmax"}   # old and new handlers (ops_math, ops_extra)


def test_node_tests_of_a_few_ops_pass(few):
    assert {c.op for c in few} == FEW
    res = [oc.run_case(c) for c in few]
    bad = [r for r in res if r.status not in ("passed", "refused")]
    assert not bad, bad
    passed = {r.op for r in res if r.status == "passed"}
    assert passed == FEW   # each op passes some case
    assert sum(r.status == "passed" for r in res) >= 20


def test_planted_wrong_handler_fails_its_cases(few, monkeypatch):
    spec = convert.OPS["Relu"]
    monkeypatch.setitem(convert.OPS, "Relu", convert.Spec(lambda ctx, ins: [ops.abs(ins[0])], spec.inputs,
                                                          spec.attrs, spec.static, None, spec.check))
    res = [oc.run_case(c) for c in few if c.op == "Relu"]
    assert res and all(r.status == "failed" and "max |diff|" in r.detail for r in res), res


def test_static_inputs_are_bound_as_initializers():
    (case,) = [c for c in oc.collect({"ReduceSum"}) if c.name == "test_reduce_sum_keepdims_example"]
    model, inputs = oc.bind_static(case)
    assert len(case.model.graph.input) == 2 and len(model.graph.input) == 1 and len(inputs) == 1
    assert [i.name for i in model.graph.initializer] == [case.model.graph.input[1].name]
    assert oc.run_case(case).status == "passed"


def test_mismatch_checks_shape_dtype_nan_and_tolerance():
    w = np.array([1.0, np.nan, np.inf], np.float32)
    assert oc._mismatch(w.copy(), w, 1e-3, 1e-7) is None
    assert "dtype" in oc._mismatch(w.astype(np.float64), w, 1e-3, 1e-7)
    assert "shape" in oc._mismatch(w[:2], w, 1e-3, 1e-7)
    assert "NaN" in oc._mismatch(np.array([1.0, 2.0, np.inf], np.float32), w, 1e-3, 1e-7)
    assert "max |diff|" in oc._mismatch(np.array([1.01, np.nan, np.inf], np.float32), w, 1e-3, 1e-7)
    assert "differ" in oc._mismatch(np.array([1, 2], np.int64), np.array([1, 3], np.int64), 0, 0)
    bf = w.astype(ml_dtypes.bfloat16)   # ml_dtypes' kind is "V": compared as floats (NaN agrees with NaN)
    assert oc._mismatch(bf.copy(), bf, 0.0, 0.0) is None
    assert "max |diff|" in oc._mismatch(np.array([1.5, np.nan, np.inf], ml_dtypes.bfloat16), bf, 1e-3, 1e-7)


def _one(op, opset, ins=("x",), dtype=T.FLOAT, out=None, **attrs):
    node = h.make_node(op, list(ins), ["y"], name="n", **attrs)
    vis = [h.make_tensor_value_info(i, dtype, [2, 3]) for i in ins]
    g = h.make_graph([node], "g", vis, [h.make_tensor_value_info("y", out or dtype, [2, 3])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def test_opset_judged_per_node(rng):
    a, b = rng.standard_normal((2, 2, 3)).astype(np.float32)
    m = _one("And", 7, ("x", "z"), T.BOOL)          # And is version 7 at opset 7 and at 13..21
    got = ts.onnx.load(m)(a > 0, b > 0)
    assert np.array_equal(got, (a > 0) & (b > 0))
    got = ts.onnx.load(_one("Relu", 25))(a)        # Relu 14 up to opset 25
    assert np.allclose(got, np.maximum(a.astype(np.float64), 0), rtol=1e-6)
    assert versions.problem("AveragePool", 22) is None   # version 22 only adds bfloat16
    with pytest.raises(OnnxUnsupportedError, match="opset 11 is not supported for Softmax: its version there is 11"):
        ts.onnx.load(_one("Softmax", 11))
    cast = _one("Cast", 28, out=T.FLOAT16, to=T.FLOAT16)
    assert np.array_equal(ts.onnx.load(cast)(a), a.astype(np.float16))
    with pytest.raises(OnnxUnsupportedError, match="sets round_mode, new in its version"):
        ts.onnx.load(_one("Cast", 28, out=T.FLOAT16, to=T.FLOAT16, round_mode="down"))
    assert onnx.defs.get_schema("Cast", 28).since_version > 21   # the case above is a real newer version


def test_reshaped_scalar_constant_as_an_output():
    """A one-element constant given a shape (ONNX's Shape with end=1, folded at load) is a result of
    its own: it was refused with SCHEDULE_ILLEGAL (no kernel input to view) before."""
    x = np.ones((3, 4), np.float32)
    got = ts.jit(lambda x: (x + 1.0, ops.reshape(constant(2.5, ts.float32), (1, 1))))(x)
    assert got[1].shape == (1, 1) and got[1][0, 0] == 2.5 and np.array_equal(got[0], x + 1)
    (case,) = [c for c in oc.collect({"Shape"}) if c.name == "test_shape_end_1"]
    assert oc.run_case(case).status == "passed"


ATTENTION = ("test_attention_4d_gqa_with_past_and_present", "test_attention_3d_causal",
             "test_attention_4d_gqa_causal_nonpad_decode",
             "test_attention_4d_with_qk_matmul_softcap", "test_attention_local_window_with_past",
             "test_attention_4d_attn_mask_bool")


def test_onnx_attention_cases_and_a_planted_causal_bug(monkeypatch):
    """ONNX Attention (opsets 23-25): GQA with a past cache, 3-D causal, per-batch nonpad decode,
    softcap with the QK output (composed), a sliding window over a cache, a bool mask."""
    cases = [c for c in oc.collect({"Attention"}) if c.name in ATTENTION]
    assert len(cases) == len(ATTENTION)
    res = {c.name: oc.run_case(c) for c in cases}
    assert all(r.status == "passed" for r in res.values()), res
    from tessera.onnx import ops_attention
    real = ops_attention.ops.attention
    monkeypatch.setattr(ops_attention.ops, "attention",
                        lambda q, k, v, *, causal=False, scale=None, mask=None: real(q, k, v, scale=scale, mask=mask))
    (c,) = [c for c in cases if c.name == "test_attention_3d_causal"]
    assert oc.run_case(c).status == "failed"   # the causal flag dropped
