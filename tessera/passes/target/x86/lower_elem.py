"""Elementwise, masks and reductions on register tiles"""
from __future__ import annotations


from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    IntegerType,
    StringAttr,
)
from xdsl.ir import SSAValue

from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import Builder
from tessera.ir.target import x86 as x
from tessera.passes.target.x86 import lower_typed_elem as TE

from tessera.passes.target.x86.lower_values import PTR, Regs, ViewVal, _const_int, _elem_bytes, _is_half  # noqa: F401


class ElementwiseLowering:
    """Methods of the x86 Tile IR lowering (``lower_tile_to_x86._Lowerer``) for elementwise, masks and reductions on register tiles."""

    def op_tile_elementwise(self, op: t.ElementwiseOp, b: Builder) -> None:
        if TE.needs_typed(op):
            TE.lower_elementwise(self, op, b)
            return
        fn = op.fn.data
        R, C = op.result.type.dims
        ins = [self._expand(self.get(v), R, C) for v in op.inputs]
        nv = self.nvec(C)
        rows = []
        for i in range(R):
            row = []
            for v in range(nv):
                if len(ins) == 1:
                    new = x.VUnaryOp.create(operands=[ins[0][i][v]], attributes={"fn": StringAttr(fn)},
                                            result_types=[self.vreg])
                else:
                    new = x.VBinaryOp.create(operands=[ins[0][i][v], ins[1][i][v]],
                                             attributes={"fn": StringAttr(fn)}, result_types=[self.vreg])
                b.op(new)
                row.append(new.results[0])
            rows.append(row)
        self.vmap[op.result] = Regs((R, C), rows)

    def op_tile_index(self, op, b: Builder) -> None:
        TE.lower_index(self, op, b)

    def op_tile_splat_index(self, op, b: Builder) -> None:
        i = b.op(arith.IndexCastOp(self.scalar(op.input), IntegerType(64))).results[0]
        fv = b.op(arith.SIToFPOp(i, self.reg)).results[0]
        sp = x.VSplatOp.create(operands=[fv], result_types=[self.vreg])
        b.op(sp)
        self.vmap[op.result] = Regs((1, 1), [[sp.result]])

    def op_tile_mask(self, op: t.MaskOp, b: Builder) -> None:
        R, C = op.input.type.dims
        nv = self.nvec(C)
        src = self._expand(self.get(op.input), R, C)
        cols = self.scalar(op.cols)
        padv = self.vconst(b, op.pad.value.data)
        diag = self.scalar(op.diag) if op.diag is not None else None

        def masked(bb: Builder):
            return self._mask_rows(bb, src, cols, diag, op.keep_side, padv, R, nv)
        if diag is None and _const_int(cols) is None:
            # a row loop's chunks keep every column but the last: the selects (and the lane
            # masks they compare out of the count, on AVX2 two 64-bit compares and shuffles per
            # vector) run only where some column is dropped (softmax's max and exp passes
            # spent about a seventh of their time on them)
            flat = b.if_(self._keeps_every_column(b, cols, C), lambda bb: [v for row in src for v in row],
                         lambda bb: [v for row in masked(bb) for v in row], [self.vreg] * (R * nv))
            rows = [flat[i * nv:(i + 1) * nv] for i in range(R)]
        else:
            rows = masked(b)
        self.vmap[op.result] = Regs((R, C), rows)

    @staticmethod
    def _keeps_every_column(b: Builder, cols, C: int) -> SSAValue:
        return b.cmp("sge", cols, C)

    def _mask_rows(self, b: Builder, src, cols, diag, keep_side: str, padv, R: int, nv: int):
        """``src`` with the columns past ``cols`` (and, with ``diag``, those on the dropped side
        of column row + diag) replaced by ``padv``."""
        def select(keep, drop, count):
            return b.op(x.VLaneSelectOp.create(operands=[keep, drop, b.c(count)],
                                               result_types=[self.vreg])).results[0]

        col_counts = [self._count(b, cols, v) for v in range(nv)]  # the same for every row
        rows = []
        for i in range(R):
            row = [select(src[i][v], padv, col_counts[v]) for v in range(nv)]
            if diag is not None:  # lane l of vector v is column v*W + l; the edge is column i + diag
                edge = b.add(diag, i)
                if keep_side == "le":   # keep columns <= edge: the first edge + 1 of them
                    row = [select(val, padv, self._count(b, b.add(edge, 1), v)) for v, val in enumerate(row)]
                else:                   # keep columns >= edge: drop the first edge of them
                    row = [select(padv, val, self._count(b, edge, v)) for v, val in enumerate(row)]
            rows.append(row)
        return rows

    def op_tile_reduce(self, op: t.ReduceOp, b: Builder) -> None:
        kind = op.kind.data
        src: Regs = self.get(op.input)
        R, C = op.input.type.dims
        rows = self._expand(src, R, C)
        fn = kind   # tile.reduce's kinds are elementwise fns of the same names

        def comb(x0, x1):
            new = x.VBinaryOp.create(operands=[x0, x1], attributes={"fn": StringAttr(fn)}, result_types=[self.vreg])
            b.op(new)
            return new.results[0]

        if ival(op.axis) == 1:
            out = []
            for i in range(R):
                acc = rows[i][0]
                for v in rows[i][1:]:
                    acc = comb(acc, v)
                if C > 1:
                    red = x.VReduceOp.create(operands=[acc], attributes={"kind": StringAttr(
                        "max" if kind == "select_max" else kind)},
                                             result_types=[self.vreg])
                    b.op(red)
                    acc = red.result
                out.append([acc])
            self.vmap[op.result] = Regs((R, 1), out)
        else:
            acc_row = list(rows[0])
            for i in range(1, R):
                acc_row = [comb(a0, a1) for a0, a1 in zip(acc_row, rows[i])]
            self.vmap[op.result] = Regs((1, C), [acc_row])

    # ------------------------------------------------------------------ packing copies
