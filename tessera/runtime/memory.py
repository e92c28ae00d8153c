"""Output buffers: large results come from a pool of huge-page mappings that are reused.

A fresh multi-megabyte array costs a page fault per 4 KiB page the first time it is
written (~28 ms for 128 MiB here).  Results of 1 MiB or more are therefore carved from
anonymous mappings advised as transparent huge pages and kept after the caller drops
them: a mapping is free again when nothing but the pool refers to it (every numpy
array or view over it holds a reference to the mapping, so its reference count is an
exact liveness test).  Pooled memory is capped; beyond the cap mappings are released.

Intermediates (a kernel's output another kernel reads, never handed back) come from the same
pool from 64 KiB up (``scratch``), in 64 KiB grains below the huge-page size: a fresh
``numpy.empty`` of a few hundred KiB is page-faulted again on every call (glibc trims and
regrows its heap), which cost the conv block's pad kernels 0.4 ms each on a 0.03 ms copy.

``TESSERA_POOL=0`` turns the pool off (fresh ``numpy.empty`` for every result and
intermediate), which the benchmarks use to report like-with-like figures.
"""
from __future__ import annotations

import math
import mmap
import os
import sys

import numpy as np

from tessera import forksafe, host

MIN_POOLED = 1 << 20
GRAIN = 2 << 20  # huge-page size classes
MIN_SCRATCH = 64 << 10   # intermediates pooled from this size up
SMALL_GRAIN = 64 << 10   # size classes of mappings below GRAIN


class BufferPool:
    def __init__(self, cap_bytes: int | None = None):
        self.cap = cap_bytes if cap_bytes is not None else min(4 << 30, host.memory_available() // 4)
        self.maps: list[mmap.mmap] = []
        forksafe.lock(self, "lock")
        self.total = 0
        self.enabled = os.environ.get("TESSERA_POOL", "1") != "0"

    def _free_index(self, i: int) -> bool:
        # references when free: the self.maps list and getrefcount's own argument
        return sys.getrefcount(self.maps[i]) <= 2

    def empty(self, shape, dtype, min_bytes: int = MIN_POOLED) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not self.enabled or nbytes < min_bytes:
            return np.empty(shape, dtype)
        grain = GRAIN if nbytes >= MIN_POOLED else SMALL_GRAIN
        size = -(-nbytes // grain) * grain
        with self.lock:
            best = -1
            for i in range(len(self.maps)):
                if len(self.maps[i]) >= size and self._free_index(i) and (
                        best < 0 or len(self.maps[i]) < len(self.maps[best])):
                    best = i
            mm = self.maps[best] if best >= 0 else self._new(size)
            arr = np.ndarray(shape, dtype, buffer=mm)
        return arr

    def _new(self, size: int) -> mmap.mmap:
        while self.total + size > self.cap and self.maps:
            victim = next((i for i in range(len(self.maps)) if self._free_index(i)), None)
            if victim is None:
                break
            self.total -= len(self.maps.pop(victim))
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if size >= GRAIN and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        if self.total + size <= self.cap:
            self.maps.append(mm)
            self.total += size
        return mm


POOL = BufferPool()


def empty(shape, dtype) -> np.ndarray:
    return POOL.empty(shape, dtype)


def scratch(shape, dtype) -> np.ndarray:
    """An intermediate of one call (read by later kernels, never handed back): pooled from
    ``MIN_SCRATCH`` up, so it is not page-faulted again on every call."""
    return POOL.empty(shape, dtype, MIN_SCRATCH)
