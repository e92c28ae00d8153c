"""Decode attention's key blocks / key-chunk split and the GEMM thread split as tunable Schedule IR
attributes (docs/tuning.md): legal ranges refused by the space, the pass and the IR verifier; a tuner
run on a small shape records an entry (the winner picked on the fake clock) that a later function
reuses, with results checked against float64."""
from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.errors import ScheduleIllegalError, ScheduleVerifyError
from tessera.frontend import tune
from tessera.passes.schedule import space
from tessera.runtime import tunedb


@pytest.fixture
def cache(tmp_path, monkeypatch):
    from tessera import host
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TESSERA_TUNING_DB", raising=False)   # the database under the cache dir
    monkeypatch.setenv("TESSERA_TUNE_QUIET", "1")
    monkeypatch.setenv("TESSERA_TUNE_JOBS", "1")
    monkeypatch.setattr(host, "usable_cpus", lambda: 2)
    tessera.set_num_threads(2)
    yield tmp_path
    tessera.set_num_threads(None)


def _decode(q, k, v):
    return tessera.ops.attention(q, k, v)


def _decode64(q, k, v):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _mm(x, y):
    return x @ y


def test_split_ranges_are_refused_everywhere(rng):
    for fam, pins in (("gemm", {"split": 17}), ("gemm", {"split": 2, "parallel": "b*m"}), ("gemm", {"parallel": "r"}),
                      ("decode", {"split": 257}), ("decode", {"tile_n": 8}), ("decode", {"tile_n": 4096})):
        with pytest.raises(ScheduleIllegalError):
            space.check(fam, pins)
    for fam in ("gemm", "decode"):
        for pins in space.candidates(fam, (2, 1, 300, 32) if fam == "decode" else (64, 64, 64), threads=2):
            space.check(fam, pins)
    a = rng.standard_normal((40, 24)).astype(np.float32)
    with pytest.raises(ScheduleIllegalError, match="split=17 is illegal for a gemm kernel"):
        tessera.jit(_mm, schedule={"split": 17})(a, a.T.copy())
    with pytest.raises(ScheduleIllegalError, match="split=300 is out of range"):
        tessera.jit(_mm, schedule={"split": 300})(a, a.T.copy())
    # the Schedule IR verifier refuses an out-of-range split in IR text (tessera-opt's input)
    c = tessera.compile(tessera.jit(_mm, schedule={"split": 2}), a, a.T.copy())
    text = c.compiled.layer_ir["schedule"]
    assert "split = 2" in text
    from tessera.ir.text import parse_module
    parse_module(text).verify()
    with pytest.raises(ScheduleVerifyError, match="split=40 is out of range"):
        parse_module(text.replace("split = 2", "split = 40")).verify()


def _tune_fake(fn, args, winner, monkeypatch):
    """tessera.tune with every candidate costing 1.0 on a fake clock except ``winner(kernel_info)``'s, 0.5."""
    t = [0.0]
    real = tune._runner

    def runner(c, arrays):
        run = real(c, arrays)
        cost = 0.5 if any(winner(k) for k in c.meta["kernels"]) else 1.0

        def timed():
            t[0] += cost
            return run()
        return timed
    monkeypatch.setattr(tune, "_runner", runner)
    entry = tessera.tune(fn, *args, min_rounds=5, max_rounds=10, budget_s=1e9, quiet=True, clock=lambda: t[0],
                         seed=0)
    monkeypatch.setattr(tune, "_runner", real)
    return entry


def test_tune_decode_split_records_and_reuses(cache, rng, monkeypatch):
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 300, 32)).astype(np.float32) for _ in range(2))
    entry = _tune_fake(_decode, (q, k, v), lambda kk: kk.get("split") == 1, monkeypatch)
    assert entry.key.family == "decode" and entry.key.shape == (2, 1, 300, 32) and entry.key.threads == 2
    assert entry.pins == {"split": 1}
    assert set(entry.times) >= {"model", "nc64", "nc128", "split1", "split8"}
    assert all(e <= space.error_budget("decode", "f32") for e in entry.errors.values())
    with tunedb.TuningDB() as db:
        assert db.lookup(entry.key).pins == {"split": 1}
    f = tessera.jit(_decode)   # not tuning: the entry is its schedule
    np.testing.assert_allclose(f(q, k, v), _decode64(q, k, v), rtol=2e-5, atol=2e-5)
    rep = f.explain(q, k, v)
    assert rep.schedule.startswith("schedule from the tuning database (entry decode v1 f32 2x1x300x32")
    (kern,) = [kk for kk in rep.kernels if kk["kind"] == "attention"]
    assert kern["kernel"].endswith("_decode") and kern["split"] == 1 and "split=1" in rep.pipeline


