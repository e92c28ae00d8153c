"""The compile cache: what it reads, what it keys on, who it trusts, how threads share it,
and the reproducer a compiler failure leaves behind.

Every test runs with its own cache directory and an empty in-memory cache, and every
result is compared with a float64 oracle: a cache that hands back the wrong code fails
the numbers, not just a status string.  Tests run as root here, so ownership and
read-only directories are also simulated (``cache.current_uid``, a write raising
``EROFS``/``ENOSPC``) where the kernel would not stop root.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from oracle import assert_close, f64, softmax
from tessera.errors import CacheUntrustedError, CompilerInternalError, PassFailedError
from tessera.frontend import compile as C
from tessera.runtime import cache

TOL = 1e-5


@pytest.fixture
def cdir(tmp_path, monkeypatch) -> Path:
    """A fresh cache directory (not yet created) and an empty in-memory cache."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(d))
    monkeypatch.delenv("TESSERA_NO_CACHE", raising=False)
    monkeypatch.delenv("TESSERA_REPRO_DIR", raising=False)
    monkeypatch.setattr(C, "_MEMORY", OrderedDict())
    return d


def prog_a(x, y):
    return ts.ops.softmax(x) * 2.0 + y


def oracle_a(x, y):
    return softmax(f64(x)) * 2.0 + f64(y)


def prog_b(x, y):
    return x * y - 3.0


def oracle_b(x, y):
    return f64(x) * f64(y) - 3.0


def inputs(rng):
    return (rng.standard_normal((6, 40)).astype(np.float32), rng.standard_normal((6, 40)).astype(np.float32))


def run(fn, args):
    """Compile ``fn`` afresh (a new JitFunction: no variant cache) and run it: (status, key, out)."""
    art = ts.compile(fn, *args)
    return art.compiled.cache_status, art.compiled.key, art(*args)


def entries(d: Path) -> list[Path]:
    return sorted(d.rglob("*.tsr"))


def temp_files(d: Path) -> list[Path]:
    return sorted(d.rglob(".tmp-*"))


def forget(monkeypatch):
    monkeypatch.setattr(C, "_MEMORY", OrderedDict())


# --------------------------------------------------------------------------- directory
def test_cache_directory_and_shards_are_created_0700(cdir, rng):
    x, y = inputs(rng)
    status, key, out = run(prog_a, (x, y))
    assert status == "compiled"
    assert_close(out, oracle_a(x, y), TOL, "fresh compile")
    assert stat.S_IMODE(os.stat(cdir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cdir / key[:2]).st_mode) == 0o700
    (entry,) = entries(cdir)
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o600


def test_untrusted_directory_or_entry_is_refused(cdir, rng, monkeypatch):
    x, y = inputs(rng)
    _, key, _ = run(prog_a, (x, y))
    forget(monkeypatch)
    # a directory owned by someone else
    monkeypatch.setattr(cache, "current_uid", lambda: os.geteuid() + 4242)
    with pytest.raises(CacheUntrustedError) as info:
        run(prog_a, (x, y))
    assert info.value.code == "CACHE_UNTRUSTED" and str(cdir) in str(info.value)
    with pytest.raises(CacheUntrustedError):
        cache.store("ab" * 32, {"x": 1})
    monkeypatch.undo()
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(cdir))
    monkeypatch.delenv("TESSERA_NO_CACHE", raising=False)
    forget(monkeypatch)
    # a directory others may write
    os.chmod(cdir, 0o777)
    with pytest.raises(CacheUntrustedError, match="writable by others"):
        cache.load(key)
    os.chmod(cdir, 0o770)       # group write (a private group under umask 002) is accepted
    assert cache.load(key) is not None
    os.chmod(cdir, 0o700)
    # an entry owned by someone else (chown needs root; the uid check is the same code path)
    (entry,) = entries(cdir)
    if os.geteuid() == 0:
        os.chown(entry, 4242, 4242)
        with pytest.raises(CacheUntrustedError, match="entry"):
            run(prog_a, (x, y))
        assert entry.exists()       # refused, not deleted
        os.chown(entry, 0, 0)
    status, _, out = run(prog_a, (x, y))
    assert status == "disk"
    assert_close(out, oracle_a(x, y), TOL, "trusted again")


