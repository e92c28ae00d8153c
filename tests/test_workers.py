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


def test_every_tid_runs_once_per_launch():
    p = workers.pool(1)
    for n in (1, 2):
        seen = []
        lock = threading.Lock()

        def job(tid):
            with lock:
                seen.append(tid)
        p.run(job, n)
        assert sorted(seen) == list(range(min(n, p.size + 1)))


def test_idle_workers_stop_spinning():
    p = workers.pool(1)
    p.run(lambda tid: None, 2)
    time.sleep(10 * workers.SPIN_SECONDS + 0.05)
    states = [_state(t.native_id) for t in p.threads]
    assert all(s == "S" for s in states), states     # blocked on the condition, not burning a core


def test_concurrent_callers_get_correct_results(rng):
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
