"""AMDGPU code objects: compile -> ld.lld -> inspect (pure-Python ELF + MessagePack) -> disassembly
(llvm-objdump when a system LLVM >= 19 has one, else LLVM's own listing checked against the object)."""
from __future__ import annotations

import struct

import pytest

from tessera.codegen import elf
from tessera.codegen import hsaco as H
from tessera.errors import CodegenError, ToolchainMissingError, UnknownArchError
from tessera.toolchain import find_llvm_tool

needs_lld = pytest.mark.skipif(find_llvm_tool("ld.lld") is None, reason="ld.lld >= 19 not installed")
ARCHS = ["gfx1100", "gfx1151", "gfx1201", "gfx90a", "gfx942", "gfx950"]
LDS_WORDS = 256

KERNEL_IR = f"""
target triple = "amdgcn-amd-amdhsa"
@lds = internal addrspace(3) global [{LDS_WORDS} x i32] poison, align 4
declare i32 @llvm.amdgcn.workitem.id.x()

define amdgpu_kernel void @tiny(ptr addrspace(1) %out, i64 %n) {{
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %t64 = zext i32 %tid to i64
  %sum = add i64 %t64, %n
  %v = trunc i64 %sum to i32
  %slot = getelementptr [{LDS_WORDS} x i32], ptr addrspace(3) @lds, i32 0, i32 %tid
  store volatile i32 %v, ptr addrspace(3) %slot, align 4
  %back = load volatile i32, ptr addrspace(3) %slot, align 4
  %dst = getelementptr i32, ptr addrspace(1) %out, i64 %t64
  store i32 %back, ptr addrspace(1) %dst, align 4
  ret void
}}
"""

_built: dict[str, tuple[bytes, str]] = {}


def _build(arch: str) -> tuple[bytes, str]:
    """The linked code object and LLVM's assembly listing of the same optimised module."""
    if arch not in _built:
        oc = H.compile_object(KERNEL_IR, arch, want_asm=True)
        _built[arch] = (H.link(oc.obj, arch), oc.asm)
    return _built[arch]


def built(arch: str) -> bytes:
    return _build(arch)[0]


def listing(arch: str) -> str:
    return _build(arch)[1]


# --------------------------------------------------------------------------- the arch table
def test_mach_table_matches_llvm_elf_h():
    assert {a: H.expected_e_flags_mach(a) for a in ARCHS} == {
        "gfx1100": 0x41, "gfx1151": 0x4A, "gfx1201": 0x4E, "gfx90a": 0x3F, "gfx942": 0x4C, "gfx950": 0x4F}
    assert (H.MACH["gfx1101"], H.MACH["gfx1102"], H.MACH["gfx1200"]) == (0x46, 0x47, 0x48)
    assert len(set(H.MACH.values())) == len(H.MACH)
    with pytest.raises(UnknownArchError, match="gfx942"):
        H.expected_e_flags_mach("gfx9999")


# --------------------------------------------------------------------------- real code objects
@needs_lld
@pytest.mark.parametrize("arch", ARCHS)
def test_code_object(arch):
    info = H.inspect(built(arch))
    assert info.machine == 224
    assert info.e_flags & 0xFF == H.expected_e_flags_mach(arch)
    assert info.arch == arch
    assert info.code_object_version is not None and info.code_object_version >= 5
    gfx9 = arch.startswith("gfx9")
    # xnack/sramecc are "any" on the gfx9 data-centre parts, unsupported on RDNA
    assert (info.xnack, info.sramecc) == (("any", "any") if gfx9 else ("unsupported", "unsupported"))
    assert info.metadata["amdhsa.target"].startswith(f"amdgcn-amd-amdhsa--{arch}")
    (k,) = info.kernels
    assert (k.name, k.symbol) == ("tiny", "tiny.kd")
    assert "tiny" in info.symbols and info.descriptors == ["tiny.kd"]
    assert [(a["offset"], a["size"]) for a in k.args] == [(0, 8), (8, 8)]
    assert [a.get("name") for a in k.args] == ["out", "n"]
    assert (k.args[0]["value_kind"], k.args[0]["address_space"]) == ("global_buffer", "global")
    assert k.args[1]["value_kind"] == "by_value"
    assert k.kernarg_size >= 16
    assert k.group_segment >= 4 * LDS_WORDS
    assert k.private_segment == 0
    assert k.wavefront_size == (64 if gfx9 else 32)
    assert k.vgpr_count and k.sgpr_count and k.max_workgroup_size
    assert k.raw is info.metadata["amdhsa.kernels"][0]


@needs_lld
@pytest.mark.parametrize("arch", ARCHS)
def test_disassemble(arch):
    text, source = H.disassembly(built(arch), arch, listing(arch))
    assert source == ("llvm-objdump" if H.objdump_for(arch) else "llvm-listing")
    label = "<tiny>:" if source == "llvm-objdump" else "\ntiny:\n"
    assert label in text and "global_store" in text and "ds_" in text


