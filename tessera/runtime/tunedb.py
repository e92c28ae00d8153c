"""The tuning database: measured schedule pins per kernel family and shape, per host.

A small SQLite file, ``tuning/tuning.sqlite`` under the cache directory (``cache.cache_dir()``,
``TESSERA_CACHE_DIR``; ``tessera cache clear`` keeps it unless given ``--tuning``), in WAL mode
with a busy timeout, so tuners in several processes may write at once (each write is one
transaction).  A row is keyed by:

    (family, its schedule-space version, target, arch, CPU feature string, dtype, exact shape,
     threads)

where ``threads`` is the number of threads the kernel runs with (``TESSERA_NUM_THREADS`` /
``set_num_threads`` capped at the usable CPUs): a 1-thread best register tile, blocking and
thread split are not the 8-thread ones.

and also records the shape's bucket (each dimension rounded up to a power of two), the best pins
(JSON), the best median time and every candidate's times.  ``lookup`` returns the exact entry,
else the nearest one of the same key but shape (same bucket first, then the smallest
log2 distance within ``NEAREST_MAX`` per dimension).  A lookup never crosses thread counts while
an entry of its own count answers it (exact or nearest shape); only when none does, it takes the
entry of the closest thread count (smallest log2 distance, then nearest shape), marked
``nearest`` so that a tuning run replaces it.

A file that is not a database, or one of another schema (schema 1 had no thread count), is set aside with a
``TuningDatabaseWarning`` and rebuilt empty.  ``export`` / ``import_file`` move entries through a
JSON file (a site-wide database for a cluster of one chip).
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tessera.errors import TuningDatabaseWarning
from tessera.runtime.cache import cache_dir

SCHEMA = 2             # 2: the thread count joined the key
FILE = "tuning.sqlite"
TUNING_DIR = "tuning"    # the folder cache_admin.clear keeps unless asked (tessera cache clear --tuning)
BUSY_MS = 30_000
NEAREST_MAX = 2.0      # a nearest entry differs by at most 4x in any dimension (log2 distance 2)
EXPORT_FORMAT = "tessera-tuning"

_DDL = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    family TEXT NOT NULL, version INTEGER NOT NULL, target TEXT NOT NULL, arch TEXT NOT NULL,
    features TEXT NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL, bucket TEXT NOT NULL,
    threads INTEGER NOT NULL,
    pins TEXT NOT NULL, best_ms REAL NOT NULL, times TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (family, version, target, arch, features, dtype, shape, threads));
"""
KEY_FIELDS = ("family", "version", "target", "arch", "features", "dtype")   # and shape, threads


@dataclass(frozen=True)
class Key:
    family: str
    version: int
    target: str
    arch: str
    features: str
    dtype: str
    shape: tuple[int, ...]
    threads: int            # the threads the kernel runs with (tune.run_threads)

    @property
    def bucket(self) -> tuple[int, ...]:
        return bucket(self.shape)


@dataclass
class Entry:
    key: Key
    pins: dict
    best_ms: float
    times: dict = field(default_factory=dict)   # candidate label -> median ms (None: failed)
    created: float = 0.0
    match: str = "exact"                        # exact | nearest
    failed: dict = field(default_factory=dict)  # candidate label -> why it failed (this run only; not stored)
    errors: dict = field(default_factory=dict)  # candidate label -> error against float64 (this run only)

    def describe(self) -> str:
        k = self.key
        shape = "x".join(map(str, k.shape))
        return (f"{k.family} v{k.version} {k.dtype} {shape} on {k.arch}, {k.threads} thread"
                + ("s" if k.threads != 1 else "") + ("" if self.match == "exact" else " (nearest)"))


def bucket(shape) -> tuple[int, ...]:
    return tuple(1 << max(0, int(d) - 1).bit_length() for d in shape)


def path() -> Path:
    """``<cache dir>/tuning/tuning.sqlite``: ``tessera cache clear`` keeps the ``tuning/`` folder
    unless given ``--tuning`` (runtime/cache_admin.py).  ``TESSERA_TUNING_DB`` names another file
    (``tessera bench cpu`` uses a private one, so its untuned column is the cost model's)."""
    other = os.environ.get("TESSERA_TUNING_DB")
    return Path(other) if other else cache_dir() / TUNING_DIR / FILE


def _pins_json(pins: dict) -> str:
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in sorted(pins.items())})


def _pins_load(text: str) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(text).items()}