# --------------------------------------------------------------------------- what is read
def _plant_key_file(cdir: Path, key: str, kind: str, valid_elsewhere: Path) -> Path:
    p = cdir / key[:2] / f"{key}.tsr"
    p.unlink()
    if kind == "link-to-dev-zero":
        p.symlink_to("/dev/zero")
    elif kind == "link-to-valid-entry":
        p.symlink_to(valid_elsewhere)
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
        (p / "inside").write_text("not an entry")
    elif kind == "char-device":
        try:
            os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))     # /dev/zero's numbers
        except (PermissionError, OSError):
            pytest.skip("mknod needs privileges")
    return p


def _load_with_deadline(key: str, seconds: float = 20.0):
    out: list = []
    t = threading.Thread(target=lambda: out.append(cache.load(key)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "cache.load hung"
    return out[0]


@pytest.mark.parametrize("kind", ["link-to-dev-zero", "link-to-valid-entry", "fifo", "directory", "char-device"])
def test_only_regular_files_are_read(cdir, rng, monkeypatch, tmp_path, kind):
    x, y = inputs(rng)
    _, key, _ = run(prog_a, (x, y))
    valid = tmp_path / "elsewhere.tsr"
    shutil.copy(entries(cdir)[0], valid)
    _plant_key_file(cdir, key, kind, valid)
    assert _load_with_deadline(key) is None
    forget(monkeypatch)
    status, _, out = run(prog_a, (x, y))
    assert status == "compiled"
    assert_close(out, oracle_a(x, y), TOL, kind)
    assert not temp_files(cdir)
    if kind == "directory":     # a non-empty directory is not deleted; nothing is written over it
        assert (cdir / key[:2] / f"{key}.tsr" / "inside").exists()
    else:                       # the planted thing was discarded and a good entry written
        forget(monkeypatch)
        assert run(prog_a, (x, y))[0] == "disk"
        assert valid.exists()   # a link's target is not touched


def test_a_followed_link_is_caught(cdir, rng, monkeypatch, tmp_path):
    """Teeth for the test above: without O_NOFOLLOW the link to a valid entry is read."""
    x, y = inputs(rng)
    _, key, _ = run(prog_a, (x, y))
    valid = tmp_path / "elsewhere.tsr"
    shutil.copy(entries(cdir)[0], valid)
    _plant_key_file(cdir, key, "link-to-valid-entry", valid)
    monkeypatch.setattr(cache.os, "O_NOFOLLOW", 0)
    assert _load_with_deadline(key) is not None


def test_entry_size_is_bounded(cdir, rng, monkeypatch):
    x, y = inputs(rng)
    _, key, _ = run(prog_a, (x, y))
    size = entries(cdir)[0].stat().st_size
    assert size < cache.MAX_ENTRY_BYTES // 100
    assert cache.load(key) is not None
    # well under this entry's size: the next entry's header carries another creation time, whose
    # text may be a byte or two shorter (round(t, 3) drops trailing zeros), and would fit size - 1
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", size // 2)
    assert cache.load(key) is None and not entries(cdir)          # too big: discarded unread
    forget(monkeypatch)
    status, _, out = run(prog_a, (x, y))
    assert status == "compiled" and not entries(cdir)            # and not written either
    assert_close(out, oracle_a(x, y), TOL, "over the cap")


# --------------------------------------------------------------------------- what an entry says
def test_entry_of_another_program_is_not_run(cdir, rng, monkeypatch):
    x, y = inputs(rng)
    _, key_a, _ = run(prog_a, (x, y))
    _, key_b, _ = run(prog_b, (x, y))
    assert key_a != key_b
    path_a = cdir / key_a[:2] / f"{key_a}.tsr"
    shutil.copy(cdir / key_b[:2] / f"{key_b}.tsr", path_a)
    forget(monkeypatch)
    status, _, out = run(prog_a, (x, y))
    assert status == "compiled"
    assert_close(out, oracle_a(x, y), TOL, "A after B's entry was copied over it")


def test_forged_entry_would_fail_the_oracle(cdir, rng, monkeypatch):
    """Teeth: B's code under A's key, with the recorded key forged too, is loaded (only a key can
    be checked) and the float64 comparison of the test above catches the wrong program."""
    x, y = inputs(rng)
    _, key_a, _ = run(prog_a, (x, y))
    _, key_b, _ = run(prog_b, (x, y))
    entry_b = cache.load(key_b)
    cache.store(key_a, entry_b)                    # records key_a
    forget(monkeypatch)
    status, _, out = run(prog_a, (x, y))
    assert status == "disk"
    with pytest.raises(AssertionError):
        assert_close(out, oracle_a(x, y), TOL, "forged")


def _damage(entry: dict, how: str) -> dict:
    e = dict(entry)
    if how == "no-program":
        del e["program"]
    elif how == "program-wrong-type":
        e["program"] = "a string"
    elif how == "meta-wrong-type":
        e["meta"] = ["not", "a", "dict"]
    elif how == "kernels-wrong-type":
        e["kernels"] = 7
    elif how == "obj-wrong-type":
        e["objs"] = ["text, not bytes"]
    elif how == "objs-empty":
        e["objs"] = []
    elif how == "missing-symbol":                 # passes the field checks; CODEGEN when loaded
        e["kernels"] = list(e["kernels"]) + ["k99_not_in_the_object"]
    return e


DAMAGE = ["no-program", "program-wrong-type", "meta-wrong-type", "kernels-wrong-type", "obj-wrong-type",
          "missing-symbol", "objs-empty"]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_entry_with_valid_checksum_is_discarded(cdir, rng, monkeypatch, how):
    x, y = inputs(rng)
    _, key, _ = run(prog_a, (x, y))
    cache.store(key, _damage(cache.load(key), how))         # a valid checksum over a bad entry
    if how != "missing-symbol":
        assert cache.load(key, validate=lambda e: C.entry_ok(e, "cpu")) is None
    statuses = []
    for _ in range(2):
        forget(monkeypatch)
        status, _, out = run(prog_a, (x, y))
        statuses.append(status)
        assert_close(out, oracle_a(x, y), TOL, how)
    assert statuses == ["compiled", "disk"]   # the first run discarded and rewrote it; the second loaded that


@pytest.mark.parametrize("how", DAMAGE[:-1])
def test_entry_checks_have_teeth(cdir, rng, how):
    """With the field checks planted away, a damaged entry passes ``load``."""
    x, y = inputs(rng)
    _, key, _ = run(prog_a, (x, y))
    cache.store(key, _damage(cache.load(key), how))
    assert cache.load(key, validate=lambda e: True) is not None


@pytest.mark.parametrize("how", ["corrupt", "truncated", "empty", "garbage", "readonly-valid",
                                 "readonly-corrupt"])
def test_corrupt_truncated_and_readonly_entries(cdir, rng, monkeypatch, how):
    x, y = inputs(rng)
    _, key, first = run(prog_a, (x, y))
    assert_close(first, oracle_a(x, y), TOL, "first")
    (p,) = entries(cdir)
    data = bytearray(p.read_bytes())
    if how in ("corrupt", "readonly-corrupt"):
        i = int(rng.integers(len(cache.MAGIC) + 32, len(data)))
        data[i] ^= 0x5A
        p.write_bytes(bytes(data))
    elif how == "truncated":
        p.write_bytes(bytes(data[: int(rng.integers(1, len(data)))]))
    elif how == "empty":
        p.write_bytes(b"")
    elif how == "garbage":
        p.write_bytes(rng.integers(0, 256, len(data), dtype=np.uint8).tobytes())
    if how.startswith("readonly"):
        os.chmod(p, 0o400)
        os.chmod(p.parent, 0o500)
        os.chmod(cdir, 0o500)

        def read_only(*a, **k):        # root ignores the modes: a read-only file system does not
            raise OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(cache.tempfile, "mkstemp", read_only)
    try:
        for _ in range(2):
            forget(monkeypatch)
            status, _, out = run(prog_a, (x, y))
            assert_close(out, oracle_a(x, y), TOL, how)
            if how == "readonly-corrupt":
                assert status == "compiled"          # nothing could be written: compiled each time
            elif how == "readonly-valid":
                assert status == "disk"
        if how not in ("readonly-valid", "readonly-corrupt"):
            assert status == "disk"                  # the damaged entry was replaced
    finally:
        os.chmod(cdir, 0o700)
        os.chmod(p.parent, 0o700)
    assert not temp_files(cdir)


def test_failed_write_leaves_no_temp_file(cdir, rng, monkeypatch):
    x, y = inputs(rng)

    def full(f, data):
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(cache, "_write_all", full)
    status, _, out = run(prog_a, (x, y))
    assert status == "compiled"
    assert_close(out, oracle_a(x, y), TOL, "full disk")
    assert cdir.exists() and not temp_files(cdir) and not entries(cdir)
    # teeth: were the temp file not removed, the check above would see it
    monkeypatch.setattr(cache.os, "unlink", lambda *a, **k: None)
    forget(monkeypatch)
    run(prog_b, (x, y))
    assert temp_files(cdir)


# --------------------------------------------------------------------------- keys
def _key_tracks_sources(tmp_path: Path) -> bool:
    """Point the source hash at a copy of the package, change one byte of one pass: does the
    key change?"""
    def clear():
        getattr(cache.source_hash, "cache_clear", lambda: None)()
    copy = tmp_path / "src"
    shutil.copytree(cache.SOURCE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    real_root = cache.SOURCE_ROOT
    cache.SOURCE_ROOT = copy
    clear()
    try:
        before = cache.make_key("graph", "spec")
        victim = copy / "passes" / "pipeline.py"
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
        clear()
        return cache.make_key("graph", "spec") != before
    finally:
        cache.SOURCE_ROOT = real_root
        clear()


def test_key_tracks_compiler_sources(tmp_path, monkeypatch):
    assert cache.hash_tree(cache.SOURCE_ROOT) == cache.source_hash()
    assert _key_tracks_sources(tmp_path)


def test_key_without_source_hash_is_caught(tmp_path, monkeypatch):
    """Teeth: the source hash dropped from the key (a constant in its place)."""
    monkeypatch.setattr(cache, "source_hash", lambda: "constant")
    assert not _key_tracks_sources(tmp_path)


def _features_change_key(isa, graph="g", spec="s") -> bool:
    other = dataclasses.replace(isa, llvm_features=isa.llvm_features.replace("+avx2", "-avx2"))
    assert other.llvm_features != isa.llvm_features
    return C.compile_key(graph, spec, isa, "cpu") != C.compile_key(graph, spec, other, "cpu")


def test_key_holds_cpu_features_and_versions(cdir, rng):
    x, y = inputs(rng)
    art = ts.compile(prog_a, x, y)
    c = art.compiled
    isa = C.resolve_arch("cpu", None)
    assert c.key == C.compile_key(c.layer_ir["graph"], c.spec, isa, "cpu")   # what compile_graph used
    assert _features_change_key(isa)
    cpu_other = dataclasses.replace(isa, llvm_cpu="skylake-avx512")
    assert C.compile_key("g", "s", isa, "cpu") != C.compile_key("g", "s", cpu_other, "cpu")
    v = cache.tool_versions()
    assert "xdsl=" in v and "llvmlite=" in v and "llvm=" in v and "?" not in v


def test_key_without_features_is_caught(monkeypatch):
    """Teeth: the feature string dropped from the key."""
    real = cache.make_key
    monkeypatch.setattr(cache, "make_key", lambda *parts: real(*[p for p in parts if not p.startswith("features=")]))
    assert not _features_change_key(C.resolve_arch("cpu", None))


def test_key_tracks_gpu_assembler(tmp_path, monkeypatch):
    from tessera import toolchain
    tool = tmp_path / "ptxas"
    tool.write_bytes(b"#!/bin/sh\necho 1\n")
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: str(tool))
    isa = C.resolve_arch("nvidia", "sm_90")
    k1 = C.compile_key("g", "s", isa, "nvidia")
    tool.write_bytes(b"#!/bin/sh\necho 2 -- a new version\n")
    assert C.compile_key("g", "s", isa, "nvidia") != k1
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: None)
    assert C.compile_key("g", "s", isa, "nvidia") != k1
    assert cache.toolchain_identity("cpu") == ""


# --------------------------------------------------------------------------- threads, memory
def _cold_start_in_threads(monkeypatch, rng, lock_per_key: bool) -> dict[str, int]:
    """8 threads (4 per program) call two fresh jitted functions at once; builds per key."""
    builds: dict[str, int] = {}
    real_build = C._build

    def counting_build(module, passes, isa, spec, graph_text):
        key = C.compile_key(graph_text, spec, isa, "cpu")
        builds[key] = builds.get(key, 0) + 1
        time.sleep(0.3)      # widen the window in which the other threads arrive
        return real_build(module, passes, isa, spec, graph_text)
    monkeypatch.setattr(C, "_build", counting_build)
    if not lock_per_key:
        monkeypatch.setattr(C, "_key_lock", lambda key: nullcontext())
    x, y = inputs(rng)
    fa, fb = ts.jit(prog_a), ts.jit(prog_b)
    barrier = threading.Barrier(8)
    results, errors = {}, []

    def worker(i):
        try:
            barrier.wait()
            f = fa if i % 2 == 0 else fb
            results[i] = f(x, y)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for i, out in results.items():
        assert_close(out, (oracle_a if i % 2 == 0 else oracle_b)(x, y), TOL, f"thread {i}")
    assert len(results) == 8
    return builds


def test_one_compile_per_key_across_threads(cdir, rng, monkeypatch):
    builds = _cold_start_in_threads(monkeypatch, rng, lock_per_key=True)
    assert len(builds) == 2 and set(builds.values()) == {1}, builds
    assert len(entries(cdir)) == 2
    assert not C._KEY_LOCKS                 # the per-key locks are dropped when unused


def test_one_compile_per_key_has_teeth(cdir, rng, monkeypatch):
    builds = _cold_start_in_threads(monkeypatch, rng, lock_per_key=False)
    print("builds without the per-key lock:", sorted(builds.values()))
    assert sum(builds.values()) > 2, builds


def test_memory_cache_is_a_bounded_lru(cdir, rng, monkeypatch):
    monkeypatch.setattr(C, "MEMORY_MAX", 3)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    scalars = [float(s) for s in rng.uniform(0.5, 4.0, 5)]
    keys = []
    for i, s in enumerate(scalars):
        art = ts.compile(ts.jit(lambda x, s: x * s + 1.0, static_argnames="s"), x, s)
        keys.append(art.compiled.key)
        assert_close(art(x, s), f64(x) * s + 1.0, TOL, f"scalar {s}")
        if i == 2:                            # touch the first: it becomes the most recent
            assert C._memory_get(keys[0]) is not None
    assert len(set(keys)) == 5
    assert list(C._MEMORY) == [keys[0], keys[3], keys[4]]
    # an evicted graph comes back from disk
    art = ts.compile(ts.jit(lambda x, s: x * s + 1.0, static_argnames="s"), x, scalars[1])
    assert art.compiled.cache_status == "disk"
    assert_close(art(x, scalars[1]), f64(x) * scalars[1] + 1.0, TOL, "evicted, reloaded")
    assert len(C._MEMORY) == 3


def test_default_memory_bound():
    assert 16 <= C.MEMORY_MAX <= 4096


# --------------------------------------------------------------------------- reproducers
def _opt(args: list[str], prelude: str = "") -> subprocess.CompletedProcess:
    code = f"import sys\n{prelude}\nfrom tessera.tools.opt import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)


PLANT = """
import tessera.passes.pipelines  # noqa: F401 - registers the passes
from tessera.passes.base import PASSES
def _boom(self, ctx, module):
    raise RuntimeError("planted internal error")
PASSES["fuse-elementwise"].apply = _boom
"""


def _header_pipeline(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith("// tessera-opt: ")]
    arg = line[len("// tessera-opt: "):]
    assert arg.startswith("--pass-pipeline='") and arg.endswith("'")
    return arg[len("--pass-pipeline='"):-1]


def test_internal_pass_error_leaves_a_replayable_reproducer(cdir, rng, monkeypatch, tmp_path):
    from tessera.passes.base import PASSES
    repro_dir = tmp_path / "repro"
    monkeypatch.setenv("TESSERA_REPRO_DIR", str(repro_dir))

    def boom(self, ctx, module):
        raise RuntimeError("planted internal error")
    monkeypatch.setattr(PASSES["fuse-elementwise"], "apply", boom)
    x, y = inputs(rng)
    with pytest.raises(PassFailedError) as info:
        ts.compile(prog_a, x, y)
    msg = str(info.value)
    assert "planted internal error" in msg and "reproducer: " in msg
    assert isinstance(info.value.__cause__, RuntimeError)       # the chain is kept
    (path,) = repro_dir.glob("repro-*.mlir")
    assert str(path) in msg
    text = path.read_text()
    spec = _header_pipeline(text)
    assert spec.startswith("tessera-cpu{arch=") and "target=cpu" in text and "features=+" in text
    assert "tessera.softmax" in text
    # replayed in a fresh process: without the plant the passes run to the Target IR ...
    ok = _opt([str(path), f"--pass-pipeline={spec}"])
    assert ok.returncode == 0, ok.stderr
    assert "tessera_x86.launch" in ok.stdout
    # ... and with it, the same failure
    bad = _opt([str(path), f"--pass-pipeline={spec}"], prelude=PLANT)
    assert bad.returncode == 1 and "PASS_FAILED" in bad.stderr and "planted internal error" in bad.stderr
    monkeypatch.undo()
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(cdir))
    forget(monkeypatch)
    status, _, out = run(prog_a, (x, y))   # nothing bad was cached
    assert status == "compiled"
    assert_close(out, oracle_a(x, y), TOL, "after the failure")


