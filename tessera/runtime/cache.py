"""The compile cache on disk, under ``TESSERA_CACHE_DIR`` (default ``~/.cache/tessera``).

A key hashes everything that can change the machine code: the Graph IR text, the
pipeline (target, arch, pinned schedule), the CPU name and features the code is built
for, a hash of Tessera's own sources, the xDSL, llvmlite and LLVM versions, and (GPU
lanes) the identity of the external assembler/linker.  An entry holds object code (so a
warm process skips LLVM entirely), the Target IR (the host program), the IR of every
layer, the compile report, and its own key.

The cache trusts nothing it reads:

- the directory and its shards are created ``0700``; a directory or entry owned by
  another user, or a directory anyone may write, is refused (``CacheUntrustedError``):
  entries are unpickled, so whoever can write them can run code in this process;
- only a regular file of at most ``MAX_ENTRY_BYTES`` is read, opened without following
  a link and without blocking (a link to ``/dev/zero``, a FIFO or a directory under an
  entry's name is discarded unread);
- a wrong magic, a checksum mismatch, an unpicklable payload, a payload that is not a
  dict, or an entry recording another key (program B's entry copied over A's name) is
  discarded and ``None`` returned, so the caller recompiles.  The caller's ``validate``
  adds its own checks of the entry's fields.

Entries are written atomically (temp file + rename); a failed write (full or read-only
disk) removes its temp file and only costs the next process a compile.

An entry file is ``MAGIC``, the SHA-256 of the rest, one JSON line of what ``tessera cache ls``
shows (function, target, compiler version, created), then the pickled entry.  A hit sets the
file's modification time (least recently used first out), and each write keeps the directory
under its size cap (``TESSERA_CACHE_MAX``, default 1 GiB; ``cache_admin.py``).  Two processes
may share a directory: a file that vanishes under a reader, a writer or an eviction is a miss.
"""
from __future__ import annotations

import errno
import hashlib
import os
import pickle
import stat
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable

from tessera.errors import CacheUntrustedError

MAGIC = b"TSRC3\n"
# The largest entry read or written.  An entry is one graph's object code plus the IR text
# of its layers: of 1,897 entries left by test runs on this host the median was 34 KiB and
# the largest 1.6 MiB; schedules are bounded (unroll, chunk), so a legitimate entry stays
# far below this, while a 256 MiB read is still harmless to a process.  Anything larger is
# not ours: discarded unread (and an entry that large is not written).
MAX_ENTRY_BYTES = 256 << 20
SOURCE_ROOT = Path(__file__).resolve().parent.parent      # the tessera package


