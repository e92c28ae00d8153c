"""A process that forks after using Tessera works in the child; the thread count follows the
documented setting (TESSERA_NUM_THREADS / tessera.set_num_threads)."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import warnings

import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera import host
from tessera.runtime import workers

TOL32 = 1e-5
CHILD_TIMEOUT = 60.0


def _softmax_2(x):
    return ts.ops.softmax(x) * 2.0


# two threads pinned, and rows enough (work >= 2^15 elements) that both are used: the pool runs
_JF = ts.jit(_softmax_2, schedule={"threads": 2})


def _child_ok(seed: int) -> bool:
    x = np.random.default_rng(seed).standard_normal((256, 300)).astype(np.float32)
    return O.gate(_JF(x), O.softmax(x) * 2.0, TOL32)


def _fork_and_wait(body, timeout: float = CHILD_TIMEOUT) -> int | None:
    """Run body() in an os.fork()ed child: its exit status (0: body returned True), or None if
    it was still running after ``timeout`` seconds (it is killed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # 3.12+: fork() of a multi-threaded process
        pid = os.fork()
    if pid == 0:   # the child: never return into pytest
        code = 3
        try:
            code = 0 if body() else 1
        except BaseException:   # noqa: BLE001 - reported through the exit status
            import traceback
            traceback.print_exc()
            code = 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def _uses_the_pool(rng) -> None:
    """Compile and run in this process with two threads, so the worker pool exists."""
    x = rng.standard_normal((256, 300)).astype(np.float32)
    O.assert_close(_JF(x), O.softmax(x) * 2.0, TOL32)
    assert workers._pool is not None and workers._pool.size >= 1


def test_a_forked_child_runs_a_function_compiled_in_the_parent(rng):
    _uses_the_pool(rng)
    assert _fork_and_wait(lambda: _child_ok(int(rng.integers(1 << 30)))) == 0
    assert _child_ok(int(rng.integers(1 << 30)))   # and the parent still runs


def test_a_forked_child_compiles_and_runs_new_code(rng):
    _uses_the_pool(rng)

    def body():
        x = rng.standard_normal((300, 257)).astype(np.float32)
        g = ts.jit(lambda v: ts.ops.layer_norm(v) + 1.0, schedule={"threads": 2})
        return O.gate(g(x), O.layer_norm(x) + 1.0, TOL32)
    assert _fork_and_wait(body) == 0


def _executables(jf) -> list:
    return [v.compiled.executable for vs in jf._variants.values() for v in vs if v.compiled is not None]


def _held_locks() -> list:
    """Every lock Tessera keeps across calls that a call or a compile takes: the executables' run
    locks, the pool's launch lock and its table's, the function's variant lock, the buffer pool's,
    the compile cache's and LLVM's."""
    from tessera.codegen import jit as cj
    from tessera.frontend import compile as compile_mod
    from tessera.runtime import memory
    return ([e._run_lock for e in _executables(_JF)] + [workers._pool.lock, workers._pool_lock, _JF._lock,
            memory.POOL.lock, compile_mod._MEMORY_LOCK, cj._lock])


def _child_calls_and_compiles() -> bool:
    x = np.random.default_rng(11).standard_normal((200, 129)).astype(np.float32)
    g = ts.jit(lambda v: ts.ops.rms_norm(v) * 3.0)
    return _child_ok(7) and O.gate(g(x), O.rms_norm(x) * 3.0, TOL32)


def _fork_with_locks_held(rng, timeout: float = CHILD_TIMEOUT) -> int | None:
    """Another thread of the parent holds every lock (as it may during a call or a compile) at
    the moment of the fork; the child calls a compiled function and compiles a new one."""
    import threading
    _uses_the_pool(rng)
    locks = _held_locks()
    assert len(locks) >= 7
    held, release = threading.Event(), threading.Event()

    def holder():
        for lk in locks:
            lk.acquire()
        held.set()
        release.wait()
        for lk in reversed(locks):
            lk.release()
    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        return _fork_and_wait(_child_calls_and_compiles, timeout)
    finally:
        release.set()
        t.join()


def test_fork_while_another_thread_is_inside_a_call(rng):
    """The child's copies of locks held by a thread it does not have must not be waited for."""
    assert _fork_with_locks_held(rng) == 0
    assert _child_ok(8)


@pytest.mark.parametrize("hook", ["workers", "forksafe"])
def test_teeth_without_the_at_fork_reset_the_child_hangs(rng, monkeypatch, hook):
    """Planted: one of the two after-fork hooks (runtime/workers.py: the pool; tessera/forksafe.py:
    every registered lock) does nothing; the child waits forever (killed after 5 s)."""
    from tessera import forksafe
    monkeypatch.setattr({"workers": workers, "forksafe": forksafe}[hook], "_after_fork_in_child", lambda: None)
    if hook == "workers":
        # a launch that waits for the parent's workers (one that would wake them): the child's
        # copy of the pool, if kept, has none to come
        monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: wanted)
        _uses_the_pool(rng)
        assert _fork_and_wait(lambda: _child_ok(9), 5.0) is None
    assert _fork_with_locks_held(rng, 5.0) is None


