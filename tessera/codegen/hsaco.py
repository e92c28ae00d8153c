"""AMDGPU code objects (``.hsaco``): compile, link, inspect, disassemble.

The ROCm lane's artifact is an HSA code object: an ELF64 shared object for
``EM_AMDGPU`` (224) that ``ld.lld -shared`` links from the relocatable object LLVM
emits for the ``amdgcn-amd-amdhsa`` triple.  What a loader needs to know about it is
in two places, both read here in pure Python so a test or a cache check needs no
ROCm install:

* ``e_flags``: the processor (``EF_AMDGPU_MACH``, low byte) and, for code object
  V4+, the xnack (bits 8-9) and sramecc (bits 10-11) settings: 0 unsupported,
  1 any, 2 off, 3 on.  ``EI_ABIVERSION`` gives the code object version (V2 is 0).
* The ``NT_AMDGPU_METADATA`` note (type 32, owner ``AMDGPU``), whose payload is
  MessagePack: per kernel its descriptor symbol (``<name>.kd``), kernarg layout,
  LDS ("group segment") and scratch sizes, register counts and wavefront size.

Values follow LLVM's ``llvm/BinaryFormat/ELF.h`` and the AMDGPUUsage document.
``ld.lld`` (LLVM >= 19; the ziglang wheel's LLD 22 by default) and ``llvm-objdump`` (a
system LLVM >= 19; no wheel ships it) are external tools found by ``tessera.toolchain``:
without them :func:`link` and :func:`disassemble` raise ``ToolchainMissingError``.
:func:`listing` is the disassembly that needs no tool: llvm-objdump's when there is one,
else LLVM's own assembly listing of the module the object was emitted from.
A malformed code object raises ``CodegenError`` saying what is wrong, never a bare
``IndexError``/``struct.error``.
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field

from tessera.codegen import elf
from tessera.codegen.elf import slice_of as _slice
from tessera.codegen.elf import unpack as _unpack
from tessera.codegen.jit import emit_guarded
from tessera.errors import CodegenError, UnknownArchError
from tessera.toolchain import find_llvm_tool, require

TRIPLE = "amdgcn-amd-amdhsa"
EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
NT_AMDGPU_METADATA = 32

# EF_AMDGPU_MACH_AMDGCN_* (llvm/include/llvm/BinaryFormat/ELF.h)
MACH = {
    "gfx90a": 0x3F, "gfx942": 0x4C, "gfx950": 0x4F,
    "gfx1100": 0x41, "gfx1101": 0x46, "gfx1102": 0x47, "gfx1150": 0x43, "gfx1151": 0x4A,
    "gfx1200": 0x48, "gfx1201": 0x4E,
}
_ARCH_OF_MACH = {v: k for k, v in MACH.items()}
EF_AMDGPU_MACH = 0xFF
EF_AMDGPU_FEATURE_XNACK_V4 = 0x300      # >> 8
EF_AMDGPU_FEATURE_SRAMECC_V4 = 0xC00    # >> 10
_V4_SETTING = ("unsupported", "any", "off", "on")
# LLVM releases older than this cannot disassemble the arch (llvm-objdump 19 aborts on gfx950)
DISASSEMBLER_MIN_LLVM = {"gfx950": 20}


def expected_e_flags_mach(arch: str) -> int:
    """The ``EF_AMDGPU_MACH`` value LLVM writes for ``arch``."""
    try:
        return MACH[arch]
    except KeyError:
        raise UnknownArchError(f"unknown AMDGPU arch {arch!r}; known: {', '.join(MACH)}") from None


# --------------------------------------------------------------------------- MessagePack
class _MsgPack:
    """A MessagePack decoder for the subset AMDGPU metadata can use (no ext types)."""

    def __init__(self, data: bytes):
        self.data = bytes(data)
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise CodegenError(f"MessagePack data is truncated: {n} bytes wanted at offset {self.pos}, "
                               f"{len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def num(self, fmt: str):
        return struct.unpack(">" + fmt, self.take(struct.calcsize(fmt)))[0]

    def text(self, n: int) -> str:
        at = self.pos
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise CodegenError(f"MessagePack string at offset {at} is not UTF-8") from None

    def array(self, n: int) -> list:
        return [self.value() for _ in range(n)]

    def map(self, n: int) -> dict:
        out = {}
        for _ in range(n):
            at, key = self.pos, self.value()
            try:
                out[key] = self.value()
            except TypeError:
                raise CodegenError(f"MessagePack map key at offset {at} is a {type(key).__name__}") from None
        return out

    def value(self):
        at = self.pos
        b = self.take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self.map(b & 0x0F)
        if 0x90 <= b <= 0x9F:
            return self.array(b & 0x0F)
        if 0xA0 <= b <= 0xBF:
            return self.text(b & 0x1F)
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        ints = {0xCC: "B", 0xCD: "H", 0xCE: "I", 0xCF: "Q", 0xD0: "b", 0xD1: "h", 0xD2: "i", 0xD3: "q",
                0xCA: "f", 0xCB: "d"}
        if b in ints:
            return self.num(ints[b])
        lengths = {0xC4: "B", 0xC5: "H", 0xC6: "I", 0xD9: "B", 0xDA: "H", 0xDB: "I",
                   0xDC: "H", 0xDD: "I", 0xDE: "H", 0xDF: "I"}
        if b in lengths:
            n = self.num(lengths[b])
            if b <= 0xC6:
                return self.take(n)
            if b <= 0xDB:
                return self.text(n)
            return self.array(n) if b <= 0xDD else self.map(n)
        raise CodegenError(f"MessagePack type byte 0x{b:02x} at offset {at} is not supported "
                           "(ext types and 0xc1 never appear in AMDGPU metadata)")


def msgpack_decode(data: bytes):
    """Decode one MessagePack value that spans all of ``data``; ``CodegenError`` if malformed."""
    reader = _MsgPack(data)
    try:
        value = reader.value()
    except RecursionError:
        raise CodegenError("MessagePack data is nested too deeply") from None
    if reader.pos != len(reader.data):
        raise CodegenError(f"MessagePack data has {len(reader.data) - reader.pos} trailing bytes "
                           f"after the value ending at offset {reader.pos}")
    return value


# --------------------------------------------------------------------------- ELF
def _notes(area: bytes, align: int):
    """(owner, type, desc) of each note in a note section or segment."""
    off = 0
    while off + 12 <= len(area):
        namesz, descsz, ntype = _unpack("III", area, off, "note header")
        off += 12
        name = _slice(area, off, namesz, "note name").rstrip(b"\0").decode("utf-8", "replace")
        off += -(-namesz // align) * align
        desc = _slice(area, off, descsz, "note")
        off += -(-descsz // align) * align
        yield name, ntype, desc


@dataclass
class KernelMeta:
    name: str
    symbol: str
    kernarg_size: int
    group_segment: int          # static LDS bytes
    private_segment: int        # scratch bytes per work-item
    vgpr_count: int | None
    sgpr_count: int | None
    agpr_count: int | None
    wavefront_size: int | None
    max_workgroup_size: int | None
    args: list[dict]            # {offset, size, value_kind, address_space?, name?}
    raw: dict = field(repr=False)


@dataclass
class HsacoInfo:
    machine: int
    e_flags: int
    arch: str
    xnack: str
    sramecc: str
    code_object_version: int | None
    kernels: list[KernelMeta]
    symbols: list[str]
    descriptors: list[str]
    metadata: dict = field(repr=False)


def _kernel(raw: dict) -> KernelMeta:
    if not isinstance(raw, dict) or not isinstance(raw.get(".name"), str):
        raise CodegenError(f"AMDGPU metadata: a kernel entry has no .name: {raw!r:.200}")
    args = []
    for a in raw.get(".args", []):
        if not isinstance(a, dict):
            raise CodegenError(f"AMDGPU metadata: kernel {raw['.name']} has a malformed argument {a!r:.100}")
        args.append({k.lstrip("."): v for k, v in a.items()
                     if k in (".offset", ".size", ".value_kind", ".address_space", ".name")})
    return KernelMeta(name=raw[".name"], symbol=raw.get(".symbol", raw[".name"] + ".kd"),
                      kernarg_size=raw.get(".kernarg_segment_size", 0),
                      group_segment=raw.get(".group_segment_fixed_size", 0),
                      private_segment=raw.get(".private_segment_fixed_size", 0),
                      vgpr_count=raw.get(".vgpr_count"), sgpr_count=raw.get(".sgpr_count"),
                      agpr_count=raw.get(".agpr_count"), wavefront_size=raw.get(".wavefront_size"),
                      max_workgroup_size=raw.get(".max_flat_workgroup_size"), args=args, raw=raw)


def inspect(hsaco: bytes) -> HsacoInfo:
    """Header flags, symbols and decoded kernel metadata of an AMDGPU ELF64 object."""
    buf = bytes(hsaco)
    ident = _slice(buf, 0, 16, "ELF identification")
    if ident[:4] != b"\x7fELF":
        raise CodegenError("not an ELF file (bad magic)")
    if ident[4] != 2 or ident[5] != 1:
        raise CodegenError("not a little-endian ELF64 file: an AMDGPU code object is ELF64 LSB")
    (_type, machine, _ver, _entry, phoff, _shoff, e_flags, _ehsize, phentsize, phnum, _shentsize, _shnum,
     _shstrndx) = _unpack("HHIQQQIHHHHHH", buf, 16, "ELF header")
    if machine != EM_AMDGPU:
        raise CodegenError(f"ELF e_machine is {machine}, not EM_AMDGPU ({EM_AMDGPU}): "
                           "not an AMDGPU code object")
    mach = e_flags & EF_AMDGPU_MACH
    cov = ident[8] + 2 if ident[7] == ELFOSABI_AMDGPU_HSA else None
    if cov is not None and cov >= 4:
        xnack = _V4_SETTING[(e_flags & EF_AMDGPU_FEATURE_XNACK_V4) >> 8]
        sramecc = _V4_SETTING[(e_flags & EF_AMDGPU_FEATURE_SRAMECC_V4) >> 10]
    else:   # V3: one "enabled" bit each
        xnack = "on" if e_flags & 0x100 else "off"
        sramecc = "on" if e_flags & 0x200 else "off"

    secs = elf.sections(buf)
    symbols: list[str] = []
    for sym in elf.symbols(buf, secs):
        if sym.name not in symbols:
            symbols.append(sym.name)
    note_areas: list[tuple[bytes, int]] = [(_slice(buf, sec.offset, sec.size, "note section"),
                                            8 if sec.align == 8 else 4)
                                           for sec in secs if sec.sh_type == elf.SHT_NOTE]
    if not note_areas and phoff:        # no section headers: the PT_NOTE segments
        for i in range(phnum):
            p_type, _fl, off, _va, _pa, filesz, _msz, align = _unpack(
                "IIQQQQQQ", buf, phoff + i * phentsize, f"program header {i}")
            if p_type == 4:
                note_areas.append((_slice(buf, off, filesz, "note segment"), 8 if align == 8 else 4))

    metadata = None
    for area, align in note_areas:
        for owner, ntype, desc in _notes(area, align):
            if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
                try:
                    metadata = msgpack_decode(desc)
                except CodegenError as e:
                    raise CodegenError(f"the NT_AMDGPU_METADATA note is corrupt: {e.message}") from None
    if metadata is None:
        raise CodegenError("no NT_AMDGPU_METADATA note (type 32, owner AMDGPU): not a code object V3+")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("amdhsa.kernels", []), list):
        raise CodegenError("the NT_AMDGPU_METADATA note is not a map with an amdhsa.kernels list")
    kernels = [_kernel(k) for k in metadata.get("amdhsa.kernels", [])]
    return HsacoInfo(machine=machine, e_flags=e_flags, arch=_ARCH_OF_MACH.get(mach, f"mach-0x{mach:02x}"),
                     xnack=xnack, sramecc=sramecc, code_object_version=cov, kernels=kernels,
                     symbols=symbols, descriptors=[s for s in symbols if s.endswith(".kd")],
                     metadata=metadata)


# --------------------------------------------------------------------------- tools
def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise CodegenError(f"{what} timed out: {' '.join(cmd)}") from None
    if p.returncode != 0:
        lines = (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}").splitlines()
        errors = [ln.strip() for ln in lines if "error" in ln.lower()]   # not a crash's stack dump
        raise CodegenError(f"{what} failed: {' / '.join((errors or lines)[-5:])}")
    return p


def compile_object(llvm_ir: str, arch: str, features: str = "", *, opt: int = 3, timeout: float = 300,
                   want_asm: bool = False):
    """AMDGPU LLVM IR text -> ``ObjectCode`` (object bytes, assembly if asked), compiled in a
    subprocess so that an LLVM abort becomes ``LLVMAbortError``."""
    expected_e_flags_mach(arch)         # refuse unknown names before LLVM sees them
    if "target triple" not in llvm_ir:
        llvm_ir = f'target triple = "{TRIPLE}"\n' + llvm_ir
    elif f'"{TRIPLE}"' not in llvm_ir:
        raise CodegenError(f"AMDGPU IR must use the {TRIPLE} triple")
    return emit_guarded(llvm_ir, arch, features, opt=opt, timeout=timeout, want_asm=want_asm)


def link(obj: bytes, arch: str) -> bytes:
    """``ld.lld -shared`` a relocatable AMDGPU object into code object bytes for ``arch``."""
    want = expected_e_flags_mach(arch)
    lld = require("ld.lld", find_llvm_tool("ld.lld"), "link AMDGPU code objects", 19)
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "kernel.o"), os.path.join(d, "kernel.hsaco")
        with open(src, "wb") as f:
            f.write(obj)
        _run([*lld, "-shared", "-o", dst, src], "ld.lld")
        with open(dst, "rb") as f:
            out = f.read()
    got = _unpack("I", out, 48, "e_flags")[0] & EF_AMDGPU_MACH
    if got != want:
        raise CodegenError(f"linked code object is for {_ARCH_OF_MACH.get(got, hex(got))}, not {arch}")
    return out


def objdump_for(arch: str) -> tuple[str, ...] | None:
    """An llvm-objdump new enough to know ``arch`` (gfx950 arrived in LLVM 20), or None."""
    return find_llvm_tool("llvm-objdump", DISASSEMBLER_MIN_LLVM.get(arch, 19))


def disassemble(hsaco: bytes, arch: str) -> str:
    """``llvm-objdump -d --mcpu=<arch>`` of a code object."""
    need = DISASSEMBLER_MIN_LLVM.get(arch, 19)
    objdump = require("llvm-objdump", objdump_for(arch), f"disassemble {arch} code objects"
                      + (f" (older LLVM does not know {arch})" if need > 19 else ""), need)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.hsaco")
        with open(path, "wb") as f:
            f.write(hsaco)
        return _run([*objdump, "-d", f"--mcpu={arch}", path], "llvm-objdump").stdout


# --------------------------------------------------------------------------- listings
# LLVM's AMDGPU assembly listing names each kernel's descriptor fields in an .amdhsa_kernel block
_LISTING_KERNEL = re.compile(r"^[ \t]*\.amdhsa_kernel (\S+)\n(.*?)^[ \t]*\.end_amdhsa_kernel", re.M | re.S)
_LISTING_FIELD = re.compile(r"^[ \t]*\.amdhsa_(\w+) (-?\d+)[ \t]*$", re.M)
_LISTING_TARGET = re.compile(r'^[ \t]*\.amdgcn_target "([^"]+)"', re.M)
# descriptor fields the listing states and the metadata note repeats: (listing field, KernelMeta field)
_LISTED = (("group_segment_fixed_size", "group_segment"), ("private_segment_fixed_size", "private_segment"),
           ("kernarg_size", "kernarg_size"))


def listing_kernels(asm: str) -> dict[str, dict[str, int]]:
    """Each ``.amdhsa_kernel`` block of an AMDGPU assembly listing: kernel -> {field: value}."""
    return {m.group(1): {f: int(v) for f, v in _LISTING_FIELD.findall(m.group(2))}
            for m in _LISTING_KERNEL.finditer(asm)}


def check_listing(info: HsacoInfo, asm: str) -> None:
    """``CodegenError`` unless ``asm`` is a listing of the code object ``info`` describes: the
    same target arch, the same kernels, and the descriptor fields the metadata note states."""
    m = _LISTING_TARGET.search(asm)
    target = m.group(1) if m else None
    if target is None or not re.fullmatch(rf"{re.escape(TRIPLE)}--{re.escape(info.arch)}(:.*)?", target):
        raise CodegenError(f"the assembly listing targets {target or 'no .amdgcn_target'}, but the code "
                           f"object is for {info.arch}")
    listed = listing_kernels(asm)
    if set(listed) != {k.name for k in info.kernels}:
        raise CodegenError(f"the assembly listing has kernels {sorted(listed)}, the code object "
                           f"{sorted(k.name for k in info.kernels)}")
    for k in info.kernels:
        for field_, attr in _LISTED:
            if listed[k.name].get(field_) != getattr(k, attr):
                raise CodegenError(f"kernel {k.name}: the assembly listing has .amdhsa_{field_} "
                                   f"{listed[k.name].get(field_)}, the code object's metadata {getattr(k, attr)}")


def disassembly(hsaco: bytes, arch: str, llvm_asm: str) -> tuple[str, str]:
    """A disassembly of the code object ``hsaco`` and what produced it.

    ``llvm-objdump -d`` when one that knows ``arch`` is found (``"llvm-objdump"``); else
    ``llvm_asm``, LLVM's own assembly listing of the optimised module the object was emitted
    from by the same target machine (``"llvm-listing"``; no wheel ships llvm-objdump), after
    :func:`check_listing` has matched it against the object's metadata."""
    if objdump_for(arch) is not None:
        return disassemble(hsaco, arch), "llvm-objdump"
    check_listing(inspect(hsaco), llvm_asm)
    return llvm_asm, "llvm-listing"
