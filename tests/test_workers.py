"""The CPU lane's spinning worker pool: fast wake-up, then sleep; serialised launches."""
from __future__ import annotations

import threading
import time

import numpy as np

import tessera as ts
from tessera.runtime import workers


def _state(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


_COUNT_IR = r"""
define void @count(ptr %words, i64 %tid) {
  %p = getelementptr i64, ptr %words, i64 %tid
  %old = atomicrmw add ptr %p, i64 1 monotonic
  ret void
}
"""


def _counter():
    """A native job like a kernel's ``.entry``: words[tid] += 1."""
    from tessera.codegen import jit
    from tessera.mma import x86 as X
    _, cpu, feats = X.resolve(None)
    oc = jit.emit(f'target triple = "{jit.host_triple()}"\n' + _COUNT_IR, cpu, X.llvm_feature_string(feats))
    loaded = jit.LoadedObject(oc.obj, ["count"])
    return loaded, loaded.addresses["count"]


def test_every_tid_runs_once_per_launch():
    p = workers.pool(1)
    loaded, count = _counter()
    for n in (1, 2):
        words = np.zeros(8, np.int64)
        for _ in range(50):
            p.run(count, words.ctypes.data, n)
        want = np.zeros(8, np.int64)
        want[:min(n, p.size + 1)] = 50
        assert words.tolist() == want.tolist()


def test_idle_workers_stop_spinning():
    p = workers.pool(1)
    loaded, count = _counter()
    words = np.zeros(8, np.int64)
    p.run(count, words.ctypes.data, 2)
    time.sleep(10 * workers.SPIN_SECONDS + 0.05)
    states = [_state(t.native_id) for t in p.threads]
    assert all(s == "S" for s in states), states     # blocked on the condition, not burning a core


def test_concurrent_callers_get_correct_results(rng, monkeypatch):
    # the worker takes its share of every launch (a short launch would not wake a sleeping one)
    monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: wanted)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 250)).astype(np.float32)
    f = ts.jit(lambda x, y: x @ y, schedule={"threads": 2})
    want = a.astype(np.float64) @ b
    errs = []

    def call():
        for _ in range(5):
            errs.append(float(np.abs(f(a, b) - want).max()))
    ts_ = [threading.Thread(target=call) for _ in range(3)]
    for t in ts_:
        t.start()
    for t in ts_:
        t.join()
    assert len(errs) == 15 and max(errs) < 1e-3
