"""The compile cache managed: what is in it, its size cap, clearing and pruning.

Entries live in ``<cache dir>/<2 hex>/<key>.tsr`` (``cache.py``).  A hit sets an entry's
modification time, so the oldest modification time is the least recently used entry.  After
each write the directory is kept under ``TESSERA_CACHE_MAX`` (default 1 GiB; ``512M``, ``2G``,
``1.5GiB``, a byte count, or ``none`` for no cap; K/M/G/T are powers of 1024): when over, the
least recently used entries go until it is under 90% of the cap (so a full cache does not
evict on every write).  The entry just written is never the one evicted.

Processes may share the directory: every step tolerates a file vanishing under it (another
process evicted or cleared it), entries are replaced by rename only, and a writer's temporary
file is left alone unless it is older than an hour (a crashed writer's).

``tuning/`` (the tuning database, runtime/tunedb.py) and ``repro/`` (compiler-failure
reproducers) are kept by ``clear`` unless asked for.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from tessera.errors import CacheSizeError
from tessera.runtime import cache

DEFAULT_MAX = 1 << 30
LOW_WATER = 0.9            # eviction stops under this fraction of the cap
TMP_STALE_S = 3600         # a temporary file this old is a crashed writer's
TUNING_DIR, REPRO_DIR = "tuning", "repro"
_HEX = frozenset("0123456789abcdef")


@dataclass
class Entry:
    path: Path
    size: int
    mtime: float           # last used (a hit sets it) or written
    meta: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.path.name[:-len(".tsr")]


def parse_size(text, what: str = "TESSERA_CACHE_MAX") -> int | None:
    """Bytes from ``2G``, ``512M``, ``1.5GiB``, ``4096``; None for ``none`` / ``off`` (no cap)."""
    t = str(text).strip().lower().replace(" ", "")
    if t in ("none", "off", "unlimited"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d*)?)([kmgt]?)(?:ib|b)?", t)
    if not m:
        raise CacheSizeError(f"{what}={text!r} is not a size: write e.g. 512M, 2G, 1.5GiB, 1048576 or none")
    return int(float(m[1]) * 1024 ** " kmgt".index(m[2] or " "))


def max_bytes() -> int | None:
    """The cap: ``TESSERA_CACHE_MAX``, else DEFAULT_MAX."""
    v = os.environ.get("TESSERA_CACHE_MAX")
    return DEFAULT_MAX if v is None or not v.strip() else parse_size(v)


def _shards(d: Path):
    try:
        with os.scandir(d) as it:
            for s in it:
                if len(s.name) == 2 and set(s.name) <= _HEX and s.is_dir(follow_symlinks=False):
                    yield s.path
    except FileNotFoundError:
        return


def scan(d: Path | None = None, *, sweep_tmp: bool = True) -> list[Entry]:
    """Every entry (a regular ``.tsr`` file) under the cache directory; stale temp files removed."""
    d = cache.cache_dir() if d is None else d
    out, now = [], time.time()
    for shard in _shards(d):
        for f, st in _files(shard):
            if not stat.S_ISREG(st.st_mode):
                continue
            if f.name.endswith(".tsr"):
                out.append(Entry(Path(f.path), st.st_size, st.st_mtime))
            elif sweep_tmp and f.name.startswith(".tmp-") and now - st.st_mtime > TMP_STALE_S:
                _remove(Path(f.path))
    return out


def _files(shard: str):
    """(entry, its lstat) for each file of a shard still there when read: another process may
    clear the shard, or remove a file, while this one walks it."""
    try:
        files = list(os.scandir(shard))
    except FileNotFoundError:
        return
    for f in files:
        try:
            yield f, f.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue


def _remove(p: Path) -> bool:
    try:
        os.unlink(p)
        return True
    except FileNotFoundError:   # another process removed it first
        return False


def read_meta(p: Path) -> dict:
    """The JSON line of an entry (function, target, version, created); {} where unreadable."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        head = os.read(fd, 4096)
    except OSError:
        return {}
    finally:
        os.close(fd)
    start = len(cache.MAGIC) + 32
    if not head.startswith(cache.MAGIC) or b"\n" not in head[start:]:
        return {}
    try:
        meta = json.loads(head[start:head.index(b"\n", start)])
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _evict(entries: list[Entry], budget: int, keep: Path | None = None) -> tuple[int, int]:
    """Remove the least recently used of ``entries`` until they total at most ``budget``."""
    total = sum(e.size for e in entries)
    n = freed = 0
    for e in sorted(entries, key=lambda e: e.mtime):
        if total <= budget:
            break
        if keep is not None and e.path == keep:
            continue
        total -= e.size   # gone either way: removed here, or by another process
        if _remove(e.path):
            n, freed = n + 1, freed + e.size
    return n, freed


