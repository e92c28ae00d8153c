"""The autotuner: schedule search space, tuning database, tuner and its jit hook (docs/tuning.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tessera
from tessera.errors import ScheduleIllegalError, TuneError, TuneWarning, TuningDatabaseWarning
from tessera.frontend import tune
from tessera.frontend.trace import ARRAY
from tessera.passes.schedule import space
from tessera.runtime import tunedb

AVX2 = "x86-64-v3"   # 16 vector registers, whatever this host has


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TESSERA_TUNE_QUIET", "1")
    monkeypatch.setenv("TESSERA_TUNE_NOISE_MAX", "1000")   # a loaded test host; the refusal is tested below
    monkeypatch.setenv("TESSERA_TUNE_JOBS", "1")   # compile in-process (the suite's workers fill the cores)
    return tmp_path


def _key(dtype="f32", shape=(64, 48, 40), family="gemm", threads=1):
    return tunedb.Key(family, space.version(family), "cpu", "znver4", "avx2,fma", dtype, shape, threads)


# --------------------------------------------------------------------------- space
def test_space_rejects_illegal_register_tile():
    with pytest.raises(ScheduleIllegalError, match="8x4 .* needs 37 vector registers"):
        space.check("gemm", {"register_tile": (8, 4)}, arch=AVX2)
    with pytest.raises(ScheduleIllegalError, match="no attribute chunk"):
        space.check("gemm", {"chunk": 8}, arch=AVX2)
    with pytest.raises(ScheduleIllegalError, match="chunk=12"):
        space.check("row", {"chunk": 12}, arch=AVX2)
    cands = space.candidates("gemm", (1024, 1024, 1024), arch=AVX2)
    assert cands[0] == {} and len(cands) > 2
    for pins in cands:   # every candidate is legal, and its footprints fit the model's caches
        space.check("gemm", pins, arch=AVX2)
    # the cache model prunes: a KC x 16-float micro-panel of 64 KiB would spill a 256 KiB L2's quarter
    caches = {"L1": 32 << 10, "L2": 256 << 10, "L3": 8 << 20}
    assert space.fits(512, 64, 512, 16, 4, caches) and not space.fits(4096, 64, 512, 16, 4, caches)


@pytest.mark.parametrize("arch", [AVX2, "x86-64-v4"])
def test_attention_space_is_the_verifiers(arch):
    """Every attention candidate passes the space check and schedule-cpu's block rule; a query
    block off lcm(MR, NR*W) or a key block off MR is refused (the verifier's own rule)."""
    cands = space.candidates("attention", (4, 512, 512, 64), arch=arch)
    assert cands[0] == {} and len(cands) >= 3
    for p in cands[1:]:
        space.check("attention", p, arch=arch)
        assert set(p) == {"register_tile", "tile_m", "tile_n"}
    mr, nr = cands[1]["register_tile"]
    with pytest.raises(ScheduleIllegalError, match="key block"):
        space.check("attention", {"register_tile": (mr, nr), "tile_n": mr * 16 + 1}, arch=arch)
    with pytest.raises(ScheduleIllegalError, match="query block"):
        space.check("attention", {"register_tile": (mr, nr), "tile_m": cands[1]["tile_m"] + 1}, arch=arch)
    short = space.candidates("attention", (4, 64, 40, 64), arch=arch)
    assert all(p["tile_n"] <= 40 + mr and p["tile_m"] <= 64 + 64 for p in short[1:])


def _attn(q, k, v):
    return tessera.ops.attention(q, k, v)


def test_tune_attention_blocks(cache, rng):
    """tessera.tune on flash attention measures block / register-tile candidates, records the
    winner per the margin rule, and a function compiled from the entry matches float64."""
    from tessera.frontend import reference
    q, k, v = (rng.standard_normal((1, 2, 128, 32)).astype(np.float32) for _ in range(3))
    entry = tessera.tune(_attn, q, k, v, min_rounds=3, max_rounds=4, budget_s=2, quiet=True)
    assert entry.key.family == "attention" and entry.key.shape == (2, 128, 128, 32)
    assert len(entry.times) >= 2 and entry.times["model"] > 0
    f = tessera.jit(_attn)
    out = f(q, k, v)
    assert "tuning database" in f.explain(q, k, v).schedule
    ref = reference.attention64(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), None,
                                 1 / np.sqrt(32), False)
    np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4)
    # a candidate's blocks reach the attention kernel (pins scoped to it)
    graph = f._trace([q, k, v], [ARRAY] * 3, frozenset())
    p = space.candidates("attention", (2, 128, 128, 32))[-1]
    kern = next(kk for kk in tune._compile(f, graph, {**p, "pin_kinds": "attention"}).meta["kernels"]
                if kk["kind"] == "attention")
    assert (kern["tiles"]["q"], kern["tiles"]["kv"], tuple(kern["register_tile"])) == \
        (p["tile_m"], p["tile_n"], p["register_tile"])


