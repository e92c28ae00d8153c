"""The ``wgmma`` part of ``lower-tile-to-nvidia{arch=sm_90a}``: warpgroup MMA from shared memory.

A warpgroup (4 warps, 128 threads; the kernel's ``vector``) owns a 64 x n f32 accumulator in
registers.  A (64 x 16) and B (16 x n) are read from shared memory through 64-bit matrix
descriptors (PTX ISA, "Matrix Descriptor Format" of wgmma):

  bits  0-13  start address >> 4 (shared-window byte address)
  bits 16-29  leading dimension byte offset >> 4   (unused for K-major swizzled layouts: 1)
  bits 32-45  stride dimension byte offset >> 4    (8-row group to 8-row group: 1024 B)
  bits 49-51  base offset (0: every swizzle atom is 1024-byte aligned)
  bits 62-63  swizzle mode (0 none, 1 = 128 B, 2 = 64 B, 3 = 32 B)

A is K-major (its 64 rows of k).  B is K-major (its n columns of k, i.e. B^T's rows, when B is
given transposed) or MN-major (``imm-trans-b`` = 1, f16/bf16 only; B's rows of n, when B is
row-major [K, N]), so that both are copied from global memory in 16-byte vectors.  A staged
block of R x C 16-bit elements (C a multiple of 64) is copied by ``tile.async_copy {layout =
"swizzle128"}`` as C/64 panels of R rows x 128 bytes (panel p at element p*R*64), 16-byte chunk
j of row r landing at chunk j ^ (r % 8) (the 128-byte swizzle the descriptor names).

K-major (A, or B^T staged as n rows of k): the k16 slice kk of a block is the descriptor of
the block's base + 2*kk bytes: the hardware adds the row offsets and applies the XOR to the
full address, which is why the block base must be 1024-byte aligned.  SBO = 1024 (8 rows of
M/N to the next 8), LBO unused.

MN-major (B staged as k rows of n, PTX ISA canonical layout ``Swizzle<3,4,3> o
((8,8,m),(8,k)):((1,8,LBO),(64,SBO))``): 64 consecutive n are one 128-byte row, the k16 slice
kk starts at row kk (base + 128*kk bytes, still 1024-aligned), SBO = 1024 (8 rows of k to the
next 8) and LBO = the panel stride R*128 (64 columns of n to the next 64).

Accumulator fragment (PTX ISA, "Register Fragments" of wgmma .m64nNk16, f32 D): thread t of
the warpgroup, warp w = t / 32, g = (t % 32) / 4, q = t % 4; register i (0 <= i < n/2)
holds D[16w + g + 8*((i/2) % 2), 8*(i/4) + 2q + i % 2].

Placement (the lowering's, not the kernel writer's): a run of ``tile.mma`` of this family is
one group — ``wgmma.fence`` before its first instruction, ``commit_group`` and ``wait_group 0``
before anything else touches the accumulators or shared memory.  A kernel whose k-loop keeps
``wgmma.inflight`` = 1 group in flight (its attribute: the generator staged its copies far
enough behind, see ``kernels/gpu_gemm_wgmma.py``) gets ``wait_group 1`` where its loop body
ends — the previous group, which read the stage the next copy overwrites, is complete — and
``wait_group 0`` right after the loop, before the accumulators are read.  The staging copy is cp.async
(one commit group per copy) and ``tile.wait`` becomes ``cp.async.wait_group n`` followed by
``fence.proxy.async.shared::cta``, so the landed (generic-proxy) writes are visible to the
async-proxy reads of wgmma after the barrier.
"""
from __future__ import annotations

from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import IntegerAttr, StringAttr, UnitAttr, f32, i64
from xdsl.ir import SSAValue

from tessera.errors import CodegenError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.ir.builder import Builder
from tessera.ir.target import nvidia as NV
from tessera.passes.target.gpu.simt_values import (Dist, Item, LaneMap, OperandMap, View, const_int, elem_bytes,
                                                   vec)

ROW_BYTES = 128          # one swizzled row: 64 16-bit elements
ATOM_BYTES = 1024        # 8 rows: the swizzle pattern's period; stride between 8-row groups
SWIZZLE_128B = 1
LBO_UNUSED = 16          # bytes; K-major swizzled layouts ignore it (encoded as 1)


