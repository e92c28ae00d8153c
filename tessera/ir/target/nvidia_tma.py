"""``tessera_nvidia`` ops of the tensor copy engine (TMA) and its ``mbarrier``s (sm_90a).

Per thread, like every Target IR op; the lowering elects the thread that issues them.

  mbarrier_init %bars[%i] {count}      ``mbarrier.init.shared::cta.b64 [bar], count``
  fence_mbarrier_init                  ``fence.mbarrier_init.release.cluster``: the inits
                                       become visible to the async proxy (the copy engine's
                                       complete_tx) and, after a barrier, to the other threads
  mbarrier_expect_tx %bars[%i] {bytes} ``mbarrier.arrive.expect_tx.shared::cta.b64``: one
                                       arrival, ``bytes`` more transaction bytes expected
  mbarrier_wait %bars[%i], %parity     ``mbarrier.try_wait.parity.shared::cta.b64`` in a loop
                                       until the phase of that parity has completed
  tma_load %dst[%di], %bars[%bi], [%c0, %c1] {map, box}
                                       ``cp.async.bulk.tensor.2d.shared::cluster.global.
                                       mbarrier::complete_tx::bytes [dst], [tmap, {c0, c1}],
                                       [bar]``: the box (``box`` = [inner, outer] elements) at
                                       coordinates (c0 innermost, c1) of the tensor that the
                                       kernel's tensor-map parameter ``map`` describes
"""
from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, IndexType, IntegerAttr
from xdsl.irdl import IRDLOperation, attr_def, irdl_op_definition, operand_def

from tessera.errors import TargetVerifyError
from tessera.ir.attrs import ival
from tessera.ir.tile import BufferType


def _smem(op, *bufs) -> None:
    for b in bufs:
        if isinstance(b.type, BufferType) and b.type.space.data != "smem":
            raise TargetVerifyError(f"{op.name} takes shared-memory (smem) buffers", op=op)


@irdl_op_definition
class MbarrierInitOp(IRDLOperation):
    name = "tessera_nvidia.mbarrier_init"
    bars = operand_def(BufferType)
    index = operand_def(IndexType)
    count = attr_def(IntegerAttr)
    assembly_format = "$bars `[` $index `]` attr-dict `:` type($bars)"

    def verify_(self) -> None:
        _smem(self, self.bars)
        if not 1 <= ival(self.count) < (1 << 20):
            raise TargetVerifyError("mbarrier_init count is 1..2^20-1", op=self)


@irdl_op_definition
class FenceMbarrierInitOp(IRDLOperation):
    name = "tessera_nvidia.fence_mbarrier_init"
    assembly_format = "attr-dict"


@irdl_op_definition
class MbarrierExpectTxOp(IRDLOperation):
    name = "tessera_nvidia.mbarrier_expect_tx"
    bars = operand_def(BufferType)
    index = operand_def(IndexType)
    bytes = attr_def(IntegerAttr)
    assembly_format = "$bars `[` $index `]` attr-dict `:` type($bars)"

    def verify_(self) -> None:
        _smem(self, self.bars)
        if not 0 < ival(self.bytes) < (1 << 20):
            raise TargetVerifyError("mbarrier_expect_tx bytes are 1..2^20-1", op=self)


@irdl_op_definition
class MbarrierWaitOp(IRDLOperation):
    name = "tessera_nvidia.mbarrier_wait"
    bars = operand_def(BufferType)
    index = operand_def(IndexType)
    parity = operand_def(IndexType)
    assembly_format = "$bars `[` $index `]` `,` $parity attr-dict `:` type($bars)"

    def verify_(self) -> None:
        _smem(self, self.bars)


@irdl_op_definition
class TmaLoadOp(IRDLOperation):
    name = "tessera_nvidia.tma_load"
    dst = operand_def(BufferType)
    dst_index = operand_def(IndexType)
    bars = operand_def(BufferType)
    bar_index = operand_def(IndexType)
    c0 = operand_def(IndexType)
    c1 = operand_def(IndexType)
    map = attr_def(IntegerAttr)
    box = attr_def(ArrayAttr)
    assembly_format = ("$dst `[` $dst_index `]` `,` $bars `[` $bar_index `]` `,` `[` $c0 `,` $c1 `]` attr-dict `:` "
                       "type($dst) `,` type($bars)")

    def verify_(self) -> None:
        _smem(self, self.dst, self.bars)
        if len(self.box.data) != 2 or not all(1 <= ival(a) <= 256 for a in self.box.data):
            raise TargetVerifyError("tma_load box is [inner, outer], each 1..256 elements", op=self)


TMA_OPS = [MbarrierInitOp, FenceMbarrierInitOp, MbarrierExpectTxOp, MbarrierWaitOp, TmaLoadOp]

__all__ = ["MbarrierInitOp", "FenceMbarrierInitOp", "MbarrierExpectTxOp", "MbarrierWaitOp", "TmaLoadOp", "TMA_OPS"]
