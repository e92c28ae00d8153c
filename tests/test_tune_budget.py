"""Accuracy-budgeted tuning choices (docs/tuning.md, "Accuracy budgets").

A candidate whose result on the tuning data differs from the float64 reference by more than its
family's budget (``space.ERROR_BUDGET``) is rejected with its measured error and never wins, even
when it is the fastest: here a planted GEMM candidate that drops a k-block runs in half the model's
time on the fake clock.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import tessera
from tessera.frontend import tune
from tessera.frontend.trace import ARRAY
from tessera.passes.schedule import space
from tessera.runtime import tunedb

KC = 16
PLANTED = {"register_tile": (2, 1), "tile_k": KC, "tile_m": 16, "tile_n": 16}   # "splits K" and drops a block


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TESSERA_TUNING_DB", raising=False)   # the database under the cache dir
    monkeypatch.setenv("TESSERA_TUNE_QUIET", "1")
    monkeypatch.setenv("TESSERA_TUNE_JOBS", "1")
    return tmp_path


class _Clock:
    """Fake time: a model call costs 1.0, the planted candidate's 0.5 (it skips work)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _tune_with_planted(rng, monkeypatch):
    a = rng.standard_normal((32, 48)).astype(np.float32)
    b = rng.standard_normal((48, 24)).astype(np.float32)
    f = tessera.jit(lambda x, y: x @ y)
    graph = f._trace([a, b], [ARRAY, ARRAY], frozenset())
    monkeypatch.setattr(space, "candidates", lambda *args, **kw: [{}, PLANTED])
    clock = _Clock()
    real = tune._runner

    def runner(c, arrays):
        run = real(c, arrays)
        planted = c.meta["kernels"][0]["tiles"]["k"] == KC

        def timed():
            if planted:   # the first k-block dropped: a split-K whose partial sums lose one part
                clock.t += 0.5
                x, y = arrays
                return [(x[:, KC:].astype(np.float64) @ y[KC:].astype(np.float64)).astype(np.float32)]
            clock.t += 1.0
            return run()
        return timed
    monkeypatch.setattr(tune, "_runner", runner)
    key = tunedb.Key("gemm", space.version("gemm"), "cpu", "host", "", "f32", (32, 24, 48), 1)
    return tune.tune_graph(f, graph, [a, b], key, min_rounds=5, max_rounds=12, budget_s=1e9, quiet=True,
                           clock=clock, seed=0)


def test_candidate_outside_the_budget_is_rejected_even_when_faster(cache, rng, monkeypatch):
    entry = _tune_with_planted(rng, monkeypatch)
    lab = tune.label(PLANTED)
    budget = space.error_budget("gemm", "f32")
    assert entry.pins == {}                               # the model's schedule: the planted one never wins
    assert entry.times[lab] is None and entry.times["model"] > 0
    assert entry.errors[lab] > 10 * budget and entry.errors["model"] <= budget
    assert entry.failed[lab].startswith("rejected: error ") and "gemm f32 accuracy budget" in entry.failed[lab]
    assert f"{entry.errors[lab]:.3g}" in entry.failed[lab]


def test_planted_budget_lets_the_faster_wrong_candidate_win(cache, rng, monkeypatch):
    """Teeth: with an unbounded budget the planted candidate (half the model's fake time) wins."""
    monkeypatch.setitem(space.ERROR_BUDGET, "gemm", {"f32": math.inf})
    entry = _tune_with_planted(rng, monkeypatch)
    assert entry.pins == PLANTED and not entry.failed


def test_budgets_are_declared_per_family_and_dtype():
    for fam in space.FAMILIES:
        assert fam in space.ERROR_BUDGET, fam
        assert {"f32", "f64", "bf16", "f16"} <= set(space.ERROR_BUDGET[fam])
    assert space.error_budget("gemm", "f64") < space.error_budget("gemm", "f32") < space.error_budget("gemm", "bf16")


def test_error_measure():
    ref = np.array([[2.0, np.nan, np.inf, -4.0]])
    assert tune.error([ref.astype(np.float32)], [ref]) == 0.0
    assert tune.error([ref + [[0.004, 0, 0, 0]]], [ref]) == pytest.approx(0.001)   # relative to max |ref| = 4
    assert tune.error([np.array([[2.0, 0.0, np.inf, -4.0]])], [ref]) == math.inf    # NaN lost
    assert tune.error([ref[:, :2]], [ref]) == math.inf                            # another shape
