"""Reductions over leading axes (kernels/reduce.py: ``_columns_in_place``): each work item walks
the rows reading a contiguous run of up to RUN_BYTES and combines it into the output in place.
Checked against float64 on random data at odd widths (masked tail chunks), several outer
indices, runs cut short (RUN_BYTES shrunk: many items per outer index), and empty row counts."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.passes.tile.kernels import reduce as red

OPS = {"sum": (lambda x, ax: x.sum(axis=ax), lambda x, ax: x.sum(axis=ax)),
       "mean": (lambda x, ax: x.mean(axis=ax), lambda x, ax: x.mean(axis=ax)),
       "max": (lambda x, ax: x.max(axis=ax), lambda x, ax: x.max(axis=ax))}
CASES = [((333, 77), 0), ((4, 129, 50), 1), ((2, 3, 40, 17), (1, 2)), ((1500, 1030), 0), ((1, 1), 0)]


def _check(rng, shape, ax, name, dtype=np.float32):
    x = rng.standard_normal(shape).astype(dtype)
    mine, ref = OPS[name]
    got = ts.jit(lambda v: mine(v, ax))(x)
    want = ref(x.astype(np.float64), ax)
    rows = np.prod([shape[a] for a in np.atleast_1d(ax)])
    tol = 1e-6 * max(1, np.sqrt(rows)) * 8 if dtype == np.float32 else 1e-12 * rows
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return got


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("shape,ax", CASES)
def test_leading_axis_reductions_match_float64(rng, shape, ax, name):
    _check(rng, shape, ax, name)


@pytest.mark.parametrize("shape,ax", CASES[:4])
def test_short_runs_split_each_row_into_many_items(rng, shape, ax, monkeypatch):
    """RUN_BYTES of 256: every 64-column chunk its own work item, tails masked per item."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(red, "RUN_BYTES", 256)
    for name in OPS:
        _check(rng, shape, ax, name)


def test_float64_and_empty_rows(rng):
    _check(rng, (257, 45), 0, "sum", np.float64)
    got = ts.jit(lambda v: v.sum(axis=0))(np.ones((0, 9), np.float32))
    np.testing.assert_array_equal(got, np.zeros(9, np.float32))


def test_planted_wrong_start_value_is_caught(rng, monkeypatch):
    """Teeth: the in-place path with its accumulator started at 1 instead of 0 fails the check
    (so the checks above run this path, not another kernel)."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = red._columns_in_place

    def planted(kf, b, O, Rn, I, chunk, in_bytes, out_buf, kind, init, *rest):
        return real(kf, b, O, Rn, I, chunk, in_bytes, out_buf, kind, init + 1.0 if kind == "add" else init, *rest)
    monkeypatch.setattr(red, "_columns_in_place", planted)
    with pytest.raises(AssertionError):
        _check(rng, (300, 70), 0, "sum")