def _shape_text(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def _shape_parse(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split("x")) if text else ()


class TuningDB:
    """One connection to the database at ``where`` (default: ``path()``)."""

    def __init__(self, where: Path | str | None = None, *, create: bool = True):
        self.path = Path(where) if where is not None else path()
        self.conn: sqlite3.Connection | None = None
        if not create and not self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self._open()
        except sqlite3.DatabaseError as e:
            self._set_aside(f"unreadable ({e})")
            self._open()

    def _open(self) -> None:
        conn = sqlite3.connect(str(self.path), timeout=BUSY_MS / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_DDL)
            row = conn.execute("SELECT v FROM meta WHERE k='schema'").fetchone()
            if row is None:
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
            elif row[0] != str(SCHEMA):
                conn.close()
                self._set_aside(f"schema {row[0]}, this Tessera reads {SCHEMA}")
                return self._open()
        except sqlite3.DatabaseError:
            conn.close()
            raise
        self.conn = conn

    def _set_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.bad-{os.getpid()}-{int(time.time())}")
        warnings.warn(TuningDatabaseWarning(f"tuning database {self.path}: {why}; set aside as {aside.name} "
                                            "and rebuilt empty"), stacklevel=3)
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                os.replace(p, Path(str(aside) + suffix))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> "TuningDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ write
    def store(self, entry: Entry) -> None:
        k = entry.key
        with self.conn:   # one transaction (BEGIN ... COMMIT)
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute("INSERT OR REPLACE INTO entries VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                              (k.family, k.version, k.target, k.arch, k.features, k.dtype, _shape_text(k.shape),
                               _shape_text(k.bucket), int(k.threads), _pins_json(entry.pins), float(entry.best_ms),
                               json.dumps(entry.times), entry.created or time.time()))

    def clear(self) -> int:
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn.execute("DELETE FROM entries").rowcount

    # ------------------------------------------------------------------ read
    def _rows(self, where: str = "", args: tuple = ()) -> list[Entry]:
        if self.conn is None:
            return []
        out = []
        for r in self.conn.execute("SELECT family, version, target, arch, features, dtype, shape, pins, best_ms, "
                                   f"times, created, threads FROM entries {where} ORDER BY family, dtype, shape", args):
            key = Key(r[0], int(r[1]), r[2], r[3], r[4], r[5], _shape_parse(r[6]), int(r[11]))
            out.append(Entry(key, _pins_load(r[7]), r[8], json.loads(r[9]), r[10]))
        return out

    def entries(self) -> list[Entry]:
        return self._rows()

    def lookup(self, key: Key) -> Entry | None:
        """The exact entry for ``key``, else the nearest shape of the same key and thread count
        (same bucket first); only when no entry of that thread count answers, the closest thread
        count's exact or nearest shape."""
        where = "WHERE " + " AND ".join(f"{f}=?" for f in KEY_FIELDS)
        args = tuple(getattr(key, f) for f in KEY_FIELDS)
        rows = self._rows(where + " AND shape=? AND threads=?", args + (_shape_text(key.shape), int(key.threads)))
        if rows:
            return rows[0]
        best, best_d = None, None
        for e in self._rows(where, args):
            if len(e.key.shape) != len(key.shape):
                continue
            dists = [abs(math.log2(max(a, 1) / max(b, 1))) for a, b in zip(e.key.shape, key.shape)]
            if max(dists) > NEAREST_MAX:
                continue
            d = (abs(math.log2(max(e.key.threads, 1) / max(key.threads, 1))), e.key.bucket != key.bucket, sum(dists))
            if best_d is None or d < best_d:
                best, best_d = e, d
        if best is not None:
            best.match = "nearest"
        return best

    # ------------------------------------------------------------------ files
    def export(self, dest: Path | str) -> int:
        rows = self.entries()
        doc = {"format": EXPORT_FORMAT, "schema": SCHEMA,
               "entries": [{**{f: getattr(e.key, f) for f in KEY_FIELDS}, "shape": list(e.key.shape),
                            "threads": e.key.threads,
                            "pins": json.loads(_pins_json(e.pins)), "best_ms": e.best_ms, "times": e.times,
                            "created": e.created} for e in rows]}
        Path(dest).write_text(json.dumps(doc, indent=1))
        return len(rows)

    def import_file(self, src: Path | str) -> int:
        """Store every entry of an exported file (an entry replaces the same key's); returns the count.
        A file of another format or schema is refused (``ValueError``) before anything is written."""
        doc = json.loads(Path(src).read_text())
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT or doc.get("schema") != SCHEMA:
            raise ValueError(f"{src}: not a Tessera tuning export of schema {SCHEMA}")
        entries = []
        for i, d in enumerate(doc.get("entries", [])):
            try:
                key = Key(str(d["family"]), int(d["version"]), str(d["target"]), str(d["arch"]),
                          str(d["features"]), str(d["dtype"]), tuple(int(x) for x in d["shape"]),
                          int(d["threads"]))
                pins = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(d["pins"]).items()}
                entries.append(Entry(key, pins, float(d["best_ms"]), dict(d.get("times", {})),
                                     float(d.get("created", 0.0))))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{src}: entry {i} is malformed ({e})") from None
        for e in entries:
            self.store(e)
        return len(entries)


def as_dict(entry: Entry) -> dict:
    return asdict(entry)
