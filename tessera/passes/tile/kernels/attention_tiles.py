"""Tile IR building blocks shared by the CPU attention kernels (forward: ``attention.py``,
backward: ``attention_backward.py``): views, loads and stores in the kernel's register type,
packing, row strips, and the register-tile micro-GEMM over packed panels."""
from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr

from tessera.ir import tile as t
from tessera.ir.builder import Builder
from tessera.passes.tile.kernels.common import pack_now


class Tiles:
    """Helpers for one kernel: registers of ``F``, register tiles of MR rows x NR*W columns of the
    MMA record ``rec``'s family, k loops unrolled ``U`` times."""

    def __init__(self, F, rec, MR: int, NRW: int, U: int):
        self.F, self.MR, self.NRW, self.U = F, MR, NRW, U
        self.frag_a = t.fragment((MR, NRW, 1), F, F, "a", "col_major", rec.family)
        self.frag_b = self.frag_a.with_role("b", "row_major")
        self.frag_c = t.fragment((MR, NRW, 1), F, F, "acc", "row_major", rec.family)

    def view(self, bb: Builder, src, el, space, shape, off, rs, cs, rows, cols):
        v = t.ViewOp.create(operands=[src, bb.c(off), bb.c(rs), bb.c(cs), bb.c(rows), bb.c(cols)],
                            result_types=[t.view_type(shape[0], shape[1], el, space)])
        bb.op(v)
        return v.result

    def load(self, bb: Builder, v, shape, pad: float = 0.0):
        attrs = {"pad": FloatAttr(pad, self.F)} if pad != 0.0 else {}
        ld = t.LoadOp.create(operands=[v], attributes=attrs, result_types=[t.tile_type(shape[0], shape[1], self.F)])
        bb.op(ld)
        return ld.result

    def store(self, bb: Builder, value, v):
        bb.op(t.StoreOp.create(operands=[value, v]))

    def pack(self, bb: Builder, src, dst, layout: str, panel: int):
        pack_now(bb, src, dst, layout, panel)

    def strip(self, bb: Builder, pitch: int, rows, width: int, fn):
        """fn(builder, row, col0) for every row and every ``width`` columns of a ``pitch``-wide block."""
        def r_body(br, r, _c):
            br.for_(0, pitch, width, lambda bc, c0, _c2: fn(bc, r, c0) or [])
            return []
        bb.for_(0, rows, 1, r_body)

    def panel_at(self, ba: Builder, panel, pitch, jr, kk):
        """B[kk, jr..] in a b_panel whose panels hold ``pitch`` k rows."""
        NRW = self.NRW
        return panel, "l2", ba.add(ba.mul(ba.div(jr, NRW), ba.mul(NRW, pitch)), ba.mul(kk, NRW))

    def micro_gemm(self, bb: Builder, a_at, b_at, rows, cols, kext, finish, col0=None, ahead=None):
        """For every MR x NR*W tile of a rows x cols result: finish(acc = sum over k < kext of
        A[rows, k] B[k, cols]).  a_at(ir, kk) -> (buffer, space, offset, row stride) of the MR
        elements A[ir.., kk]; b_at(jr, kk) -> (buffer, space, offset) of the NR*W contiguous
        elements B[kk, jr..].  kext may be a function of (builder, ir): the k extent of row tile
        ir; col0(builder, ir), if given, is the first column of row tile ir that is computed
        (a multiple of NR*W; the tiles before it are not); ahead(builder, ir), if given, runs
        before each row tile (prefetches)."""
        F, MR, NRW, U = self.F, self.MR, self.NRW, self.U
        view = self.view

        def tile_ir(bi: Builder, ir, _c):
            ke = kext(bi, ir) if callable(kext) else kext
            if ahead is not None:
                ahead(bi, ir)

            def tile_jr(bj: Builder, jr, _c2):
                acc0 = bj.op(t.FragmentZeroOp.create(result_types=[self.frag_c])).results[0]

                def step(bk: Builder, kk, acc):
                    buf_a, space_a, off_a, rs_a = a_at(bk, ir, kk)
                    av = view(bk, buf_a, F, space_a, (MR, 1), off_a, rs_a, 1, MR, 1)
                    buf_b, space_b, off_b = b_at(bk, jr, kk)
                    bv = view(bk, buf_b, F, space_b, (1, NRW), off_b, 1, 1, 1, NRW)
                    fa = bk.op(t.FragmentPackOp.create(operands=[av], result_types=[self.frag_a])).results[0]
                    fb = bk.op(t.FragmentPackOp.create(operands=[bv], result_types=[self.frag_b])).results[0]
                    return bk.op(t.MmaOp.create(operands=[fa, fb, acc], result_types=[self.frag_c])).results[0]

                kmain = bj.mul(bj.div(ke, U), U)

                def unrolled(bk, kk, c):
                    acc = c[0]
                    for u in range(U):
                        acc = step(bk, bk.add(kk, u), acc)
                    return [acc]

                acc = bj.for_(0, kmain, U, unrolled, [acc0])[0]
                acc = bj.for_(kmain, ke, 1, lambda bk, kk, c: [step(bk, kk, c[0])], [acc])[0]
                un = bj.op(t.FragmentUnpackOp.create(operands=[acc], result_types=[t.tile_type(MR, NRW, F)]))
                finish(bj, ir, jr, un.results[0])
                return []
            bi.for_(col0(bi, ir) if col0 is not None else 0, cols, NRW, tile_jr)
            return []
        bb.for_(0, rows, MR, tile_ir)


__all__ = ["Tiles"]
