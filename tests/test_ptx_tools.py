"""ptxas wrapper: assemble real PTX for sm_80/sm_90/sm_120, parse ``ptxas -v``, errors."""
from __future__ import annotations

import pytest

from tessera import toolchain
from tessera.codegen.ptx_tools import KernelResources, assemble, parse_ptxas_log, sass
from tessera.errors import CodegenError, ToolchainMissingError

needs_ptxas = pytest.mark.skipif(toolchain.find_ptxas() is None, reason="ptxas not installed")

# The lowest PTX ISA that accepts each target (sm_120 needs 8.7; mma.sync m16n8k16 needs 7.0).
PTX_VERSION = {"sm_80": "7.0", "sm_90": "7.8", "sm_120": "8.7"}
SMEM_BYTES = 4096


def mma_kernel(arch: str) -> str:
    """Each thread stores 16 bytes to shared memory, syncs, reads a neighbour's 8 bytes back
    as the B fragment and issues one m16n8k16 f16 mma into zero accumulators."""
    return f"""\
.version {PTX_VERSION[arch]}
.target {arch}
.address_size 64

.visible .entry mma_smem(.param .u64 p_out, .param .u64 p_in)
{{
    .reg .b32 %a<4>;
    .reg .b32 %b<2>;
    .reg .f32 %c<4>;
    .reg .b32 %t, %off, %sa;
    .reg .b64 %rd<5>;
    .shared .align 16 .b8 tile[{SMEM_BYTES}];

    ld.param.u64 %rd0, [p_out];
    ld.param.u64 %rd1, [p_in];
    cvta.to.global.u64 %rd0, %rd0;
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %t, %tid.x;
    shl.b32 %off, %t, 4;
    cvt.u64.u32 %rd2, %off;
    add.u64 %rd3, %rd1, %rd2;
    ld.global.v4.b32 {{%a0, %a1, %a2, %a3}}, [%rd3];
    mov.u32 %sa, tile;
    add.u32 %sa, %sa, %off;
    st.shared.v4.b32 [%sa], {{%a0, %a1, %a2, %a3}};
    bar.sync 0;
    xor.b32 %sa, %off, 16;
    mov.u32 %b0, tile;
    add.u32 %sa, %sa, %b0;
    ld.shared.v2.b32 {{%b0, %b1}}, [%sa];
    mov.f32 %c0, 0f00000000;
    mov.f32 %c1, 0f00000000;
    mov.f32 %c2, 0f00000000;
    mov.f32 %c3, 0f00000000;
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%c0, %c1, %c2, %c3}}, {{%a0, %a1, %a2, %a3}}, {{%b0, %b1}}, {{%c0, %c1, %c2, %c3}};
    add.u64 %rd4, %rd0, %rd2;
    st.global.v4.f32 [%rd4], {{%c0, %c1, %c2, %c3}};
    ret;
}}
"""


def spill_kernel(arch: str, live: int = 48) -> str:
    """``live`` floats loaded with volatile loads and all kept alive by a reversed fma chain,
    under ``.maxnreg 24`` (ptxas' floor): ptxas must spill.  A second entry writes a local
    array at a thread-dependent index: a stack frame but no spills."""
    loads = "\n".join(f"    ld.global.volatile.f32 %f{i}, [%rd0+{4 * i}];" for i in range(live))
    chain = "\n".join(f"    fma.rn.f32 %f{live}, %f{live}, %f{live - 1 - i}, %f{i};" for i in range(live))
    return f"""\
.version {PTX_VERSION[arch]}
.target {arch}
.address_size 64

.visible .entry spills(.param .u64 p)
.maxnreg 24
{{
    .reg .f32 %f<{live + 1}>;
    .reg .b64 %rd0;
    ld.param.u64 %rd0, [p];
    cvta.to.global.u64 %rd0, %rd0;
{loads}
    mov.f32 %f{live}, 0f3F800000;
{chain}
    st.global.f32 [%rd0], %f{live};
    ret;
}}

.visible .entry local_array(.param .u64 p)
{{
    .local .align 4 .b8 arr[256];
    .reg .b64 %r<4>;
    .reg .b32 %x<3>;
    ld.param.u64 %r0, [p];
    cvta.to.global.u64 %r0, %r0;
    mov.u32 %x0, %tid.x;
    and.b32 %x0, %x0, 63;
    ld.global.u32 %x1, [%r0];
    mov.u64 %r1, arr;
    mul.wide.u32 %r2, %x0, 4;
    add.u64 %r3, %r1, %r2;
    st.local.u32 [%r3], %x1;
    and.b32 %x0, %x1, 63;
    mul.wide.u32 %r2, %x0, 4;
    add.u64 %r3, %r1, %r2;
    ld.local.u32 %x2, [%r3];
    st.global.u32 [%r0], %x2;
    ret;
}}
"""


