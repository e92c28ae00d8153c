"""``tile.load_index`` on x86 (a mixin of lower-tile-to-x86's lowerer): a scalar load of the
i32 / i64 element, sign-extended to ``index``."""
from __future__ import annotations

from xdsl.dialects import arith

from tessera.ir import tile as t
from tessera.ir.builder import INDEX, Builder
from tessera.ir.target import x86 as x


class LoadIndexLowering:
    vmap: dict

    def op_tile_load_index(self, op: t.LoadIndexOp, b: Builder) -> None:
        elem = op.source.type.element_type
        ld = b.op(x.LoadOp.create(operands=[self.vmap[op.source], self.vmap[op.offset]],
                                  result_types=[elem]))
        self.vmap[op.result] = b.op(arith.IndexCastOp(ld.results[0], INDEX)).results[0]


__all__ = ["LoadIndexLowering"]
