"""The copy-engine part of ``lower-tile-to-nvidia{arch=sm_90a}``: Tile IR bulk staging -> TMA + mbarriers.

``tile.bulk_init`` -> thread 0 runs ``mbarrier.init`` (count) on every barrier of the ring and
``fence.mbarrier_init.release.cluster`` (so the copy engine's complete_tx, an async-proxy
access, sees initialised barriers), then the workgroup barrier (so every thread does).
``tile.bulk_expect`` / ``tile.bulk_copy`` -> thread 0 runs ``mbarrier.arrive.expect_tx`` /
``cp.async.bulk.tensor.2d`` (coordinates innermost first: column, row).  ``tile.bulk_wait`` ->
every thread spins on ``mbarrier.try_wait.parity``.  The destination of a bulk copy is recorded
as a 128-byte-swizzled block (panel stride = the box's rows x 128 bytes), so the wgmma
descriptors read it exactly as they read a block the threads staged (``wgmma.py``).

No ``fence.proxy.async`` is placed around the stages: the copy engine writes and wgmma reads
through the async proxy both; the generic-proxy write such a kernel does make is the barriers'
init, which the mbarrier_init fence covers.
"""
from __future__ import annotations

from tessera.errors import CodegenError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, int_array, ival
from tessera.ir.builder import Builder
from tessera.ir.target import gpu as G
from tessera.ir.target import nvidia as NV
from tessera.passes.target.gpu.simt_values import elem_bytes
from tessera.passes.target.nvidia.wgmma import ROW_BYTES

TMA_CONSUMES = ("tile.bulk_init", "tile.bulk_expect", "tile.bulk_copy", "tile.bulk_wait")
TMA_PRODUCES = ("tessera_nvidia.mbarrier_init", "tessera_nvidia.fence_mbarrier_init",
                "tessera_nvidia.mbarrier_expect_tx", "tessera_nvidia.mbarrier_wait", "tessera_nvidia.tma_load")


class TmaLowering:
    """Mixin of the NVIDIA lowerer (needs ``arch``, ``tid``, ``swizzled``, ``scalar``)."""

    def _tma_arch(self, op) -> None:
        if self.arch != "sm_90a":
            raise CodegenError(f"{op.name}: the tensor copy engine stages wgmma blocks on sm_90a, not {self.arch}")

    def _elected(self, b: Builder, emit) -> None:
        def then(b2: Builder):
            emit(b2)
            return []
        b.if_(b.cmp("eq", self.tid, 0), then)

    def op_tile_bulk_init(self, op: t.BulkInitOp, b: Builder) -> None:
        self._tma_arch(op)
        bars = self.scalar(op.bars)
        owner = op.bars.owner
        stages = ival(owner.size) if isinstance(owner, t.AllocOp) else None
        if stages is None:
            raise CodegenError("tile.bulk_init: the barrier ring must be a tile.alloc of this kernel")

        def init(b2: Builder):
            for s in range(stages):
                b2.op(NV.MbarrierInitOp.create(operands=[bars, b2.c(s)], attributes={"count": op.count}))
            b2.op(NV.FenceMbarrierInitOp.create())
        self._elected(b, init)
        b.op(G.BarrierOp.create())

    def op_tile_bulk_expect(self, op: t.BulkExpectOp, b: Builder) -> None:
        self._tma_arch(op)
        bars, stage = self.scalar(op.bars), self.scalar(op.stage)
        self._elected(b, lambda b2: b2.op(NV.MbarrierExpectTxOp.create(operands=[bars, stage],
                                                                        attributes={"bytes": op.bytes})))

    def op_tile_bulk_copy(self, op: t.BulkCopyOp, b: Builder) -> None:
        self._tma_arch(op)
        rows, cols = op.box_shape
        dst = self.scalar(op.dest)
        eb = elem_bytes(op.dest.type.element_type)
        if cols * eb != ROW_BYTES:
            raise CodegenError(f"tile.bulk_copy boxes are 128-byte swizzled rows; this box has {cols} {eb}-byte "
                               "columns")
        row = ROW_BYTES // eb
        if self.swizzled.get(dst, rows * row) != rows * row:
            raise CodegenError(f"bulk copies of {rows} and {self.swizzled[dst] // row} rows share one buffer")
        self.swizzled[dst] = rows * row          # the descriptors' panel stride (MN-major LBO)
        operands = [dst, self.scalar(op.dest_offset), self.scalar(op.bars), self.scalar(op.stage),
                    self.scalar(op.col), self.scalar(op.row)]
        attrs = {"map": i64_attr(ival(op.map)), "box": int_array([cols, rows])}
        self._elected(b, lambda b2: b2.op(NV.TmaLoadOp.create(operands=operands, attributes=attrs)))

    def op_tile_bulk_wait(self, op: t.BulkWaitOp, b: Builder) -> None:
        self._tma_arch(op)
        b.op(NV.MbarrierWaitOp.create(operands=[self.scalar(op.bars), self.scalar(op.stage),
                                                self.scalar(op.parity)]))


__all__ = ["TmaLowering", "TMA_CONSUMES", "TMA_PRODUCES"]
