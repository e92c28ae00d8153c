"""Joins along the last axis and sin / cos on the GPU lanes (Llama's rotary embedding): the
segment-split elementwise kernel and the concat kernel (kernels/gpu_rows.py), PTX assembled by
ptxas, numerics by the warp emulator against float64 — with teeth (a dropped segment shift)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.toolchain import find_ptxas

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def rope(q, cos, sin):
    h = q.shape[-1] // 2
    return q * cos + ts.ops.concatenate([-q[..., h:], q[..., :h]], axis=-1) * sin


def rope64(q, cos, sin):
    q = q.astype(np.float64)
    h = q.shape[-1] // 2
    return q * cos.astype(np.float64) + np.concatenate([-q[..., h:], q[..., :h]], -1) * sin.astype(np.float64)


def _inputs(rng, dt=np.float32, s=37, d=26):
    return (rng.standard_normal((2, 3, s, d)).astype(dt), rng.standard_normal((s, d)).astype(dt),
            rng.standard_normal((s, d)).astype(dt))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_rotate_half_is_one_gpu_kernel_matching_float64(arch, rng):
    q, c, s = _inputs(rng)
    art = ts.compile(rope, q, c, s, target="nvidia", arch=arch)
    ks = art.report().kernels
    assert art.report().lane == f"nvidia-{arch}" and len(ks) == 1 and "tessera.concat" in ks[0]["ops"]
    assert ks[0]["registers"] > 0 and art.binary()[:4] == b"\x7fELF"      # ptxas assembled it
    got = art.emulate(q, c, s)
    np.testing.assert_allclose(got, rope64(q, c, s), rtol=0, atol=4 * 2 ** -24 * 8)


def test_concat_kernel_f32_and_bf16_and_unequal_widths(rng):
    for dt in (np.float32, ml_dtypes.bfloat16):
        a = rng.standard_normal((5, 37, 13)).astype(dt)
        b = rng.standard_normal((5, 37, 6)).astype(dt)
        art = ts.compile(lambda a, b: ts.ops.concatenate([a, b], axis=-1), a, b, target="nvidia", arch="sm_80")
        assert [k["kind"] for k in art.report().kernels] == ["concat"]
        np.testing.assert_array_equal(art.emulate(a, b), np.concatenate([a, b], -1))   # a copy: exact


def test_concat_along_an_inner_axis_is_refused_by_name(rng):
    from tessera.errors import ScheduleIllegalError
    a = rng.standard_normal((4, 6)).astype(np.float32)
    with pytest.raises(ScheduleIllegalError, match="tessera.concat.*last axis"):
        ts.compile(lambda a, b: ts.ops.concatenate([a, b], axis=0), a, a, target="nvidia", arch="sm_80")


def test_sin_cos_on_the_gpu_lane_match_float64(rng):
    x = (rng.standard_normal((33, 70)) * 20).astype(np.float32)
    art = ts.compile(lambda x: ts.ops.sin(x) * 2 + ts.ops.cos(x), x, target="nvidia", arch="sm_80")
    assert art.report().kernels[0]["registers"] > 0
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(art.emulate(x), np.sin(x64) * 2 + np.cos(x64), rtol=0, atol=3e-6 * 4)
    # the generated code is the CPU lane's f64-widened polynomial (an ulp; tests/test_elementwise_math.py)
    assert "sin.approx" not in art.ptx() and "cos.approx" not in art.ptx()


def test_teeth_a_segment_read_without_its_shift_fails(rng, monkeypatch):
    """Plant: segment i's operand read at the output column instead of column - start."""
    from tessera.passes.tile.kernels import gpu_rows
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gpu_rows, "segment_col", lambda b, c, start: c)
    q, c, s = _inputs(rng)
    got = ts.compile(rope, q, c, s, target="nvidia", arch="sm_80").emulate(q, c, s)
    assert np.abs(got - rope64(q, c, s)).max() > 0.1


@pytest.mark.parametrize("arch", ["gfx942", "gfx1151"])
def test_rotate_half_and_sin_on_rocm_match_float64(arch, rng):
    from tessera.toolchain import find_llvm_tool
    if find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")
    q, c, s = _inputs(rng)
    art = ts.compile(lambda q, c, s: rope(q, ts.ops.cos(c), ts.ops.sin(s)), q, c, s, target="rocm", arch=arch)
    assert art.report().lane == f"rocm-{arch}" and art.report().kernels[0]["vgprs"] > 0
    want = rope64(q, np.cos(c.astype(np.float64)), np.sin(s.astype(np.float64)))
    np.testing.assert_allclose(art.emulate(q, c, s), want, rtol=0, atol=1e-5)
