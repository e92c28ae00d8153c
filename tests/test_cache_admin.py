"""The managed compile cache: ``tessera cache info | ls | clear | prune``, the size cap with
least-recently-used eviction, and two processes sharing one directory (issue 29).

Each test has its own cache directory.  Entries are written through ``cache.store`` (the
compiler's own path); one test compiles a real function and checks its numbers too.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera.errors import CacheSizeError
from tessera.frontend import compile as C
from tessera.runtime import cache, cache_admin
from tessera.tools import cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cdir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(d))
    monkeypatch.delenv("TESSERA_CACHE_MAX", raising=False)
    monkeypatch.delenv("TESSERA_NO_CACHE", raising=False)
    monkeypatch.setattr(C, "_MEMORY", OrderedDict())
    monkeypatch.setattr(cache_admin, "_seen", {"dir": None, "room": 0, "writes": 0})
    return d


def _key(i: int) -> str:
    return f"{i:02x}" + f"{i:062x}"


def _put(i: int, nbytes: int = 4000, when: float | None = None, name: str | None = None) -> Path:
    assert cache.store(_key(i), {"blob": os.urandom(nbytes)}, {"function": name or f"fn{i}", "target": "cpu"})
    p = cache._path(_key(i))
    if when is not None:
        os.utime(p, (when, when))
    return p


def _cli(capsys, *argv) -> str:
    assert cli.main(["cache", *argv]) == 0
    return capsys.readouterr().out


def test_info_ls_clear(cdir, capsys):
    paths = [_put(i) for i in range(3)]
    (cdir / "tuning").mkdir()
    (cdir / "tuning" / "db.json").write_text("{}")
    (cdir / "repro").mkdir()
    (cdir / "repro" / "x.mlir").write_text("x")
    info = cache_admin.info()
    assert info["entries"] == 3 and info["bytes"] == sum(p.stat().st_size for p in paths)
    assert info["dir"] == str(cdir) and info["stale"] == 0
    out = _cli(capsys, "info")
    assert str(cdir) in out and "3 (0 of an older" in out
    out = _cli(capsys, "ls")
    assert all(f"fn{i}" in out and _key(i)[:16] in out for i in range(3))
    assert "removed 3 entries" in _cli(capsys, "clear")
    assert cache_admin.info()["entries"] == 0 and cache.load(_key(0)) is None
    assert (cdir / "tuning" / "db.json").exists() and (cdir / "repro" / "x.mlir").exists()
    _cli(capsys, "clear", "--tuning", "--repro")
    assert not (cdir / "tuning").exists() and not (cdir / "repro").exists()


def test_real_compile_is_listed_and_served(cdir, rng, capsys):
    @ts.jit
    def scaled_sum(x, y):
        return x * 2.0 + y
    x, y = (rng.standard_normal((6, 5)).astype(np.float32) for _ in range(2))
    want = x.astype(np.float64) * 2 + y
    np.testing.assert_allclose(scaled_sum(x, y), want, rtol=1e-6)
    (e,) = cache_admin.listing()
    assert e.meta["function"] == "scaled_sum" and e.meta["target"] == "cpu"
    assert e.meta["version"] == cache.source_hash()
    assert "scaled_sum" in _cli(capsys, "ls")
    old = time.time() - 1000
    os.utime(e.path, (old, old))
    C._MEMORY.clear()                       # the next compile reads the disk entry
    again = ts.jit(scaled_sum.fn)
    np.testing.assert_allclose(again(x, y), want, rtol=1e-6)
    assert again.compile(x, y).compiled.cache_status == "disk"
    assert e.path.stat().st_mtime > old + 500   # a hit marks it used


def test_lru_eviction_keeps_recently_used(cdir, monkeypatch):
    now = time.time()
    a, b, c = (_put(i, when=now - 100 + 10 * i) for i in range(3))   # a oldest, then b, then c
    size = a.stat().st_size
    monkeypatch.setenv("TESSERA_CACHE_MAX", str(int(size * 3.5)))
    assert cache.load(_key(0)) is not None   # a used now: b is the least recently used
    d = _put(3)
    assert not b.exists() and a.exists() and c.exists() and d.exists()
    assert sum(e.size for e in cache_admin.scan()) <= size * 3.5


def test_lru_has_teeth(cdir, monkeypatch):
    """Without the touch on a hit, the entry just used is the one evicted: the check above fails."""
    monkeypatch.setattr(cache, "_touch", lambda p: None)
    with pytest.raises(AssertionError):
        test_lru_eviction_keeps_recently_used(cdir, monkeypatch)


def test_the_entry_just_written_is_kept(cdir, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_MAX", "1000")   # smaller than one entry
    _put(0, when=time.time() - 50)
    p = _put(1)
    assert p.exists() and [e.path for e in cache_admin.scan()] == [p]


def test_prune_older_compiler_and_max_size(cdir, monkeypatch, capsys):
    monkeypatch.setattr(cache, "source_hash", lambda: "an-older-one")
    old = _put(0)
    monkeypatch.undo()
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(cdir))
    now = time.time()
    fresh = [_put(i, when=now - 100 + i) for i in range(1, 4)]
    assert cache_admin.info()["stale"] == 1
    assert "(older compiler)" in _cli(capsys, "ls")
    # entries differ by a few bytes (the metadata's timestamp): room for the two largest kept ones
    size = max(p.stat().st_size for p in fresh[1:])
    out = _cli(capsys, "prune", "--max-size", str(2 * size))
    assert "removed 1 entries of an older compiler version and 1 least recently used" in out
    assert not old.exists() and not fresh[0].exists() and fresh[1].exists() and fresh[2].exists()


@pytest.mark.parametrize("text,want", [("2G", 2 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29),
                                       ("4096", 4096), ("64kb", 64 << 10), ("none", None)])
def test_parse_size(text, want):
    assert cache_admin.parse_size(text) == want


def test_bad_size_is_coded(cdir, monkeypatch, capsys):
    with pytest.raises(CacheSizeError) as e:
        cache_admin.parse_size("lots")
    assert e.value.code == "CACHE_SIZE"
    assert cli.main(["cache", "prune", "--max-size", "2X"]) == 1
    assert "CACHE_SIZE" in capsys.readouterr().err
    monkeypatch.setenv("TESSERA_CACHE_MAX", "big")
    with pytest.raises(CacheSizeError):
        _put(0)


def test_scans_are_skipped_only_far_under_the_cap(cdir, monkeypatch):
    scans = []
    real = cache_admin.scan
    monkeypatch.setattr(cache_admin, "scan", lambda *a, **k: scans.append(1) or real(*a, **k))
    _put(0)
    probe = cache._path(_key(0)).stat().st_size
    monkeypatch.setenv("TESSERA_CACHE_MAX", str(probe * 10))
    for i in range(1, 12):
        _put(i)
    # a scan at the first write under this cap; skipped while under half; every write once past it
    assert 4 <= len(scans) <= 10
    assert sum(e.size for e in cache_admin.scan()) <= probe * 10


def test_vanished_files_are_a_miss(cdir, monkeypatch):
    """Another process removed entries under this one's scan: eviction, clear and load go on."""
    now = time.time()
    paths = [_put(i, when=now - 100 + i) for i in range(4)]
    listed = cache_admin.scan()
    for p in paths[:2]:
        p.unlink()
    size = sum(p.stat().st_size for p in paths[2:])
    assert cache_admin._evict(listed, 0) == (2, size)
    assert cache.load(_key(0)) is None
    # teeth: an eviction that does not expect a vanished file crashes on the same list
    monkeypatch.setattr(cache_admin, "_remove", lambda p: os.unlink(p) or True)
    with pytest.raises(FileNotFoundError):
        cache_admin._evict(listed, 0)


WORKER = textwrap.dedent("""
    import os, random, sys
    from tessera.runtime import cache
    me, n = int(sys.argv[1]), int(sys.argv[2])
    rnd, keys = random.Random(me), []
    for i in range(n):
        k = ("%02x" % (i % 4)) + "%062x" % (me * 1000 + i)   # four shards, shared by both writers
        keys.append(k)
        assert cache.store(k, {"blob": bytes([me]) * 3000, "who": me}, {"function": "w%d" % me})
        e = cache.load(rnd.choice(keys))   # may have been evicted by either process: a miss
        assert e is None or e["blob"] == bytes([me]) * 3000
    print("ok")
""")


def test_two_processes_share_a_capped_cache(cdir):
    env = dict(os.environ, TESSERA_CACHE_MAX="40K", PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(me), "60"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for me in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]
    left = cache_admin.scan()
    cap = 40 << 10
    assert 0 < sum(e.size for e in left) <= cap + left[0].size   # under the cap (one write may be in flight)
    for e in left:                                                # every survivor whole
        got = cache.load(e.key)
        assert got is not None and got["blob"] == bytes([got["who"]]) * 3000
    assert not [p for p in cdir.rglob(".tmp-*")]