def test_disassemble_without_objdump_names_it(monkeypatch):
    monkeypatch.setattr(H, "find_llvm_tool", lambda name, min_major=19: None)
    with pytest.raises(ToolchainMissingError, match=r"llvm-objdump >= 20 .*gfx950.*apt-get install llvm-19"):
        H.disassemble(b"\x7fELF", "gfx950")


@needs_lld
def test_listing_is_checked_against_the_object():
    """The listing stands in for a disassembly only if it describes the object: another arch's,
    another kernel's, or one with a different descriptor field is refused."""
    blob, asm = built("gfx942"), listing("gfx942")
    H.check_listing(H.inspect(blob), asm)
    assert H.listing_kernels(asm)["tiny"]["group_segment_fixed_size"] == 4 * LDS_WORDS
    with pytest.raises(CodegenError, match="targets amdgcn-amd-amdhsa--gfx90a.*object is for gfx942"):
        H.check_listing(H.inspect(blob), listing("gfx90a"))
    with pytest.raises(CodegenError, match=r"kernels \['tiny2'\], the code object \['tiny'\]"):
        H.check_listing(H.inspect(blob), asm.replace(".amdhsa_kernel tiny\n", ".amdhsa_kernel tiny2\n"))
    planted = asm.replace(f".amdhsa_group_segment_fixed_size {4 * LDS_WORDS}\n",
                          f".amdhsa_group_segment_fixed_size {8 * LDS_WORDS}\n")
    assert planted != asm
    with pytest.raises(CodegenError, match="group_segment_fixed_size 2048, the code object's metadata 1024"):
        H.check_listing(H.inspect(blob), planted)
    if H.objdump_for("gfx942") is None:
        with pytest.raises(CodegenError, match="targets"):
            H.disassembly(blob, "gfx942", listing("gfx90a"))


@needs_lld
def test_link_rejects_garbage_and_wrong_arch():
    with pytest.raises(CodegenError, match="ld.lld failed"):
        H.link(b"definitely not an object file", "gfx942")
    with pytest.raises(CodegenError, match="gfx942, not gfx90a"):
        H.link(H.compile_object(KERNEL_IR, "gfx942").obj, "gfx90a")


def test_compile_refuses_unknown_arch_and_foreign_triple():
    with pytest.raises(UnknownArchError):
        H.compile_object(KERNEL_IR, "gfx9999")
    with pytest.raises(CodegenError, match="amdgcn-amd-amdhsa"):
        H.compile_object(KERNEL_IR.replace("amdgcn-amd-amdhsa", "x86_64-unknown-linux-gnu"), "gfx942")


# --------------------------------------------------------------------------- teeth: corrupt objects
def _note_header(buf: bytes) -> int:
    at = buf.find(b"AMDGPU\0\0") - 12
    assert at > 0 and struct.unpack_from("<III", buf, at)[::2] == (7, 32)
    return at


@needs_lld
def test_corrupt_note_is_a_codegen_error():
    good = built("gfx942")
    at = _note_header(good)
    descsz = struct.unpack_from("<I", good, at + 4)[0]
    for new_size, message in [(descsz - 9, "note is corrupt: MessagePack data is truncated"),
                              (descsz + 4096, "runs past the end")]:
        bad = bytearray(good)
        struct.pack_into("<I", bad, at + 4, new_size)
        with pytest.raises(CodegenError, match=message):
            H.inspect(bytes(bad))
    bad = bytearray(good)
    struct.pack_into("<I", bad, at + 8, 33)                     # not the metadata note type
    with pytest.raises(CodegenError, match="no NT_AMDGPU_METADATA note"):
        H.inspect(bytes(bad))


@needs_lld
def test_corrupt_header_is_a_codegen_error():
    good = built("gfx1100")
    bad = bytearray(good)
    struct.pack_into("<H", bad, 18, 62)                         # EM_X86_64
    with pytest.raises(CodegenError, match="e_machine is 62, not EM_AMDGPU"):
        H.inspect(bytes(bad))
    with pytest.raises(CodegenError, match="ELF header .* runs past the end"):
        H.inspect(good[:40])
    with pytest.raises(CodegenError, match="section header"):
        H.inspect(good[:len(good) - 100])                      # section headers sit at the end
    with pytest.raises(CodegenError, match="bad magic"):
        H.inspect(b"\x7fELG" + good[4:])
    with pytest.raises(CodegenError, match="ELF64"):
        H.inspect(good[:4] + b"\x01" + good[5:])


