"""Graph IR ops with typed results or int operands: comparisons (-> bool), ``where``, bitwise /
logical ops, ``isnan`` / ``isinf`` / ``isfinite``, floor division, modulo, shifts, ``pow`` and
the index generator ``iota``.  Each names the ``tile.elementwise`` function it becomes
(``TILE_FN``; ``tessera.passes.tile.kernels.typed``)."""
from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import IntegerAttr, IntegerType, i1
from xdsl.irdl import attr_def, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from tessera.errors import GraphAttributeError, GraphDtypeError
from tessera.ir.attrs import ival
from tessera.ir.graph import (GraphOp, TensorType, _operand_tensor, broadcast_dims, is_bool, is_float, is_int)

_FMT2 = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)"
_FMT1 = "$input attr-dict `:` functional-type(operands, results)"


def _kinds(name: str, t, allowed: str) -> None:
    """``allowed``: letters of f (float), i (int), b (bool)."""
    k = "f" if is_float(t) else "i" if is_int(t) else "b" if is_bool(t) else "?"
    if k not in allowed:
        what = {"f": "float", "i": "int", "b": "bool"}
        raise GraphDtypeError(f"{name} takes {' or '.join(what[c] for c in allowed)} operands, got {t}")


class _TypedBinary(GraphOp):
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = _FMT2
    KINDS: ClassVar[str] = "fib"
    BOOL_RESULT: ClassVar[bool] = False

    def infer_result_type(self) -> TensorType:
        a, b = _operand_tensor(self.name, self.lhs), _operand_tensor(self.name, self.rhs)
        if a.element_type != b.element_type:
            raise GraphDtypeError(f"{self.name} operands disagree: {a.element_type} vs {b.element_type}")
        _kinds(self.name, a.element_type, self.KINDS)
        return TensorType.of(broadcast_dims(a.dims, b.dims, f"{self.name} operands"),
                             i1 if self.BOOL_RESULT else a.element_type)

    @property
    def FN(self) -> str:   # noqa: N802 - the name elementwise_fn reads
        return self.TILE_FN


class _TypedUnary(GraphOp):
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = _FMT1
    KINDS: ClassVar[str] = "f"
    BOOL_RESULT: ClassVar[bool] = False

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        _kinds(self.name, t.element_type, self.KINDS)
        return TensorType.of(t.dims, i1 if self.BOOL_RESULT else t.element_type)

    @property
    def FN(self) -> str:   # noqa: N802
        return self.TILE_FN


def _cmp(op_name: str, fn: str):
    @irdl_op_definition
    class Cmp(_TypedBinary):
        name = f"tessera.{op_name}"
        TILE_FN: ClassVar[str] = fn
        BOOL_RESULT: ClassVar[bool] = True
    Cmp.__name__ = Cmp.__qualname__ = "".join(p.capitalize() for p in op_name.split("_")) + "Op"
    return Cmp


EqualOp = _cmp("equal", "cmp_eq")
NotEqualOp = _cmp("not_equal", "cmp_ne")
LessOp = _cmp("less", "cmp_lt")
LessEqualOp = _cmp("less_equal", "cmp_le")
GreaterOp = _cmp("greater", "cmp_gt")
GreaterEqualOp = _cmp("greater_equal", "cmp_ge")


@irdl_op_definition
class BitwiseAndOp(_TypedBinary):
    name = "tessera.bitwise_and"
    TILE_FN: ClassVar[str] = "and"
    KINDS: ClassVar[str] = "ib"


@irdl_op_definition
class BitwiseOrOp(_TypedBinary):
    name = "tessera.bitwise_or"
    TILE_FN: ClassVar[str] = "or"
    KINDS: ClassVar[str] = "ib"


@irdl_op_definition
class BitwiseXorOp(_TypedBinary):
    name = "tessera.bitwise_xor"
    TILE_FN: ClassVar[str] = "xor"
    KINDS: ClassVar[str] = "ib"


@irdl_op_definition
class LeftShiftOp(_TypedBinary):
    name = "tessera.left_shift"
    TILE_FN: ClassVar[str] = "shl"
    KINDS: ClassVar[str] = "i"


@irdl_op_definition
class RightShiftOp(_TypedBinary):
    name = "tessera.right_shift"
    TILE_FN: ClassVar[str] = "shr"
    KINDS: ClassVar[str] = "i"