def test_space_candidates_follow_the_shape():
    small = space.candidates("gemm", (20, 24, 12), arch=AVX2)
    for pins in small[1:]:   # KC collapses to K rounded to the k unit; MC, NC: whole register tiles
        rt = pins["register_tile"]
        assert pins["tile_k"] == 12 and pins["tile_m"] % rt[0] == 0 and pins["tile_n"] % (8 * rt[1]) == 0
    assert len({tune.label(p) for p in small}) == len(small)
    rows = space.candidates("row", (8, 100), arch=AVX2)
    assert rows[0] == {} and all(space.check("row", p, arch=AVX2) is None for p in rows)


# --------------------------------------------------------------------------- database
def _isolates_keys(db: tunedb.TuningDB) -> bool:
    """An f32 entry must never answer an f64, another family's or another arch's lookup."""
    db.store(tunedb.Entry(_key("f32"), {"register_tile": (6, 2)}, 1.0))
    others = [_key("f64"), _key(family="row"),
              tunedb.Key("gemm", 1, "cpu", "skylake-avx512", "avx2,fma,avx512f", "f32", (64, 48, 40), 1),
              tunedb.Key("gemm", space.version("gemm") + 1, "cpu", "znver4", "avx2,fma", "f32", (64, 48, 40), 1)]
    return all(db.lookup(k) is None for k in others)


def test_db_round_trip_nearest_and_isolation(cache):
    with tunedb.TuningDB() as db:
        assert tunedb.path() == cache / "tuning" / "tuning.sqlite" and tunedb.path().exists()
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert _isolates_keys(db)
        e = db.lookup(_key())
        assert e.match == "exact" and e.pins == {"register_tile": (6, 2)} and e.best_ms == 1.0
        near = db.lookup(_key(shape=(60, 50, 33)))     # the same bucket (64, 64, 64)
        assert near.match == "nearest" and near.key.shape == (64, 48, 40)
        assert db.lookup(_key(shape=(1024, 48, 40))) is None   # 16x away: not near
    with tunedb.TuningDB() as db2:   # a second connection sees it
        assert db2.lookup(_key()).pins == {"register_tile": (6, 2)}


def test_db_thread_count_is_part_of_the_key(cache):
    """A 1-thread entry never answers a 2-thread lookup while a 2-thread entry (exact or nearest
    shape) exists; with none of that count, the closest count's entry answers as nearest."""
    with tunedb.TuningDB() as db:
        db.store(tunedb.Entry(_key(threads=1), {"register_tile": (6, 2)}, 1.0))
        alone = db.lookup(_key(threads=2))
        assert alone.match == "nearest" and alone.key.threads == 1   # no 2-thread entry: the rule's fallback
        db.store(tunedb.Entry(_key(shape=(60, 50, 33), threads=2), {"register_tile": (4, 3)}, 2.0))
        db.store(tunedb.Entry(_key(threads=8), {"register_tile": (2, 4)}, 3.0))
        e2 = db.lookup(_key(threads=2))
        assert e2.key.threads == 2 and e2.match == "nearest" and e2.pins == {"register_tile": (4, 3)}
        e1 = db.lookup(_key(threads=1))
        assert e1.match == "exact" and e1.pins == {"register_tile": (6, 2)}
        assert db.lookup(_key(threads=4)).key.threads in (2, 8)   # log2 distance 1 both ways
        assert len(db.entries()) == 3


