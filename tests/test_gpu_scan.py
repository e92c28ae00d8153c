"""``cumsum`` / ``cumprod`` on the GPU lanes (kernels/gpu_scan.py, the ``tile.scan`` lowering in
passes/target/gpu/simt_rows.py): compiled for nvidia (sm_80, sm_90: ptxas) and rocm (gfx942 wave64,
gfx1100 wave32: linked code objects), run in the warp/wave emulator on random rows against float64
numpy.  Rows shorter than one chunk and rows of several chunks whose length is no multiple of it
(the carry between chunks, the masked tail: any read or write outside an array faults in the
emulator), the last axis and an inner axis, f32 and bf16, NaN / inf propagating to exactly the
positions numpy gives.  Planted bugs (an exclusive scan, waves that never see each other's totals)
fail.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.toolchain import find_llvm_tool, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def _inputs(rng, shape, dtype, ax):
    x = rng.standard_normal(shape).astype(dtype)
    p = (1 + 0.02 * rng.standard_normal(shape)).astype(dtype)      # products that stay in range
    if len(shape) == 2 and ax in (-1, 1):
        x[1, shape[1] // 2] = np.nan                                  # NaN from there on
        x[2, 3] = np.inf                                              # +inf from there on
        p[1, shape[1] // 3] = 0.0                                     # zero from there on
    return x, p


def _check(got, x, p, ax, tol):
    cs, cp = (np.asarray(v, np.float64) for v in got)
    x64, p64 = x.astype(np.float64), p.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ws, wp = np.cumsum(x64, axis=ax), np.cumprod(p64, axis=ax)
    n = x.shape[ax]           # a product of n roundings: relative error up to about n/2 ulps (f32: 6e-8 each)
    for g, w, bound in ((cs, ws, tol * np.cumsum(np.abs(np.nan_to_num(x64, posinf=0)), axis=ax)),
                        (cp, wp, max(tol, 6e-8 * n) * np.abs(wp))):
        assert np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(np.isinf(g), np.isinf(w))
        fin = np.isfinite(w)
        assert (np.abs(g - w)[fin] <= bound[fin] + 1e-30).all(), np.max(np.abs(g - w)[fin] / bound[fin])


def _run(target, arch, x, p, ax):
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")
    art = ts.compile(lambda a, b: (ts.ops.cumsum(a, axis=ax), ts.ops.cumprod(b, axis=ax)), x, p,
                     target=target, arch=arch)
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and not rep.reason
    assert [k["kind"] for k in rep.kernels] == ["scan", "scan"]
    assert all(k["registers" if target == "nvidia" else "vgprs"] > 0 for k in rep.kernels)
    return art.emulate(x, p)


CASES = [("nvidia", "sm_80", (5, 77), -1), ("nvidia", "sm_90", (3, 2500), -1), ("nvidia", "sm_80", (4, 9, 130), 1),
         ("rocm", "gfx942", (3, 1000), -1), ("rocm", "gfx1100", (3, 700), -1), ("rocm", "gfx942", (2, 6, 40), 0)]


@needs_ptxas
@pytest.mark.parametrize("target,arch,shape,ax", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-ax{c[3]}" for c in CASES])
def test_scans_on_the_gpu_lanes_match_float64(rng, target, arch, shape, ax):
    x, p = _inputs(rng, shape, np.float32, ax)
    _check(_run(target, arch, x, p, ax), x, p, ax, 2e-6)      # f32: a few ulps of the running |sum| / product


@needs_ptxas
def test_bf16_scans_round_once_per_output(rng):
    x, p = _inputs(rng, (3, 600), ml_dtypes.bfloat16, -1)
    _check(_run("nvidia", "sm_90", x, p, -1), x, p, -1, 2 ** -8)


@needs_ptxas
@pytest.mark.parametrize("plant", ["exclusive", "no_exchange"])
def test_planted_scan_bugs_fail(rng, monkeypatch, plant):
    from tessera.passes.target.gpu import simt_rows
    from tessera.passes.tile.kernels import gpu_scan
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    if plant == "exclusive":
        monkeypatch.setattr(gpu_scan, "INCLUSIVE", False)
    else:   # every wave sees only its own total: the waves' prefixes are lost
        monkeypatch.setattr(simt_rows.RowsLowerer, "wave_totals",
                            lambda self, b, t_: [t_] * (self.block // self.wave))
    x, p = _inputs(rng, (3, 2500), np.float32, -1)
    with pytest.raises(AssertionError):
        _check(_run("nvidia", "sm_80", x, p, -1), x, p, -1, 2e-6)
