"""Tile IR ops of bulk staging: tiles moved by a copy engine, completion counted on barriers.

A kernel whose schedule says ``copy_engine = "tma"`` (NVIDIA sm_90a) stages its GEMM blocks
without the threads moving the data: one elected thread asks the copy engine for a 2-D box
of a global tensor, and a ring of ``stages`` barriers (one per staged block, in a shared
buffer of one i64 per stage) counts the bytes that land.  The global tensors are described
by the kernel's tensor maps (the function attribute ``tma.maps``: which buffer argument,
its dims, row stride, box and swizzle; encoded on the host, passed by value).

  tile.bulk_init %bars {count}        every barrier of the ring set up to expect ``count``
                                      arrivals per phase; visible to the copy engine and to
                                      every thread before any uses it (the lowering fences
                                      and synchronises the workgroup)
  tile.bulk_expect %bars[%s] {bytes}  one arrival on barrier s announcing ``bytes`` bytes
                                      of copies for its current phase
  tile.bulk_copy %dst[%off], %bars[%s] at [%row, %col] {map, rows, cols}
                                      the rows x cols box at (row, col) of tensor map
                                      ``map`` into dst at element off (128-byte swizzled,
                                      elements past the tensor read as zero); its bytes
                                      complete on barrier s
  tile.bulk_wait %bars[%s], %parity   every thread waits until the phase of barrier s with
                                      parity ``parity`` (0/1, flipping per ring lap) is complete
"""
from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, IndexType, IntegerAttr, IntegerType
from xdsl.irdl import IRDLOperation, attr_def, irdl_op_definition, operand_def

from tessera.errors import TileMemorySpaceError, TileVerifyError
from tessera.ir.attrs import ival
from tessera.ir.tile_types import BufferType


def _check_bars(op, bars) -> None:
    t = bars.type
    if isinstance(t, BufferType) and (t.space.data != "smem" or not isinstance(t.element_type, IntegerType)
                                      or t.element_type.width.data != 64):
        raise TileMemorySpaceError(f"{op.name}: the barrier ring is a shared (smem) buffer of i64, got {t}", op=op)


@irdl_op_definition
class BulkInitOp(IRDLOperation):
    name = "tile.bulk_init"
    bars = operand_def(BufferType)
    count = attr_def(IntegerAttr)
    assembly_format = "$bars attr-dict `:` type($bars)"

    def verify_(self) -> None:
        _check_bars(self, self.bars)
        if ival(self.count) < 1:
            raise TileVerifyError("tile.bulk_init count must be >= 1", op=self)


@irdl_op_definition
class BulkExpectOp(IRDLOperation):
    name = "tile.bulk_expect"
    bars = operand_def(BufferType)
    stage = operand_def(IndexType)
    bytes = attr_def(IntegerAttr)
    assembly_format = "$bars `[` $stage `]` attr-dict `:` type($bars)"

    def verify_(self) -> None:
        _check_bars(self, self.bars)
        if not 0 < ival(self.bytes) < (1 << 20):
            raise TileVerifyError("tile.bulk_expect bytes must be in 1..2^20-1 (the barrier's tx-count)", op=self)


@irdl_op_definition
class BulkCopyOp(IRDLOperation):
    name = "tile.bulk_copy"
    dest = operand_def(BufferType)
    dest_offset = operand_def(IndexType)
    bars = operand_def(BufferType)
    stage = operand_def(IndexType)
    row = operand_def(IndexType)
    col = operand_def(IndexType)
    map = attr_def(IntegerAttr)
    box = attr_def(ArrayAttr)          # [rows, cols]
    assembly_format = ("$dest `[` $dest_offset `]` `,` $bars `[` $stage `]` `at` `[` $row `,` $col `]` attr-dict "
                       "`:` type($dest) `,` type($bars)")

    @property
    def box_shape(self) -> tuple[int, int]:
        r, c = (ival(a) for a in self.box.data)
        return r, c

    def verify_(self) -> None:
        _check_bars(self, self.bars)
        d = self.dest.type
        if isinstance(d, BufferType) and d.space.data != "smem":
            raise TileMemorySpaceError(f"tile.bulk_copy lands in shared memory (smem), not {d.space.data}", op=self)
        if len(self.box.data) != 2 or not all(1 <= ival(a) <= 256 for a in self.box.data):
            raise TileVerifyError("tile.bulk_copy box is [rows, cols], each 1..256", op=self)


@irdl_op_definition
class BulkWaitOp(IRDLOperation):
    name = "tile.bulk_wait"
    bars = operand_def(BufferType)
    stage = operand_def(IndexType)
    parity = operand_def(IndexType)
    assembly_format = "$bars `[` $stage `]` `,` $parity attr-dict `:` type($bars)"

    def verify_(self) -> None:
        _check_bars(self, self.bars)


BULK_OPS = [BulkInitOp, BulkExpectOp, BulkCopyOp, BulkWaitOp]

__all__ = ["BulkInitOp", "BulkExpectOp", "BulkCopyOp", "BulkWaitOp", "BULK_OPS"]
