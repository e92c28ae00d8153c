"""The ``wgmma`` part of ``lower-tile-to-nvidia{arch=sm_90a}``: warpgroup MMA from shared memory.

A warpgroup (4 warps, 128 threads; the kernel's ``vector``) owns a 64 x n f32 accumulator in
registers.  A (64 x 16) and B (16 x n) are read from shared memory through 64-bit matrix
descriptors (PTX ISA, "Matrix Descriptor Format" of wgmma):

  bits  0-13  start address >> 4 (shared-window byte address)
  bits 16-29  leading dimension byte offset >> 4   (unused for K-major swizzled layouts: 1)
  bits 32-45  stride dimension byte offset >> 4    (8-row group to 8-row group: 1024 B)
  bits 49-51  base offset (0: every swizzle atom is 1024-byte aligned)
  bits 62-63  swizzle mode (0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B)

Both operands are K-major: A as its 64 rows of k, B as its n columns of k (B^T's rows).  A
staged block is ``rows x 64`` 16-bit elements, 128 bytes a row, copied by ``tile.async_copy
{layout = "swizzle128"}`` so that 16-byte chunk j of row r lands at chunk j ^ (r % 8) (the
128-byte swizzle the descriptor names).  The k16 slice kk of a block is the descriptor of
the block's base + 2*kk bytes: the hardware adds the row offsets and applies the XOR to the
full address, which is why the block base must be 1024-byte aligned.

Accumulator fragment (PTX ISA, "Register Fragments" of wgmma .m64nNk16, f32 D): thread t of
the warpgroup, warp w = t / 32, g = (t % 32) / 4, q = t % 4; register i (0 <= i < n/2)
holds D[16w + g + 8*((i/2) % 2), 8*(i/4) + 2q + i % 2].

Placement (the lowering's, not the kernel writer's): a run of ``tile.mma`` of this family is
one group — ``wgmma.fence`` before its first instruction, ``commit_group`` and ``wait_group 0``
before anything else touches the accumulators or shared memory; the staging copy is cp.async
(one commit group per copy) and ``tile.wait`` becomes ``cp.async.wait_group n`` followed by
``fence.proxy.async.shared::cta``, so the landed (generic-proxy) writes are visible to the
async-proxy reads of wgmma after the barrier.
"""
from __future__ import annotations

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr, StringAttr, i64
from xdsl.ir import SSAValue

from tessera.errors import CodegenError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.ir.builder import Builder
from tessera.ir.target import nvidia as NV
from tessera.passes.target.gpu.simt_values import Item, LaneMap, OperandMap, View, const_int, elem_bytes

ROW_BYTES = 128          # one swizzled row: 64 16-bit elements
ATOM_BYTES = 1024        # 8 rows: the swizzle pattern's period; stride between 8-row groups
SWIZZLE_128B = 1
LBO_UNUSED = 16          # bytes; K-major swizzled layouts ignore it (encoded as 1)


