"""Compile tuning candidates in worker processes, so a candidate that crashes the compiler or hangs
is recorded as failed and never takes the tuner down, and two cores compile two at once.

A worker is a fresh interpreter (``subprocess``, as ``codegen.jit.emit_guarded`` runs a guarded
LLVM compile), never a ``fork()`` of the caller: by the time a program tunes, JAX, torch or
Tessera's own worker pool have threads, and a child forked while one of them held a lock (the
allocator's, the import lock, a logging handler's) hangs on its first use of it.  A fresh process
has no such locks, inherits the environment at its start (the cache dir, ``TESSERA_*``), and
re-runs no user code (``multiprocessing``'s ``spawn`` / ``forkserver`` re-import the main script).

The first candidate (the cost model's choice) compiles here, warming the compiler; each other
candidate gets its own worker (at most ``jobs`` at a time), which calls ``Worker.function`` (a
module-level function named by module and name, so no closure crosses the process boundary) with
the worker's JSON arguments and the candidate's pins: it compiles through the normal path, so the
object code lands in the disk cache, and prints one JSON line.  The parent then compiles the
candidates that succeeded itself: a disk-cache hit, no LLVM.  A worker that dies (a signal, an
abort) or outlives ``timeout_s`` is killed and its candidate recorded as failed with the reason.
With one job, ``TESSERA_TUNE_JOBS=1``, or no ``Worker``, candidates compile in this process one
after another.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from tessera import host
from tessera.errors import TesseraError

TIMEOUT_S = 120.0

_CHILD = """
import importlib, json, sys
spec = json.loads(sys.stdin.read())
sys.path[:0] = [p for p in spec["path"] if p not in sys.path]
from tessera.errors import TesseraError
try:
    fn = getattr(importlib.import_module(spec["module"]), spec["function"])
    pins = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["pins"].items()}
    fn(*spec["args"], pins)
    status = {"ok": True}
except TesseraError as e:
    status = {"ok": False, "why": f"{e.code}: {e.message}"[:500]}
except BaseException as e:   # anything the compiler raised: this candidate failed
    status = {"ok": False, "why": f"{type(e).__name__}: {e}"[:500]}
sys.stdout.write("\\n" + json.dumps(status) + "\\n")
sys.stdout.flush()
"""


@dataclass(frozen=True)
class Worker:
    """What a worker process calls: ``module.function(*args, pins)`` (args JSON-serialisable)."""
    module: str
    function: str
    args: tuple = ()


def jobs() -> int:
    env = os.environ.get("TESSERA_TUNE_JOBS")
    return max(1, int(env)) if env else max(1, min(2, host.usable_cpus()))


def _pins_json(pins: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in pins.items()}


def _start(worker: Worker, pins: dict) -> subprocess.Popen:
    out = tempfile.TemporaryFile("w+")   # a file, not a pipe: a chatty compiler never blocks on a full pipe
    p = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=out,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    p.report = out
    spec = {"module": worker.module, "function": worker.function, "args": list(worker.args),
            "pins": _pins_json(pins), "path": [p for p in sys.path if p]}
    try:
        p.stdin.write(json.dumps(spec))
        p.stdin.close()
    except OSError:   # it died already: its exit status says why
        pass
    return p


def compile_all(compile_one, cands: list[dict], *, worker: Worker | None = None, njobs: int | None = None,
                timeout_s: float | None = None) -> list[tuple[dict, object, str]]:
    """(pins, compiled or None, why it failed) per candidate, in order; ``compile_one(pins)``
    compiles one candidate here (raising ``TesseraError`` when it cannot), ``worker`` the same in
    a worker process."""
    njobs = jobs() if njobs is None else njobs
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    if njobs <= 1 or worker is None or len(cands) < 2:
        return [_here(compile_one, p) for p in cands]
    # the first (the cost model's own schedule) compiles here: it warms what later compiles here reuse
    first = _here(compile_one, cands[0])
    why: dict[int, str] = {}
    pending = list(range(1, len(cands)))
    running: dict[int, tuple[subprocess.Popen, float]] = {}   # candidate -> (worker, start)
    while pending or running:
        while pending and len(running) < njobs:
            i = pending.pop(0)
            running[i] = (_start(worker, cands[i]), time.monotonic())
        time.sleep(0.01)
        for i, (p, t0) in list(running.items()):
            rc = p.poll()
            if rc is None and time.monotonic() - t0 > timeout_s:
                p.kill()
                p.wait()
                why[i] = f"timed out after {timeout_s:.0f} s in its worker"
            elif rc is None:
                continue
            elif rc < 0:
                why[i] = f"its worker died ({signal.Signals(-rc).name})"
            else:
                p.report.seek(0)
                lines = (p.report.read() or "").strip().splitlines()
                try:
                    rep = json.loads(lines[-1]) if lines else {"ok": False, "why": f"its worker reported nothing "
                                                                                   f"(exit status {rc})"}
                except ValueError:
                    rep = {"ok": False, "why": "its worker's report is unreadable"}
                if not rep.get("ok"):
                    why[i] = str(rep.get("why", "failed"))
            p.report.close()
            del running[i]
    return [first] + [(p, None, why[i]) if i in why else _here(compile_one, p) for i, p in enumerate(cands) if i]


def _here(compile_one, pins: dict) -> tuple[dict, object, str]:
    try:
        return pins, compile_one(pins), ""
    except TesseraError as e:
        return pins, None, f"{e.code}: {e.message}"