def _pool_task(seed: int) -> bool:
    return _child_ok(seed)


def test_multiprocessing_fork_pool_workers(rng):
    """A data-loader-like pool of forked worker processes, each running the parent's function."""
    _uses_the_pool(rng)
    seeds = [int(s) for s in rng.integers(1 << 30, size=4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with mp.get_context("fork").Pool(2) as p:
            res = p.map_async(_pool_task, seeds)
            assert res.get(timeout=CHILD_TIMEOUT) == [True] * 4


# --------------------------------------------------------------------------- the thread setting
needs_two = pytest.mark.skipif(host.usable_cpus() < 2, reason="one usable CPU")


@pytest.fixture
def launches(monkeypatch):
    """The thread count of every CPU kernel launch from here on (1: run on the caller alone,
    no worker woken): the pool's run is wrapped, and still runs."""
    from tessera.runtime import cpu
    seen: list[int] = []
    orig_run = workers.WorkerPool.run

    def run(self, entry, args, nthreads, call=None):
        seen.append(nthreads)
        return orig_run(self, entry, args, nthreads, call)
    monkeypatch.setattr(workers.WorkerPool, "run", run)
    # every planned worker counts as ready (on a busy machine one may be off its core, and a
    # launch then runs without it: test_worker_presence.py); these tests are about the setting
    monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: wanted)
    orig_exec = cpu.CpuExecutable._execute

    def execute(self, plan, arrays):
        n = len(seen)
        out = orig_exec(self, plan, arrays)
        seen.extend([1] * sum(1 for ps in plan.steps if ps.nthreads == 1 and not ps.skip))
        assert len(seen) - n == sum(1 for ps in plan.steps if not ps.skip)
        return out
    monkeypatch.setattr(cpu.CpuExecutable, "_execute", execute)
    yield seen


@pytest.fixture(autouse=True)
def _setting_restored(monkeypatch):
    """Each test starts and ends with no TESSERA_NUM_THREADS and no set_num_threads cap."""
    monkeypatch.delenv("TESSERA_NUM_THREADS", raising=False)
    ts.set_num_threads(None)
    yield
    monkeypatch.undo()
    ts.set_num_threads(None)


def _call(rng, jf=None):
    x = rng.standard_normal((256, 300)).astype(np.float32)
    O.assert_close((jf or _JF)(x), O.softmax(x) * 2.0, TOL32)


def check_a_setting_change_reaches_a_kept_plan(rng, launches, jf) -> None:
    """jf (pinned to two threads) runs on two, then, after set_num_threads(1), the same
    signature (its launch plan kept by the frontend) runs on one."""
    ts.set_num_threads(None)
    _call(rng, jf)
    assert launches[-1] == 2                     # pinned 2, uncapped: the pool runs
    ts.set_num_threads(1)
    _call(rng, jf)
    assert ts.get_num_threads() == 1 and launches[-1] == 1


@needs_two
def test_set_num_threads_caps_every_call(rng, launches):
    assert ts.get_num_threads() is None
    check_a_setting_change_reaches_a_kept_plan(rng, launches, _JF)
    unpinned = ts.jit(_softmax_2)                # the default (every usable CPU) is capped too
    _call(rng, unpinned)
    assert launches[-1] == 1
    ts.set_num_threads(None)
    _call(rng)
    _call(rng, unpinned)
    assert launches[-2:] == [2, 2]


@needs_two
def test_the_environment_variable_sets_the_cap(rng, launches, monkeypatch):
    """TESSERA_NUM_THREADS, re-read by set_num_threads(None); set_num_threads overrides it."""
    monkeypatch.setenv("TESSERA_NUM_THREADS", "1")
    ts.set_num_threads(None)                     # back to the environment: read again
    assert ts.get_num_threads() == 1
    _call(rng)
    assert launches[-1] == 1
    ts.set_num_threads(2)                        # the call overrides the variable
    _call(rng)
    assert launches[-1] == 2


@needs_two
def test_the_environment_variable_at_process_start():
    """A fresh process started with TESSERA_NUM_THREADS=1 runs a call pinned to two threads on one."""
    import subprocess
    import sys
    code = ("import numpy as np, tessera as ts\n"
            "from tessera.runtime import workers\n"
            "f = ts.jit(lambda x: ts.ops.softmax(x) * 2.0, schedule={'threads': 2})\n"
            "x = np.random.default_rng(1).standard_normal((256, 300)).astype(np.float32)\n"
            "y = f(x)\n"
            "e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))\n"
            "err = np.abs(y - 2 * e / e.sum(-1, keepdims=True)).max()\n"
            "print(ts.get_num_threads(), workers._pool is None, err < 1e-6)\n")
    env = {**os.environ, "TESSERA_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True", "True"], out.stdout   # no worker pool was ever started


def test_the_threads_setting_is_checked(monkeypatch):
    """Bad values are refused with BAD_ARGUMENT, the variable's naming it."""
    from tessera.errors import ArgumentError
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ArgumentError) as e:
            ts.set_num_threads(bad)
        assert e.value.code == "BAD_ARGUMENT"
    for text in ("0", "two", "-3"):
        monkeypatch.setenv("TESSERA_NUM_THREADS", text)
        ts.set_num_threads(None)
        with pytest.raises(ArgumentError, match="TESSERA_NUM_THREADS"):
            ts.get_num_threads()
    monkeypatch.setenv("TESSERA_NUM_THREADS", " 3 ")
    ts.set_num_threads(None)
    assert ts.get_num_threads() == 3
    monkeypatch.delenv("TESSERA_NUM_THREADS")
    ts.set_num_threads(None)
    assert ts.get_num_threads() is None
    ts.set_num_threads(5)
    assert ts.get_num_threads() == 5