def descriptor(start: int, lbo: int = LBO_UNUSED, sbo: int = ATOM_BYTES, swizzle: int = SWIZZLE_128B,
               base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor."""
    return (((start >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)
            | ((base_offset & 7) << 49) | ((swizzle & 3) << 62))


def descriptor_high() -> int:
    """Every field but the start address (the lowering ORs the address in at run time)."""
    return descriptor(0)


def swizzled_index(r, j: int | SSAValue, b: Builder | None = None):
    """Element offset, within a staged block, of 16-byte chunk ``j`` of row ``r`` (ints, or
    index values built with ``b``)."""
    if b is None:
        return r * (ROW_BYTES // 2) + (j ^ (r % 8)) * 8
    r8 = b.rem(r, 8)
    x = b.op(arith.XOrIOp(b.c(j), b.c(r8))).results[0]
    return b.add(b.mul(r, ROW_BYTES // 2), b.mul(x, 8))


class WgmmaMap(LaneMap):
    lanes = 128

    def __init__(self, rec, ptx_type: str):
        self.rec = rec
        self.ptx_type = ptx_type
        self.n = rec.shape[1]

    def build(self, b: Builder, lane: SSAValue) -> None:
        warp, l32 = b.div(lane, 32), b.rem(lane, 32)
        row = b.add(b.mul(warp, 16), b.div(l32, 4))
        col = b.mul(b.rem(l32, 4), 2)
        self.c = OperandMap([Item(row, 8 * ((i // 2) % 2), col, 8 * (i // 4) + i % 2, 2)
                             for i in range(self.n // 2)], [1] * (self.n // 2))
        # A and B are descriptors (one 64-bit value per thread, the same in every thread)
        self.a = OperandMap([], [])
        self.b = OperandMap([], [])

    def emit_mma(self, b: Builder, ft: t.FragmentType, a, bb, c):
        m, n, k = ft.mnk
        op = NV.WgmmaOp.create(operands=[a[0], bb[0], *c], result_types=[x.type for x in c],
                               attributes={"shape": StringAttr(f"m{m}n{n}k{k}"), "atype": StringAttr(self.ptx_type)})
        b.op(op)
        return list(op.results)


class WgmmaLowering:
    """Mixin of the NVIDIA lowerer: descriptors, the swizzled copy, fence/commit/wait placement."""

    wg_open: bool = False
    swizzled: set

    def wgmma_kernel(self) -> bool:
        return self.wave == 128

    def close_group(self, b: Builder) -> None:
        if self.wg_open:
            b.op(NV.WgmmaCommitOp.create())
            b.op(NV.WgmmaWaitOp.create(attributes={"pending": i64_attr(0)}))
            self.wg_open = False

    def descriptor_of(self, b: Builder, vv: View, ft: t.FragmentType) -> SSAValue:
        """The descriptor of a K-major operand view in a swizzled staged block."""
        role = ft.role.data
        m, n, k = ft.mnk
        if vv.base.type.space.data != "smem" or elem_bytes(vv.elem) != 2:
            raise CodegenError(f"wgmma reads 16-bit {role.upper()} from shared memory; this view is in "
                               f"{vv.base.type.space.data}")
        if vv.base not in self.swizzled:
            raise CodegenError(f"wgmma {role.upper()} view is not in a buffer staged with the 128-byte swizzle "
                               "(tile.async_copy layout swizzle128)")
        kstride, mnstride = (vv.cs, vv.rs) if role == "a" else (vv.rs, vv.cs)
        if const_int(kstride) != 1 or const_int(mnstride) != ROW_BYTES // 2 or not vv.full:
            raise CodegenError(f"wgmma {role.upper()} must be K-major with 64-element rows and whole "
                               f"(k stride {const_int(kstride)}, row stride {const_int(mnstride)})")
        off = const_int(vv.off)
        if off is not None and (off % (ROW_BYTES // 2)) % 8 != 0:
            raise CodegenError(f"wgmma {role.upper()} view starts at element {off}: not a whole 16-byte chunk")
        addr = b.op(NV.SharedAddressOp.create(operands=[vv.base, b.c(vv.off)], result_types=[i64])).results[0]
        field = b.op(arith.AndIOp(b.op(arith.ShRUIOp(addr, _i64(b, 4))).results[0], _i64(b, 0x3FFF))).results[0]
        return b.op(arith.OrIOp(field, _i64(b, descriptor_high()))).results[0]

    def copy_swizzled(self, b: Builder, src: View, dst: SSAValue, doff) -> None:
        """The block ``src`` (rows x 64) into ``dst[doff...]`` swizzled: each thread moves 16-byte
        chunks — ``cp.async`` (zero-filled past the valid extent) when the source rows are
        contiguous and aligned, else eight masked element loads and one 16-byte store — and commits
        them as one group.  ``tile.wait`` waits for the group and fences the thread's writes for the
        async proxy (``fence.proxy.async``) before the barrier that precedes the wgmma."""
        R, C = src.shape
        if C * elem_bytes(src.elem) != ROW_BYTES:
            raise CodegenError(f"a swizzle128 copy moves rows of 128 bytes; this block has {C} "
                               f"{elem_bytes(src.elem)}-byte columns")
        chunks = R * 8
        fast_ok = b.op(arith.AndIOp(b.cmp("eq", src.cs, 1), b.op(arith.AndIOp(
            b.cmp("eq", b.rem(src.rs, 8), 0), b.cmp("eq", b.rem(src.off, 8), 0))).results[0])).results[0]
        for q in range(-(-chunks // self.block)):
            ch = b.add(self.tid, q * self.block)

            def one(b2: Builder, ch=ch):
                # contiguous rows: consecutive threads take consecutive 16-byte chunks of a row; strided
                # (B read as B^T): consecutive threads take consecutive rows, so each of the eight element
                # loads is coalesced across the warp.  fast_ok is uniform: one mapping per copy.
                r = b2.select(fast_ok, b2.c(b2.div(ch, 8)), b2.c(b2.rem(ch, R)))
                j = b2.select(fast_ok, b2.c(b2.rem(ch, 8)), b2.c(b2.div(ch, R)))
                c0 = b2.mul(j, 8)
                daddr = b2.add(doff, swizzled_index(r, j, b2))

                def vector(bt: Builder):
                    # cp.async of 16 bytes, zero-filling what lies past the view's valid extent
                    avail = bt.mul(bt.max(bt.min(bt.sub(src.cols, c0), 8), 0), 2)
                    nbytes = bt.select(bt.cmp("slt", r, src.rows), bt.c(avail), bt.c(0))
                    has = bt.cmp("sgt", nbytes, 0)
                    sidx = bt.select(has, bt.c(bt.add(src.off, bt.add(bt.mul(r, src.rs), c0))), bt.c(0))
                    bt.op(NV.CpAsyncOp.create(operands=[dst, bt.c(daddr), src.base, sidx, nbytes],
                                              attributes={"bytes": i64_attr(16)}))
                    return []

                def edge(be: Builder):
                    vals = [self.masked_load(be, src, r, be.add(c0, i), src.elem, 0.0) for i in range(8)]
                    self.store(be, self.pack(be, vals), dst, daddr, 16)
                    return []
                b2.if_(fast_ok, vector, edge)
                return []
            if (q + 1) * self.block <= chunks:
                one(b)
            else:
                b.if_(b.cmp("slt", ch, chunks), one)
        b.op(NV.CpAsyncCommitOp.create())     # one group per copy: tile.wait counts copies
        self.swizzled.add(dst)


def _i64(b: Builder, v: int) -> SSAValue:
    return b.op(arith.ConstantOp(IntegerAttr(v, i64), i64)).results[0]


__all__ = ["WgmmaMap", "WgmmaLowering", "descriptor", "descriptor_high", "swizzled_index", "ROW_BYTES",
           "ATOM_BYTES"]
