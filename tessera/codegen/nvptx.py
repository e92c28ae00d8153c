"""NVIDIA Target IR (``tessera_gpu`` + ``tessera_nvidia``) -> LLVM IR -> PTX -> cubin.

Kernels use the ``ptx_kernel`` calling convention; ``tessera_nvidia.mma_sync`` becomes
the ``llvm.nvvm.mma.*`` intrinsic of the selector's record (bf16 registers go as
i32; f32 registers of a tf32 record are rounded by ``cvt.rna.tf32.f32`` first), ``ldmatrix`` / ``cp_async`` / ``cp_async_commit`` / ``cp_async_wait`` their NVVM
intrinsics; shared memory is the launch's dynamic shared memory.  Every ``mma_sync`` is
checked against the selector's table for the arch before LLVM sees it (bf16 on sm_75 is a ``MmaSelectorError`` here).  The PTX version is
the highest any used record needs on the arch (``+ptxNN``); PTX comes from LLVM's
NVPTX backend (in a subprocess), the cubin and the per-kernel registers / shared
memory / spills from ``ptxas -arch=<sm> -v``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from llvmlite import ir
from xdsl.dialects.builtin import BFloat16Type, ModuleOp

from tessera.codegen import ptx_tools
from tessera.codegen.amdgpu import _parse_llvm_type
from tessera.codegen.gpu import GpuFn, translate_kernels
from tessera.codegen.jit import emit_guarded
from tessera.codegen.nvptx_tma import TmaCodegen
from tessera.codegen.llvm_common import BF16, I32, llvm_type
from tessera.errors import CodegenError, MmaSelectorError
from tessera.ir.attrs import ival
from tessera.ir.target import nvidia as NV
from tessera.mma import nvidia as NVR
from tessera.mma.records import MmaRecord
from tessera.mma.selector import get_isa

TRIPLE = "nvptx64-nvidia-cuda"


def record_for(op: NV.MmaSyncOp, arch: str) -> MmaRecord:
    isa = get_isa("nvidia", arch)
    shape = tuple(int(x) for x in op.shape.data[1:].replace("n", " ").replace("k", " ").split())
    # f32 registers run the tf32 record (the only f32 mma.sync): the codegen rounds them to tf32 first
    btype = op.btype.data if op.btype is not None else op.atype.data
    cands = [r for r in isa.records if r.family == "mma_sync" and r.shape == shape and r.a_dtype == op.atype.data
             and r.b_dtype == btype and r.math_mode in (None, "tf32" if op.atype.data == "f32" else None)]
    if not cands:
        legal = sorted({f"m{r.m}n{r.n}k{r.k} {r.a_dtype}" for r in isa.records if r.family == "mma_sync"})
        raise MmaSelectorError(f"nvidia:{arch} has no mma.sync {op.shape.data} on {op.atype.data}; legal there: "
                               + ", ".join(legal))
    return cands[0]


class NvptxFn(TmaCodegen, GpuFn):
    target_name = "NVPTX"

    def setup(self, fn) -> None:
        super().setup(fn)
        self.f.calling_convention = "ptx_kernel"
        self.setup_tensor_maps(fn)       # by-value __grid_constant__ tensor maps (nvptx_tma.py)
        # wgmma reads 128-byte-swizzled blocks whose atoms must be 1024-byte aligned
        self._smem_align = 1024 if any(isinstance(o, (NV.WgmmaOp, NV.TmaLoadOp)) for o in fn.walk()) else 16

    def shared_base(self) -> ir.Value:
        """Dynamic shared memory (``.extern .shared``): the launch passes the kernel's size, so a
        workgroup may use more than the 48 KB a static array is limited to."""
        if self._lds is None:
            g = ir.GlobalVariable(self.gen.m, ir.ArrayType(ir.IntType(8), 0), f"{self.f.name}_dynsmem", addrspace=3)
            g.linkage = "external"
            g.align = self._smem_align
            g.type = ir.PointerType(addrspace=3)
            self._lds = g
        return self._lds

    def target_thread_id(self):
        return self.b.call(self.gen.intrinsic("llvm.nvvm.read.ptx.sreg.tid.x", I32, []), [])

    def target_block_id(self, axis: int):
        return self.b.call(self.gen.intrinsic(f"llvm.nvvm.read.ptx.sreg.ctaid.{'xyz'[axis]}", I32, []), [])

    def target_barrier(self) -> None:
        self.b.call(self.gen.intrinsic("llvm.nvvm.barrier0", ir.VoidType(), []), [])

    def target_shuffle_xor(self, value, mask: int, width: int):
        """``shfl.sync.bfly.b32`` over the full warp (clamp 31: lanes stay in their warp)."""
        fn = self.gen.intrinsic("llvm.nvvm.shfl.sync.bfly.f32", ir.FloatType(), [I32, ir.FloatType(), I32, I32])
        return self.b.call(fn, [ir.Constant(I32, -1), value, ir.Constant(I32, mask), ir.Constant(I32, 0x1F)])

    def op_tessera_nvidia_mma_sync(self, op: NV.MmaSyncOp):
        rec = record_for(op, self.gen.arch)
        self.gen.used.add(rec.id)
        types = [_parse_llvm_type(a) for a in rec.llvm_args]
        vals = [self.v(x) for x in (*op.a, *op.b, *op.c)]
        if len(vals) != len(types):
            raise CodegenError(f"{op.name} {op.shape.data}: {len(vals)} registers, the intrinsic takes {len(types)}")
        if rec.math_mode == "tf32":   # A and B: f32 rounded to nearest tf32 (ties away), cvt.rna.tf32.f32
            cvt = self.gen.intrinsic("llvm.nvvm.f2tf32.rna", I32, [ir.FloatType()])
            na = len(op.a) + len(op.b)
            vals = [self.b.call(cvt, [v]) if i < na else v for i, v in enumerate(vals)]
        args = [v if v.type == ty else self.b.bitcast(v, ty) for v, ty in zip(vals, types)]
        ret = ir.LiteralStructType([ir.FloatType()] * len(op.d))
        res = self.b.call(self.gen.intrinsic(rec.intrinsic, ret, types), args)
        self.set(op, *[self.b.extract_value(res, i) for i in range(len(op.d))])

    def op_tessera_nvidia_ldmatrix(self, op: NV.LdmatrixOp):
        num = len(op.regs)
        name = f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if op.trans is not None else ''}.b16"
        ret = ir.LiteralStructType([I32] * num) if num > 1 else I32
        elem = _parse_llvm_type("<2 x half>") if not isinstance(op.buf.type.element_type, BFloat16Type) else None
        ptr = self._ptr(op.buf, op.index, ir.IntType(16))
        res = self.b.call(self.gen.intrinsic(name, ret, [ptr.type]), [ptr])
        outs = [self.b.extract_value(res, i) for i in range(num)] if num > 1 else [res]
        vt = elem if elem is not None else ir.VectorType(BF16, 2)
        self.set(op, *[self.b.bitcast(o, vt) for o in outs])

    def op_tessera_nvidia_cp_async(self, op: NV.CpAsyncOp):
        nbytes = ival(op.bytes)
        dst = self._ptr(op.dst, op.dst_index, _elem(op.dst.type))
        src = self._ptr(op.src, op.src_index, _elem(op.src.type))
        kind = "cg" if nbytes == 16 else "ca"
        fn = self.gen.intrinsic(f"llvm.nvvm.cp.async.{kind}.shared.global.{nbytes}.s", ir.VoidType(),
                                [dst.type, src.type, I32])
        self.b.call(fn, [dst, src, self.b.trunc(self.v(op.src_bytes), I32)])

    def op_tessera_nvidia_cp_async_commit(self, op):
        self.b.call(self.gen.intrinsic("llvm.nvvm.cp.async.commit.group", ir.VoidType(), []), [])

    def op_tessera_nvidia_cp_async_wait(self, op):
        self.b.call(self.gen.intrinsic("llvm.nvvm.cp.async.wait.group", ir.VoidType(), [I32]),
                    [ir.Constant(I32, ival(op.pending))])


    # ------------------------------------------------------------------ wgmma (sm_90a)
    def op_tessera_nvidia_shared_address(self, op: NV.SharedAddressOp):
        ptr = self._ptr(op.buf, op.index, _elem(op.buf.type))
        self.set(op, self.b.ptrtoint(ptr, ir.IntType(64)))  # the shared-window address

    def op_tessera_nvidia_wgmma(self, op: NV.WgmmaOp):
        """Inline PTX (LLVM has no wgmma intrinsic): the n/2 accumulators are outputs tied to
        the inputs ("+f"), so they stay in registers across the asynchronous instruction."""
        from tessera.mma.selector import get_isa as _isa
        m, n, k = _shape(op.shape.data)
        rec = next((r for r in _isa("nvidia", self.gen.arch).records if r.family == "wgmma" and r.shape == (m, n, k)
                    and r.a_dtype == op.atype.data
                    and r.b_dtype == (op.btype.data if op.btype is not None else op.atype.data)), None)
        if rec is None:
            raise MmaSelectorError(f"nvidia:{self.gen.arch} has no wgmma {op.shape.data} on {op.atype.data}")
        self.gen.used.add(rec.id)
        nd = n // 2
        regs = ", ".join(f"${i}" for i in range(nd))
        tnsp_b = 1 if op.trans_b is not None else 0      # imm-trans-b: B MN-major (f16/bf16 only)
        # scale-d 1, imm-scale-a/b 1; the 16-bit forms add imm-trans-a/b, fp8 has none (K-major only)
        trans = "" if k == 32 else f", 0, {tnsp_b}"
        asm = f"{rec.mnemonic} {{{regs}}}, ${nd}, ${nd + 1}, 1, 1, 1{trans};"
        cons = ",".join(["=f"] * nd + ["l", "l"] + [str(i) for i in range(nd)] + ["~{memory}"])
        f32t = ir.FloatType()
        ret = ir.LiteralStructType([f32t] * nd)
        fty = ir.FunctionType(ret, [ir.IntType(64), ir.IntType(64)] + [f32t] * nd)
        res = self.b.call(ir.InlineAsm(fty, asm, cons, side_effect=True),
                          [self.v(op.desc_a), self.v(op.desc_b)] + [self.v(c) for c in op.c])
        self.set(op, *[self.b.extract_value(res, i) for i in range(nd)])

    def op_tessera_nvidia_wgmma_fence(self, op):
        self.b.call(self.gen.intrinsic("llvm.nvvm.wgmma.fence.sync.aligned", ir.VoidType(), []), [])

    def op_tessera_nvidia_wgmma_commit(self, op):
        self.b.call(self.gen.intrinsic("llvm.nvvm.wgmma.commit_group.sync.aligned", ir.VoidType(), []), [])

    def op_tessera_nvidia_wgmma_wait(self, op):
        self.b.call(self.gen.intrinsic("llvm.nvvm.wgmma.wait_group.sync.aligned", ir.VoidType(), [ir.IntType(64)]),
                    [ir.Constant(ir.IntType(64), ival(op.pending))])

    def op_tessera_nvidia_wgmma_fence_operand(self, op: NV.WgmmaFenceOperandOp):
        """An empty inline asm with the registers tied ("=f" / "0"..): reads of them cannot be
        moved above the wgmma.wait_group before it."""
        nd = len(op.c)
        if not nd:
            return
        cons = ",".join(["=f"] * nd + [str(i) for i in range(nd)] + ["~{memory}"])
        f32t = ir.FloatType()
        fty = ir.FunctionType(ir.LiteralStructType([f32t] * nd), [f32t] * nd)
        res = self.b.call(ir.InlineAsm(fty, "", cons, side_effect=True), [self.v(c) for c in op.c])
        self.set(op, *[self.b.extract_value(res, i) for i in range(nd)])

    def op_tessera_nvidia_fence_proxy_async(self, op):
        self.b.call(self.gen.intrinsic("llvm.nvvm.fence.proxy.async.shared_cta", ir.VoidType(), []), [])


def _shape(text: str) -> tuple[int, int, int]:
    return tuple(int(x) for x in text[1:].replace("n", " ").replace("k", " ").split())  # type: ignore[return-value]


def _elem(buf_type) -> ir.Type:
    return llvm_type(buf_type.element_type)


def ptx_version_for(arch: str, record_ids) -> tuple[int, int]:
    from tessera.mma.selector import record_by_id
    v = NVR.ARCH_MIN_PTX[arch]
    for rid in record_ids:
        v = max(v, NVR.ptx_version(arch, record_by_id(rid)))
    return max(v, (7, 0)) if arch != "sm_75" else v


def translate(module: ModuleOp, arch: str) -> tuple[str, list[dict], list[str]]:
    """LLVM IR text of every kernel, their ABI records and the MMA records they use."""
    return translate_kernels(module, TRIPLE, arch, NvptxFn, "tessera_nvidia", "lower-tile-to-nvidia")


@dataclass
class PtxBuild:
    arch: str
    ptx: str
    ptx_version: str
    cubin: ptx_tools.Cubin


REGISTER_FILE = 65536      # 32-bit registers per multiprocessor (sm_75 .. sm_120)


def register_cap(threads: int) -> int:
    """Registers per thread at which one workgroup of ``threads`` still fits the register file
    (allocated per warp in units of 256, i.e. 8 per thread); ptxas spills rather than exceed it,
    instead of the launch failing with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES."""
    return max(16, min(255, REGISTER_FILE // max(threads, 1) // 8 * 8))


def build(llvm_ir: str, arch: str, records: list[str] | None = None, max_threads: int = 0) -> PtxBuild:
    used = records if records is not None else []
    major, minor = ptx_version_for(arch, used)
    cpu = get_isa("nvidia", arch).llvm_cpu or arch
    oc = emit_guarded(llvm_ir, cpu, f"+ptx{major}{minor}", want_asm=True, want_object=False)
    ptx = oc.asm or ""
    if arch == "sm_90a":   # LLVM's sm_90a target spells the PTX target as sm_90a already; keep it
        ptx = re.sub(r"\.target sm_90\b", ".target sm_90a", ptx)
    options = [f"-maxrregcount={register_cap(max_threads)}"] if max_threads else []
    cubin = ptx_tools.assemble(ptx, arch, options=options)
    if arch == "sm_90a":
        check_wgmma_advisories(cubin.log)
    return PtxBuild(arch, ptx, f"{major}.{minor}", cubin)


# ptxas info C75xx "Potential Performance Loss: wgmma.mma_async instructions are serialized due to ...":
# the pipeline silently fell back to one wgmma at a time (extern calls, accumulators touched inside the
# pipeline stage, ...).  Such a build is a failure, not a slow success.
_WGMMA_SERIAL = re.compile(r"^.*(?:\(C75\d\d\)|wgmma[^\n]*serializ)[^\n]*$", re.MULTILINE)


def check_wgmma_advisories(log: str) -> None:
    hits = [m.group(0).strip() for m in _WGMMA_SERIAL.finditer(log)]
    if hits:
        raise CodegenError("ptxas serialized the wgmma pipeline:\n" + "\n".join(hits))
