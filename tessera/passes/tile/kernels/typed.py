"""Graph IR ops with typed lanes (comparisons, where, logic, integer ops, index generators)
-> ``tile.elementwise`` on already-mapped register tiles (shared by every row kernel and the
GEMM epilogue)."""
from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import IntegerType, StringAttr
from xdsl.ir import Attribute, SSAValue

from tessera.ir import tile as t
from tessera.ir.builder import Builder


def elementwise_typed(b: Builder, fn: str, operands: Sequence[SSAValue], elem: Attribute) -> SSAValue:
    """``tile.elementwise fn`` whose result has element type ``elem`` (broadcasting 1-sized dims)."""
    shape = operands[0].type.dims  # type: ignore[attr-defined]
    for o in operands[1:]:
        shape = t.broadcast_tile(shape, o.type.dims)  # type: ignore[attr-defined]
    op = t.ElementwiseOp.create(operands=list(operands), attributes={"fn": StringAttr(fn)},
                                result_types=[t.tile_type(shape[0], shape[1], elem)])
    b.op(op)
    return op.result


def typed_fn(op) -> str | None:
    """The tile function of a typed Graph IR op, or None for another op."""
    return getattr(op, "TILE_FN", None)


def emit_typed(b: Builder, op, vals: dict, reg: Attribute) -> SSAValue:
    from tessera.passes.tile.kernels.common import reg_elem
    fn = typed_fn(op)
    elem = reg_elem(op.results[0].type.element_type, reg)
    return elementwise_typed(b, fn, [vals[v] for v in op.operands], elem)


__all__ = ["elementwise_typed", "typed_fn", "emit_typed", "IntegerType"]
