"""``tessera bench train``: its float64 oracle (finite differences), the check that refuses a wrong
implementation before anything is timed (planted wrong peers and a planted wrong Tessera), the
figures rendered from a raw log, and (slow) a ``--quick`` run end to end."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tessera.errors import BenchLogError, BenchMismatchError
from tessera.tools import bench_cpu, bench_train
from tessera.tools import train_workloads as W


def _tiny_step(rng):
    return W.make_step(rng, batch=1, seq=6, dim=8, heads=2)


def test_oracle_gradients_match_finite_differences(rng):
    """The hand-written float64 backward of the block against central differences of its loss."""
    w = _tiny_step(rng)
    params = [p.astype(np.float64) for p in w["params"]]
    loss, grads = W.block_loss_and_grads64(w["x"], w["y"], params, w["heads"])
    assert loss == pytest.approx(w["loss64"], rel=1e-6)
    h = 1e-6
    for i, p in enumerate(params):
        d = rng.standard_normal(p.shape)
        plus = [q + h * d if j == i else q for j, q in enumerate(params)]
        minus = [q - h * d if j == i else q for j, q in enumerate(params)]
        fd = (W.block_loss_and_grads64(w["x"], w["y"], plus, 2)[0]
              - W.block_loss_and_grads64(w["x"], w["y"], minus, 2)[0]) / (2 * h)
        assert fd == pytest.approx(float((grads[i] * d).sum()), rel=1e-5, abs=1e-10), W.NAMES[i]


def test_attention_oracle_matches_finite_differences(rng):
    for causal in (False, True):
        w = W.make_attn(rng, 1, 2, 5, 4, causal)
        dq, dk, dv = W.oracle(w)
        q, k, v, do = (w[n].astype(np.float64) for n in ("q", "k", "v", "do"))
        for i, g in enumerate((dq, dk, dv)):
            d = rng.standard_normal(q.shape)
            args = [q, k, v]

            def f(s):
                a = list(args)
                a[i] = a[i] + s * d
                return float((W._attn_fwd(*a, causal)[0] * do).sum())
            assert (f(1e-6) - f(-1e-6)) / 2e-6 == pytest.approx(float((g * d).sum()), rel=1e-5)


def _plant_adamw_without_bias_correction(w):
    a = W.ADAMW
    out = [W.adamw64(p, g, m, v, 1.0, a["lr"], a["b1"], a["b2"], a["eps"], a["wd"])   # t = 1: no correction
           for p, g, m, v in zip(w["params"], w["grads64"], w["m"], w["v"])]
    want = W.oracle(w)
    n = len(W.NAMES)
    return [want[0]] + [o[0] for o in out] + want[1 + n:]


def test_check_accepts_the_oracle_in_float32_and_refuses_planted_bugs(rng):
    w = _tiny_step(rng)
    want = W.oracle(w)
    f32 = [np.asarray(np.asarray(x, np.float32), np.float64) for x in want]
    assert max(bench_train.check("f32", f32, want, w).values()) < 0.1
    n, b1 = len(W.NAMES), W.ADAMW["b1"]
    plants = {}
    g = [x.copy() for x in want]                      # one gradient 1 % too large (seen through m')
    g[1 + n + 2] = b1 * w["m"][2] + (1 - b1) * 1.01 * w["grads64"][2]
    plants["grad"] = g
    plants["param_lr"] = _plant_adamw_without_bias_correction(w)
    lo = [x.copy() for x in want]
    lo[0] = want[0] * 1.001
    plants["loss"] = lo
    for measure, got in plants.items():
        with pytest.raises(BenchMismatchError) as e:
            bench_train.check("planted", got, want, w)
        assert e.value.code == "BENCH_MISMATCH" and measure in str(e.value)
    a = W.make_attn(rng, 1, 2, 7, 4, True)
    want = W.oracle(a)
    bench_train.check("f32", [x.astype(np.float32).astype(np.float64) for x in want], want, a)
    with pytest.raises(BenchMismatchError):                # the non-causal gradient for a causal workload
        bench_train.check("planted", W.oracle(dict(a, causal=False)), want, a)
    with pytest.raises(BenchMismatchError, match="finite"):
        bench_train.check("planted", [x * np.nan for x in want], want, a)


def _no_timing(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("timed before the check")
    monkeypatch.setattr(bench_cpu, "_interleaved", refuse)


def test_planted_wrong_peer_is_refused_before_timing(rng, monkeypatch):
    """A peer computing non-causal attention for a causal workload is refused, nothing timed."""
    pytest.importorskip("jax")
    w = W.make_attn(rng, 1, 2, 16, 8, True)
    real = W.build

    def planted(impl, wl):
        return real(impl, dict(wl, causal=False) if impl == "jax.jit" else wl)
    monkeypatch.setattr(W, "build", planted)
    _no_timing(monkeypatch)
    with pytest.raises(BenchMismatchError, match="jax.jit"):
        bench_train.measure_row("attn", w, {}, 1.0, ["jax.jit"], 1)


def test_planted_wrong_tessera_is_refused_before_timing(rng, monkeypatch):
    """Tessera's attention gradient with the causal mask dropped is refused, nothing timed."""
    w = W.make_attn(rng, 1, 2, 16, 8, True)
    monkeypatch.setattr(W, "_TS_ATTN", {True: W._ts_attn(False)})
    _no_timing(monkeypatch)
    with pytest.raises(BenchMismatchError, match="tessera"):
        bench_train.measure_row("attn", w, {}, 1.0, [], 1)


