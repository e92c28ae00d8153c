"""GEMMs of few rows against a transposed B read in place (kernels/gemm_dot.py, schedule
parallel ``n``): a float64 oracle on random data with odd sizes and k tails, a fused epilogue,
more than 16 rows at run time (the BLIS nest in the same kernel), the schedule's choice, and
planted bugs (the k tail skipped; the rows and columns past the last whole block skipped)."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts

LOGITS = ts.jit(lambda h, t, s: h @ t.T / s)                              # the sampler's GEMM
BIAS_RELU = ts.jit(lambda h, t, b: ts.ops.relu(h @ t.T + b))


def close(got, want, k):
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * np.sqrt(k) * np.abs(want).max())


@pytest.mark.parametrize("m, k, n", [(1, 8, 9), (5, 77, 1001), (8, 512, 300), (13, 33, 64), (16, 130, 97)])
def test_few_rows_match_float64(rng, m, k, n):
    h = rng.standard_normal((m, k)).astype(np.float32)
    t = rng.standard_normal((n, k)).astype(np.float32)
    close(LOGITS(h, t, 0.7), h.astype(np.float64) @ t.T.astype(np.float64) / 0.7, k)


def test_epilogue_and_many_rows_run_the_other_nest(rng):
    t = rng.standard_normal((203, 45)).astype(np.float32)
    b = rng.standard_normal(203).astype(np.float32)
    for m in (3, 40):          # one kernel: 3 rows run the dot nest, 40 the BLIS nest
        h = rng.standard_normal((m, 45)).astype(np.float32)
        close(BIAS_RELU(h, t, b), np.maximum(h.astype(np.float64) @ t.T.astype(np.float64) + b, 0), 45)
    assert [k["parallel"] for k in ts.explain(BIAS_RELU, h, t, b).kernels] == ["n"]


def test_schedule_keeps_rows_split_for_a_full_addend(rng):
    f = ts.jit(lambda h, t, c: h @ t.T + c)   # C0: the BLIS nest accumulates into it
    h, t = rng.standard_normal((4, 20)).astype(np.float32), rng.standard_normal((30, 20)).astype(np.float32)
    c = rng.standard_normal((4, 30)).astype(np.float32)
    close(f(h, t, c), h.astype(np.float64) @ t.T.astype(np.float64) + c, 20)
    assert ts.explain(f, h, t, c).kernels[0]["parallel"] == "m"


def test_plant_without_k_tail_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import gemm_dot
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gemm_dot, "K_TAIL", False)
    h, t = rng.standard_normal((5, 77)).astype(np.float32), rng.standard_normal((50, 77)).astype(np.float32)
    got = ts.jit(lambda h, t, s: h @ t.T / s)(h, t, 0.7)
    with pytest.raises(AssertionError):
        close(got, h.astype(np.float64) @ t.T.astype(np.float64) / 0.7, 77)


def test_plant_without_row_and_column_edges_fails(rng, monkeypatch):
    """5 rows (one 4-row block and a single row), 51 columns (an odd count: some thread's run of
    columns ends in a single column): with the edges skipped those are never written."""
    from tessera.passes.tile.kernels import gemm_dot
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gemm_dot, "EDGES", False)
    h, t = rng.standard_normal((5, 40)).astype(np.float32), rng.standard_normal((51, 40)).astype(np.float32)
    got = ts.jit(lambda h, t, s: h @ t.T / s)(h, t, 0.7)
    want = h.astype(np.float64) @ t.T.astype(np.float64) / 0.7
    with pytest.raises(AssertionError):
        close(got, want, 40)
