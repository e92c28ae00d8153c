"""Python's cyclic garbage collector paused while a graph compiles.

Lowering builds tens of thousands of xDSL ops and llvmlite values, each linked to its parent
(cycles), so the collector's generation-2 passes walk an ever larger heap again and again while
nothing is garbage yet.  Measured on the Llama example (small, cold): lower-tile-to-x86 1.56 ->
0.71 CPU s and the LLVM IR translation 1.18 -> 0.70 CPU s with the collector paused.

``paused()`` nests and is shared by threads: the collector is disabled when the first compile
starts and enabled again when the last one ends, and only if it was enabled before (a program
that disabled it itself keeps it disabled).  What the compile left behind is collected by the
collector's next ordinary pass.
"""
from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager

from tessera import forksafe

_LOCK = forksafe.lock(sys.modules[__name__], "_LOCK")
_state = {"depth": 0, "was_enabled": False}


@contextmanager
def paused():
    with _LOCK:
        if _state["depth"] == 0:
            _state["was_enabled"] = gc.isenabled()
            gc.disable()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            if _state["depth"] == 0:     # reset by a fork inside this compile (see below)
                return
            _state["depth"] -= 1
            if _state["depth"] == 0 and _state["was_enabled"]:
                gc.enable()


def _reset_in_child() -> None:
    """A child forked while a thread compiled: the collector runs again there (that compile
    does not exist in the child, or, if the forking thread was compiling, it finishes with the
    collector on)."""
    if _state["depth"]:
        _state["depth"] = 0
        if _state["was_enabled"]:
            gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