def test_internal_error_after_the_passes_is_coded(cdir, rng, monkeypatch):
    def broken(*a, **k):
        raise ValueError("planted translation bug")
    from tessera.codegen import x86 as cg
    monkeypatch.setattr(cg, "translate", broken)
    x, y = inputs(rng)
    with pytest.raises(CompilerInternalError) as info:
        ts.compile(prog_b, x, y)
    e = info.value
    assert e.code == "COMPILER_INTERNAL" and "planted translation bug" in str(e)
    (path,) = (cdir / "repro").glob("repro-*.mlir")
    assert str(path) in str(e)
    assert stat.S_IMODE(os.stat(cdir / "repro").st_mode) == 0o700
    assert _header_pipeline(path.read_text()).startswith("tessera-cpu{arch=")


def test_refusals_leave_no_reproducer(cdir, rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(ts.TesseraError) as info:
        ts.compile(lambda x: x + 1.0, x, schedule={"bogus": 1})
    assert info.value.code == "SCHEDULE_ILLEGAL" and "reproducer" not in str(info.value)
    assert not (cdir / "repro").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_child_of_a_fork_is_not_blocked_by_a_parent_compile(cdir, rng):
    """A thread of the parent is inside a compile (holding its key's lock and the memory lock)
    when another thread forks: the child compiles and runs that same graph."""
    x, y = inputs(rng)
    key = "k" * 64
    held, release = threading.Event(), threading.Event()

    def holder():
        with C._key_lock(key):
            with C._MEMORY_LOCK:
                held.set()
                release.wait(60)
    t = threading.Thread(target=holder)
    t.start()
    held.wait(60)
    pid = os.fork()
    if pid == 0:                    # the child: must not touch pytest; report by exit status
        code = 1
        try:
            done = threading.Event()

            def child():
                with C._key_lock(key):
                    pass
                out = ts.jit(prog_b)(x, y)
                if np.allclose(f64(out), oracle_b(x, y), rtol=1e-5, atol=1e-5):
                    done.set()
            w = threading.Thread(target=child, daemon=True)
            w.start()
            w.join(120)
            code = 0 if done.is_set() else 2
        finally:
            os._exit(code)
    release.set()
    t.join(60)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
