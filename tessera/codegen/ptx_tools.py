"""PTX -> cubin with ``ptxas``, per-kernel resource usage, and SASS with ``nvdisasm``.

:func:`assemble` runs ``ptxas -arch=<arch> -v`` and parses its verbose report (written to
stderr) into one :class:`KernelResources` per entry function.  The report, as printed by
ptxas 13.0, looks like::

    ptxas info    : 0 bytes gmem
    ptxas info    : Compiling entry function 'k' for 'sm_80'
    ptxas info    : Function properties for k
        64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 19 registers, used 1 barriers, 64 bytes cumulative stack size, 368 bytes cmem[0]
    ptxas info    : Compile time = 2.839 ms
    ptxas info    : Function properties for helper          (a non-entry .func: ignored)
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads

Every item of the ``Used`` line is optional (older releases print fewer, e.g. no barriers),
``smem`` is printed only when non-zero, ``cumulative stack size`` only with a stack, and ptxas
13 prints no ``cmem[0]`` (parameter bank) for sm_90 and newer.  A missing item reads as 0.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Sequence

from tessera import toolchain
from tessera.errors import CodegenError

_ARCH = re.compile(r"sm_\d+[a-z]?")
_COMPILING = re.compile(r"Compiling (entry )?function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CUMSTACK = re.compile(r"(\d+) bytes cumulative stack size")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_TIMEOUT_S = 300


@dataclass
class KernelResources:
    """What ptxas reports for one entry function.  ``stack_bytes`` is the larger of the
    function's own stack frame and its cumulative stack size (frame plus callees)."""
    name: str
    registers: int = 0
    shared_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    barriers: int = 0
    cmem: dict[int, int] = field(default_factory=dict)

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass
class Cubin:
    """An assembled ELF cubin with the per-kernel resources and the full ptxas log."""
    arch: str
    data: bytes
    resources: dict[str, KernelResources]
    log: str


def parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """Entry function name -> resources, from the text of ``ptxas -v``."""
    kernels: dict[str, KernelResources] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    current: str | None = None    # the entry whose "Used ..." line comes next
    props: str | None = None      # the function whose stack-frame line comes next
    for line in log.splitlines():
        if m := _COMPILING.search(line):
            current = m.group(2) if m.group(1) else None
            if current is not None:
                kernels.setdefault(current, KernelResources(current))
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props is not None:
            frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            props = None
        elif (m := _USED.search(line)) and current is not None:
            k = kernels[current]
            k.registers = int(m.group(1))
            k.barriers = _int(_BARRIERS, line)
            k.shared_bytes = _int(_SMEM, line)
            k.stack_bytes = max(k.stack_bytes, _int(_CUMSTACK, line))
            k.cmem = {int(bank): int(size) for size, bank in _CMEM.findall(line)}
            current = None
    for name, (frame, stores, loads) in frames.items():
        if name in kernels:
            k = kernels[name]
            k.stack_bytes, k.spill_stores, k.spill_loads = max(k.stack_bytes, frame), stores, loads
    return kernels


def _int(rx: re.Pattern[str], line: str) -> int:
    m = rx.search(line)
    return int(m.group(1)) if m else 0


def _error_lines(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if re.search(r"\b(error|fatal)\b", ln)]
    return "\n".join(lines) or log.strip() or "no output"


def assemble(ptx: str, arch: str, *, options: Sequence[str] = ()) -> Cubin:
    """Assemble ``ptx`` for ``arch`` (``sm_80``, ``sm_90a``, ``sm_120``...) with ``ptxas -v``;
    ``options`` are extra ptxas flags (e.g. ``-maxrregcount=32``).  Raises
    ``ToolchainMissingError`` without ptxas and ``CodegenError`` (ptxas' error lines) on failure."""
    exe = toolchain.require("ptxas", toolchain.find_ptxas(), "assemble PTX into a cubin")
    if not _ARCH.fullmatch(arch):
        raise CodegenError(f"not an NVIDIA arch: {arch!r} (expected e.g. sm_90 or sm_90a)")
    with tempfile.TemporaryDirectory(prefix="tessera-ptxas-") as d:
        src, out = os.path.join(d, "kernel.ptx"), os.path.join(d, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [exe, f"-arch={arch}", "-v", *options, "-o", out, src]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CodegenError(f"ptxas timed out after {_TIMEOUT_S} s for {arch}") from None
        log = (proc.stderr + proc.stdout).replace(src, "kernel.ptx")
        if proc.returncode != 0 or not os.path.exists(out):
            raise CodegenError(f"ptxas failed for {arch} (exit {proc.returncode}):\n{_error_lines(log)}")
        with open(out, "rb") as f:
            data = f.read()
    return Cubin(arch=arch, data=data, resources=parse_ptxas_log(log), log=log)


def sass(cubin: bytes, arch: str) -> str | None:
    """The SASS of ``cubin`` (``nvdisasm -c``), or None when nvdisasm is not installed.
    ``arch`` is only for messages: nvdisasm reads the arch from the ELF header."""
    exe = toolchain.find_nvdisasm()
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tessera-nvdisasm-") as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        try:
            proc = subprocess.run([exe, "-c", path], capture_output=True, text=True, timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CodegenError(f"nvdisasm timed out after {_TIMEOUT_S} s ({arch})") from None
    if proc.returncode != 0:
        raise CodegenError(f"nvdisasm failed for {arch} (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc.stdout