def cache_dir() -> Path:
    d = os.environ.get("TESSERA_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "tessera"


def current_uid() -> int:
    return os.geteuid()


# --------------------------------------------------------------------------- keys
def hash_tree(root: Path) -> str:
    """A hash of every ``.py`` and ``.json`` file under ``root`` (relative path and bytes)."""
    h = hashlib.sha256()
    for pattern in ("*.py", "*.json"):
        for p in sorted(root.rglob(pattern)):
            h.update(str(p.relative_to(root)).encode())
            h.update(b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def source_hash() -> str:
    """Tessera's own sources: any edit to the compiler changes every key."""
    return hash_tree(SOURCE_ROOT)


@lru_cache(maxsize=1)
def tool_versions() -> str:
    import llvmlite
    import llvmlite.binding as llvm
    import xdsl
    llvm_version = ".".join(str(i) for i in llvm.llvm_version_info)
    return f"xdsl={getattr(xdsl, '__version__', '?')};llvmlite={llvmlite.__version__};llvm={llvm_version}"


def _file_identity(found: str | tuple[str, ...] | None) -> str:
    """``found``: a tool's path, or its command (the program, then its arguments: ``zig ld.lld``)."""
    if found is None:
        return "absent"
    path, *rest = (found,) if isinstance(found, str) else found
    if rest:
        return _file_identity(path) + ":" + " ".join(rest)
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:unreadable"
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def toolchain_identity(target: str) -> str:
    """The external tools a GPU lane's artifact passes through (``ptxas`` for NVIDIA, ``ld.lld``
    for ROCm), named by resolved path, size and modification time: an upgraded tool gives new
    keys without running it.  The CPU lane uses no external tool."""
    from tessera import toolchain
    if target == "nvidia":
        return "ptxas=" + _file_identity(toolchain.find_ptxas())
    if target == "rocm":
        return "ld.lld=" + _file_identity(toolchain.find_llvm_tool("ld.lld"))
    return ""


def make_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (*parts, source_hash(), tool_versions()):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.tsr"


# --------------------------------------------------------------------------- trust
def _check_owned(path: Path, st: os.stat_result, what: str) -> None:
    uid = current_uid()
    if st.st_uid != uid:
        raise CacheUntrustedError(
            f"compile-cache {what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid}); "
            "its entries would run code in this process, so it is not used",
            hint="remove it, or set TESSERA_CACHE_DIR to a directory of your own")
    # group write is allowed (umask 002 with a private group made many existing caches 0775); an
    # entry or shard planted by another user is refused by the owner check above either way
    if what == "directory" and st.st_mode & 0o002:
        raise CacheUntrustedError(
            f"compile-cache directory {path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
            "its entries would run code in this process, so it is not used",
            hint=f"chmod 700 {path}, or set TESSERA_CACHE_DIR to a directory of your own")


def _check_dir(d: Path) -> bool:
    """True if ``d`` exists (and is trusted); False if absent."""
    try:
        st = os.stat(d)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise CacheUntrustedError(f"compile-cache path {d} is not a directory",
                                  hint="remove it, or set TESSERA_CACHE_DIR to a directory of your own")
    _check_owned(d, st, "directory")
    return True


def ensure_dir(d: Path) -> None:
    """Create ``d`` (mode 0700) if absent, parents with the default mode; check it either way."""
    if _check_dir(d):
        return
    d.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(d, 0o700)
        os.chmod(d, 0o700)          # whatever the umask says
    except FileExistsError:
        pass                        # another process made it: check what is there
    _check_dir(d)


# --------------------------------------------------------------------------- entries
def discard(key: str) -> None:
    """Remove the entry under ``key`` (whatever is there: a file, a link, a FIFO, an empty dir)."""
    _discard(_path(key))


def _discard(p: Path) -> None:
    try:
        if stat.S_ISDIR(os.lstat(p).st_mode):
            os.rmdir(p)             # only an empty one; a full directory is not ours to delete
        else:
            os.unlink(p)
    except OSError:
        pass


def _read_entry_file(p: Path) -> bytes | None:
    """The bytes of a regular file of bounded size, owned by this user; None otherwise."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        return None
    except OSError:                 # ELOOP (a link), EACCES, ENXIO, ...: not an entry
        _discard(p)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _discard(p)
            return None
        _check_owned(p, st, "entry")
        if st.st_size > MAX_ENTRY_BYTES:
            _discard(p)
            return None
        chunks, left = [], st.st_size + 1       # one byte more: a file that grew is refused
        while left > 0:
            b = os.read(fd, min(left, 1 << 24))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) != st.st_size:
            _discard(p)
            return None
        return data
    except OSError:
        _discard(p)
        return None
    finally:
        os.close(fd)


def load(key: str, validate: Callable[[dict], bool] | None = None) -> dict | None:
    """The entry for ``key``, or None if absent or unusable (an unusable entry is discarded).

    Raises ``CacheUntrustedError`` for a directory or entry owned by another user."""
    p = _path(key)
    if not _check_dir(p.parent.parent) or not _check_dir(p.parent):
        return None
    data = _read_entry_file(p)
    if data is None:
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("bad magic")
        digest, rest = data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
        if hashlib.sha256(rest).digest() != digest:
            raise ValueError("checksum mismatch")
        payload = rest[rest.index(b"\n") + 1:]   # after the JSON line of what `tessera cache ls` shows
        entry = pickle.loads(payload)
        if not isinstance(entry, dict):
            raise ValueError("not an entry")
        if entry.get("key") != key:
            raise ValueError("entry of another key")
        if validate is not None and not validate(entry):
            raise ValueError("entry fails its checks")
        _touch(p)
        return entry
    except Exception:  # noqa: BLE001 - any damage: discard and recompile
        _discard(p)
        return None


def _touch(p: Path) -> None:
    """Mark an entry used now (eviction takes the least recently used first)."""
    try:
        os.utime(p)
    except OSError:   # a read-only cache, or the entry evicted meanwhile: no matter
        pass


def header(meta: dict | None) -> bytes:
    """The JSON line before the payload: ``meta`` with the compiler version and the time."""
    import json
    import time
    line = json.dumps(dict(meta or {}, version=source_hash(), created=round(time.time(), 3)),
                      ensure_ascii=True, separators=(",", ":"))
    return line.encode() + b"\n"


def store(key: str, entry: dict, meta: dict | None = None) -> bool:
    """Write ``entry`` (with its key recorded) atomically; False if it was not written (a
    read-only or full disk only costs the next process a compile).  ``meta`` (JSON: the
    function's name, the target) is what ``tessera cache ls`` shows.  Then the directory is
    kept under its size cap.  Raises ``CacheUntrustedError`` for a directory owned by another user."""
    p = _path(key)
    rest = header(meta) + pickle.dumps(dict(entry, key=key), protocol=pickle.HIGHEST_PROTOCOL)
    data = MAGIC + hashlib.sha256(rest).digest() + rest
    if len(data) > MAX_ENTRY_BYTES:
        return False
    try:
        ensure_dir(p.parent.parent)
        ensure_dir(p.parent)
    except OSError:
        return False
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            _write_all(f, data)
        os.replace(tmp, p)
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False
    from tessera.runtime import cache_admin
    cache_admin.enforce_cap(keep=p)
    return True


def _write_all(f, data: bytes) -> None:
    n = f.write(data)
    if n is not None and n != len(data):
        raise OSError(errno.EIO, "short write")


__all__ = ["cache_dir", "ensure_dir", "make_key", "source_hash", "hash_tree", "tool_versions", "toolchain_identity", "load",
           "store", "discard", "MAX_ENTRY_BYTES", "CacheUntrustedError"]
