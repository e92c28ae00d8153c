"""The thread count in jit's specialisation key, where the schedule depends on it (docs/tuning.md).

A tuning-database entry is per thread count, so a function whose schedule came from the database
is specialised per count: compiled at 2 threads and called after ``set_num_threads(1)``, it compiles
the 1-thread entry's schedule (a new specialisation whose lane report says 1 thread), and back at 2
it reuses the first.  Where the other count's lookup gives the same pins, the first specialisation
serves it too (no compile); a function whose schedule is the cost model's (no entry) is not
recompiled when the count changes.
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.frontend import tune
from tessera.passes.schedule import space
from tessera.runtime import tunedb


@pytest.fixture
def db(tmp_path, monkeypatch):
    from tessera import host
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TESSERA_TUNING_DB", raising=False)   # the database under the cache dir
    monkeypatch.setattr(host, "usable_cpus", lambda: 4)   # 2 and 1 threads are both below the CPUs here
    yield tmp_path
    tessera.set_num_threads(None)


def _mm(x, y):
    return x @ y


def _entries(a, b):
    """A 2-thread and a 1-thread entry for ``a @ b`` with different KC blockings (both legal)."""
    f = tessera.jit(_mm)
    keys = {}
    for n in (2, 1):
        tessera.set_num_threads(n)
        keys[n] = tune.key_for(f, "gemm", "f32", (a.shape[0], b.shape[1], a.shape[1]))
    cands = [p for p in space.candidates("gemm", keys[1].shape) if p]
    kcs = {p["tile_k"] for p in cands}
    assert len(kcs) >= 2, cands
    two = next(p for p in cands if p["tile_k"] == max(kcs))
    one = next(p for p in cands if p["tile_k"] == min(kcs))
    with tunedb.TuningDB() as d:
        d.store(tunedb.Entry(keys[2], two, 1.0))
        d.store(tunedb.Entry(keys[1], one, 1.0))
    return two, one


def _kc(rep) -> int:
    return next(k for k in rep.kernels if k["kind"] == "gemm")["tiles"]["k"]


def _threads_respecialise(a, b, oracle) -> tuple[bool, list[str]]:
    """Whether a function compiled at 2 threads compiles anew at 1 (the 1-thread entry's KC, explain
    saying 1 thread, results to float64 tolerance) and reuses the first at 2."""
    two, one = _entries(a, b)
    f = tessera.jit(_mm)
    tessera.set_num_threads(2)
    np.testing.assert_allclose(f(a, b), oracle, rtol=1e-4, atol=1e-4)
    rep2 = f.explain(a, b)
    assert _kc(rep2) == two["tile_k"] and len(f.compiles) == 1
    ok = rep2.schedule.endswith("for 2 threads")
    tessera.set_num_threads(1)
    out1 = f(a, b)
    np.testing.assert_allclose(out1, oracle, rtol=1e-4, atol=1e-4)
    rep1 = f.explain(a, b)
    ok = ok and (len(f.compiles) == 2 and _kc(rep1) == one["tile_k"] and rep1.schedule.endswith("for 1 thread")
          and f"tile-k={one['tile_k']}" in rep1.pipeline)
    tessera.set_num_threads(2)
    np.testing.assert_allclose(f(a, b), oracle, rtol=1e-4, atol=1e-4)
    again = f.explain(a, b)
    ok = ok and len(f.compiles) == 2 and _kc(again) == two["tile_k"] and again.schedule.endswith("for 2 threads")
    return ok, list(f.compiles)


def test_thread_count_respecialises_a_tuned_schedule(db, rng):
    a = rng.standard_normal((96, 1100)).astype(np.float32)
    b = rng.standard_normal((1100, 40)).astype(np.float32)
    oracle = a.astype(np.float64) @ b.astype(np.float64)
    ok, compiles = _threads_respecialise(a, b, oracle)
    assert ok, compiles
    assert compiles[1].startswith("thread count 1")


def test_planted_key_without_threads_fails(db, rng, monkeypatch):
    """Teeth: with the thread count dropped from the key (schedule_for reporting no dependence),
    the 1-thread call reuses the 2-thread specialisation and the check fails."""
    real = tune.schedule_for

    def no_threads(jf, graph, arrays):
        pins, source, _ = real(jf, graph, arrays)
        return pins, source, None
    monkeypatch.setattr(tune, "schedule_for", no_threads)
    a = rng.standard_normal((96, 1100)).astype(np.float32)
    b = rng.standard_normal((1100, 40)).astype(np.float32)
    ok, compiles = _threads_respecialise(a, b, a.astype(np.float64) @ b)
    assert not ok and len(compiles) == 1


def test_same_pins_at_another_count_share_the_specialisation(db, rng):
    """Only a 2-thread entry: the 1-thread lookup answers with it (nearest), the same pins, so the
    first specialisation serves 1 thread too and nothing is compiled; its report names both counts."""
    a = rng.standard_normal((64, 80)).astype(np.float32)
    b = rng.standard_normal((80, 24)).astype(np.float32)
    f = tessera.jit(_mm)
    tessera.set_num_threads(2)
    key = tune.key_for(f, "gemm", "f32", (64, 24, 80))
    pins = [p for p in space.candidates("gemm", key.shape) if p][-1]
    with tunedb.TuningDB() as d:
        d.store(tunedb.Entry(key, pins, 1.0))
    f(a, b)
    tessera.set_num_threads(1)
    np.testing.assert_allclose(f(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    rep = f.explain(a, b)
    assert len(f.compiles) == 1 and rep.schedule.endswith("for 1, 2 threads") and _kc(rep) == pins["tile_k"]
    tessera.set_num_threads(2)
    f(a, b)
    assert len(f.compiles) == 1


def test_model_schedule_is_not_recompiled_per_thread_count(db, rng):
    """No database entry: the cost model's schedule ignores the count, so a change compiles nothing;
    a plan made before the change is rebuilt once (not on every call)."""
    a = rng.standard_normal((40, 36)).astype(np.float32)
    b = rng.standard_normal((36, 24)).astype(np.float32)
    f = tessera.jit(_mm)
    tessera.set_num_threads(2)
    f(a, b)
    tessera.set_num_threads(1)
    np.testing.assert_allclose(f(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert len(f.compiles) == 1 and f.explain(a, b).schedule.startswith("schedule from the cost model")
    (v, plan), = f._plans.values()
    from tessera.runtime import threads
    assert v.threads is None and plan.threads_version == threads.version()
