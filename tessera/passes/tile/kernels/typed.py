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


def index_tile(b: Builder, base, shape: tuple[int, int], row_step: int, col_step: int, elem: Attribute) -> SSAValue:
    from tessera.ir.attrs import i64_attr
    op = t.IndexOp.create(operands=[b.c(base)], attributes={"row_step": i64_attr(row_step),
                                                             "col_step": i64_attr(col_step)},
                          result_types=[t.tile_type(shape[0], shape[1], elem)])
    b.op(op)
    return op.result


def emit_iotas(b: Builder, ops, vals: dict, reg: Attribute, rank: int, coord) -> None:
    """The tiles of the ``tessera.iota`` ops among ``ops`` in a kernel whose iteration space has
    ``rank`` axes: ``coord(axis)`` gives (base index, tile shape, row step, col step) of the
    iteration axis ``axis`` for the tile being computed (an iota of lower rank takes the trailing
    axes; one of size 1 along its axis is 0)."""
    from tessera.ir import graph as g
    from tessera.ir.attrs import ival
    from tessera.passes.tile.kernels.common import reg_elem
    for op in ops:
        if not isinstance(op, g.IotaOp):
            continue
        rt = op.result.type
        ax = ival(op.axis)
        elem = reg_elem(rt.element_type, reg)
        if rt.dims[ax] == 1:
            base, shape, rs, cs = 0, (1, 1), 0, 0
        else:
            base, shape, rs, cs = coord(ax + rank - rt.rank)
        vals[op.result] = index_tile(b, base, shape, rs, cs, elem)


def row_digit(b: Builder, kf, r, dims, axis: int):
    """Coordinate ``axis`` (< the last) of row ``r`` when rows run over ``dims[:-1]`` row-major."""
    below = 1
    for d in dims[axis + 1:-1]:
        below = b.mul(below, kf.size(d))
    q = b.div(r, below) if below != 1 else r
    return b.rem(q, kf.size(dims[axis])) if axis > 0 else q
