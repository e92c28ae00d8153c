"""External tools, found at run time: ``ptxas``/``nvdisasm`` (NVIDIA), ``ld.lld`` >= 19,
``llvm-objdump``/``llvm-readelf`` >= 19 (AMDGPU).

Where each comes from, in order:

* the wheels of the ``test`` extra, which ``./dev`` installs (pyproject.toml pins them):
  ``ld.lld`` is the ``ziglang`` wheel's ``zig ld.lld`` (LLD 22), ``ptxas`` is in
  ``nvidia-cuda-nvcc`` and ``nvdisasm`` in ``nvidia-cuda-nvdisasm`` (``nvidia/cu13/bin``);
* a system tool on ``PATH``, taken instead of the wheel's only when its version is newer
  (or when no wheel has it: ``llvm-objdump``/``llvm-readelf`` ship in no usable wheel).

``TESSERA_TOOLCHAIN=bundled`` makes discovery ignore ``PATH`` entirely, so a machine that
once had LLVM or CUDA installed by hand sees what a fresh one does (``.ci/run`` sets it).
A tool is a command, not always one file: ``zig ld.lld ...`` is ``ld.lld``.  Each tool is
optional; a lane that needs a missing one raises ``ToolchainMissingError`` naming it and
how to get it.  ``tessera doctor`` prints what was found.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from tessera.errors import ToolchainMissingError

ENV = "TESSERA_TOOLCHAIN"
MODES = ("auto", "bundled")
_EXTRA = "./dev installs it (the test extra: pip install 'tessera[test]')"

# how to get each tool: the wheel first, then the system route where one exists
INSTALL_HINT = {
    "ld.lld": f"the ziglang wheel: {_EXTRA}; or LLD >= 19 on PATH (apt-get install lld-19)",
    "llvm-objdump": "LLVM >= 19 on PATH (apt-get install llvm-19); no wheel ships it, so "
                    f"{ENV}=bundled never finds it",
    "llvm-readelf": "LLVM >= 19 on PATH (apt-get install llvm-19); no wheel ships it, so "
                    f"{ENV}=bundled never finds it",
    "ptxas": f"the nvidia-cuda-nvcc wheel: {_EXTRA}; or the CUDA toolkit on PATH",
    "nvdisasm": f"the nvidia-cuda-nvdisasm wheel: {_EXTRA}; or the CUDA toolkit on PATH",
}
# what each tool enables, for ``tessera doctor`` and docs
ENABLES = {
    "ld.lld": "rocm lanes: links AMDGPU code objects (.hsaco); docs/abi.md",
    "llvm-objdump": "hsaco.disassemble of a linked code object (else LLVM's own assembly listing)",
    "llvm-readelf": "nothing required (the code-object reader is tessera's own)",
    "ptxas": "nvidia lanes: PTX -> cubin, registers/spills; the GPU bundle",
    "nvdisasm": "SASS listings of cubins (ptx_tools.sass)",
}
LLVM_TOOLS = ("ld.lld", "llvm-objdump", "llvm-readelf")
NVIDIA_TOOLS = ("ptxas", "nvdisasm")
ALL_TOOLS = ("ld.lld", "llvm-objdump", "llvm-readelf", "ptxas", "nvdisasm")
MIN_MAJOR = {"ld.lld": 19, "llvm-objdump": 19, "llvm-readelf": 19}     # older LLVM lacks our archs

# CUDA 12 wheels install nvidia/cuda_nvcc/bin/...; CUDA 13 wheels nvidia/cu13/bin/...
NVIDIA_WHEEL_MODULES = ("nvidia.cu13", "nvidia.cu12", "nvidia.cuda_nvcc", "nvidia.cuda_nvdisasm")


@dataclass(frozen=True)
class Tool:
    """One found tool: the command that runs it (``argv`` prefix), its version and origin."""
    name: str
    command: tuple[str, ...]
    version: tuple[int, ...] | None
    source: str                       # "wheel:<distribution>" or "system"

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else "unknown"


def mode() -> str:
    """``auto`` (wheels, then PATH when newer) or ``bundled`` (wheels only), from ``TESSERA_TOOLCHAIN``."""
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise ToolchainMissingError(f"{ENV}={value!r} is not a toolchain setting; use one of: "
                                    f"{', '.join(MODES)}")
    return value


# --------------------------------------------------------------------------- versions
_VERSION_RX = {
    "llvm": re.compile(r"(?:LLVM|LLD) (?:version )?(\d+)\.(\d+)(?:\.(\d+))?"),
    "cuda": re.compile(r"release \d+\.\d+, V(\d+)\.(\d+)\.(\d+)"),
}


@lru_cache(maxsize=None)
def _version(command: tuple[str, ...], kind: str) -> tuple[int, ...] | None:
    try:
        p = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION_RX[kind].search(p.stdout + p.stderr)
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _kind(name: str) -> str:
    return "cuda" if name in NVIDIA_TOOLS else "llvm"


# --------------------------------------------------------------------------- wheels
def _package_dir(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return next(iter(spec.submodule_search_locations), None)
    return os.path.dirname(spec.origin) if spec.origin else None


def _wheel_bin(module: str, name: str) -> str | None:
    base = _package_dir(module)
    cand = os.path.join(base, "bin", name) if base else None
    return cand if cand and os.access(cand, os.X_OK) else None


def zig_binary() -> str | None:
    """The ``zig`` executable inside the ziglang wheel (``ziglang/zig``), or None."""
    base = _package_dir("ziglang")
    cand = os.path.join(base, "zig") if base else None
    return cand if cand and os.access(cand, os.X_OK) else None


def _wheel_tool(name: str) -> Tool | None:
    if name == "ld.lld":
        zig = zig_binary()
        command = (zig, "ld.lld") if zig else None
        source = "wheel:ziglang"
    elif name in NVIDIA_TOOLS:
        command, source = None, ""
        for mod in NVIDIA_WHEEL_MODULES:
            exe = _wheel_bin(mod, name)
            if exe:
                dist = "nvidia-cuda-nvcc" if name == "ptxas" else "nvidia-cuda-nvdisasm"
                command, source = (exe,), f"wheel:{dist}"
                break
    else:
        return None
    if command is None:
        return None
    return Tool(name, command, _version(command, _kind(name)), source)


# --------------------------------------------------------------------------- PATH
def system_tool(name: str, path: str | None = None) -> Tool | None:
    """The newest ``name`` on ``path``: versioned LLVM binaries (``ld.lld-19``) and the plain one."""
    names = [f"{name}-{major}" for major in range(30, 13, -1)] if name in LLVM_TOOLS else []
    path = os.environ.get("PATH", os.defpath) if path is None else path
    best: Tool | None = None
    for exe_name in [*names, name]:
        exe = shutil.which(exe_name, path=path)
        if not exe:
            continue
        tool = Tool(name, (exe,), _version((exe,), _kind(name)), "system")
        if best is None or (tool.version or ()) > (best.version or ()):
            best = tool
    return best


@lru_cache(maxsize=None)
def _find(name: str, min_major: int, how: str, path: str) -> Tool | None:
    wheel = _wheel_tool(name)
    if wheel is not None and wheel.version is not None and wheel.version[0] < min_major:
        wheel = None
    system = None if how == "bundled" else system_tool(name, path)
    if system is not None and (system.version is None or system.version[0] < min_major):
        system = None
    if wheel is None:
        return system
    if system is not None and system.version > (wheel.version or ()):
        return system          # a newer system tool wins; an equal one does not
    return wheel


def find(name: str, min_major: int = 0) -> Tool | None:
    """``name`` with major version >= ``min_major`` (see the module text for the order), or None."""
    if name not in ALL_TOOLS:
        raise ValueError(f"unknown tool {name!r}; known: {', '.join(ALL_TOOLS)}")
    return _find(name, min_major, mode(), os.environ.get("PATH", os.defpath))


def find_llvm_tool(name: str, min_major: int = 19) -> tuple[str, ...] | None:
    """The command of ``name`` (ld.lld, llvm-objdump, llvm-readelf) of LLVM >= ``min_major``:
    a tuple to put in front of the tool's arguments (``zig ld.lld`` is two words), or None."""
    tool = find(name, min_major)
    return tool.command if tool else None


def find_ptxas() -> str | None:
    tool = find("ptxas")
    return tool.command[0] if tool else None


def find_nvdisasm() -> str | None:
    tool = find("nvdisasm")
    return tool.command[0] if tool else None


def clear_cache() -> None:
    """Forget found tools and versions (after installing one, or in tests)."""
    _find.cache_clear()
    _version.cache_clear()


def missing_message(tool: str, why: str, min_major: int | None = None) -> str:
    need = f"{tool} >= {min_major}" if min_major else tool
    where = " (TESSERA_TOOLCHAIN=bundled: PATH is not searched)" if mode() == "bundled" else ""
    return (f"{need} is needed to {why} but was not found{where}; get it with: "
            f"{INSTALL_HINT.get(tool, tool)}")


def require(tool: str, found, why: str, min_major: int | None = None):
    """``found`` (a path or command) or ``ToolchainMissingError`` naming ``tool`` and how to get it."""
    if found is None:
        raise ToolchainMissingError(missing_message(tool, why, min_major))
    return found


def status() -> dict[str, Tool | None]:
    """Every tool and what was found (None: absent) — for ``tessera doctor``, reports and docs."""
    return {name: find(name, MIN_MAJOR.get(name, 0)) for name in ALL_TOOLS}
