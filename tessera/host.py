"""Facts about the machine this process runs on, read at run time (a leaf module).

- usable CPUs: the process's affinity mask, capped by a cgroup v2/v1 CPU quota —
  not the machine's core count;
- cache sizes from sysfs (per level, data/unified);
- memory this process may still use: MemAvailable, capped by the cgroup limit;
- whether Linux grants this process the AMX tile-data state (asked for once).
"""
from __future__ import annotations

import ctypes
import math
import os
import platform
import sys
from functools import lru_cache
from pathlib import Path


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cgroup_cpu_limit() -> float | None:
    v2 = _read("/sys/fs/cgroup/cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
    q = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    p = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if q and p and int(q) > 0:
        return int(q) / int(p)
    return None


@lru_cache(maxsize=1)
def usable_cpus() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    lim = _cgroup_cpu_limit()
    if lim is not None:
        n = min(n, max(1, math.floor(lim)))
    return max(1, n)


def _size(text: str | None) -> int | None:
    if not text:
        return None
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    if text[-1] in mult:
        return int(text[:-1]) * mult[text[-1]]
    return int(text)


@lru_cache(maxsize=1)
def cache_sizes() -> dict[str, int]:
    """{"L1": bytes, "L2": bytes, "L3": bytes} (data or unified caches of cpu0); defaults if unreadable."""
    out = {"L1": 32 * 1024, "L2": 1024 * 1024, "L3": 16 * 1024 * 1024}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    if base.is_dir():
        for idx in sorted(base.glob("index*")):
            level = _read(str(idx / "level"))
            kind = _read(str(idx / "type"))
            size = _size(_read(str(idx / "size")))
            if level and size and kind in ("Data", "Unified"):
                out[f"L{level}"] = size
    return out


def memory_available() -> int:
    """Bytes this process may still allocate: MemAvailable, capped by the cgroup limit."""
    avail = None
    meminfo = _read("/proc/meminfo")
    if meminfo:
        for line in meminfo.splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    lim = _read("/sys/fs/cgroup/memory.max") or _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    used = _read("/sys/fs/cgroup/memory.current") or _read("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    if lim and lim != "max" and used:
        room = int(lim) - int(used)
        if room < (1 << 60):
            avail = room if avail is None else min(avail, room)
    return avail if avail is not None else 1 << 62


_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@lru_cache(maxsize=1)
def amx_refusal() -> str | None:
    """Ask Linux for the AMX tile-data state for this process (every thread of it), once.
    None when granted; otherwise why not.  Without it the first AMX instruction is SIGILL."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"AMX tile state is requested through Linux x86-64 arch_prctl; this is {sys.platform} {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        err = ctypes.get_errno()
        return f"Linux refused the AMX tile-data state (arch_prctl ARCH_REQ_XCOMP_PERM: {os.strerror(err)})"
    return None


def missing_features(wanted: frozenset[str]) -> tuple[str, ...]:
    """The CPU features in ``wanted`` (LLVM spelling) that this machine's CPU does not report,
    sorted; empty when code compiled for them can run here."""
    from tessera.mma.x86 import host_cpu
    return tuple(sorted(set(wanted) - host_cpu()[1]))