def test_tune_gemm_thread_split_records_and_reuses(cache, rng, monkeypatch):
    a = rng.standard_normal((96, 40)).astype(np.float32)
    b = rng.standard_normal((40, 48)).astype(np.float32)
    entry = _tune_fake(_mm, (a, b), lambda kk: kk["parallel"] == "b*m", monkeypatch)
    assert entry.key.family == "gemm" and entry.key.version == 2 and entry.key.threads == 2
    assert entry.pins == {"parallel": "b*m"} and entry.times["split1"] > 0
    f = tessera.jit(_mm)
    np.testing.assert_allclose(f(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    rep = f.explain(a, b)
    assert rep.schedule.startswith("schedule from the tuning database (entry gemm v2 f32 96x48x40")
    assert rep.kernels[0]["parallel"] == "b*m" and "for 2 threads" in rep.schedule
    # one thread: no thread-split candidates (nothing to split)
    assert not any({"split", "parallel"} & set(p) for p in space.candidates("gemm", (96, 48, 40), threads=1))


def test_old_gemm_space_version_is_set_aside(cache, rng):
    """Entries of gemm space version 1 (before the thread split joined it) are never used."""
    a = rng.standard_normal((40, 36)).astype(np.float32)
    b = rng.standard_normal((36, 24)).astype(np.float32)
    f = tessera.jit(_mm)
    key = tune.key_for(f, "gemm", "f32", (40, 24, 36))
    old = tunedb.Key(key.family, 1, *list(key.__dict__.values())[2:])
    with tunedb.TuningDB() as db:
        db.store(tunedb.Entry(old, {"register_tile": (2, 1)}, 1.0))
    assert f.explain(a, b).schedule.startswith("schedule from the cost model")
    with tunedb.TuningDB() as db:   # teeth: the same entry at the current version is used
        db.store(tunedb.Entry(key, {"register_tile": (2, 1)}, 1.0))
    assert tessera.jit(_mm).explain(a, b).schedule.startswith("schedule from the tuning database")


@pytest.mark.parametrize("pins", [{"split": 1}, {"split": 3, "tile_n": 16}, {"split": 256, "tile_n": 64}])
def test_decode_split_matches_float64_with_groups_and_mask(rng, pins):
    """Every key-chunk split and key block gives the float64 result (grouped heads, a bool mask)."""
    from tessera.frontend import reference
    q = rng.standard_normal((1, 8, 1, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 777, 32)).astype(np.float32) for _ in range(2))
    m = rng.random((1, 1, 1, 777)) > 0.3
    f = tessera.jit(lambda q, k, v, m: tessera.ops.attention(q, k, v, mask=m), schedule=pins)
    out = f(q, k, v, m)
    (kern,) = [kk for kk in f.explain(q, k, v, m).kernels if kk["kind"] == "attention"]
    assert kern["kernel"].endswith("_decode") and kern["split"] == pins["split"]
    ref = reference.attention64(*(x.astype(np.float64) for x in (q, k, v)), m, 1 / np.sqrt(32), False)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_decode_split_planted_lost_chunk_fails(rng, monkeypatch):
    """Teeth: a combine that drops the last key chunk is caught by the same float64 check."""
    from tessera.passes.tile.kernels import attention_decode
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(attention_decode, "combined_chunks", lambda b, nchunk: b.sub(nchunk, 1))
    q = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 600, 32)).astype(np.float32) for _ in range(2))
    out = tessera.jit(_decode, schedule={"split": 3, "tile_n": 64})(q, k, v)
    assert np.abs(out - _decode64(q, k, v)).max() > 1e-3