@irdl_op_definition
class FloorDivideOp(_TypedBinary):
    name = "tessera.floor_divide"
    TILE_FN: ClassVar[str] = "floordiv"
    KINDS: ClassVar[str] = "fi"


@irdl_op_definition
class ModOp(_TypedBinary):
    name = "tessera.mod"
    TILE_FN: ClassVar[str] = "mod"
    KINDS: ClassVar[str] = "fi"


@irdl_op_definition
class PowOp(_TypedBinary):
    name = "tessera.pow"
    TILE_FN: ClassVar[str] = "pow"
    KINDS: ClassVar[str] = "f"


@irdl_op_definition
class BitwiseNotOp(_TypedUnary):
    name = "tessera.bitwise_not"
    TILE_FN: ClassVar[str] = "not"
    KINDS: ClassVar[str] = "ib"


@irdl_op_definition
class IsNanOp(_TypedUnary):
    name = "tessera.isnan"
    TILE_FN: ClassVar[str] = "isnan"
    BOOL_RESULT: ClassVar[bool] = True


@irdl_op_definition
class IsInfOp(_TypedUnary):
    name = "tessera.isinf"
    TILE_FN: ClassVar[str] = "isinf"
    BOOL_RESULT: ClassVar[bool] = True


@irdl_op_definition
class IsFiniteOp(_TypedUnary):
    name = "tessera.isfinite"
    TILE_FN: ClassVar[str] = "isfinite"
    BOOL_RESULT: ClassVar[bool] = True


@irdl_op_definition
class WhereOp(GraphOp):
    """``cond ? on_true : on_false`` elementwise, the three broadcast together (numpy's where)."""

    name = "tessera.where"
    cond = operand_def(TensorType)
    on_true = operand_def(TensorType)
    on_false = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$cond `,` $on_true `,` $on_false attr-dict `:` functional-type(operands, results)"
    TILE_FN: ClassVar[str] = "select"

    def infer_result_type(self) -> TensorType:
        c, a, b = (_operand_tensor(self.name, v) for v in (self.cond, self.on_true, self.on_false))
        if not is_bool(c.element_type):
            raise GraphDtypeError(f"tessera.where: the condition is {c.element_type}, not bool (i1)")
        if a.element_type != b.element_type:
            raise GraphDtypeError(f"tessera.where: values disagree: {a.element_type} vs {b.element_type}")
        dims = broadcast_dims(broadcast_dims(c.dims, a.dims, "tessera.where operands"), b.dims,
                              "tessera.where operands")
        return TensorType.of(dims, a.element_type)


@irdl_op_definition
class IotaOp(GraphOp):
    """The index along ``axis`` of each element of the result: ``result[..., i_axis, ...] = i_axis``
    (int or float result type, whose dims give the shape).  A generator: inside a fused kernel it
    is computed from the loop indices, never read from memory."""

    name = "tessera.iota"
    axis = attr_def(IntegerAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"
    TILE_FN: ClassVar[str] = "iota"

    def infer_result_type(self) -> TensorType:
        r = self.result.type
        if not isinstance(r, TensorType):
            raise GraphDtypeError("tessera.iota result is not a !tessera.tensor")
        if not 0 <= ival(self.axis) < r.rank:
            raise GraphAttributeError(f"tessera.iota: axis {ival(self.axis)} is out of range for rank {r.rank}")
        if not (is_int(r.element_type) or is_float(r.element_type)):
            raise GraphDtypeError(f"tessera.iota: result dtype {r.element_type}; int or float")
        return r


TYPED_BINARY = (EqualOp, NotEqualOp, LessOp, LessEqualOp, GreaterOp, GreaterEqualOp, BitwiseAndOp, BitwiseOrOp,
                BitwiseXorOp, LeftShiftOp, RightShiftOp, FloorDivideOp, ModOp, PowOp)
TYPED_UNARY = (BitwiseNotOp, IsNanOp, IsInfOp, IsFiniteOp)
TYPED_OPS = TYPED_BINARY + TYPED_UNARY + (WhereOp, IotaOp)

__all__ = ["TYPED_OPS", "TYPED_BINARY", "TYPED_UNARY", "WhereOp", "IotaOp", "IntegerType"]
