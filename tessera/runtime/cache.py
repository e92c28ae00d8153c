"""The compile cache: in memory, and on disk under ``TESSERA_CACHE_DIR``
(default ``~/.cache/tessera``).

A key hashes everything that can change the machine code: the Graph IR text, the
pipeline (target, arch, pinned schedule), the CPU features, a hash of Tessera's
own sources, and the xDSL and llvmlite versions.  An entry holds object code (so a
warm process skips LLVM entirely), the Target IR (the host program), the IR of
every layer and the compile report.  Entries are written atomically (temp file +
rename) and carry a SHA-256 of their payload: a corrupt or truncated entry is
detected, discarded and recompiled.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from functools import lru_cache
from pathlib import Path

MAGIC = b"TSRC1\n"


def cache_dir() -> Path:
    d = os.environ.get("TESSERA_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "tessera"


@lru_cache(maxsize=1)
def source_hash() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    for p in sorted(root.rglob("*.json")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def tool_versions() -> str:
    import llvmlite
    import xdsl
    return f"xdsl={getattr(xdsl, '__version__', '?')};llvmlite={llvmlite.__version__}"


def make_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (*parts, source_hash(), tool_versions()):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.tsr"


def load(key: str) -> dict | None:
    """The entry for ``key``, or None if absent; a corrupt entry is deleted and None returned."""
    p = _path(key)
    try:
        data = p.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("bad magic")
        digest, payload = data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("checksum mismatch")
        entry = pickle.loads(payload)
        if not isinstance(entry, dict):
            raise ValueError("not an entry")
        return entry
    except Exception:  # noqa: BLE001 - any damage: discard and recompile
        try:
            p.unlink()
        except OSError:
            pass
        return None


def store(key: str, entry: dict) -> None:
    p = _path(key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        payload = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, p)
    except OSError:
        pass  # a read-only or full disk only costs the next process a compile
