"""A large CPU module compiled by LLVM on two cores: its kernels split into two modules, one
compiled in this process while a helper process compiles the other.

llvmlite serialises every call into LLVM behind one process-wide lock, so threads do not run
LLVM in parallel (measured: 1.53 s for the Llama example's module whole, 1.55 s split in 16
modules on 2 threads); a second process does.  The helper runs ``llvm_core.py`` as a script
(llvmlite only: it starts in about 0.1 s) on the part given to it, through files.

The split is textual, on the module llvmlite prints: a kernel and its ``.entry`` wrapper go to
one part with every declaration, the internal (``alwaysinline`` math) functions they call,
and the metadata.  Anything else at top level (a global, a definition that is neither a kernel,
its entry nor internal, a kernel calling another kernel) leaves the module whole.

The parts compile with the same function in both processes (``llvm_core.object_code``), so the
objects do not depend on which process built which part.  An abort (SIGABRT) of the helper is
an ``LLVMAbortError`` (compiled here, that input would have killed this process); any other
failure of the helper compiles its part here.  ``TESSERA_LLVM_JOBS=1`` turns the helper off.
"""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile

from tessera.codegen import llvm_core
from tessera.errors import LLVMAbortError

# below this much IR text, one process: the helper's start (~0.1 s CPU) would eat the gain
# (LLVM takes about 0.6 s per MB of the CPU lane's IR)
MIN_CHARS = 600_000
MIN_OPS = 4_000          # about as many Target IR ops (~140 characters of LLVM IR each)
_NAME = re.compile(r'@"([^"]+)"|@([-\w.$]+)')


def _defined_name(line: str) -> str | None:
    m = _NAME.search(line)
    return (m.group(1) or m.group(2)) if m else None


def split(text: str, kernels: list[str], n: int, only: list[str] | None = None) -> list[str] | None:
    """The module (whose kernels are ``kernels``) as ``n`` module texts (or fewer), each holding
    whole kernels with their ``.entry``, about equal in size (``only``: of these kernels alone);
    None where the module does not have the expected shape."""
    lines = text.split("\n")
    header, declares, meta = [], [], []
    defs: dict[str, str] = {}
    internal: set[str] = set()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("define "):
            name = _defined_name(ln)
            try:
                j = lines.index("}", i)
            except ValueError:
                return None
            if name is None or name in defs:
                return None
            defs[name] = "\n".join(lines[i:j + 1])
            if ln.startswith("define internal ") or ln.startswith("define private "):
                internal.add(name)
            i = j + 1
            continue
        if ln.startswith("declare "):
            declares.append(ln)
        elif ln.startswith("!"):
            meta.append(ln)
        elif ln.startswith(("target ", "; ModuleID", "source_filename")) or not ln.strip():
            header.append(ln)
        else:
            return None                      # a global, attribute group, ...: keep it whole
        i += 1
    if set(defs) - internal != set(kernels) | {k + ".entry" for k in kernels}:
        return None
    needs: dict[str, set[str]] = {}          # kernel -> the internal functions it reaches
    chosen = list(kernels if only is None else only)
    if not set(chosen) <= set(kernels):
        return None
    for k in chosen:
        seen: set[str] = set()
        todo = [defs[k], defs[k + ".entry"]]
        while todo:
            for m in _NAME.finditer(todo.pop()):
                name = m.group(1) or m.group(2)
                if name in internal and name not in seen:
                    seen.add(name)
                    todo.append(defs[name])
                elif name in defs and name not in internal and name not in (k, k + ".entry"):
                    return None              # one kernel calls another
        needs[k] = seen
    out = []
    for group in balance([len(defs[k]) for k in chosen], n):
        mine = {chosen[g] for g in group}
        want = set().union(*(needs[k] for k in mine)) | mine | {k + ".entry" for k in mine}
        body = [defs[name] for name in defs if name in want]       # the module's own order
        out.append("\n".join(header + declares + body + meta) + "\n")
    return out


def balance(sizes: list[int], n: int) -> list[list[int]]:
    """Indices of ``sizes`` in at most ``n`` groups of about equal sum (largest first), each
    group in index order."""
    groups: list[list[int]] = [[] for _ in range(n)]
    sums = [0] * n
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        g = sums.index(min(sums))
        groups[g].append(i)
        sums[g] += sizes[i]
    return [sorted(g) for g in groups if g]


def jobs() -> int:
    try:
        want = int(os.environ.get("TESSERA_LLVM_JOBS", "2"))
    except ValueError:
        want = 2
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(want, cores, 2))


def helper_command(src: str, dst: str) -> list[str]:
    return [sys.executable, llvm_core.__file__, src, dst]


class Helper:
    """``parts`` compiled by a helper process, started now; :meth:`result` waits for it."""

    def __init__(self, parts: list[str], cpu: str, features: str, opt: int, loop_passes: bool):
        self.parts, self.args = parts, (cpu, features, opt, loop_passes)
        self.dir = tempfile.TemporaryDirectory(prefix="tessera-llvm-")
        src, self.dst = os.path.join(self.dir.name, "in.pkl"), os.path.join(self.dir.name, "out.pkl")
        with open(src, "wb") as f:
            pickle.dump((parts, cpu, features, opt, loop_passes), f)
        try:
            self.proc = subprocess.Popen(helper_command(src, self.dst), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError:
            self.proc = None

    def abandon(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.communicate()
        self.dir.cleanup()

    def result(self) -> list[bytes]:
        """The objects; an abort of the helper is ``LLVMAbortError``, any other failure compiles
        the parts in this process."""
        got = None
        try:
            err = self.proc.communicate()[1] if self.proc is not None else b""
            if self.proc is not None and self.proc.returncode == 0:
                try:
                    with open(self.dst, "rb") as f:
                        got = pickle.load(f)
                except (OSError, pickle.UnpicklingError, EOFError):
                    got = None
            elif self.proc is not None and self.proc.returncode in (-6, 134):
                tail = (err.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
                raise LLVMAbortError(f"LLVM aborted (signal 6) compiling for {self.args[0]} in the helper "
                                     f"process: {tail}")
        finally:
            self.dir.cleanup()
        if not (isinstance(got, list) and len(got) == len(self.parts) and all(isinstance(o, bytes) for o in got)):
            got = [llvm_core.object_code(p, *self.args) for p in self.parts]
        return got


def compile_parts(parts: list[str], cpu: str, features: str, opt: int, loop_passes: bool,
                  helper: bool = True) -> list[bytes]:
    """The object of each part, in order: the first compiled here, the others (with ``helper``)
    by a second process at the same time."""
    if not helper or len(parts) < 2:
        return [llvm_core.object_code(p, cpu, features, opt, loop_passes) for p in parts]
    h = Helper(parts[1:], cpu, features, opt, loop_passes)
    try:
        objs = [llvm_core.object_code(parts[0], cpu, features, opt, loop_passes)]
    finally:
        theirs = h.result()
    return objs + theirs


def emit_objects(llvm_ir: str, kernels: list[str], cpu: str, features: str, opt: int,
                 loop_passes: bool) -> list[bytes] | None:
    """The objects of a large module built on two cores, or None: compile it whole (small, one
    usable core, or a shape :func:`split` does not take)."""
    n = jobs()
    if n < 2 or len(llvm_ir) < MIN_CHARS or len(kernels) < 2:
        return None
    parts = split(llvm_ir, kernels, n)
    if parts is None or len(parts) < 2:
        return None
    return compile_parts(parts, cpu, features, opt, loop_passes)
