"""Locks that a forked child gets fresh.

After ``fork()`` only the forking thread exists in the child; a lock that another parent thread
held at that moment stays held in the child forever, and the child's first call that takes it
hangs (a data-loader worker forked while the main thread compiles, for example).  Every lock
Tessera keeps across calls is made here, by ``lock(owner, attr)``, which stores a plain
``threading.Lock`` at ``owner.attr`` (no cost on the hot path) and remembers the pair weakly;
in a forked child each remembered attribute is replaced by a new lock before any code runs.
State that is more than a lock (the worker pool's threads, a table of per-key locks) registers
its own reset with ``os.register_at_fork`` where it lives.
"""
from __future__ import annotations

import os
import threading
import weakref

# owner (an object or a module) -> the attribute names that hold its locks
_OWNERS: "weakref.WeakKeyDictionary[object, set[str]]" = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def lock(owner: object, attr: str) -> threading.Lock:
    """A new lock stored at ``owner.attr``, renewed there in a forked child."""
    new = threading.Lock()
    setattr(owner, attr, new)
    with _REGISTRY_LOCK:
        _OWNERS.setdefault(owner, set()).add(attr)
    return new


def _after_fork_in_child() -> None:
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for owner, attrs in list(_OWNERS.items()):
        for attr in attrs:
            setattr(owner, attr, threading.Lock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _after_fork_in_child())   # looked up at fork time