def test_key_for_follows_set_num_threads(monkeypatch):
    from tessera import host
    monkeypatch.setattr(host, "usable_cpus", lambda: 4)
    f = tessera.jit(_mm)
    try:
        tessera.set_num_threads(1)
        k1 = tune.key_for(f, "gemm", "f32", (64, 64, 64))
        tessera.set_num_threads(2)
        k2 = tune.key_for(f, "gemm", "f32", (64, 64, 64))
        tessera.set_num_threads(16)
        k16 = tune.key_for(f, "gemm", "f32", (64, 64, 64))
    finally:
        tessera.set_num_threads(None)
    assert (k1.threads, k2.threads, k16.threads) == (1, 2, 4) and k1 != k2
    assert tune.key_for(tessera.jit(_mm, schedule={"threads": 3}), "gemm", "f32", (64, 64, 64)).threads <= 3


def test_db_old_schema_without_threads_is_set_aside(cache):
    """A schema-1 file (no thread count in its key) is ignored with a warning and rebuilt."""
    import sqlite3
    tunedb.path().parent.mkdir()
    con = sqlite3.connect(str(tunedb.path()))
    con.executescript("CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL); INSERT INTO meta VALUES ('schema', '1');")
    con.commit()
    con.close()
    with pytest.warns(TuningDatabaseWarning, match="schema 1, this Tessera reads 2"):
        db = tunedb.TuningDB()
    assert db.entries() == []
    db.close()


def test_db_planted_key_without_dtype_is_caught(cache, monkeypatch):
    monkeypatch.setattr(tunedb, "KEY_FIELDS", ("family", "version", "target", "arch", "features"))
    with tunedb.TuningDB() as db:
        assert not _isolates_keys(db)   # the f32 entry answers an f64 lookup: the check has teeth


