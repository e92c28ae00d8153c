"""GEMMs whose A is a transposed view (``x.T @ dy``: every weight gradient) pack A by vector
loads of the panel's rows, which are adjacent in memory (passes/target/x86/lower_pack.py:
``_pack_a_columns``).  Checked against float64 at odd sizes (row tails masked), with and without
an epilogue, f32 and f64; a planted off-by-one row fails."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.passes.target.x86 import lower_pack

SHAPES = [(37, 29, 41), (130, 257, 65), (5, 130, 17), (300, 1, 9), (64, 23, 64)]


def _check(rng, k, m, n, dt):
    x = rng.standard_normal((k, m)).astype(dt)
    d = rng.standard_normal((k, n)).astype(dt)
    w = rng.standard_normal((m, n)).astype(dt)
    got = ts.jit(lambda x, d: x.T @ d)(x, d)
    upd = ts.jit(lambda x, d, w: w - 0.05 * (x.T @ d))(x, d, w)
    want = x.astype(np.float64).T @ d.astype(np.float64)
    tol = (2e-5 if dt == np.float32 else 1e-12) * np.sqrt(k) * 4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(upd, w - 0.05 * want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("k,m,n", SHAPES)
def test_transposed_a_matches_float64(rng, k, m, n, dt):
    _check(rng, k, m, n, dt)


def test_transposed_a_is_packed_by_the_vector_path(rng, monkeypatch):
    """The path is taken (a spy counts it), and a planted bug in it (the panel read one row
    further on) fails the oracle."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = lower_pack.PackLowering._pack_a_columns
    calls = []

    def spy(self, b, src, dst, doff, mr, npanel):
        calls.append(mr)
        return real(self, b, src, dst, doff, mr, npanel)
    monkeypatch.setattr(lower_pack.PackLowering, "_pack_a_columns", spy)
    _check(rng, 40, 33, 20, np.float32)
    assert calls

    def planted(self, b, src, dst, doff, mr, npanel):
        shifted = lower_pack.ViewVal(src.base, b.add(src.off, 1), src.rs, src.cs, src.rows, src.cols, src.shape,
                                     src.elem)
        return real(self, b, shifted, dst, doff, mr, npanel)
    monkeypatch.setattr(lower_pack.PackLowering, "_pack_a_columns", planted)
    with pytest.raises(AssertionError):
        _check(rng, 40, 33, 20, np.float32)