# A scan of 2,000 entries takes ~30 ms, so while the cache was under half its cap at this
# process's last scan, a write skips the scan until its own writes since would fill that half
# (or SCAN_EVERY writes pass); nearer the cap every write scans.  With two processes the
# total stays under the cap: each skips only within the half it saw free.
SCAN_EVERY = 32
_seen = {"dir": None, "room": 0, "writes": 0}


def enforce_cap(keep: Path | None = None) -> tuple[int, int]:
    """Keep the cache under its cap after a write (``keep``: the entry just written)."""
    cap = max_bytes()
    if cap is None:
        return 0, 0
    d = cache.cache_dir()
    size = 0
    if keep is not None:
        try:
            size = os.lstat(keep).st_size
        except OSError:
            pass
    s = _seen
    if s["dir"] == (d, cap) and s["writes"] < SCAN_EVERY and s["room"] - size >= 0:
        s["room"] -= size
        s["writes"] += 1
        return 0, 0
    entries = scan(d)
    total = sum(e.size for e in entries)
    n = freed = 0
    if total > cap:
        n, freed = _evict(entries, int(cap * LOW_WATER), keep)
        total -= freed
    s.update(dir=(d, cap), room=cap // 2 - total, writes=0)
    return n, freed


def _tree_bytes(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


def _checked() -> Path:
    d = cache.cache_dir()
    cache._check_dir(d)   # a directory of another user is refused (CACHE_UNTRUSTED), not read or emptied
    return d


def info() -> dict:
    d = _checked()
    entries = scan(d, sweep_tmp=False)
    current = cache.source_hash()
    stale = sum(1 for e in entries if read_meta(e.path).get("version") != current)
    return {"dir": str(d), "entries": len(entries), "bytes": sum(e.size for e in entries),
            "max_bytes": max_bytes(), "stale": stale, "repro_bytes": _tree_bytes(d / REPRO_DIR),
            "tuning_bytes": _tree_bytes(d / TUNING_DIR)}


def listing() -> list[Entry]:
    """Every entry with its JSON line, most recently used first."""
    entries = scan(_checked(), sweep_tmp=False)
    for e in entries:
        e.meta = read_meta(e.path)
    return sorted(entries, key=lambda e: -e.mtime)


def clear(tuning: bool = False, repro: bool = False) -> tuple[int, int]:
    """Remove every entry (and temp file); ``tuning`` / ``repro`` also remove those folders.
    Returns (entries removed, bytes freed)."""
    d = _checked()
    n = freed = 0
    for shard in list(_shards(d)):
        for f, st in _files(shard):
            if f.name.endswith(".tsr") or f.name.startswith(".tmp-"):
                if _remove(Path(f.path)) and f.name.endswith(".tsr"):
                    n, freed = n + 1, freed + st.st_size
        try:
            os.rmdir(shard)   # only if empty (a writer may just have added to it)
        except OSError:
            pass
    for name, asked in ((TUNING_DIR, tuning), (REPRO_DIR, repro)):
        if asked and (d / name).is_dir():
            freed += _tree_bytes(d / name)
            shutil.rmtree(d / name, ignore_errors=True)
    return n, freed


def prune(max_size: int | None = None) -> tuple[int, int, int]:
    """Remove entries of another compiler version (their keys can never be asked for again),
    then the least recently used until the rest total at most ``max_size`` (default: the cap).
    Returns (stale removed, evicted, bytes freed)."""
    entries = scan(_checked())
    current = cache.source_hash()
    stale, fresh = [], []
    for e in entries:
        (fresh if read_meta(e.path).get("version") == current else stale).append(e)
    freed = sum(e.size for e in stale if _remove(e.path))
    budget = max_bytes() if max_size is None else max_size
    n, more = _evict(fresh, budget) if budget is not None else (0, 0)
    return len(stale), n, freed + more
