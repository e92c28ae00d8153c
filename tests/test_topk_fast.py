"""The one-pass ``top_k`` row kernel (kernels/topk.py: a running k-best list, a vector threshold
test per group of columns): a float64 oracle on fresh random rows of odd lengths, k = 1 and
k = n, rows full of ties, NaN / inf / all -inf / all NaN rows, a fused prologue, and planted bugs
(a threshold one slot too high, an insert that overwrites instead of shifting)."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts


def order64(x, k):
    """The oracle's indices: NaN first (lower index first), then descending float64 values, equal
    values by lower index."""
    v = np.asarray(x, np.float64)
    nan = np.isnan(v)
    idx = np.broadcast_to(np.arange(v.shape[-1]), v.shape)
    return np.lexsort((idx, np.where(nan, 0.0, -v), ~nan), axis=-1)[..., :k]


def check(fn, x, k, scale=1.0):
    v, i = fn(x)
    want = order64(scale * x.astype(np.float64), k)
    np.testing.assert_array_equal(i, want)
    np.testing.assert_array_equal(v.astype(np.float64), np.take_along_axis(scale * x.astype(np.float64), want, -1))


def special_rows(rng, rows, n):
    """Random rows, then ties everywhere, a NaN row, scattered NaNs, inf, an all -inf row, an
    all-NaN row, and a row of -inf with a few finite values (fewer than k of them)."""
    x = rng.standard_normal((rows, n))
    x[1] = rng.integers(-3, 4, n)                       # integer-valued: ties everywhere
    x[2, rng.integers(0, n, 3)] = np.nan
    x[3] = -np.inf
    x[4, ::3] = np.inf
    x[4, 1::7] = -np.inf
    x[5] = np.nan
    x[6] = -np.inf
    x[6, rng.integers(0, n, 2)] = rng.standard_normal(2)
    x[7, -1] = np.nan                                    # in the row's last, partial group
    return x


JITS: dict = {}


def top_k(k, scale=None):
    """One jit object per (k, prologue), shared by every test (one compile per shape)."""
    key = (k, scale)
    if key not in JITS:
        JITS[key] = ts.jit(lambda a: ts.ops.top_k(a * scale, k)) if scale else ts.jit(lambda a: ts.ops.top_k(a, k))
    return JITS[key]


@pytest.mark.parametrize("n, k", [(1, 1), (7, 3), (37, 1), (37, 37), (45, 5), (1001, 40), (4099, 50)])
def test_top_k_random_rows_match_float64(rng, n, k):
    check(top_k(k), rng.standard_normal((9, n)).astype(np.float32), k)


@pytest.mark.parametrize("n, k", [(45, 5), (37, 37), (1001, 40)])
def test_top_k_ties_nan_inf_rows(rng, n, k):
    check(top_k(k), special_rows(rng, 9, n).astype(np.float32), k)


def test_top_k_ties_f64_and_prologue(rng):
    x = special_rows(rng, 8, 301)
    check(top_k(17), x, 17)                             # float64 registers
    check(top_k(17, -2.0), x.astype(np.float32), 17, -2.0)   # a fused prologue (exact) reversing the order


def test_top_k_prefilter_off_matches(rng, fresh, monkeypatch):
    """The same rows without the prefilter (the list alone) give the same, float64-checked result."""
    monkeypatch.setattr(fresh, "PREFILTER", False)
    check(ts.jit(lambda a: ts.ops.top_k(a, 40)), special_rows(rng, 9, 1001).astype(np.float32), 40)


def test_top_k_every_value_tied(rng):
    x = np.full((3, 130), float(rng.integers(-5, 5)), np.float32)
    check(top_k(40), x, 40)                             # all equal: the first k columns, in order


def test_top_k_rising_rows_insert_every_column(rng):
    """An increasing row inserts every column at the list's head (the worst case for the list)."""
    x = np.sort(rng.standard_normal((4, 300)), -1).astype(np.float32)
    check(top_k(40), x, 40)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    from tessera.passes.tile.kernels import topk
    return topk


@pytest.mark.parametrize("plant", [("KTH", -1), ("SHIFT", 0), ("FLOOR_KEEPS_EQUAL", False)])
def test_top_k_plants_fail(rng, fresh, monkeypatch, plant):
    """A threshold one slot too high drops entries that rank between the list's last two; an
    insert that does not shift loses the entry it overwrites; a prefilter that drops columns equal
    to its floor loses tied entries (integer-valued rows): the oracle check fails."""
    monkeypatch.setattr(fresh, *plant)
    x = rng.integers(-20, 20, (24, 501)).astype(np.float32)   # 24 rows: every plant shows on some row
    with pytest.raises(AssertionError):
        check(ts.jit(lambda a: ts.ops.top_k(a, 12)), x, 12)