# --------------------------------------------------------------------------- a hand-built object
def _pack(v) -> bytes:
    """A small MessagePack encoder (test-only) using the widest forms where it matters."""
    if v is None:
        return b"\xc0"
    if isinstance(v, bool):
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        return bytes([v & 0xFF]) if -32 <= v <= 127 else b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        raw = v.encode()
        return (bytes([0xA0 | len(raw)]) if len(raw) < 32 else b"\xda" + struct.pack(">H", len(raw))) + raw
    if isinstance(v, list):
        return b"\xdc" + struct.pack(">H", len(v)) + b"".join(_pack(x) for x in v)
    if isinstance(v, dict):
        return b"\xde" + struct.pack(">H", len(v)) + b"".join(_pack(k) + _pack(x) for k, x in v.items())
    raise TypeError(v)


def _elf_with_pt_note(desc: bytes, mach: int = 0x4C, flags: int = 0xE00) -> bytes:
    """ELF64 with one PT_NOTE segment and no section headers (the program-header path)."""
    name = b"AMDGPU\0\0"
    note = struct.pack("<III", 7, len(desc), 32) + name + desc + b"\0" * (-len(desc) % 4)
    ident = b"\x7fELF" + bytes([2, 1, 1, 64, 3]) + bytes(7)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 224, 1, 0, 64, 0, mach | flags, 64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 4, 4, 120, 0, 0, len(note), len(note), 4)
    return header + phdr + note


def test_inspect_hand_built_object_via_program_headers():
    meta = {"amdhsa.version": [1, 2], "amdhsa.target": "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
            "amdhsa.kernels": [{".name": "k", ".symbol": "k.kd", ".kernarg_segment_size": 272,
                                ".group_segment_fixed_size": 65536, ".private_segment_fixed_size": 16,
                                ".wavefront_size": 64, ".agpr_count": 4,
                                ".args": [{".offset": 0, ".size": 8, ".value_kind": "global_buffer",
                                           ".address_space": "global", ".is_const": True}]}]}
    info = H.inspect(_elf_with_pt_note(_pack(meta)))
    assert (info.arch, info.xnack, info.sramecc, info.code_object_version) == ("gfx942", "off", "on", 5)
    (k,) = info.kernels
    assert (k.kernarg_size, k.group_segment, k.private_segment, k.agpr_count, k.vgpr_count) == \
        (272, 65536, 16, 4, None)
    assert k.args == [{"offset": 0, "size": 8, "value_kind": "global_buffer", "address_space": "global"}]
    assert info.metadata == meta and info.symbols == [] and info.descriptors == []
    assert H.inspect(_elf_with_pt_note(_pack(meta), mach=0x7E)).arch == "mach-0x7e"
    with pytest.raises(CodegenError, match="amdhsa.kernels"):
        H.inspect(_elf_with_pt_note(_pack({"amdhsa.kernels": 3})))
    with pytest.raises(CodegenError, match="no .name"):
        H.inspect(_elf_with_pt_note(_pack({"amdhsa.kernels": [{".symbol": "x.kd"}]})))


# --------------------------------------------------------------------------- MessagePack
@pytest.mark.parametrize("data,value", [
    (b"\x00", 0), (b"\x7f", 127), (b"\xff", -1), (b"\xe0", -32),
    (b"\xcc\xff", 255), (b"\xcd\x01\x00", 256), (b"\xce\x00\x01\x00\x00", 65536),
    (b"\xcf" + (2**64 - 1).to_bytes(8, "big"), 2**64 - 1),
    (b"\xd0\x80", -128), (b"\xd1\x80\x00", -32768), (b"\xd2\x80\x00\x00\x00", -2**31),
    (b"\xd3" + (-2**63).to_bytes(8, "big", signed=True), -2**63),
    (b"\xca\x3f\xc0\x00\x00", 1.5), (b"\xcb" + struct.pack(">d", -0.1), -0.1),
    (b"\xc0", None), (b"\xc2", False), (b"\xc3", True),
    (b"\xa0", ""), (b"\xa3abc", "abc"), (b"\xd9\x03xyz", "xyz"),
    (b"\xda\x01\x00" + b"s" * 256, "s" * 256), (b"\xdb\x00\x01\x00\x00" + b"t" * 65536, "t" * 65536),
    (b"\xa2\xc3\xa9", "\u00e9"),
    (b"\xc4\x02\x00\xff", b"\x00\xff"), (b"\xc5\x00\x01\x07", b"\x07"), (b"\xc6\x00\x00\x00\x00", b""),
    (b"\x90", []), (b"\x93\x01\xa1x\xc0", [1, "x", None]),
    (b"\xdc\x00\x03\x01\x02\x03", [1, 2, 3]), (b"\xdd\x00\x01\x00\x00" + b"\x05" * 65536, [5] * 65536),
    (b"\x80", {}), (b"\x81\xa1k\xff", {"k": -1}),
    (b"\xde\x00\x02\xa1a\x01\xa1b\x02", {"a": 1, "b": 2}), (b"\xdf\x00\x00\x00\x01\x01\xc3", {1: True}),
    (b"\x82\xa4list\x92\x81\xa1x\x90\xcb" + struct.pack(">d", 2.5) + b"\xa3map\x81\xa1y\x81\xa1z\xd0\xfe",
     {"list": [{"x": []}, 2.5], "map": {"y": {"z": -2}}}),
])
def test_msgpack_decode(data, value):
    got = H.msgpack_decode(data)
    assert got == value and type(got) is type(value)