# A log captured from ptxas 13.0 for sm_80, with one hand-added kernel in the older format
# (no barriers item, two cmem banks) to pin down what each regex reads.
CAPTURED_LOG = """\
ptxas info    : 4 bytes gmem, 256 bytes cmem[3], 8 bytes cmem[4]
ptxas info    : Compiling entry function 'second' for 'sm_80'
ptxas info    : Function properties for second
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers, 352 bytes cmem[0]
ptxas info    : Compile time = 2.118 ms
ptxas info    : Compiling entry function 'caller' for 'sm_80'
ptxas info    : Function properties for caller
    232 bytes stack frame, 228 bytes spill stores, 260 bytes spill loads
ptxas info    : Used 24 registers, used 2 barriers, 296 bytes cumulative stack size, 16384 bytes smem, 360 bytes cmem[0]
ptxas info    : Compile time = 2.498 ms
ptxas info    : Function properties for helper
    64 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function '_Z3oldPf' for 'sm_80'
ptxas info    : Function properties for _Z3oldPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 49152 bytes smem, 400 bytes cmem[0], 12 bytes cmem[2]
"""


def test_parser_reads_every_field_of_a_captured_log():
    res = parse_ptxas_log(CAPTURED_LOG)
    assert list(res) == ["second", "caller", "_Z3oldPf"]        # entries only: helper is a .func
    assert res["second"] == KernelResources("second", registers=4, shared_bytes=0, spill_stores=0,
                                            spill_loads=0, stack_bytes=0, barriers=0, cmem={0: 352})
    assert res["caller"] == KernelResources("caller", registers=24, shared_bytes=16384, spill_stores=228,
                                            spill_loads=260, stack_bytes=296, barriers=2, cmem={0: 360})
    assert res["_Z3oldPf"] == KernelResources("_Z3oldPf", registers=40, shared_bytes=49152, spill_stores=0,
                                              spill_loads=0, stack_bytes=0, barriers=0, cmem={0: 400, 2: 12})
    assert res["caller"].spills and not res["second"].spills


def test_parser_without_used_line_or_properties():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas info    : Used 8 registers\n"
           "ptxas info    : Compiling function 'f' for 'sm_90'\n"
           "ptxas info    : Used 99 registers\n")
    assert parse_ptxas_log(log) == {"k": KernelResources("k", registers=8)}
    assert parse_ptxas_log("") == {}


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_120"])
def test_assemble_mma_kernel(arch):
    cub = assemble(mma_kernel(arch), arch)
    assert cub.arch == arch and cub.data[:4] == b"\x7fELF"
    assert f"Compiling entry function 'mma_smem' for '{arch}'" in cub.log
    k = cub.resources["mma_smem"]
    assert list(cub.resources) == ["mma_smem"]
    assert k.registers > 0 and k.shared_bytes == SMEM_BYTES and k.barriers == 1
    assert (k.spill_stores, k.spill_loads, k.stack_bytes) == (0, 0, 0)


@needs_ptxas
def test_assemble_options_reach_ptxas():
    cub = assemble(mma_kernel("sm_90"), "sm_90", options=["-O0"])
    assert cub.resources["mma_smem"].shared_bytes == SMEM_BYTES


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_120"])
def test_register_pressure_spills_and_local_array_stack(arch):
    res = assemble(spill_kernel(arch), arch).resources
    s = res["spills"]
    assert s.registers <= 24 and s.spill_stores > 0 and s.spill_loads > 0 and s.stack_bytes > 0
    a = res["local_array"]
    assert a.stack_bytes >= 256 and not a.spills


@needs_ptxas
def test_bad_ptx_raises_with_ptxas_message():
    bad = mma_kernel("sm_90").replace("bar.sync 0;", "bogus.op %t;")
    with pytest.raises(CodegenError) as ei:
        assemble(bad, "sm_90")
    msg = str(ei.value)
    line = 1 + bad.splitlines().index("    bogus.op %t;")
    assert "ptxas failed for sm_90" in msg
    assert f"kernel.ptx, line {line}; error" in msg and "'bogus'" in msg


@needs_ptxas
def test_version_too_old_for_target_is_reported():
    old = mma_kernel("sm_120").replace(".version 8.7", ".version 8.6")
    with pytest.raises(CodegenError, match=r"8\.6 does not support .target sm_120"):
        assemble(old, "sm_120")


def test_bad_arch_is_rejected_before_running_ptxas(monkeypatch):
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: "/nonexistent/ptxas")
    with pytest.raises(CodegenError, match="not an NVIDIA arch"):
        assemble(".version 8.0", "-o/etc/passwd")


def test_missing_ptxas_raises_toolchain_missing(monkeypatch):
    monkeypatch.setattr(toolchain, "find_ptxas", lambda: None)
    with pytest.raises(ToolchainMissingError, match="ptxas"):
        assemble(mma_kernel("sm_90"), "sm_90")


def test_sass_without_nvdisasm_is_none(monkeypatch):
    monkeypatch.setattr(toolchain, "find_nvdisasm", lambda: None)
    assert sass(b"\x7fELF", "sm_90") is None


@needs_ptxas
@pytest.mark.skipif(toolchain.find_nvdisasm() is None, reason="nvdisasm not installed")
def test_sass_shows_the_mma_and_barrier():
    text = sass(assemble(mma_kernel("sm_90"), "sm_90").data, "sm_90")
    assert "HMMA.16816.F32" in text and "BAR.SYNC" in text


@needs_ptxas
@pytest.mark.skipif(toolchain.find_nvdisasm() is None, reason="nvdisasm not installed")
def test_sass_of_garbage_raises():
    with pytest.raises(CodegenError, match="nvdisasm failed"):
        sass(b"not an elf", "sm_90")
