"""Linking an exported library: ``ld.lld -shared`` (the bundled toolchain's, ``tessera/toolchain.py``)
over the kernels' object and the driver's, against this machine's C library.

Only the library's API is exported (a version script hides the kernels' symbols, so two
libraries never clash).  The link is ``-z defs``: every symbol must resolve in the objects or in
libc / libm / libpthread (the shared objects this Python process itself has loaded, found in
``/proc/self/maps``); the library's DT_NEEDED entries name those and nothing else.
"""
from __future__ import annotations

import os
import subprocess
import tempfile

from tessera import toolchain
from tessera.codegen import elf
from tessera.errors import ExportError

SYSTEM_LIBS = ("libc.so.6", "libm.so.6", "libpthread.so.0")
SHT_DYNAMIC, DT_NEEDED = 6, 1


def system_libraries() -> list[str]:
    """Paths of this process's libc, libm and libpthread (those loaded), by their soname."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                base = os.path.basename(path)
                if base in SYSTEM_LIBS and base not in found and os.path.exists(path):
                    found[base] = path
    except OSError:
        pass
    for lib in SYSTEM_LIBS:   # not loaded here: the usual places
        for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64"):
            if lib not in found and os.path.exists(os.path.join(d, lib)):
                found[lib] = os.path.join(d, lib)
    if "libc.so.6" not in found:
        raise ExportError("no libc.so.6 found to link the library against (an exported library needs glibc)")
    return [found[k] for k in SYSTEM_LIBS if k in found]


def link(objects: list[bytes], out_path: str, exported: list[str], soname: str) -> None:
    ld = toolchain.require("ld.lld", toolchain.find_llvm_tool("ld.lld", 19), "link an exported library", 19)
    with tempfile.TemporaryDirectory(prefix="tessera-export-") as d:
        paths = []
        for i, o in enumerate(objects):
            p = os.path.join(d, f"part{i}.o")
            with open(p, "wb") as f:
                f.write(o)
            paths.append(p)
        script = os.path.join(d, "exports.map")
        with open(script, "w") as f:
            f.write("{\n  global:\n" + "".join(f"    {s};\n" for s in exported) + "  local: *;\n};\n")
        tmp_out = out_path + ".tmp"
        cmd = [*ld, "-shared", "-o", tmp_out, "-soname", soname, "--version-script", script, "-z", "defs",
               "-z", "noexecstack", "-z", "now", "--as-needed", "--eh-frame-hdr", *paths, *system_libraries()]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            raise ExportError(f"ld.lld could not run: {e}") from None
        if p.returncode != 0:
            lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()][:8]
            raise ExportError("ld.lld refused the library: " + " | ".join(lines))
        os.replace(tmp_out, out_path)


def needed(buf: bytes) -> list[str]:
    """The DT_NEEDED entries of a shared object (its dynamic section)."""
    secs = elf.sections(buf)
    out = []
    for s in secs:
        if s.sh_type != SHT_DYNAMIC:
            continue
        strtab = elf.slice_of(buf, secs[s.link].offset, secs[s.link].size, "dynamic string table")
        table = elf.slice_of(buf, s.offset, s.size, "dynamic section")
        for i in range(s.size // 16):
            tag, val = elf.unpack("qQ", table, 16 * i, "dynamic entry")
            if tag == 0:
                break
            if tag == DT_NEEDED:
                out.append(elf.cstr(strtab, val))
    return out


def exported_symbols(buf: bytes) -> list[str]:
    """The global symbols a shared object defines in its dynamic symbol table."""
    return sorted({s.name for s in _dynsyms(buf) if s.shndx != elf.SHN_UNDEF and s.bind in (1, 2)})


def undefined_symbols(buf: bytes) -> list[str]:
    """The symbols a shared object needs from elsewhere (its dynamic symbol table)."""
    return sorted({s.name for s in _dynsyms(buf) if s.shndx == elf.SHN_UNDEF and s.bind in (1, 2)})


def _dynsyms(buf: bytes) -> list:
    """The dynamic symbol table's symbols (the static table masked out, section indices kept)."""
    secs = [elf.Section(0, 0, 0, 0, 0, 0) if s.sh_type == elf.SHT_SYMTAB else s for s in elf.sections(buf)]
    return elf.symbols(buf, secs)
