"""External tools, found at run time: ``ptxas``/``nvdisasm`` (NVIDIA), ``ld.lld`` >= 19,
``llvm-objdump``/``llvm-readelf`` >= 19 (AMDGPU).  Each is optional; a lane that needs
a missing one raises ``ToolchainMissingError`` naming what to install.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache

from tessera.errors import ToolchainMissingError

# (tool, minimum LLVM major) -> how to get it on Debian
INSTALL_HINT = {
    "ld.lld": "apt-get install -y lld-19",
    "llvm-objdump": "apt-get install -y llvm-19",
    "llvm-readelf": "apt-get install -y llvm-19",
    "ptxas": "the CUDA toolkit, or pip install nvidia-cuda-nvcc",
    "nvdisasm": "the CUDA toolkit, or pip install nvidia-cuda-nvdisasm",
}


def _wheel_bin(module: str, name: str) -> str | None:
    try:
        pkg = __import__(module, fromlist=["__file__"])
    except ImportError:
        return None
    base = getattr(pkg, "__file__", None) or next(iter(getattr(pkg, "__path__", [])), None)
    if not base:
        return None
    cand = os.path.join(os.path.dirname(base) if base.endswith(".py") else base, "bin", name)
    return cand if os.path.exists(cand) else None


@lru_cache(maxsize=None)
def _llvm_major(exe: str) -> int | None:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(?:LLVM|LLD) (?:version )?(\d+)\.", out)
    return int(m.group(1)) if m else None


@lru_cache(maxsize=None)
def find_llvm_tool(name: str, min_major: int = 19) -> str | None:
    """``name`` (ld.lld, llvm-objdump, llvm-readelf) of LLVM >= ``min_major``: a versioned
    binary (``ld.lld-19``) first, newest first, then the unversioned one if new enough."""
    for major in range(30, min_major - 1, -1):
        exe = shutil.which(f"{name}-{major}")
        if exe:
            return exe
    exe = shutil.which(name)
    if exe and (_llvm_major(exe) or 0) >= min_major:
        return exe
    return None


# CUDA 12 wheels install nvidia/cuda_nvcc/bin/...; CUDA 13 wheels nvidia/cu13/bin/...
NVIDIA_WHEEL_MODULES = ("nvidia.cu13", "nvidia.cu12", "nvidia.cuda_nvcc", "nvidia.cuda_nvdisasm")


def _nvidia_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for mod in NVIDIA_WHEEL_MODULES:
        found = _wheel_bin(mod, name)
        if found:
            return found
    return None


@lru_cache(maxsize=None)
def find_ptxas() -> str | None:
    return _nvidia_tool("ptxas")


@lru_cache(maxsize=None)
def find_nvdisasm() -> str | None:
    return _nvidia_tool("nvdisasm")


def require(tool: str, path: str | None, why: str) -> str:
    if path is None:
        raise ToolchainMissingError(f"{tool} is needed to {why} but was not found; install it with: "
                                    f"{INSTALL_HINT.get(tool, tool)}")
    return path


def status() -> dict[str, str | None]:
    """Every tool and where it was found (None: absent) — for reports and docs."""
    return {"ptxas": find_ptxas(), "nvdisasm": find_nvdisasm(), "ld.lld": find_llvm_tool("ld.lld"),
            "llvm-objdump": find_llvm_tool("llvm-objdump"), "llvm-readelf": find_llvm_tool("llvm-readelf")}
