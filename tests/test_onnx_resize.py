"""ONNX Resize, modes nearest, linear and cubic, antialiased too (tessera/onnx/ops_resize.py), on fresh random inputs
against onnx's ReferenceEvaluator (float64 inside; nearest copies values, so exactly), through each
way an axis is built: periodic slices (integer up/down-sampling, also past the 64-index gather
limit), a broadcast, a gather; planted bugs fail; the refusals are coded."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tessera as ts  # noqa: E402
from oracle import rel_err  # noqa: E402
from tessera.errors import OnnxUnsupportedError  # noqa: E402
from tessera.onnx import ops_resize  # noqa: E402
from tessera.tools import onnx_conformance as oc  # noqa: E402

F = np.float32


def resize_model(xs, scales=None, sizes=None, **attrs):
    inits = [nh.from_array(np.asarray(scales, F), "scales")] if scales else [nh.from_array(np.asarray(sizes, np.int64),
                                                                                           "sizes")]
    ins = ["x", "", "scales"] if scales else ["x", "", "", "sizes"]
    g = h.make_graph([h.make_node("Resize", ins, ["y"], name="r", **attrs)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["N"] + list(xs[1:]))],
                     [h.make_tensor_value_info("y", T.FLOAT, [f"d{i}" for i in range(len(xs))])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    onnx.checker.check_model(m)
    return m


def _run(m, x):
    return ts.onnx.load(m)(x), ReferenceEvaluator(m).run(None, {"x": x})[0]


NEAREST = [  # (x shape, scales, sizes, coordinate_transformation_mode, nearest_mode)
    ((1, 2, 3, 4), [1, 1, 2, 3], None, "asymmetric", "floor"),               # repeats
    ((2, 3, 8, 6), [1, 1, 0.5, 0.5], None, "asymmetric", "floor"),           # every other
    ((1, 2, 4, 5), None, [1, 2, 7, 9], "half_pixel", "round_prefer_floor"),  # irregular: gathered
    ((1, 1, 5, 4), None, [1, 1, 3, 8], "align_corners", "round_prefer_ceil"),
    ((2, 2, 3, 3), [1, 1, 2.5, 1.5], None, "pytorch_half_pixel", "ceil"),
    ((1, 1, 40, 3), [1, 1, 2, 1], None, "half_pixel", "round_prefer_floor"),  # 80 > 64 indices: periodic
]


@pytest.mark.parametrize("case", range(len(NEAREST)))
def test_nearest(case, rng):
    xs, scales, sizes, ct, nm = NEAREST[case]
    m = resize_model(xs, scales, sizes, mode="nearest", coordinate_transformation_mode=ct, nearest_mode=nm)
    got, want = _run(m, rng.standard_normal(xs).astype(F))
    assert got.shape == want.shape and np.array_equal(got, want)


LINEAR = [  # (x shape, scales, sizes, coordinate_transformation_mode)
    ((1, 2, 5, 4), [1, 1, 2, 2], None, "half_pixel"),                # two phases per axis
    ((1, 1, 40, 36), [1, 1, 2, 2], None, "pytorch_half_pixel"),      # 80, 72 outputs: periodic, not gathered
    ((2, 3, 8, 6), [1, 1, 0.5, 0.5], None, "half_pixel"),            # one phase, step 2
    ((1, 2, 4, 5), None, [1, 2, 7, 9], "align_corners"),             # gathered with weights
    ((1, 1, 3, 4), [1, 1, 3, 1.5], None, "asymmetric"),
    ((1, 1, 5, 6), None, [1, 1, 8, 4], "half_pixel_symmetric"),
]


@pytest.mark.parametrize("case", range(len(LINEAR)))
def test_linear(case, rng):
    xs, scales, sizes, ct = LINEAR[case]
    m = resize_model(xs, scales, sizes, mode="linear", coordinate_transformation_mode=ct)
    got, want = _run(m, rng.standard_normal(xs).astype(F))
    assert got.shape == want.shape and rel_err(got, want.astype(np.float64)) < 1e-6


CUBIC = [  # (x shape, scales, sizes, coordinate_transformation_mode, cubic_coeff_a, exclude_outside)
    ((1, 2, 5, 4), [1, 1, 2, 2], None, "half_pixel", -0.75, 0),
    ((1, 1, 36, 34), [1, 1, 2, 2], None, "pytorch_half_pixel", -0.75, 0),   # 72, 68 outputs: periodic
    ((2, 1, 8, 6), [1, 1, 0.5, 0.5], None, "asymmetric", -0.5, 0),          # integer sources: one tap
    ((1, 2, 4, 5), None, [1, 2, 7, 9], "align_corners", -0.75, 0),         # gathered, four taps
    ((1, 1, 6, 5), [1, 1, 1.5, 2], None, "half_pixel", -0.5, 1),            # edge taps zeroed, renormalised
]


@pytest.mark.parametrize("case", range(len(CUBIC)))
def test_cubic(case, rng):
    xs, scales, sizes, ct, a, excl = CUBIC[case]
    m = resize_model(xs, scales, sizes, mode="cubic", coordinate_transformation_mode=ct, cubic_coeff_a=a,
                     exclude_outside=excl)
    got, want = _run(m, rng.standard_normal(xs).astype(F))
    assert got.shape == want.shape and rel_err(got, want.astype(np.float64)) < 1e-6


ANTIALIAS = [  # (x shape, scales, sizes, mode, coordinate_transformation_mode, exclude_outside)
    ((1, 2, 8, 6), [1, 1, 0.5, 0.5], None, "linear", "half_pixel", 0),
    ((1, 1, 160, 4), [1, 1, 0.5, 1], None, "linear", "half_pixel", 0),      # 80 outputs of 4 taps: periodic
    ((1, 2, 9, 10), None, [1, 2, 4, 6], "cubic", "half_pixel", 0),           # gathered, wide footprint
    ((2, 1, 12, 8), [1, 1, 0.6, 0.75], None, "cubic", "align_corners", 1),
    ((1, 1, 6, 4), [1, 1, 2, 0.5], None, "linear", "asymmetric", 0),         # up: the plain kernel
]


@pytest.mark.parametrize("case", range(len(ANTIALIAS)))
def test_antialias(case, rng):
    xs, scales, sizes, mode, ct, excl = ANTIALIAS[case]
    m = resize_model(xs, scales, sizes, mode=mode, coordinate_transformation_mode=ct, antialias=1,
                     exclude_outside=excl)
    got, want = _run(m, rng.standard_normal(xs).astype(F))
    # up to ~16 taps of a float32 sum (cubic with negative lobes) against a float64 sum rounded to float32
    assert got.shape == want.shape and rel_err(got, want.astype(np.float64)) < 4e-6


def test_planted_antialias_ignored_fails(monkeypatch, rng):
    monkeypatch.setattr(ops_resize, "antialias_taps", lambda xo, mode, scale, a, n, excl:
                        ops_resize.cubic_taps(xo, a, n, excl))
    xs, scales, sizes, mode, ct, excl = ANTIALIAS[2]
    got, want = _run(resize_model(xs, scales, sizes, mode=mode, coordinate_transformation_mode=ct, antialias=1),
                     rng.standard_normal(xs).astype(F))
    assert rel_err(got, want.astype(np.float64)) > 1e-3


def test_planted_cubic_coefficient_fails(monkeypatch, rng):
    real = ops_resize.cubic_taps
    monkeypatch.setattr(ops_resize, "cubic_taps", lambda xo, a, n, excl: real(xo, -0.5, n, excl))  # a ignored
    xs, scales, sizes, ct, a, excl = CUBIC[0]
    got, want = _run(resize_model(xs, scales, sizes, mode="cubic", coordinate_transformation_mode=ct,
                                  cubic_coeff_a=a), rng.standard_normal(xs).astype(F))
    assert rel_err(got, want.astype(np.float64)) > 1e-3


def test_planted_coordinate_transform_fails(monkeypatch, rng):
    real = ops_resize.source_coords
    monkeypatch.setattr(ops_resize, "source_coords", lambda ct, *a: real("asymmetric", *a))
    xs, scales, sizes, ct = LINEAR[0]
    got, want = _run(resize_model(xs, scales, sizes, mode="linear", coordinate_transformation_mode=ct),
                     rng.standard_normal(xs).astype(F))
    assert rel_err(got, want.astype(np.float64)) > 0.01


def test_planted_nearest_mode_fails(monkeypatch, rng):
    real = ops_resize.nearest_index
    monkeypatch.setattr(ops_resize, "nearest_index", lambda x, mode, n: real(x, "floor", n))
    xs, scales, sizes, ct, nm = NEAREST[2]
    got, want = _run(resize_model(xs, scales, sizes, mode="nearest", coordinate_transformation_mode=ct,
                                  nearest_mode=nm), rng.standard_normal(xs).astype(F))
    assert not np.array_equal(got, want)


def test_refusals():
    for attrs, why in (({"mode": "nearest", "antialias": 1}, "antialias=1"),
                       ({"mode": "linear", "exclude_outside": 1}, "exclude_outside=1"),
                       ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, "tf_crop")):
        with pytest.raises(OnnxUnsupportedError, match=why):
            ts.onnx.load(resize_model((1, 1, 4, 4), [1, 1, 2, 2], **attrs))
    # 97 outputs from 70 with align_corners: no short period, too many to gather one by one
    fn = ts.onnx.load(resize_model((1, 1, 70, 2), sizes=[1, 1, 97, 2], mode="linear",
                                   coordinate_transformation_mode="align_corners"))
    with pytest.raises(OnnxUnsupportedError, match="97 output indices in no pattern"):
        fn(np.ones((1, 1, 70, 2), F))


def test_node_cases():
    names = {"test_resize_upsample_scales_linear", "test_resize_downsample_sizes_linear_pytorch_half_pixel",
             "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside",
             "test_resize_upsample_sizes_nearest_floor_align_corners", "test_resize_downsample_scales_nearest"}
    res = [oc.run_case(c) for c in oc.collect({"Resize"}) if c.name in names]
    assert len(res) == len(names) and all(r.status == "passed" for r in res), res
