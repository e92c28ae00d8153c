"""docs/benchmarks.md is rendered from raw logs: the figures' arithmetic (medians, the matched and
default-path ratios, faults per call) and the per-host log files.  No timing is measured here: the
logs are synthetic, with random timings, and every figure is checked against numpy in float64."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tessera.errors import BenchLogError
from tessera.tools import bench_doc


def _lib(rng, scale_s: float, rounds: int, faults: int) -> dict:
    return {"warm_s": scale_s, "times_s": list(scale_s * rng.uniform(0.95, 1.05, rounds)),
            "minflt": [int(v) for v in rng.integers(faults, faults + 5, rounds)]}


def _run(rng, slug="amd-epyc-znver4-avx2", date="2026-12-04T00:00:00Z", commit="a" * 40, quick=False,
         rounds=7) -> dict:
    row = {"workload": "softmax 64x64", "kind": "softmax", "threads": "all", "unit": "GB/s", "work": 32768.0,
           "rounds": rounds, "failed": {}, "also": {},
           "libraries": {bench_doc.POOLED: _lib(rng, 1e-3, rounds, 0),
                         bench_doc.FRESH: _lib(rng, 2e-3, rounds, 1000),
                         "numpy": _lib(rng, 3e-3, rounds, 2000),
                         "torch": _lib(rng, 4e-3, rounds, 3000)}}
    return {"schema": bench_doc.SCHEMA, "date": date, "commit": commit, "dirty": False, "quick": quick,
            "command": "./dev tessera bench cpu --write",
            "host": {"slug": slug, "cpu_model": "AMD EPYC", "llvm_cpu": "znver4", "isa": "AVX2 (no AVX-512), FMA",
                     "features": ["avx2", "fma"], "usable_cpus": 2, "thp": "always [madvise] never"},
            "software": {"python": "3.12", "numpy": np.__version__}, "load": {"cpus_online": 2, "loadavg_before":
                                                                              [3.0, 2.0, 1.0],
                                                                              "loadavg_after": [4.0, 2.0, 1.0]},
            "method": {"reps": 7, "max_reps": 21, "rounds_budget_s": 15.0, "quiesce_s": 0.3, "wake_below_s": 0.25,
                       "pair_pause_s": 0.05, "pair_least": 41, "pair_most": 201, "pair_budget_s": 30.0},
            "host_measures": {}, "rows": [row]}


def _expected(row) -> dict:
    """The figures in float64, from the rounds."""
    med = {n: float(np.median(np.array(v["times_s"], np.float64))) for n, v in row["libraries"].items()}
    best = min(("numpy", "torch"), key=med.get)
    return {"best": best, "matched": med[best] / med[bench_doc.FRESH], "default": med[best] / med[bench_doc.POOLED],
            "faults": {n: float(np.median(np.array(v["minflt"], np.float64))) for n, v in row["libraries"].items()}}


def _check_ratios(row) -> None:
    s, e = bench_doc.row_stats(row), _expected(row)
    assert s["best_peer"] == e["best"]
    assert s["matched"] == pytest.approx(e["matched"], rel=1e-12)
    assert s["default"] == pytest.approx(e["default"], rel=1e-12)
    assert s["faults"] == pytest.approx(e["faults"])


def test_matched_ratio_divides_by_fresh_outputs(rng):
    row = _run(rng)["rows"][0]
    _check_ratios(row)
    # pooled 1 ms, fresh 2 ms, best peer 3 ms (within the random spread): the two ratios differ about 2x
    s = bench_doc.row_stats(row)
    assert 1.7 < s["default"] / s["matched"] < 2.3


def test_matched_ratio_check_has_teeth(rng, monkeypatch):
    """Planted: the headline divides by Tessera's pooled time (the old table's bug): the check fails."""
    row = _run(rng)["rows"][0]
    monkeypatch.setattr(bench_doc, "MATCHED", bench_doc.POOLED)
    with pytest.raises(AssertionError):
        _check_ratios(row)


def test_rendered_table_quotes_both_ratios_and_faults(rng):
    run = _run(rng)
    e = _expected(run["rows"][0])
    text = "\n".join(bench_doc.render_run(run))
    line = next(ln for ln in text.splitlines() if ln.startswith("| softmax"))
    assert f"**{e['matched']:.2f}** | {e['default']:.2f} |" in line
    fault_line = [ln for ln in text.splitlines() if ln.startswith("| softmax")][1]
    assert f"| {e['faults'][bench_doc.FRESH]:.0f} |" in fault_line
    assert "Load average (1 min) 3.00 before the run and 4.00 after it" in text
    assert "rough" in text
    assert bench_doc.headline(run) == [f"softmax 64x64 (all threads) {e['matched']:.2f}x {e['best']}"]


def test_logs_one_per_host_and_the_doc_shows_each_hosts_latest(rng, tmp_path):
    a_old = _run(rng, date="2026-12-01T00:00:00Z", commit="1" * 40)
    a_new = _run(rng, date="2026-12-02T00:00:00Z", commit="2" * 40)
    a_quick = _run(rng, date="2026-12-03T00:00:00Z", commit="3" * 40, quick=True, rounds=3)
    b = _run(rng, slug="intel-xeon-emeraldrapids-avx512-amx", date="2026-11-30T00:00:00Z", commit="4" * 40,
             quick=True, rounds=3)
    for r in (a_old, a_new, a_quick, b):
        bench_doc.write_run(tmp_path, r)
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/*.json"))
    # the newer full run replaced the older; a quick run sits beside the host's full run
    assert files == ["amd-epyc-znver4-avx2/2026-12-02-222222222222.json",
                     "amd-epyc-znver4-avx2/2026-12-03-333333333333-quick.json",
                     "intel-xeon-emeraldrapids-avx512-amx/2026-11-30-444444444444-quick.json"]
    assert json.loads((tmp_path / files[0]).read_text()) == a_new
    doc = bench_doc.render_doc(tmp_path)
    assert "commit `222222222222`" in doc and "commit `333333333333`" not in doc   # full beats a later quick
    assert "commit `444444444444`, a `--quick` smoke test, not a measurement, on a loaded host" in doc
    e = _expected(a_new["rows"][0])
    assert f"softmax 64x64 (all threads) {e['matched']:.2f}x {e['best']}" in doc
    assert bench_doc.render_doc(tmp_path) == doc


def test_malformed_logs_get_a_clear_error(rng, tmp_path):
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "x.json").write_text("{not json")
    with pytest.raises(BenchLogError) as e:
        bench_doc.load_logs(tmp_path)
    assert e.value.code == "BENCH_LOG"
    run = _run(rng, slug="h")
    del run["rows"][0]["libraries"][bench_doc.FRESH]
    (tmp_path / "h" / "x.json").write_text(json.dumps(run))
    with pytest.raises(BenchLogError, match="fresh-output"):
        bench_doc.load_logs(tmp_path)
    run = _run(rng, slug="other")
    (tmp_path / "h" / "x.json").write_text(json.dumps(run))
    with pytest.raises(BenchLogError, match="folder"):
        bench_doc.load_logs(tmp_path)


def test_committed_cpu_logs_render_with_matched_ratios():
    logs = bench_doc.load_logs(bench_doc.LOG_DIR)
    assert logs, "no raw CPU log is committed under benchmarks/results/cpu/"
    for host, runs in logs.items():
        assert len(runs) <= 2, f"{host}: the repository keeps the latest run per host (and a later quick one)"
        for run in runs:
            for row in run["rows"]:
                s = bench_doc.row_stats(row)
                if s["best_peer"]:
                    med = {n: float(np.median(v["times_s"])) for n, v in row["libraries"].items()}
                    assert s["matched"] == pytest.approx(med[s["best_peer"]] / med[bench_doc.FRESH], rel=1e-12)


def test_bench_render_command_prints_the_doc_of_a_log_dir(rng, tmp_path, capsys):
    from tessera.tools import cli
    bench_doc.write_run(tmp_path, _run(rng))
    assert cli.main(["bench", "render", "--log-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == bench_doc.render_doc(tmp_path)


def test_models_section_renders_ratios_from_raw_timings(tmp_path):
    """The models table divides the fastest peer's median by Tessera's fresh-output median, from
    the logged rounds; a log without Tessera's timings is refused."""
    import json

    from tessera.errors import BenchLogError
    from tessera.tools import bench_models
    host = {"slug": "h", "cpu_model": "CPU", "llvm_cpu": "znver4", "isa": "AVX2", "usable_cpus": 2}
    libs = {"tessera": {"times_s": [0.010, 0.011, 0.009]}, "tessera (fresh outputs)": {"times_s": [0.02] * 3},
            "torch": {"times_s": [0.030, 0.031, 0.029]}, "jax.jit": {"times_s": [0.025] * 3}}
    run = {"schema": 1, "date": "2026-12-04T08:00:00", "commit": "abcdef123456", "quick": False, "host": host,
           "rows": [{"model": "gpt2_block", "size": "small", "sizes": {"seq": 8}, "first_call_s": 1.5,
                     "libraries": libs, "families_s": {"gemm": 0.015, "attention": 0.005}}]}
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "2026-12-04-abcdef123456.json").write_text(json.dumps(run))
    text = "\n".join(bench_models.section(tmp_path))
    assert "| gpt2_block | seq=8 | all | 20.00 | 10.00 |" in text and "1.25 (jax.jit)" in text and "gemm 75%" in text
    del run["rows"][0]["libraries"]["tessera (fresh outputs)"]
    (tmp_path / "h" / "2026-12-04-abcdef123456.json").write_text(json.dumps(run))
    with pytest.raises(BenchLogError):
        bench_models.section(tmp_path)
