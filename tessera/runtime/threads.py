"""How many threads a CPU call may use: ``TESSERA_NUM_THREADS`` or ``tessera.set_num_threads``.

By default a kernel with enough work runs on every CPU this process may use (its affinity
mask and cgroup quota).  Next to torch, MKL or OpenBLAS, whose own pools also take every
core, that oversubscribes: each library's threads wait for the others' time slices, and
Tessera's workers spin for a moment after each job.  The setting caps the threads of every
call (pinned ``schedule={"threads": n}`` included; it never raises a count above the usable
CPUs), so e.g. ``TESSERA_NUM_THREADS=4`` beside ``torch.set_num_threads(4)`` on 8 cores
shares them. ``1`` runs every kernel on the calling thread and starts no worker thread.

The variable is read at the first call (or when ``set_num_threads(None)`` returns to it);
``set_num_threads(n)`` overrides it for the process.  A change reaches calls whose launch
plans were made before it: ``version()`` moves, and a plan made under another version is
rebuilt.
"""
from __future__ import annotations

import os

from tessera.errors import ArgumentError

ENV = "TESSERA_NUM_THREADS"

_override: int | None = None
_from_env: int | None = None
_env_read = False
_version = 0


def _check(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"{what}: expected a positive number of threads, got {n!r}")
    return n


def _read_env() -> int | None:
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        n = text
    return _check(n, f"environment variable {ENV}={text!r}")


def set_num_threads(n: int | None) -> None:
    """Cap the threads of every later CPU call at ``n`` (>= 1); ``None`` returns to
    ``TESSERA_NUM_THREADS`` (re-read) or, unset, to every usable CPU."""
    global _override, _env_read, _version
    if n is None:
        _override = None
        _env_read = False
    else:
        _override = _check(n, "tessera.set_num_threads")
    _version += 1


def get_num_threads() -> int | None:
    """The cap in force: set_num_threads's, else TESSERA_NUM_THREADS's, else None (no cap:
    every CPU this process may use)."""
    global _from_env, _env_read
    if _override is not None:
        return _override
    if not _env_read:
        _from_env = _read_env()
        _env_read = True
    return _from_env


def version() -> int:
    """Moves whenever the setting may have changed (plans compare it)."""
    return _version