def test_msgpack_round_trip_with_test_encoder():
    value = {"a": [1, -5, -1000, 2**40, 1.25, None, True, False, "x" * 40], "b": {"c": {"d": [[], {}]}}}
    assert H.msgpack_decode(_pack(value)) == value


@pytest.mark.parametrize("data,message", [
    (b"", "truncated"), (b"\xcd\x01", "truncated"), (b"\xa5abc", "truncated"),
    (b"\xdb\xff\xff\xff\xff", "truncated"), (b"\x92\x01", "truncated"), (b"\x81\xa1k", "truncated"),
    (b"\x01\x02", "1 trailing bytes"), (b"\xc1", "0xc1"), (b"\xd4\x01\x00", "ext"),
    (b"\xa1\xff", "not UTF-8"), (b"\x81\x90\x01", "map key .* is a list"),
    (b"\x91" * 5000 + b"\x90", "nested too deeply"),
])
def test_msgpack_malformed_is_a_codegen_error(data, message):
    with pytest.raises(CodegenError, match=message):
        H.msgpack_decode(data)


@needs_lld
@pytest.mark.parametrize("arch", ["gfx90a", "gfx1201"])
def test_inspect_agrees_with_llvm_listing(arch):
    """What ``llvm-readelf -h -s --notes`` would show, read from LLVM's own listing of the module
    the object came from: the target (-> e_flags), the kernel and descriptor symbols, and the
    metadata note (the listing's ``.amdgpu_metadata`` is the YAML readelf prints for the note)."""
    import re
    out = listing(arch)
    info = H.inspect(built(arch))
    (k,) = info.kernels
    target = re.search(r'\.amdgcn_target "amdgcn-amd-amdhsa--([^"]+)"', out).group(1)
    name, *features = target.split(":")
    assert name == info.arch == arch and info.e_flags & 0xFF == H.MACH[name]
    feature = {f[:-1]: f[-1] for f in features}            # "xnack-" -> off, absent -> any/unsupported
    gfx9 = arch.startswith("gfx9")
    for setting, got in (("xnack", info.xnack), ("sramecc", info.sramecc)):
        want = {"+": "on", "-": "off"}.get(feature.get(setting), "any" if gfx9 else "unsupported")
        assert got == want, setting
    names = set(re.findall(r"^\s*\.globl\s+(\S+)$", out, re.M))
    names |= {f"{n}.kd" for n in re.findall(r"^\s*\.amdhsa_kernel (\S+)$", out, re.M)}
    assert names == {s.name for s in elf.symbols(built(arch)) if s.bind == 1} == {"tiny", "tiny.kd"}
    sets = set(re.findall(r"^\s*\.set (\S+),", out, re.M))       # resource symbols, absolute
    assert {s.name for s in elf.symbols(built(arch)) if s.shndx == 0xFFF1} <= sets
    assert set(info.symbols) <= names | sets | {"_DYNAMIC"}        # _DYNAMIC: made by the linker
    metadata = out[out.index(".amdgpu_metadata"):out.index(".end_amdgpu_metadata")]
    assert re.search(rf"\.name:\s+{k.name}\n", metadata) and re.search(rf"\.symbol:\s+{k.symbol}\n", metadata)
    for key, value in [("group_segment_fixed_size", k.group_segment), ("kernarg_segment_size", k.kernarg_size),
                       ("vgpr_count", k.vgpr_count), ("sgpr_count", k.sgpr_count),
                       ("wavefront_size", k.wavefront_size), ("max_flat_workgroup_size", k.max_workgroup_size)]:
        assert re.search(rf"\.{key}:\s+{value}\n", metadata), key


@needs_lld
def test_symbols_come_from_dynsym_when_symtab_is_stripped():
    buf = bytearray(built("gfx942"))
    shoff, = struct.unpack_from("<Q", buf, 40)
    shentsize, shnum = struct.unpack_from("<HH", buf, 58)
    types = [struct.unpack_from("<I", buf, shoff + i * shentsize + 4)[0] for i in range(shnum)]
    assert 2 in types and 11 in types
    struct.pack_into("<I", buf, shoff + types.index(2) * shentsize + 4, 0)     # .symtab -> SHT_NULL
    info = H.inspect(bytes(buf))
    assert info.symbols == ["tiny", "tiny.kd"] and info.descriptors == ["tiny.kd"]
