"""A launch uses only the workers that can start now: never one the OS has parked (more
runnable threads than cores), and a sleeping one only for a launch long enough to pay its
wake-up (runtime/workers.py: ready; runtime/cpu.py: the launch)."""
from __future__ import annotations

import time

import numpy as np
import pytest

import tessera as ts
from tessera.runtime import workers

_GEMM = ts.jit(lambda x, y: x @ y)                       # 2^21 MACs and up: split across threads
_ROWS = ts.jit(lambda x: ts.ops.relu(x * 2.0 + 1.0))     # 2^15 elements and up: split across threads


def _asleep(p) -> bool:
    return bool(p.ctl[workers._ASLEEP])


def test_sleeping_worker_is_woken_only_for_long_launches():
    p = workers.pool(1)
    deadline = time.monotonic() + 5
    while not _asleep(p) and time.monotonic() < deadline:
        time.sleep(10 * workers.SPIN_SECONDS)
    assert _asleep(p)
    assert p.ready(1, wake=False) == 0
    assert p.ready(0, wake=True) == 0
    assert p.ready(1, wake=True) == 1   # a long launch takes it (run() wakes it)


@pytest.fixture
def two_threads():
    ts.set_num_threads(2)
    yield
    ts.set_num_threads(None)


def _oracle_checks(rng):
    a = rng.standard_normal((160, 96)).astype(np.float32)
    b = rng.standard_normal((96, 200)).astype(np.float32)
    x = rng.standard_normal((300, 129)).astype(np.float32)
    got_g, got_r = _GEMM(a, b), _ROWS(x)
    want_g = a.astype(np.float64) @ b.astype(np.float64)
    want_r = np.maximum(x.astype(np.float64) * 2 + 1, 0)
    return float(np.abs(got_g - want_g).max()), float(np.abs(got_r - want_r).max())


def test_parked_worker_is_not_waited_for(rng, monkeypatch, two_threads):
    """No worker ready: the caller runs every launch alone (the kernels see one thread) and
    never publishes a job a parked worker would have to pick up."""
    published = []
    monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: 0)
    monkeypatch.setattr(workers.WorkerPool, "run", lambda self, *a, **k: published.append(a))
    eg, er = _oracle_checks(rng)
    assert published == []
    assert eg < 1e-3 and er < 1e-5


def test_ready_worker_shares_the_launch(rng, monkeypatch, two_threads):
    """The teeth of the test above: with the worker ready the same calls do publish jobs, and
    a launch whose words still say two threads while only the caller runs would be caught by
    the count of jobs."""
    real_run = workers.WorkerPool.run
    published = []

    def run(self, entry, args, nthreads, call=None):
        published.append(nthreads)
        return real_run(self, entry, args, nthreads, call)
    monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: wanted)
    monkeypatch.setattr(workers.WorkerPool, "run", run)
    eg, er = _oracle_checks(rng)
    assert published == [2, 2]
    assert eg < 1e-3 and er < 1e-5


# --------------------------------------------------------------------------- the thread split
def _split(kernel, outs, ins, dims=(), env=None, max_threads=2):
    import types

    from tessera.runtime import cpu
    spec = lambda d: cpu.TensorSpec(tuple(d), "<f4")   # noqa: E731
    step = cpu.Step(kernel, [], [], [spec(o) for o in outs], list(dims), 0, 0, 0, "b*m", in_types=tuple(
        spec(i) for i in ins))
    env = env or {}
    sizes = [cpu._eval(d, env) for d in step.dims]
    fake = types.SimpleNamespace(max_threads=max_threads)
    return (cpu.CpuExecutable.threads_for(fake, step, env, sizes),
            cpu.CpuExecutable.worth_waking(step, env, sizes), step)


def test_an_implicit_gemm_conv_is_split_by_its_multiply_adds():
    """The conv block (small): 4 x 28 x 28 x 64 outputs of 576 multiply-adds each (115 M) over a
    dynamic batch.  Counting the output times the last size (the batch) gave 0.8 M: one thread
    while a second core sat idle (bench models: 16 ms on two threads, 7.4 on one)."""
    conv = dict(outs=[("n", 28, 28, 64)], ins=[("n", 30, 30, 64), (3, 3, 64, 64), (64,)], dims=["n"], env={"n": 4})
    assert _split("k2_gemm", **conv)[:2] == (2, True)
    tiny = dict(outs=[(16, 16)], ins=[(16, 8), (8, 16)])
    assert _split("k0_gemm", **tiny)[:2] == (1, False)
    # teeth: a step without its arguments' specs (as unpickled from an older cache) falls back
    # to the old count, which keeps the conv on one thread
    conv["ins"] = []
    assert _split("k2_gemm", **conv)[0] == 1


def test_decode_attention_is_split_by_its_kv_cache():
    """One query row per head against 32k keys: 4096 output elements, 33 M cache elements."""
    outs, ins = [(1, 32, 1, 128)], [(1, 32, 1, 128), (1, 8, 32768, 128), (1, 8, 32768, 128)]
    assert _split("k0_attention_decode", outs, ins)[:2] == (2, True)
    assert _split("k0_rowwise", outs, ins)[:2] == (1, False)   # a row kernel counts its output


def test_flash_attention_is_split_by_its_multiply_adds():
    """16 heads x 1024 queries x 1024 keys x 64: 2^20 elements in its largest tensor but 2^31
    multiply-adds.  Counted as elements it never woke a sleeping worker, so bench cpu's
    attention 16x1024x64 ran on one core (43.7 ms, 0.61x torch.compile; 21.7 ms on two)."""
    qkv = [(1, 16, "s", 64)] * 3
    assert _split("k0_attention", [(1, 16, "s", 64)], qkv, env={"s": 1024})[:2] == (2, True)
    assert _split("k2_attention_bwd", [(1, 16, "s", 64)] * 3, qkv + [(1, 16, "s")], env={"s": 1024})[:2] == (2, True)
    # a short one still stays on the threads already spinning, and a tiny one on the caller
    assert _split("k0_attention", [(1, 4, 128, 64)], [(1, 4, 128, 64)] * 3)[:2] == (2, False)
    assert _split("k0_attention", [(1, 1, 8, 16)], [(1, 1, 8, 16)] * 3)[:2] == (1, False)
    # teeth: counting the largest tensor (the old rule) leaves 16 x 1024 x 64 asleep
    assert _split("k0_scatter", [(1, 16, "s", 64)], qkv, env={"s": 1024})[1] is False
