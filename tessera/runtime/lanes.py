"""The lane log: every call records which lane ran and why.

Strict dispatch is the default: a function compiled for a lane runs there or the
call fails.  Only ``strict=False`` allows the numpy reference to run instead, and
that decision is logged with its reason (the test suite fails on any such entry it
did not ask for).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaneDecision:
    function: str
    lane: str
    reason: str
    requested_fallback: bool = False
    inputs: tuple[str, ...] = ()   # how torch / JAX / DLPack arguments were read (LaneLog.inputs on)


@dataclass
class LaneLog:
    entries: list[LaneDecision] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    inputs: bool = False   # a call with foreign arrays notes each one read in place or copied (interop.py)

    def record(self, d: LaneDecision) -> None:
        with self.lock:
            self.entries.append(d)
            if len(self.entries) > 10000:
                del self.entries[:5000]

    def fallbacks(self) -> list[LaneDecision]:
        return [e for e in self.entries if e.lane == "reference"]

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


LOG = LaneLog()
