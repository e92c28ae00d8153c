"""Reading ELF64 little-endian objects: bounds-checked fields, section headers, symbols.

Shared by the AMDGPU code-object inspector (``hsaco.py``) and the CPU object loader
(``jit.py``), which refuses an object whose undefined symbols this process cannot
resolve before any of its code runs.  Every read is bounds-checked: a malformed object
is a ``CodegenError``, never an ``IndexError`` or ``struct.error``.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from tessera.errors import CodegenError

SHT_SYMTAB, SHT_DYNSYM, SHT_NOTE = 2, 11, 7
SHN_UNDEF = 0


def unpack(fmt: str, buf: bytes, off: int, what: str) -> tuple:
    size = struct.calcsize(fmt)
    if off < 0 or off + size > len(buf):
        raise CodegenError(f"malformed code object: {what} at offset {off} (+{size} bytes) runs past the "
                           f"end of the {len(buf)} bytes that hold it")
    return struct.unpack_from("<" + fmt, buf, off)


def slice_of(buf: bytes, off: int, size: int, what: str) -> bytes:
    if off < 0 or size < 0 or off + size > len(buf):
        raise CodegenError(f"malformed code object: {what} at offset {off} (+{size} bytes) runs past the "
                           f"end of the {len(buf)} bytes that hold it")
    return buf[off:off + size]


def cstr(table: bytes, off: int) -> str:
    end = table.find(b"\0", off)
    if off >= len(table) or end < 0:
        raise CodegenError(f"malformed code object: string offset {off} outside its string table")
    return table[off:end].decode("utf-8", "replace")


@dataclass(frozen=True)
class Section:
    sh_type: int
    offset: int
    size: int
    link: int
    align: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    name: str
    shndx: int         # SHN_UNDEF: defined elsewhere
    bind: int          # 0 local, 1 global, 2 weak


def sections(buf: bytes) -> list[Section]:
    """The section headers of an ELF64 LSB object (the caller has checked the identification)."""
    (_type, _machine, _ver, _entry, _phoff, shoff, _flags, _ehsize, _phentsize, _phnum, shentsize, shnum,
     _shstrndx) = unpack("HHIQQQIHHHHHH", buf, 16, "ELF header")
    out = []
    for i in range(shnum if shoff else 0):
        (_name, sh_type, _fl, _addr, off, size, link, _info, align, entsize) = unpack(
            "IIQQQQIIQQ", buf, shoff + i * shentsize, f"section header {i}")
        out.append(Section(sh_type, off, size, link, align, entsize))
    return out


def symbols(buf: bytes, secs: list[Section] | None = None) -> list[Symbol]:
    """Every named symbol of the object's symbol tables, in table order."""
    secs = sections(buf) if secs is None else secs
    out = []
    for s in secs:
        if s.sh_type not in (SHT_SYMTAB, SHT_DYNSYM):
            continue
        if s.link >= len(secs):
            raise CodegenError(f"malformed code object: symbol table links to section {s.link}")
        strtab = slice_of(buf, secs[s.link].offset, secs[s.link].size, "string table")
        table = slice_of(buf, s.offset, s.size, "symbol table")
        step = s.entsize or 24
        for i in range(1, s.size // step):
            st_name, st_info, _other, st_shndx = unpack("IBBH", table, i * step, "symbol")
            name = cstr(strtab, st_name)
            if name:
                out.append(Symbol(name, st_shndx, st_info >> 4))
    return out


def undefined(buf: bytes) -> list[str]:
    """Names the object uses but does not define (each once, in table order)."""
    seen: list[str] = []
    for s in symbols(buf):
        if s.shndx == SHN_UNDEF and s.bind in (1, 2) and s.name not in seen:
            seen.append(s.name)
    return seen
