"""Compile tuning candidates in worker processes (forked), so a candidate that crashes the compiler
or hangs is recorded as failed and never takes the tuner down, and two cores compile two at once.

The first candidate (the cost model's choice) compiles here, warming the compiler; each other
candidate gets its own forked child (at most ``jobs`` at a time), which compiles it through
the normal path, so the object code lands in the disk cache, reports one JSON line through a
pipe and exits with ``os._exit`` (it never returns into the caller's code).  The parent then
compiles the candidates that succeeded itself: a disk-cache hit, no LLVM.  A child that dies
(a signal, an abort) or outlives ``timeout_s`` is killed and its candidate recorded as failed
with the reason.  Without ``os.fork``, with one job, or ``TESSERA_TUNE_JOBS=1``, candidates
compile in this process one after another.
"""
from __future__ import annotations

import json
import os
import signal
import time

from tessera import host
from tessera.errors import TesseraError

TIMEOUT_S = 120.0


def jobs() -> int:
    env = os.environ.get("TESSERA_TUNE_JOBS")
    return max(1, int(env)) if env else max(1, min(2, host.usable_cpus()))


def _child(compile_one, pins, w: int) -> None:
    status = {"ok": True}
    try:
        compile_one(pins)
    except TesseraError as e:
        status = {"ok": False, "why": f"{e.code}: {e.message}"[:500]}
    except BaseException as e:   # noqa: BLE001 - anything the compiler raised: this candidate failed
        status = {"ok": False, "why": f"{type(e).__name__}: {e}"[:500]}
    try:
        os.write(w, (json.dumps(status) + "\n").encode())
    finally:
        os._exit(0)


def compile_all(compile_one, cands: list[dict], *, njobs: int | None = None,
                timeout_s: float | None = None) -> list[tuple[dict, object, str]]:
    """(pins, compiled or None, why it failed) per candidate, in order; ``compile_one(pins)``
    compiles one candidate (raising ``TesseraError`` when it cannot)."""
    njobs = jobs() if njobs is None else njobs
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    if njobs <= 1 or not hasattr(os, "fork") or len(cands) < 2:
        return [_here(compile_one, p) for p in cands]
    # the first (the cost model's own schedule) compiles here: it warms what every compile imports
    # and builds lazily, which forked children would otherwise each pay for again
    first = _here(compile_one, cands[0])
    why: dict[int, str] = {}
    pending = list(range(1, len(cands)))
    running: dict[int, tuple[int, int, float]] = {}   # pid -> (candidate, read fd, start)
    while pending or running:
        while pending and len(running) < njobs:
            i = pending.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:   # the child: compile, report, exit
                os.close(r)
                _child(compile_one, cands[i], w)
            os.close(w)
            running[pid] = (i, r, time.monotonic())
        time.sleep(0.01)
        for pid, (i, r, t0) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0 and time.monotonic() - t0 > timeout_s:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                why[i] = f"timed out after {timeout_s:.0f} s in its worker"
            elif done == 0:
                continue
            elif os.WIFSIGNALED(status):
                why[i] = f"its worker died ({signal.Signals(os.WTERMSIG(status)).name})"
            else:
                line = _read(r)
                try:
                    rep = json.loads(line) if line else {"ok": False, "why": "its worker reported nothing"}
                except ValueError:
                    rep = {"ok": False, "why": "its worker's report is unreadable"}
                if not rep.get("ok"):
                    why[i] = str(rep.get("why", "failed"))
            os.close(r)
            del running[pid]
    return [first] + [(p, None, why[i]) if i in why else _here(compile_one, p) for i, p in enumerate(cands) if i]


def _read(fd: int) -> str:
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            b = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
    return b"".join(chunks).decode(errors="replace").strip()


def _here(compile_one, pins: dict) -> tuple[dict, object, str]:
    try:
        return pins, compile_one(pins), ""
    except TesseraError as e:
        return pins, None, f"{e.code}: {e.message}"