def test_db_two_processes_write_at_once(cache):
    code = ("import sys; from tessera.runtime import tunedb as t\n"
            "for i in range(40):\n"
            "    with t.TuningDB() as db:\n"
            "        db.store(t.Entry(t.Key('gemm', 1, 'cpu', 'a', 'f', sys.argv[1], (i + 1, 8, 8), 1), {}, float(i)))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, d], cwd=str(tessera.__path__[0] + "/.."))
             for d in ("f32", "f64")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with tunedb.TuningDB() as db:
        rows = db.entries()
    assert len(rows) == 80 and {r.key.dtype for r in rows} == {"f32", "f64"}


def test_db_corrupt_file_is_set_aside(cache):
    tunedb.path().parent.mkdir()
    tunedb.path().write_bytes(b"this is not a database" * 100)
    with pytest.warns(TuningDatabaseWarning, match="set aside"):
        db = tunedb.TuningDB()
    db.store(tunedb.Entry(_key(), {}, 2.0))
    assert db.lookup(_key()).best_ms == 2.0
    db.close()


def test_db_foreign_schema_is_set_aside(cache):
    with tunedb.TuningDB() as db:
        db.store(tunedb.Entry(_key(), {}, 2.0))
        db.conn.execute("UPDATE meta SET v='99' WHERE k='schema'")
    with pytest.warns(TuningDatabaseWarning, match="schema 99, this Tessera reads 2"):
        db = tunedb.TuningDB()
    assert db.entries() == [] and list(tunedb.path().parent.glob("tuning.sqlite.bad-*"))
    db.close()


def test_db_export_import(cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "site.json"
    with tunedb.TuningDB() as db:
        db.store(tunedb.Entry(_key(), {"register_tile": (4, 3), "tile_k": 40}, 1.5, {"model": 1.7}))
        db.store(tunedb.Entry(_key("f64", (32, 32, 32)), {}, 3.0))
        assert db.export(out) == 2
        assert db.clear() == 2 and db.entries() == []
        assert db.import_file(out) == 2
        got = db.lookup(_key())
        assert got.pins == {"register_tile": (4, 3), "tile_k": 40} and got.times == {"model": 1.7}
        doc = json.loads(out.read_text())
        doc["schema"] = 99
        out.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match="not a Tessera tuning export"):
            db.import_file(out)


# --------------------------------------------------------------------------- tuner and jit hook
def _mm(x, y):
    return x @ y


def test_jit_tune_stores_and_a_second_function_reuses(cache, rng, monkeypatch):
    monkeypatch.setenv("TESSERA_TUNE_BUDGET", "2")
    a = rng.standard_normal((40, 36)).astype(np.float32)
    b = rng.standard_normal((36, 24)).astype(np.float32)
    oracle = a.astype(np.float64) @ b.astype(np.float64)
    tuned = tessera.jit(_mm, tune=True)
    np.testing.assert_allclose(tuned(a, b), oracle, rtol=1e-4, atol=1e-4)
    with tunedb.TuningDB() as db:
        (entry,) = db.entries()
    assert entry.key.family == "gemm" and entry.key.dtype == "f32" and entry.key.shape == (40, 24, 36)
    assert entry.times and all(t is None or t > 0 for t in entry.times.values())
    again = tessera.jit(_mm)   # not tuning: the database's entry is its schedule
    rep = tessera.explain(again, a, b)
    assert rep.schedule.startswith(f"schedule from the tuning database (entry gemm v{space.version('gemm')} f32 40x24x36")
    assert "  schedule  schedule from the tuning database" in str(rep)
    for k, v in entry.pins.items():
        assert f"{k.replace('_', '-')}={','.join(map(str, v)) if isinstance(v, tuple) else v}" in rep.pipeline
    np.testing.assert_allclose(again(a, b), oracle, rtol=1e-4, atol=1e-4)
    with tunedb.TuningDB() as db:
        db.clear()
    rep = tessera.explain(tessera.jit(_mm), a, b)   # teeth: without the entry, the model's schedule
    assert rep.schedule.startswith("schedule from the cost model")


def _softmax(x):
    return tessera.ops.softmax(x, axis=-1)


def test_jit_tune_row_family_chunk(cache, rng, monkeypatch):
    monkeypatch.setenv("TESSERA_TUNE_BUDGET", "1")
    x = rng.standard_normal((24, 100)).astype(np.float32)
    x64 = x.astype(np.float64)
    oracle = np.exp(x64 - x64.max(-1, keepdims=True))
    oracle /= oracle.sum(-1, keepdims=True)
    np.testing.assert_allclose(tessera.jit(_softmax, tune=True)(x), oracle, rtol=1e-5, atol=1e-6)
    with tunedb.TuningDB() as db:
        (entry,) = db.entries()
    from tessera.passes.schedule import space
    # the model's chunk and 1, 2, 8 registers' worth as far as a 100-column row is that wide (the
    # count depends on the host's vector width)
    n = len(space.row_candidates(cols=100))
    assert entry.key.family == "row" and entry.key.shape == (24, 100) and len(entry.times) == n >= 3
    assert set(entry.pins) <= {"chunk"}
    rep = tessera.explain(tessera.jit(_softmax), x)
    assert rep.schedule.startswith("schedule from the tuning database (entry row v1 f32 24x100")
    assert f"chunk={entry.pins['chunk']}" in rep.pipeline if entry.pins else "chunk=" not in rep.pipeline


def _attn_then_gemm(q, k, v, w):
    return tessera.ops.attention(q, k, v).reshape(-1, 32) @ w


def test_pins_scoped_to_a_kernel_kind_leave_the_others_alone(rng):
    """A tuned GEMM pin (MC = 30, register tile 2x2) must not reach the attention kernel of the same
    program: pin_kinds scopes it (the tuner always scopes its pins to the family it tuned)."""
    q, k, v = (rng.standard_normal((1, 2, 40, 32)).astype(np.float32) for _ in range(3))
    w = rng.standard_normal((32, 24)).astype(np.float32)
    pins = {"tile_m": 30, "register_tile": (2, 2)}
    with pytest.raises(ScheduleIllegalError, match="query block 30"):   # unscoped, MC=30 is attention's block
        tessera.jit(_attn_then_gemm, schedule=pins)(q, k, v, w)
    f = tessera.jit(_attn_then_gemm, schedule={**pins, "pin_kinds": "gemm"})
    got = f(q, k, v, w)
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / np.sqrt(32)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = ((p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)).reshape(-1, 32) @ w
    assert np.abs(got - want).max() < 1e-4
    kern = {kk["kind"]: kk for kk in tessera.explain(f, q, k, v, w).kernels}
    assert list(kern["gemm"]["register_tile"]) == [2, 2] and kern["gemm"]["tiles"]["m"] == 30
    assert list(kern["attention"]["register_tile"]) != [2, 2]
    with pytest.raises(ScheduleIllegalError, match="pin_kinds"):
        tessera.jit(_attn_then_gemm, schedule={"pin_kinds": "gemm+bogus"})(q, k, v, w)


def test_tessera_tune_api(cache, rng):
    """tessera.tune(fn, *args) tunes now and stores; a function without a tunable kernel is refused."""
    a = rng.standard_normal((8, 24)).astype(np.float32)
    b = rng.standard_normal((24, 16)).astype(np.float32)
    entry = tessera.tune(_mm, a, b, limit=2, min_rounds=2, max_rounds=3, quiet=True)
    # 2 candidates, and the 2 other thread splits on more than one thread
    assert entry.key.shape == (8, 16, 24) and len(entry.times) == 2 + 2 * (entry.key.threads > 1)
    with tunedb.TuningDB() as db:
        assert db.lookup(entry.key).pins == entry.pins
    with pytest.raises(TuneError, match="no tunable kernel"):
        tessera.tune(lambda x: x + 1.0, a)


def test_jit_tune_refuses_gpu_targets(rng):
    from tessera.frontend.tune import schedule_for

    class Fn:   # the refusal comes before any GPU compile or device
        target, tune, name, schedule = "nvidia", True, "f", {}
    with pytest.raises(TuneError, match="tuning nvidia schedules is not built yet"):
        schedule_for(Fn(), None, [])


def test_tuner_records_a_failing_candidate(cache, rng, monkeypatch):
    """A candidate that cannot compile is recorded as failed (None) and the tuner goes on; one that
    spells the model's own schedule as pins is timed once (as the model)."""
    bad = {"register_tile": (6, 2), "tile_m": 7, "tile_k": 16, "tile_n": 16}   # MC not a multiple of MR
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    f = tessera.jit(_mm)
    graph = f._trace([a, b], [ARRAY, ARRAY], frozenset())
    k = tune._compile(f, graph, {}).meta["kernels"][0]
    same = {"register_tile": tuple(k["register_tile"]), "tile_m": k["tiles"]["m"], "tile_n": k["tiles"]["n"],
            "tile_k": k["tiles"]["k"]}
    monkeypatch.setattr(space, "candidates", lambda *a, **k: [{}, bad, same])
    monkeypatch.setenv("TESSERA_TUNE_JOBS", "2")   # through forked workers
    entry = tune.tune_graph(f, graph, [a, b], _key(shape=(16, 16, 16)), min_rounds=3, max_rounds=5,
                            budget_s=1)
    assert entry.times[tune.label(bad)] is None and entry.pins == {} and entry.times["model"] > 0
    assert set(entry.times) == {"model", tune.label(bad)}
    assert entry.failed[tune.label(bad)].startswith("SCHEDULE_ILLEGAL")
    monkeypatch.setattr(tune, "_compile", lambda *a, **k: (_ for _ in ()).throw(ScheduleIllegalError("planted")))
    with pytest.raises(TuneError, match="no candidate"):
        tune.tune_graph(f, graph, [a, b], _key(shape=(16, 16, 16)), quiet=True)


class _FakeClock:
    """Time that moves only when a fake runner runs: each call costs ``base`` times a lognormal
    factor of spread ``sigma`` (seeded), so the race sees injected timings, never the host's."""

    def __init__(self, seed=0):
        self.t = 0.0
        self.rng = np.random.default_rng(seed)

    def __call__(self):
        return self.t

    def runner(self, pins, base, sigma):
        def run():
            self.t += base * float(self.rng.lognormal(0.0, sigma))
        return [pins, run, 1, []]


def _race(speedup, sigma, margin=tune.MARGIN, seed=0, others=()):
    clock = _FakeClock(seed)
    runners = [clock.runner({}, 1.0, sigma), clock.runner({"tile_k": 256}, 1.0 - speedup, sigma)]
    runners += [clock.runner(p, 1.0 - s, sigma) for p, s in others]
    best, rounds = tune.race(runners, np.random.default_rng(seed), min_rounds=5, max_rounds=60, budget_s=1e9,
                             margin=margin, clock=clock)
    return best[0], rounds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_race_a_candidate_wins_only_by_more_than_the_noise(seed):
    """1 % faster within noise (and even 1 % with a tight spread, under the 2 % margin) keeps the
    model's schedule; 10 % faster with a tight spread replaces it, and the race stops early."""
    assert _race(0.01, 0.05, seed=seed)[0] == {}
    assert _race(0.01, 0.002, seed=seed)[0] == {}
    assert _race(-0.10, 0.002, seed=seed)[0] == {}          # slower: never
    pins, rounds = _race(0.10, 0.01, seed=seed)
    assert pins == {"tile_k": 256} and rounds < 60
    # among two that beat the model, the faster one; a third within noise of the model drops out
    assert _race(0.10, 0.01, seed=seed, others=[({"tile_k": 512}, 0.20), ({"tile_m": 64}, 0.005)])[0] == \
        {"tile_k": 512}


def test_race_planted_zero_margin_lets_noise_win():
    """Teeth: without the margin, a 1 % faster candidate with a tight spread replaces the model,
    and a plain lowest-median pick takes a 1 % candidate inside the noise about half the time."""
    assert _race(0.01, 0.002, margin=0.0)[0] == {"tile_k": 256}
    picks = []
    for seed in range(8):
        clock = _FakeClock(seed)
        rs = [clock.runner({}, 1.0, 0.05), clock.runner({"tile_k": 256}, 0.99, 0.05)]
        tune.race(rs, np.random.default_rng(seed), min_rounds=5, max_rounds=20, budget_s=1e9, clock=clock)
        picks.append(min(rs, key=lambda r: np.median(r[3]))[0])   # the old rule
    assert {"tile_k": 256} in picks


def test_tuner_keeps_the_model_as_a_candidate(cache, rng, monkeypatch):
    """Candidates without the model's ``{}`` still race against it."""
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    f = tessera.jit(_mm)
    graph = f._trace([a, b], [ARRAY, ARRAY], frozenset())
    seen = []
    real = tune.race
    monkeypatch.setattr(space, "candidates", lambda *a, **k: [{"tile_k": 16}])
    monkeypatch.setattr(tune, "race", lambda runners, *a, **k: seen.append([r[0] for r in runners]) or
                        real(runners, *a, **k))
    tune.tune_graph(f, graph, [a, b], _key(shape=(16, 16, 16)), min_rounds=3, max_rounds=4, budget_s=1)
    assert seen and seen[0][0] == {}


def _fake_compile(pins):
    import os
    import signal
    import time
    what = pins.get("what")
    if what == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "hang":
        time.sleep(600)
    if what == "illegal":
        raise ScheduleIllegalError("no such tile")
    return f"compiled {what}"


@pytest.mark.slow   # a fresh interpreter per worker and a 15 s timeout: ~19 s
def test_workers_isolate_crashes_and_timeouts():
    """A candidate that kills or hangs its worker is recorded as failed; the others compile."""
    from tessera.frontend import tune_workers
    cands = [{"what": "model"}, {"what": "crash"}, {"what": "ok"}, {"what": "hang"}, {"what": "illegal"}]
    worker = tune_workers.Worker(__name__, "_fake_compile")
    got = tune_workers.compile_all(_fake_compile, cands, worker=worker, njobs=2, timeout_s=15)
    assert [p for p, _, _ in got] == cands
    assert [c for _, c, _ in got] == ["compiled model", None, "compiled ok", None, None]
    why = [w for _, _, w in got]
    assert "SIGKILL" in why[1] and "timed out" in why[3] and why[4] == "SCHEDULE_ILLEGAL: no such tile"


_HELD = threading.Lock()   # held by a parent thread in the test below; a forked child would inherit it held


def _compile_taking_the_lock(pins):
    if not _HELD.acquire(timeout=30):   # a fork()ed worker waits here forever (30 s: the test's timeout says so)
        raise RuntimeError("the lock a parent thread held came along into the worker")
    _HELD.release()
    return "compiled"


def test_workers_are_fresh_processes_not_forks_of_a_threaded_parent():
    """Tuning after a background thread took a lock (as JAX / torch threads do) finishes: the
    workers are fresh interpreters, not forks that inherit the held lock."""
    from tessera.frontend import tune_workers
    go, stop = threading.Event(), threading.Event()

    def hold():
        with _HELD:
            go.set()
            stop.wait(120)
    t = threading.Thread(target=hold, daemon=True)
    t.start()
    go.wait(10)
    try:
        worker = tune_workers.Worker(__name__, "_compile_taking_the_lock")
        got = tune_workers.compile_all(lambda p: "here", [{}, {"a": 1}, {"b": (2, 3)}], worker=worker, njobs=2,
                                       timeout_s=25)
        assert [w for _, _, w in got] == ["", "", ""] and [c for _, c, _ in got] == ["here"] * 3
        # teeth: a forked child of this process finds the lock held (what the old fork workers did)
        if hasattr(os, "fork"):
            pid = os.fork()
            if pid == 0:
                os._exit(0 if _HELD.acquire(timeout=1) else 3)
            assert os.waitpid(pid, 0)[1] >> 8 == 3
    finally:
        stop.set()
        t.join(10)


def test_worker_compiles_a_candidate_from_the_module_text(cache, rng):
    """The worker's entry point compiles the graph text to the same schedule as the in-process path."""
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    f = tessera.jit(_mm)
    graph = f._trace([a, b], [ARRAY, ARRAY], frozenset())
    w = tune._worker(f, graph, "gemm")
    pins = {"tile_k": 16}
    c = tune.compile_text(*json.loads(json.dumps(w.args)), pins)
    assert tune._schedule_of(c) == tune._schedule_of(tune._compile(f, graph, {**pins, "pin_kinds": "gemm"}))
    out = tune._runner(c, [a, b])()
    np.testing.assert_allclose(out[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_tuner_refuses_noise_and_wrong_results(cache, rng, monkeypatch):
    a = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16, 16)).astype(np.float32)
    f = tessera.jit(_mm)
    graph = f._trace([a, b], [ARRAY, ARRAY], frozenset())
    monkeypatch.setattr(space, "candidates", lambda *a, **k: [{}])
    with pytest.raises(TuneError, match="too noisy"):
        tune.tune_graph(f, graph, [a, b], _key(shape=(16, 16, 16)), min_rounds=4, max_rounds=4,
                        noise_max=-1.0, quiet=True)
    # a candidate whose result is wrong is not eligible (the float64 check has teeth)
    monkeypatch.setattr(tune, "error", lambda got, ref: float("inf"))
    with pytest.raises(TuneError, match="no candidate.*rejected: error inf"):
        tune.tune_graph(f, graph, [a, b], _key(shape=(16, 16, 16)), quiet=True)
    assert tune.fresh_inputs([a], np.random.default_rng(0))[0].all()   # never zeros


def test_result_check_tolerance_nan_and_inf():
    ref = np.array([1.0, np.nan, np.inf])
    assert tune._close([ref.astype(np.float32)], [ref], "f32")
    assert not tune._close([np.array([1.001, np.nan, np.inf])], [ref], "f32")
    assert not tune._close([np.array([1.0, 0.0, np.inf])], [ref], "f32")
    assert not tune._close([np.array([1.0, np.nan, -np.inf])], [ref], "f32")


def test_jit_tune_on_a_noisy_host_warns_and_uses_the_model(cache, rng, monkeypatch):
    monkeypatch.setenv("TESSERA_TUNE_NOISE_MAX", "-1")   # every spread is too much
    monkeypatch.setenv("TESSERA_TUNE", "1")
    a = rng.standard_normal((16, 12)).astype(np.float32)
    b = rng.standard_normal((12, 8)).astype(np.float32)
    f = tessera.jit(_mm)
    with pytest.warns(TuneWarning, match="too noisy"):
        out = f(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert f.explain(a, b).schedule.startswith("schedule from the cost model")
    with tunedb.TuningDB() as db:
        assert db.entries() == []


# --------------------------------------------------------------------------- CLI
SCRIPT = """
import numpy as np, tessera
rng = np.random.default_rng(7)
a = rng.standard_normal((16, 12)).astype(np.float32)
b = rng.standard_normal((12, 8)).astype(np.float32)
out = tessera.jit(lambda x, y: x @ y)(a, b)
assert np.abs(out - a.astype(np.float64) @ b).max() < 1e-4
"""


def test_cli_tune_file_show_export_import(cache, tmp_path_factory, monkeypatch, capsys):
    from tessera.tools import cli
    d = tmp_path_factory.mktemp("cli")
    script = d / "model.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("TESSERA_TUNE", "0")      # restored after the test (the CLI sets it to 1)
    monkeypatch.setenv("TESSERA_TUNE_BUDGET", "1")
    monkeypatch.setenv("TESSERA_TUNE_QUIET", "0")
    assert cli.main(["tune", str(script), "--show"]) == 0
    out, err = capsys.readouterr()
    assert "tessera tune <lambda> gemm f32 16x8x12: round" in err and "eta" in err
    assert "1 entries" in out and "16x8x12" in out and "ok/tried" in out
    exported = d / "site.json"
    assert cli.main(["tune", "--export", str(exported)]) == 0
    assert cli.main(["tune", "--clear"]) == 0
    assert cli.main(["tune", "--import", str(exported), "--show"]) == 0
    out, _ = capsys.readouterr()
    assert "removed 1 entries" in out and "imported 1 entries" in out and "16x8x12" in out
    (d / "bad.json").write_text("{}")
    assert cli.main(["tune", "--import", str(d / "bad.json")]) == 1


def test_cache_clear_keeps_the_tuning_database_unless_asked(cache):
    from tessera.tools import cli
    with tunedb.TuningDB() as db:
        db.store(tunedb.Entry(_key(), {"register_tile": (4, 3)}, 1.0))
    assert cli.main(["cache", "clear"]) == 0
    with tunedb.TuningDB() as db:
        assert db.lookup(_key()).pins == {"register_tile": (4, 3)}
    assert cli.main(["cache", "clear", "--tuning"]) == 0
    assert not tunedb.path().exists()
    with tunedb.TuningDB() as db:   # rebuilt empty on the next use
        assert db.entries() == []


def test_bench_tuned_column_times_model_and_tuned_schedules(cache, rng, monkeypatch):
    """``tessera bench cpu --tuned``: the plain column keeps the cost model's schedule (compiled before the
    tuning, in a private database), the tuned callable takes the tuned entry; both are timed in the same
    rounds and the doc renders untuned / tuned."""
    from tessera.tools import bench_cpu, bench_doc
    monkeypatch.setenv("TESSERA_TUNE_BUDGET", "2")
    monkeypatch.setenv("TESSERA_BENCH_TUNED", "1")
    # the bench sets it; setenv (unlike delenv of an absent variable) records it, so it is removed after the test
    monkeypatch.setenv("TESSERA_TUNING_DB", "")
    user_db = tunedb.path()
    made = []
    real = bench_cpu._tessera_fn
    monkeypatch.setattr(bench_cpu, "_tessera_fn", lambda kind, threads: made.append(real(kind, threads)) or made[-1])
    a = rng.standard_normal((48, 40)).astype(np.float32)
    b = rng.standard_normal((40, 56)).astype(np.float32)
    row = bench_cpu.run_workload("sgemm 48x56x40", "gemm", [a, b], 2 * 48 * 56 * 40, "GFLOP/s", None, {},
                                 use_compile=False, reps=2, with_numpy=False)
    assert tunedb.path() != user_db and not user_db.exists()   # the user's database is left alone
    untuned, tuned = made[0], made[-1]
    assert tessera.explain(untuned, a, b).schedule.startswith("schedule from the cost model")
    assert tessera.explain(tuned, a, b).schedule.startswith("schedule from the tuning database")
    assert bench_cpu.TUNED in row["also"] and len(row["also"][bench_cpu.TUNED]["times_s"]) == 2
    assert row["tuning"]["pins"] and "model" in row["tuning"]["candidates_ms"]
    np.testing.assert_allclose(tuned(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    text = "\n".join(bench_doc._tuned_lines({"rows": [row]}))
    assert "| sgemm 48x56x40 | all |" in text and row["tuning"]["pins"] in text
