"""Staging copies of the GPU SIMT lowering: ``tile.async_copy`` into shared memory, the
workgroup's threads each moving a share (16-byte vectors when strides and alignment allow,
else elements with zeros outside the valid extent)."""
from __future__ import annotations

from xdsl.dialects import arith
from xdsl.ir import SSAValue

from tessera.errors import CodegenError
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import Builder
from tessera.passes.target.gpu.simt_values import View, elem_bytes, vec


class SimtCopies:
    """Mixin of :class:`~tessera.passes.target.gpu.simt.SimtLowerer`."""

    def op_tile_async_copy(self, op: t.AsyncCopyOp, b: Builder) -> None:
        if op.layout.data != "row_major":
            raise CodegenError(f"GPU copies are row_major; {op.layout.data} is a CPU packing layout")
        src: View = self.vmap[op.source]
        dst = self.scalar(op.dest)
        doff = self.scalar(op.dest_offset)
        pitch = ival(op.panel)
        self.copy_rows(b, src, dst, doff, pitch)
        self.vmap[op.token] = None

    def copy_plan(self, src: View) -> tuple[int, int, int]:
        """(elements per vector, vectors per row, passes of the workgroup over the block)."""
        R, C = src.shape
        v = 16 // elem_bytes(src.elem)
        if C % v:
            v = 1
        chunks = R * C // v
        return v, C // v, -(-chunks // self.block)

    def copy_fast_condition(self, b: Builder, src: View, doff, pitch: int, v: int) -> SSAValue | None:
        """True (for the whole workgroup) when 16-byte vectors may be used."""
        if v == 1 or pitch % v:
            return None
        conds = [b.cmp("eq", src.cs, 1), b.cmp("eq", b.rem(src.rs, v), 0), b.cmp("eq", b.rem(src.off, v), 0),
                 b.cmp("eq", b.rem(doff, v), 0)]
        out = conds[0]
        for x in conds[1:]:
            out = b.op(arith.AndIOp(out, x)).results[0]
        return out

    def copy_rows(self, b: Builder, src: View, dst: SSAValue, doff, pitch: int) -> None:
        R, C = src.shape
        v, per_row, passes = self.copy_plan(src)
        fast = self.copy_fast_condition(b, src, doff, pitch, v)

        def vector_path(bb: Builder):
            for q in range(passes):
                ch = bb.add(self.tid, q * self.block)

                def one(b2: Builder, ch=ch):
                    r, c0 = b2.div(ch, per_row), b2.mul(b2.rem(ch, per_row), v)
                    self.copy_vector(b2, src, dst, doff, pitch, r, c0, v)
                    return []
                if (q + 1) * self.block <= R * per_row:
                    one(bb)
                else:
                    bb.if_(bb.cmp("slt", ch, R * per_row), one)
            return []

        def element_path(bb: Builder):
            n = R * C
            for q in range(-(-n // self.block)):
                e = bb.add(self.tid, q * self.block)

                def one(b2: Builder, e=e):
                    r, c = b2.div(e, C), b2.rem(e, C)
                    val = self.masked_load(b2, src, r, c, src.elem, 0.0)
                    self.store(b2, val, dst, b2.add(doff, b2.add(b2.mul(r, pitch), c)), elem_bytes(src.elem))
                    return []
                if (q + 1) * self.block <= n:
                    one(bb)
                else:
                    bb.if_(bb.cmp("slt", e, n), one)
            return []

        if fast is None:
            element_path(b)
        else:
            b.if_(fast, vector_path, element_path)

    def copy_vector(self, b: Builder, src: View, dst, doff, pitch: int, r, c0, v: int) -> None:
        """One v-element piece of row r at column c0: a 16-byte load and store when it lies
        inside the valid extent, else element by element with zeros outside."""
        full = b.op(arith.AndIOp(b.cmp("slt", r, src.rows), b.cmp("sle", b.add(c0, v), src.cols))).results[0]
        daddr = b.add(doff, b.add(b.mul(r, pitch), c0))
        vt = vec(src.elem, v)

        def whole(bt: Builder):
            val = self.load(bt, src.base, bt.add(src.off, bt.add(bt.mul(r, src.rs), c0)), vt, 16)
            self.store(bt, val, dst, daddr, 16)
            return []

        def edge(be: Builder):
            vals = [self.masked_load(be, src, r, be.add(c0, i), src.elem, 0.0) for i in range(v)]
            self.store(be, self.pack(be, vals), dst, daddr, 16)
            return []
        b.if_(full, whole, edge)
