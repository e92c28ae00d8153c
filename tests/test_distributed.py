"""Data-parallel training on torch.distributed around Tessera ops (issue 29, scale-out).

``examples/ddp_train.py`` launched with ``python -m torch.distributed.run --standalone
--nproc-per-node 2`` (gloo on the CPU, a free localhost port chosen by the launcher): a
``DistributedDataParallel`` model whose three blocks are ``tessera.torch.op``s (forward kernels
and ``tessera.vjp`` backward programs), each rank on its half of one global batch.  After a few
SGD steps both ranks hold the same parameters, equal (within ``TOL``) to one process training
on the whole batch, and those match the same model in float64 torch ops (the oracle).  Teeth: the
same launch without DDP (no gradient all-reduce) drifts away from the single-process result by
orders of magnitude more than ``TOL``.  Under ``-m slow``: the same with FSDP2 (``fully_shard``),
parameters sharded over the two ranks.  About 30 s in the default run (each launch ~10 s: two
interpreters importing torch and Tessera, then compiling the blocks' programs).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ddp_train.py"
_spec = importlib.util.spec_from_file_location("ddp_train_example", EXAMPLE)
ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex)     # registers tessera_ddp::dense_gelu, ::norm, ::dense

STEPS, BATCH, DIMS = 4, 32, (16, 32, 4)
# max |parameter difference| allowed between two runs of the same float32 training (measured
# here: ~1e-7 between 2-rank DDP and one process, ~2e-7 against the float64 oracle)
TOL = 2e-5


def _launch(out: Path, seed: int, *extra: str) -> list[dict]:
    """The example on two processes through torch's own launcher; each rank's npz."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
           "--steps", str(STEPS), "--seed", str(seed), "--batch", str(BATCH), "--dims", ",".join(map(str, DIMS)),
           "--out", str(out), *extra]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"torch.distributed.run failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    ranks = [dict(np.load(out / f"rank{i}.npz")) for i in range(2)]
    for rk in ranks:
        assert int(rk["world"]) == 2
        # the blocks really ran as Tessera kernels on the CPU lane, forward and backward, on each rank
        assert set(rk["lanes"]) >= {f"{f}@cpu-x86" for f in ("dense_gelu", "norm", "dense", "dense_gelu_vjp",
                                                              "norm_vjp", "dense_vjp")}, rk["lanes"]
    return ranks


def _max_diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)))) for k in ex.PARAMS)


@pytest.fixture(scope="module")
def seed():
    return int(np.random.default_rng([int(os.environ["TESSERA_TEST_SEED"]), 29]).integers(1 << 30))


@pytest.fixture(scope="module")
def single(seed):
    """One process on the whole batch (Tessera ops, float32) and the float64 torch oracle."""
    x, y = ex.batch(seed, BATCH, DIMS[0], DIMS[2])
    model = ex.TesseraMLP(ex.init_params(*DIMS, seed=seed))
    losses = ex.train(model, x, y, STEPS)
    oracle = ex.TorchMLP(ex.init_params(*DIMS, seed=seed, dtype=torch.float64))
    oracle_losses = ex.train(oracle, x.double(), y.double(), STEPS)
    init = {k: v.numpy() for k, v in ex.init_params(*DIMS, seed=seed).items()}
    return {"params": ex.params_of(model), "losses": losses, "oracle": ex.params_of(oracle),
            "oracle_losses": oracle_losses, "init": init}


def test_single_process_matches_float64_oracle(single):
    assert _max_diff(single["params"], single["oracle"]) <= TOL
    assert np.allclose(single["losses"], single["oracle_losses"], rtol=1e-5, atol=1e-6)
    assert _max_diff(single["params"], single["init"]) > 1000 * TOL      # the steps moved the parameters


def test_ddp_two_processes_match_one_process_on_the_combined_batch(tmp_path, seed, single):
    ranks = _launch(tmp_path, seed)
    # DDP: every rank applies the same all-reduced gradient, so the ranks agree bit for bit
    assert _max_diff(ranks[0], ranks[1]) == 0.0
    for rk in ranks:
        assert _max_diff(rk, single["params"]) <= TOL
        assert _max_diff(rk, single["oracle"]) <= TOL
    # the first step's loss is each rank's mean over its half: their average is the whole batch's
    assert np.isclose((ranks[0]["losses"][0] + ranks[1]["losses"][0]) / 2, single["oracle_losses"][0], rtol=1e-5)


def test_planted_missing_allreduce_diverges(tmp_path, seed, single):
    """Teeth: without DDP (no gradient all-reduce) each rank fits its own half; the check above fails."""
    ranks = _launch(tmp_path, seed, "--no-ddp")
    assert _max_diff(ranks[0], ranks[1]) > 100 * TOL
    for rk in ranks:
        assert _max_diff(rk, single["params"]) > 100 * TOL


@pytest.mark.slow
def test_fsdp_two_processes_match_one_process_on_the_combined_batch(tmp_path, seed, single):
    """FSDP2 (``fully_shard``): parameters sharded over the ranks, all-gathered around the Tessera ops."""
    ranks = _launch(tmp_path, seed, "--fsdp")
    for rk in ranks:
        assert _max_diff(rk, single["params"]) <= TOL
        assert _max_diff(rk, single["oracle"]) <= TOL


def test_reading_a_tensor_leaves_its_storage_resizable():
    """FSDP frees an unsharded parameter with ``storage.resize_(0)`` after the backward: Tessera's read
    of a tensor (the fast path) must not mark its storage not resizable as ``tensor.numpy()`` does."""
    import tessera as ts
    x = torch.randn(6, 5)
    w = torch.randn(5, 3)
    y = ts.jit(lambda x, w: x @ w)(x, w)
    assert np.allclose(y.numpy(), x.double().numpy() @ w.double().numpy(), rtol=1e-5, atol=1e-5)
    for t in (x, w):
        assert t.untyped_storage().resizable()
        t.untyped_storage().resize_(0)     # what FSDP does; raised "not resizable" before
