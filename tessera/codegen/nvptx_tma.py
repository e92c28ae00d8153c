"""NVPTX translation of the tensor copy engine's ops (``ir/target/nvidia_tma.py``), sm_90a.

Tensor maps are kernel parameters after the kernel's own (one per record of the function's
``tma.maps``): ``ptr byval([128 x i8]) align 64 "nvvm.grid_constant"``, which LLVM prints as
``.param .align 64 .b8 name[128]`` and whose address it takes with ``cvta.param`` (no local
copy: the copy engine reads the map where the launch put it, ``__grid_constant__``).  A local
copy would put the map in local memory, which the engine cannot read: the SASS check (no
``LDL``/``STL``) catches that.

LLVM 22 has intrinsics for ``mbarrier.init``, ``fence.mbarrier_init`` and the 2-D tiled tensor
copy; ``arrive.expect_tx`` and ``try_wait.parity`` are inline PTX (the wait as a loop of
LLVM blocks around one ``try_wait``, so no label is repeated when it is emitted many times).
"""
from __future__ import annotations

from llvmlite import ir

from tessera.codegen.llvm_common import I32, I64
from tessera.errors import CodegenError
from tessera.ir import tensor_map as TM
from tessera.ir.attrs import ival
from tessera.ir.target import nvidia as NV

MAP_TYPE = f"byval([{TM.MAP_BYTES} x i8])"
GRID_CONSTANT = '"nvvm.grid_constant"'


def maps_of(fn) -> list[dict]:
    attr = fn.attributes.get("tma.maps")
    return [TM.parse(a.data) for a in attr.data] if attr is not None else []


class TmaCodegen:
    """Mixin of ``NvptxFn``."""

    def extra_params(self, fn) -> list[ir.Type]:
        return [ir.PointerType() for _ in maps_of(fn)]

    def setup_tensor_maps(self, fn) -> None:
        n = len(maps_of(fn))
        self.tensor_maps = list(self.f.args[len(self.f.args) - n:]) if n else []
        for a in self.tensor_maps:
            at = a.attributes
            at._known = dict(at._known) | {MAP_TYPE: False, GRID_CONSTANT: False}
            at.add(MAP_TYPE)
            at.add(GRID_CONSTANT)
            at.align = TM.MAP_ALIGN

    def _bar(self, op) -> ir.Value:
        return self._ptr(op.bars, op.index if hasattr(op, "index") else op.bar_index, I64)

    def op_tessera_nvidia_mbarrier_init(self, op: NV.MbarrierInitOp):
        fn = self.gen.intrinsic("llvm.nvvm.mbarrier.init.shared", ir.VoidType(), [ir.PointerType(addrspace=3), I32])
        self.b.call(fn, [self._bar(op), ir.Constant(I32, ival(op.count))])

    def op_tessera_nvidia_fence_mbarrier_init(self, op):
        self.b.call(self.gen.intrinsic("llvm.nvvm.fence.mbarrier_init.release.cluster", ir.VoidType(), []), [])

    def op_tessera_nvidia_mbarrier_expect_tx(self, op: NV.MbarrierExpectTxOp):
        bar = self._bar(op)
        fty = ir.FunctionType(I64, [bar.type, I32])
        asm = ir.InlineAsm(fty, "mbarrier.arrive.expect_tx.shared::cta.b64 $0, [$1], $2;", "=l,r,r,~{memory}",
                           side_effect=True)
        self.b.call(asm, [bar, ir.Constant(I32, ival(op.bytes))])

    def op_tessera_nvidia_mbarrier_wait(self, op: NV.MbarrierWaitOp):
        bar = self._bar(op)
        parity = self.v(op.parity)
        parity = self.b.trunc(parity, I32) if parity.type.width > 32 else parity
        fty = ir.FunctionType(I32, [bar.type, I32])
        asm = ir.InlineAsm(fty, "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\n\t"
                                "selp.u32 $0, 1, 0, p;\n\t}", "=r,r,r,~{memory}", side_effect=True)
        spin = self.f.append_basic_block("mbar.wait")
        done = self.f.append_basic_block("mbar.done")
        self.b.branch(spin)
        self.b.position_at_end(spin)
        ok = self.b.call(asm, [bar, parity])
        self.b.cbranch(self.b.icmp_unsigned("!=", ok, ir.Constant(I32, 0)), done, spin)
        self.b.position_at_end(done)

    def op_tessera_nvidia_tma_load(self, op: NV.TmaLoadOp):
        m = ival(op.map)
        if m >= len(self.tensor_maps):
            raise CodegenError(f"tma_load names tensor map {m}; the kernel has {len(self.tensor_maps)}")
        elem = ir.IntType(8)
        dst = self.b.gep(self.v(op.dst), [self.b.mul(self.v(op.dst_index), ir.Constant(
            self.v(op.dst_index).type, _esize(op.dst.type)))], source_etype=elem, inbounds=True)
        dst7 = self.b.addrspacecast(dst, ir.PointerType(addrspace=7))
        bar = self._ptr(op.bars, op.bar_index, I64)
        i1, i16 = ir.IntType(1), ir.IntType(16)
        fn = self.gen.intrinsic("llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d", ir.VoidType(),
                                [dst7.type, bar.type, ir.PointerType(), I32, I32, i16, I64, i1, i1, I32])
        c0, c1 = (self.v(c) for c in (op.c0, op.c1))
        c0, c1 = (self.b.trunc(c, I32) if c.type.width > 32 else c for c in (c0, c1))
        self.b.call(fn, [dst7, bar, self.tensor_maps[m], c0, c1, ir.Constant(i16, 0), ir.Constant(I64, 0),
                         ir.Constant(i1, 0), ir.Constant(i1, 0), ir.Constant(I32, 0)])


def _esize(buf_type) -> int:
    return TM.ELEM_BYTES[str(buf_type.element_type)]


__all__ = ["TmaCodegen", "maps_of"]