def descriptor(start: int, lbo: int = LBO_UNUSED, sbo: int = ATOM_BYTES, swizzle: int = SWIZZLE_128B,
               base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor."""
    return (((start >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)
            | ((base_offset & 7) << 49) | ((swizzle & 3) << 62))


def descriptor_high(panel_bytes: int = 0) -> int:
    """Every field but the start address (the lowering ORs the address in at run time): K-major
    (``panel_bytes`` 0), or MN-major with LBO = ``panel_bytes`` (64 columns to the next 64)."""
    return descriptor(0) if not panel_bytes else descriptor(0, lbo=panel_bytes, sbo=ATOM_BYTES)


def swizzled_index(r, j: int | SSAValue, b: Builder | None = None, esize: int = 2):
    """Element offset, within a staged block of ``esize``-byte elements, of 16-byte chunk ``j`` of
    row ``r`` (ints, or index values built with ``b``)."""
    row, chunk = ROW_BYTES // esize, 16 // esize
    if b is None:
        return r * row + (j ^ (r % 8)) * chunk
    r8 = b.rem(r, 8)
    x = b.op(arith.XOrIOp(b.c(j), b.c(r8))).results[0]
    return b.add(b.mul(r, row), b.mul(x, chunk))


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

    def emit_mma(self, b: Builder, ft: t.FragmentType, a, bb, c, trans_b: bool = False, btype: str | None = None):
        m, n, k = ft.mnk
        attrs = {"shape": StringAttr(f"m{m}n{n}k{k}"), "atype": StringAttr(self.ptx_type)}
        if btype is not None and btype != self.ptx_type:     # e4m3 x e5m2: B's own format
            attrs["btype"] = StringAttr(btype)
        if trans_b:
            attrs["trans_b"] = UnitAttr()
        op = NV.WgmmaOp.create(operands=[a[0], bb[0], *c], result_types=[x.type for x in c], attributes=attrs)
        b.op(op)
        return list(op.results)


class WgmmaLowering:
    """Mixin of the NVIDIA lowerer: descriptors, the swizzled copy, fence/commit/wait placement."""

    wg_open: bool = False
    wg_inflight: int = 0          # wgmma groups a k-loop body may leave in flight (kernel attribute)
    swizzled: dict                # staged buffer -> its panel stride in elements (rows * 64)
    mn_major: set                 # descriptors of MN-major B operands

    def wgmma_kernel(self) -> bool:
        return self.wave == 128

    def close_group(self, b: Builder, pending: int = 0) -> None:
        if self.wg_open:
            b.op(NV.WgmmaCommitOp.create())
            b.op(NV.WgmmaWaitOp.create(attributes={"pending": i64_attr(pending)}))
            self.wg_open = False

    def lower_wgmma_boundary(self, op, b: Builder) -> bool:
        """Close an open group before ``op``; True when ``op`` ends a loop body that may leave
        ``wg_inflight`` groups in flight (then the loop is followed by ``wait_group 0``)."""
        if not self.wg_open or op.name in self.WG_INSIDE or op.dialect_name() == "arith":
            return False
        inflight = self.wg_inflight if op.name == "scf.yield" and isinstance(op.parent_op(), scf.ForOp) else 0
        self.close_group(b, inflight)
        return inflight > 0

    def drain_after_loop(self, b: Builder, loop) -> None:
        """``wait_group 0`` after a k-loop that left groups in flight, then the loop's
        accumulator results through ``wgmma_fence_operand`` so nothing reads them earlier."""
        b.op(NV.WgmmaWaitOp.create(attributes={"pending": i64_attr(0)}))
        for r in loop.results:
            d = self.vmap.get(r)
            if isinstance(d, Dist) and d.parts and all(p.type == f32 for p in d.parts):
                f = NV.WgmmaFenceOperandOp.create(operands=list(d.parts), result_types=[p.type for p in d.parts])
                b.op(f)
                self.vmap[r] = Dist(list(f.results), d.omap, d.shape)

    def op_tile_mma(self, op: t.MmaOp, b: Builder) -> None:
        if op.c.type.family.data != "wgmma":
            return super().op_tile_mma(op, b)
        fa, fb, fc = self.vmap[op.a], self.vmap[op.b], self.vmap[op.c]
        lm = self.lmap(op.a.type)
        btype = {"f8E4M3FN": "f8e4m3fn", "f8E5M2": "f8e5m2"}.get(str(op.b.type.elem))
        parts = lm.emit_mma(b, op.c.type, fa.parts, fb.parts, fc.parts, trans_b=fb.parts[0] in self.mn_major,
                            btype=btype)
        self.vmap[op.result] = Dist(parts, fc.omap, fc.shape)

    def descriptor_of(self, b: Builder, vv: View, ft: t.FragmentType) -> SSAValue:
        """The descriptor of an operand view in a swizzled staged block: K-major (A; B read as
        B^T, ``rs`` 1 and ``cs`` 64) or MN-major (B, ``rs`` 64 and ``cs`` 1; columns past 64
        continue in the next panel)."""
        role = ft.role.data
        eb = elem_bytes(vv.elem)
        if vv.base.type.space.data != "smem" or eb not in (1, 2):
            raise CodegenError(f"wgmma reads 16-bit or fp8 {role.upper()} from shared memory; this view is in "
                               f"{vv.base.type.space.data}")
        if vv.base not in self.swizzled:
            raise CodegenError(f"wgmma {role.upper()} view is not in a buffer staged with the 128-byte swizzle "
                               "(tile.async_copy layout swizzle128)")
        row = ROW_BYTES // eb
        rs, cs = const_int(vv.rs), const_int(vv.cs)
        # fp8 wgmma has no transpose immediates: both operands K-major (PTX ISA, wgmma.mma_async)
        mn_major = role == "b" and (rs, cs) == (row, 1) and eb == 2
        kstride, mnstride = (cs, rs) if role == "a" else (rs, cs)
        if not vv.full or not (mn_major or (kstride, mnstride) == (1, row)):
            raise CodegenError(f"wgmma {role.upper()} must be K-major with {row}-element rows"
                               f"{' or MN-major (B, 16-bit only)' if role == 'b' else ''} and whole (row stride "
                               f"{rs}, column stride {cs})")
        off = const_int(vv.off)
        if off is not None and (off % row) % (row if mn_major else 16 // eb) != 0:
            raise CodegenError(f"wgmma {role.upper()} view starts at element {off}: not a whole "
                               f"{'row' if mn_major else '16-byte chunk'}")
        addr = b.op(NV.SharedAddressOp.create(operands=[vv.base, b.c(vv.off)], result_types=[i64])).results[0]
        field = b.op(arith.AndIOp(b.op(arith.ShRUIOp(addr, _i64(b, 4))).results[0], _i64(b, 0x3FFF))).results[0]
        high = descriptor_high(2 * self.swizzled[vv.base] if mn_major else 0)
        desc = b.op(arith.OrIOp(field, _i64(b, high))).results[0]
        if mn_major:
            self.mn_major.add(desc)
        return desc

    def copy_swizzled(self, b: Builder, src: View, dst: SSAValue, doff) -> None:
        """The block ``src`` (R x C, C a multiple of 64) into ``dst[doff...]`` as C/64 swizzled
        panels of R x 64: each thread moves 16-byte chunks — ``cp.async`` when the source rows
        are contiguous and aligned (plain when the whole block lies inside the source, else
        zero-filled past the valid extent), otherwise eight masked element loads and one 16-byte
        store — and commits them as one group.  ``tile.wait`` waits for
        the group and fences the thread's writes for the async proxy (``fence.proxy.async``)
        before the barrier that precedes the wgmma."""
        R, C = src.shape
        eb = elem_bytes(src.elem)
        row, epc = ROW_BYTES // eb, 16 // eb     # elements per swizzled row, per 16-byte chunk
        if (C * eb) % ROW_BYTES or eb not in (1, 2):
            raise CodegenError(f"a swizzle128 copy moves rows of 128-byte panels; this block has {C} "
                               f"{eb}-byte columns")
        if self.swizzled.get(dst, R * row) != R * row:
            raise CodegenError(f"swizzle128 copies of {R} and {self.swizzled[dst] // row} rows share one buffer")
        per_row = C // epc                    # 16-byte chunks in a source row
        chunks = R * per_row
        fast_ok = b.op(arith.AndIOp(b.cmp("eq", src.cs, 1), b.op(arith.AndIOp(
            b.cmp("eq", b.rem(src.rs, epc), 0), b.cmp("eq", b.rem(src.off, epc), 0))).results[0])).results[0]
        # the whole block inside the source and aligned: plain 16-byte copies, no extent arithmetic
        inside = b.op(arith.AndIOp(b.cmp("sge", src.rows, R), b.cmp("sge", src.cols, C))).results[0]
        full_ok = b.op(arith.AndIOp(fast_ok, inside)).results[0]

        def place(b2: Builder, ch, contiguous: bool):
            """(row, first column, shared element offset) of chunk ``ch``: for contiguous rows,
            consecutive threads take consecutive 16-byte chunks of a row; strided (B read as
            B^T): consecutive threads take consecutive rows, so each element load is coalesced."""
            r = b2.div(ch, per_row) if contiguous else b2.rem(ch, R)
            cc = b2.rem(ch, per_row) if contiguous else b2.div(ch, R)
            j = b2.rem(cc, 8) if per_row > 8 else cc
            daddr = b2.add(doff, swizzled_index(r, j, b2, eb))
            if per_row > 8:
                daddr = b2.add(daddr, b2.mul(b2.div(cc, 8), R * row))
            return r, b2.mul(cc, epc), daddr

        def each_chunk(bb: Builder, one) -> None:
            for q in range(-(-chunks // self.block)):
                ch = bb.add(self.tid, q * self.block)
                if (q + 1) * self.block <= chunks:
                    one(bb, ch)
                else:
                    bb.if_(bb.cmp("slt", ch, chunks), lambda b3, ch=ch: one(b3, ch) or [])

        def full(bb: Builder):
            def one(b2: Builder, ch):
                r, c0, daddr = place(b2, ch, True)
                sidx = b2.add(src.off, b2.add(b2.mul(r, src.rs), c0))
                b2.op(NV.CpAsyncOp.create(operands=[dst, b2.c(daddr), src.base, b2.c(sidx), b2.c(16)],
                                          attributes={"bytes": i64_attr(16)}))
            each_chunk(bb, one)
            return []

        def partial(bb: Builder):
            def one(b2: Builder, ch):
                def vector(bt: Builder):
                    # cp.async of 16 bytes, zero-filling what lies past the view's valid extent
                    r, c0, daddr = place(bt, ch, True)
                    avail = bt.mul(bt.max(bt.min(bt.sub(src.cols, c0), epc), 0), eb)
                    nbytes = bt.select(bt.cmp("slt", r, src.rows), bt.c(avail), bt.c(0))
                    has = bt.cmp("sgt", nbytes, 0)
                    sidx = bt.select(has, bt.c(bt.add(src.off, bt.add(bt.mul(r, src.rs), c0))), bt.c(0))
                    bt.op(NV.CpAsyncOp.create(operands=[dst, bt.c(daddr), src.base, sidx, nbytes],
                                              attributes={"bytes": i64_attr(16)}))
                    return []

                def edge(be: Builder):
                    r, c0, daddr = place(be, ch, False)
                    vals = [self.masked_load(be, src, r, be.add(c0, i), src.elem, 0.0) for i in range(epc)]
                    self.store(be, self.pack(be, vals), dst, daddr, 16)
                    return []
                b2.if_(fast_ok, vector, edge)
            each_chunk(bb, one)
            return []
        if eb == 1 and R % 16 == 0 and per_row <= 8:
            # fp8 B^T from a row-major B (k rows of n: the view's rows contiguous, rs = 1): 16-byte
            # loads of 16 consecutive n at one k, each byte stored to its row of the staged block
            tvec_ok = b.op(arith.AndIOp(b.cmp("eq", src.rs, 1), b.op(arith.AndIOp(
                b.cmp("eq", b.rem(src.cs, 16), 0), b.cmp("eq", b.rem(src.off, 16), 0))).results[0])).results[0]
            tvec_full = b.op(arith.AndIOp(tvec_ok, inside)).results[0]
            b.if_(full_ok, full, lambda bb: bb.if_(tvec_full, lambda bt: self._copy_transposed_bytes(
                bt, src, dst, doff, R, C) or [], partial) or [])
        else:
            b.if_(full_ok, full, partial)
        b.op(NV.CpAsyncCommitOp.create())     # one group per copy: tile.wait counts copies
        self.swizzled[dst] = R * row


def _copy_transposed_bytes(self, b: Builder, src: View, dst: SSAValue, doff, R: int, C: int) -> None:
    """A whole R x C fp8 block whose rows are contiguous in memory (the B^T view of a row-major
    B): unit u takes rows 16g..16g+15 (g = u % (R/16)) of column c = u / (R/16) — consecutive
    threads, consecutive 16-byte chunks — as one 16-byte load, then stores each byte at
    (row, c) of the swizzled block."""
    groups = R // 16
    units = groups * C

    def one(b2: Builder, u) -> None:
        r0, c = b2.mul(b2.rem(u, groups), 16), b2.div(u, groups)
        v = self.load(b2, src.base, b2.add(src.off, b2.add(r0, b2.mul(c, src.cs))), vec(src.elem, 16), 16)
        j = b2.div(c, 16)
        # row r0 + i (r0 % 8 == 0) is placed as row i % 8 of an atom: eight offsets serve the 16 rows
        rowbase = b2.add(doff, b2.add(b2.mul(r0, ROW_BYTES), b2.rem(c, 16)))
        xj = [swizzled_index(k, j, b2, 1) for k in range(8)]
        for i in range(16):
            daddr = b2.add(rowbase, b2.add(xj[i % 8], (i - i % 8) * ROW_BYTES))
            self.store(b2, self.extract(b2, v, i), dst, daddr, 1)

    for q in range(-(-units // self.block)):
        u = b.add(self.tid, q * self.block)
        if (q + 1) * self.block <= units:
            one(b, u)
        else:
            b.if_(b.cmp("slt", u, units), lambda b3, u=u: one(b3, u) or [])


WgmmaLowering._copy_transposed_bytes = _copy_transposed_bytes


def _i64(b: Builder, v: int) -> SSAValue:
    return b.op(arith.ConstantOp(IntegerAttr(v, i64), i64)).results[0]


__all__ = ["WgmmaMap", "WgmmaLowering", "descriptor", "descriptor_high", "swizzled_index", "ROW_BYTES",
           "ATOM_BYTES"]