def _synthetic_run(slug="h") -> dict:
    libs = {bench_train.FRESH: {"times_s": [0.020, 0.022, 0.018]}, bench_train.POOLED: {"times_s": [0.019] * 3},
            "torch": {"times_s": [0.030, 0.031, 0.029]}, "jax.jit": {"times_s": [0.025, 0.026, 0.024]}}
    row = {"workload": "gpt2 block step 1x64x64", "kind": "step", "sizes": {}, "gflop": 2.0, "threads": "all",
           "rounds": 3, "libraries": libs, "first_call_s": {}, "families_s": {"gemm": 0.012, "row": 0.004},
           "check": {"tessera": {"loss": 1e-7, "grad": 2e-5}, "torch": {"loss": 0.0}, "jax.jit": {"loss": 0.0}},
           "peak_bytes": {"tessera": 30 * 2 ** 20, "torch": 40 * 2 ** 20, "jax.jit": 35 * 2 ** 20}}
    host = {"slug": slug, "cpu_model": "CPU", "llvm_cpu": "znver4", "isa": "AVX2", "usable_cpus": 2}
    return {"schema": bench_train.SCHEMA, "date": "2026-12-04T08:00:00Z", "commit": "abcdef1234567890",
            "quick": False, "host": host, "rows": [row]}


def test_train_section_renders_figures_from_raw_timings(tmp_path):
    run = _synthetic_run()
    path = bench_train.write_run(run, tmp_path)
    assert path.name == "2026-12-04-abcdef123456.json" and json.loads(path.read_text()) == run
    text = "\n".join(bench_train.section(tmp_path))
    libs = run["rows"][0]["libraries"]
    med = {k: float(np.median(np.asarray(v["times_s"], np.float64))) for k, v in libs.items()}
    ratio = min(med["torch"], med["jax.jit"]) / med[bench_train.FRESH]
    line = next(ln for ln in text.splitlines() if ln.startswith("| gpt2 block step"))
    assert f"**{ratio:.2f}** (jax.jit)" in line and "1.0x met" in line
    assert f"| {2.0 / med[bench_train.FRESH]:.0f} |" in line                          # GFLOP/s
    assert "gemm 12.0 (75%), row 4.0 (25%)" in line and "30 / 40 / 35 (0.75x torch)" in line
    assert "| 2.0e-05 |" in line
    assert "| 19.0 | -- |" in line   # no donated timing in this log


