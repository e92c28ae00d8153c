"""Typed lanes in ``lower-tile-to-x86``: int and bool register tiles, and the Tile IR
elementwise functions whose types differ between operands and result.

A float tile lives in registers of the kernel's type (``<W x f32>``, or f64); an int tile in
``<W x iN>`` of its own width, a bool tile in ``<W x i1>`` (one byte per element in memory:
loads compare with 0, stores widen).  Every typed function becomes one ``tessera_x86.velem``.
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerAttr, IntegerType, StringAttr, VectorType
from xdsl.ir import Attribute, SSAValue

from tessera.ir import tile as t
from tessera.ir.builder import Builder
from tessera.ir.target import x86 as x
from tessera.ir.target.x86_elem import VELEM_FNS


def is_int_elem(elem: Attribute) -> bool:
    return isinstance(elem, IntegerType)


def reg_vec(low, elem: Attribute) -> VectorType:
    """The register type of a tile of ``elem``: its own int / i1 lanes, else the kernel's floats."""
    return VectorType(elem, [low.w]) if is_int_elem(elem) else low.vreg


def velem(b: Builder, fn: str, operands: list[SSAValue], result: VectorType) -> SSAValue:
    op = x.VElemOp.create(operands=operands, attributes={"fn": StringAttr(fn)}, result_types=[result])
    b.op(op)
    return op.result


def convert(b: Builder, v: SSAValue, to: VectorType) -> SSAValue:
    return v if v.type == to else velem(b, "cvt", [v], to)


def int_const(b: Builder, value, vt: VectorType) -> SSAValue:
    elem = vt.element_type
    iv = int(value != 0) if elem.width.data == 1 else int(value)
    op = x.VConstantOp.create(attributes={"value": IntegerAttr(iv, elem)}, result_types=[vt])
    b.op(op)
    return op.result


def needs_typed(op: t.ElementwiseOp) -> bool:
    """Whether ``op`` lowers to velem: a typed function, or any function on int / bool tiles."""
    return op.fn.data in VELEM_FNS and (
        op.fn.data in t.TYPED_UNARY_FNS + t.TYPED_BINARY_FNS + t.TYPED_TERNARY_FNS
        or any(is_int_elem(v.type.element_type) for v in op.inputs))


def lower_elementwise(low, op: t.ElementwiseOp, b: Builder) -> None:
    from tessera.passes.target.x86.lower_values import Regs
    fn = op.fn.data
    R, C = op.result.type.dims
    ins = [low._expand(low.get(v), R, C) for v in op.inputs]
    rt = reg_vec(low, op.result.type.element_type)
    rows = [[velem(b, fn, [a[i][v] for a in ins], rt) for v in range(low.nvec(C))] for i in range(R)]
    low.vmap[op.result] = Regs((R, C), rows)


__all__ = ["reg_vec", "convert", "int_const", "needs_typed", "lower_elementwise", "is_int_elem"]


def lower_index(low, op, b: Builder) -> None:
    """``tile.index``: per register, the splat of its first element's index (+ the lane number
    where the index runs along the columns), converted to the tile's registers."""
    from xdsl.dialects import arith
    from xdsl.dialects.builtin import IntegerType as IT

    from tessera.ir.attrs import ival
    from tessera.passes.target.x86.lower_values import Regs
    R, C = op.result.type.dims
    rs, cs = ival(op.row_step), ival(op.col_step)
    base = low.scalar(op.base)
    i64v = VectorType(IT(64), [low.w])
    rt = reg_vec(low, op.result.type.element_type)
    rows = []
    for i in range(R):
        row = []
        for v in range(low.nvec(C)):
            first = b.add(base, i * rs + (v * low.w * cs if C > 1 else 0))
            s = b.op(arith.IndexCastOp(b.c(first), IT(64))).results[0]
            vec = b.op(x.VSplatOp.create(operands=[s], result_types=[i64v])).results[0]
            if C > 1 and cs:
                vec = velem(b, "ramp", [vec], i64v)
            row.append(convert(b, vec, rt))
        rows.append(row)
    low.vmap[op.result] = Regs((R, C), rows)
