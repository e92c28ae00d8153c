"""ONNX RotaryEmbedding (tessera/onnx/ops_rotary.py) on fresh random inputs and angles against a
float64 oracle written here as complex multiplication (each rotated pair a complex number times
e^{i theta}), with a planted bug that fails; plus ONNX's node tests of the op."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h  # noqa: E402

import tessera as ts  # noqa: E402
from oracle import rel_err  # noqa: E402
from tessera.onnx import convert, model as _registry  # noqa: E402,F401 - importing it registers the ops
from tessera.tools import onnx_conformance as oc  # noqa: E402

F = np.float32


def rope_ref(x, theta, interleaved, rd, heads=None):
    """x [B, H, S, D] (or [B, S, H*D] with ``heads``), theta [B, S, rd/2] in float64."""
    three = x.ndim == 3
    if three:
        b, s, hd = x.shape
        x = x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)
    x = x.astype(np.float64).copy()
    rot = x[..., :rd]
    pairs = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., : rd // 2], rot[..., rd // 2:])
    z = (pairs[0] + 1j * pairs[1]) * np.exp(1j * theta)[:, None]          # [B, 1, S, rd/2] over the heads
    if interleaved:
        rot[..., 0::2], rot[..., 1::2] = z.real, z.imag
    else:
        rot[..., : rd // 2], rot[..., rd // 2:] = z.real, z.imag
    return x.transpose(0, 2, 1, 3).reshape(b, s, hd) if three else x


def rope_model(xs, n_pos, half, with_pos, **attrs):
    ins = ["x", "cos", "sin"] + (["pos"] if with_pos else [])
    b, s = (xs[0], xs[1]) if len(xs) == 3 else (xs[0], xs[2])
    cache = [n_pos, half] if with_pos else [b, s, half]
    vis = [h.make_tensor_value_info("x", T.FLOAT, list(xs)), h.make_tensor_value_info("cos", T.FLOAT, cache),
           h.make_tensor_value_info("sin", T.FLOAT, cache)]
    if with_pos:
        vis.append(h.make_tensor_value_info("pos", T.INT64, [b, s]))
    g = h.make_graph([h.make_node("RotaryEmbedding", ins, ["y"], name="rope", **attrs)], "g", vis,
                     [h.make_tensor_value_info("y", T.FLOAT, list(xs))])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 23)])
    onnx.checker.check_model(m)
    return m


CASES = [  # (x shape, rotary_embedding_dim (0: the head size), interleaved, positions given, heads of a 3-D input)
    ((2, 4, 5, 16), 0, 0, True, None), ((2, 4, 5, 16), 0, 1, True, None), ((2, 3, 6, 16), 8, 0, False, None),
    ((2, 3, 6, 16), 8, 1, True, None), ((2, 5, 24), 0, 0, True, 3),
]


def _run(case, rng):
    xs, rd, inter, with_pos, heads = CASES[case]
    d = xs[-1] // heads if heads else xs[-1]
    rd = rd or d
    b, s = (xs[0], xs[1]) if heads else (xs[0], xs[2])
    x = rng.standard_normal(xs).astype(F)
    attrs = {"interleaved": inter, **({"rotary_embedding_dim": rd} if rd != d else {}),
             **({"num_heads": heads} if heads else {})}
    m = rope_model(xs, 32, rd // 2, with_pos, **attrs)
    if with_pos:
        angles = rng.uniform(-np.pi, np.pi, (32, rd // 2))
        pos = rng.integers(0, 32, (b, s))
        theta, args = angles[pos], (x, np.cos(angles).astype(F), np.sin(angles).astype(F), pos)
    else:
        theta = rng.uniform(-np.pi, np.pi, (b, s, rd // 2))
        args = (x, np.cos(theta).astype(F), np.sin(theta).astype(F))
    return ts.onnx.load(m)(*args), rope_ref(x, theta, inter, rd, heads)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rotary_embedding(case, rng):
    got, want = _run(case, rng)
    assert got.shape == want.shape and rel_err(got, want) < 1e-6


def test_planted_interleave_ignored_fails(monkeypatch, rng):
    spec = convert.OPS["RotaryEmbedding"]
    monkeypatch.setitem(convert.OPS, "RotaryEmbedding", convert.Spec(
        lambda ctx, ins: spec.fn(convert.Ctx(ctx.node, {**ctx.attrs, "interleaved": 0}, ctx.opset, 1), ins),
        spec.inputs, spec.attrs, spec.static, spec.fold, spec.check))
    got, want = _run(1, rng)
    assert rel_err(got, want) > 0.1


def test_node_cases():
    res = [oc.run_case(c) for c in oc.collect({"RotaryEmbedding"})
           if c.name in {"test_rotary_embedding_3d_input", "test_rotary_embedding_with_interleaved_rotary_dim"}]
    assert len(res) == 2 and all(r.status == "passed" for r in res), res