def test_donated_step_is_timed_checked_and_rendered(tmp_path):
    run = _synthetic_run()
    row = run["rows"][0]
    row["libraries"][bench_train.DONATED] = {"times_s": [0.015, 0.016, 0.014]}
    row["check"][bench_train.DONATED] = {"loss": 1e-7}
    row["peak_bytes"][bench_train.DONATED] = 12 * 2 ** 20
    bench_train.write_run(run, tmp_path)
    line = next(ln for ln in "\n".join(bench_train.section(tmp_path)).splitlines() if ln.startswith("| gpt2 block"))
    assert "| 19.0 | 15.0, 12 |" in line
    del row["check"][bench_train.DONATED]   # a timing of an unchecked implementation is refused
    with pytest.raises(BenchLogError, match="unchecked"):
        bench_train.write_run(run, tmp_path / "other")


def test_donated_workload_updates_its_own_copies_in_place(rng):
    w = W.make_step(rng, batch=1, seq=8, dim=16, heads=2)
    before = [a.copy() for a in (*w["params"], *w["m"], *w["v"])]
    call, outputs = W.build(bench_train.DONATED, w)
    plain, _ = W.build("tessera", w)
    first = outputs(call())
    want = outputs(plain())
    for a, b in zip(first, want):
        np.testing.assert_array_equal(a, b)
    out = call()   # the second step reads the first's results and writes into their buffers
    addr = [o.ctypes.data for o in out[1:]]
    out = call()
    assert [o.ctypes.data for o in out[1:]] == addr
    for a, b in zip((*w["params"], *w["m"], *w["v"]), before):   # the workload's arrays are intact
        np.testing.assert_array_equal(a, b)


def test_train_logs_without_timings_or_check_are_refused(tmp_path):
    run = _synthetic_run()
    del run["rows"][0]["libraries"][bench_train.FRESH]
    with pytest.raises(BenchLogError, match="timings"):
        bench_train.write_run(run, tmp_path)
    run = _synthetic_run()
    del run["rows"][0]["check"]["torch"]
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "x.json").write_text(json.dumps(run))
    with pytest.raises(BenchLogError, match="unchecked"):
        bench_train.section(tmp_path)


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path, capsys):
    """``tessera bench train --quick --write --log-dir DIR``: every row checked, timed, profiled and
    measured for memory, kept as a log that renders."""
    from tessera.tools import cli
    assert cli.main(["bench", "train", "--quick", "--write", "--log-dir", str(tmp_path)]) == 0
    logs = sorted(tmp_path.glob("*/*-quick.json"))
    assert len(logs) == 1
    run = json.loads(logs[0].read_text())
    assert [r["workload"] for r in run["rows"]] == [wl[0] for wl in bench_train.workloads(True, oracle=False)]
    for r in run["rows"]:
        assert set(r["libraries"]) >= {bench_train.FRESH, bench_train.POOLED}
        # measured, not assumed: at --quick sizes an attention gradient (no S x S buffer) may grow the
        # resident set by less than a page the child had not touched, so 0 is a valid measurement
        assert r["families_s"] and r["peak_bytes"]["tessera"] >= 0
        assert "step" not in r["workload"] or r["peak_bytes"]["tessera"] > 0
        assert max(r["check"]["tessera"].values()) < 1
        assert not math.isnan(bench_train.row_figures(r)["gflops"])
    assert "gpt2 block step" in "\n".join(bench_train.section(tmp_path))


@pytest.mark.slow
def test_planted_wrong_tessera_step_is_refused_before_timing(rng, monkeypatch):
    """Tessera's training step with the loss summed instead of averaged (a wrong loss and gradient
    scale, the kind of bug AdamW's sign-like first steps would hide) is refused, nothing timed."""
    import tessera as ts
    w = W.make_step(rng, batch=1, seq=8, dim=16, heads=2)

    def summed(x, y, *params, n_head):
        return ts.ops.reduce_sum(ts.ops.square(W._ts_block(x, params, n_head) - y))
    monkeypatch.setattr(W, "_ts_loss", summed)
    monkeypatch.setattr(W, "_TS_STEP", {})
    _no_timing(monkeypatch)
    with pytest.raises(BenchMismatchError, match="tessera.*(loss|grad)"):
        bench_train.measure_row("step", w, {}, 1.0, [], 1)