@needs_two
def test_teeth_a_plan_kept_across_a_setting_change_is_caught(rng, launches, monkeypatch):
    """Planted: the plan's thread-setting stamp never moves, so a plan made before
    set_num_threads(1) keeps its two threads."""
    from tessera.runtime import threads
    monkeypatch.setattr(threads, "version", lambda: 0)
    with pytest.raises(AssertionError):
        check_a_setting_change_reaches_a_kept_plan(rng, launches, ts.jit(_softmax_2, schedule={"threads": 2}))
    assert launches[-1] == 2      # the stale plan ran on two threads


def test_a_thread_cap_below_the_schedule_is_reported(rng):
    """TESSERA_NUM_THREADS / set_num_threads below a kernel's (pinned) threads: the lane report
    says so, naming the kernel; with no cap it says nothing."""
    x = rng.standard_normal((64, 64)).astype(np.float32)
    f = ts.jit(lambda a: a @ a, schedule={"threads": 2})
    assert not ts.explain(f, x).notes
    ts.set_num_threads(1)
    try:
        rep = ts.explain(f, x)
        assert rep.notes and "at most 1 threads" in rep.notes[0] and "_gemm (2)" in rep.notes[0], rep.notes
        assert "note      calls run at most 1" in str(rep)
        O.assert_close(f(x), O.f64(x) @ O.f64(x), 1e-6)
    finally:
        ts.set_num_threads(None)
