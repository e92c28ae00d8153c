"""Graph IR's tensor type (``!tessera.tensor<[dims], elem>``, dimensions symbolic or
static) and the shape and dtype rules the ops' verifiers share.  Re-exported by
:mod:`tessera.ir.graph`."""
from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntAttr,
    IntegerType,
    StringAttr,
)
from xdsl.ir import Attribute, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer

from tessera.errors import (
    GraphAttributeError,
    GraphDtypeError,
    GraphShapeError,
)
from tessera.ir import dims as D
from tessera.ir import opset


FLOAT_TYPES = (Float32Type, Float16Type, BFloat16Type, Float64Type)


# --------------------------------------------------------------------------- type
@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """``!tessera.tensor<[d0, d1, ...], elem>``; a dim is an integer or a symbol product."""

    name = "tessera.tensor"
    shape: ArrayAttr
    element_type: Attribute

    @staticmethod
    def of(dims: Sequence[D.Dim], element_type: Attribute) -> "TensorType":
        attrs: list[Attribute] = []
        for d in dims:
            d = D.canon(d)
            attrs.append(IntAttr(d) if isinstance(d, int) else StringAttr(d))
        return TensorType(ArrayAttr(attrs), element_type)

    @property
    def dims(self) -> tuple[D.Dim, ...]:
        return tuple(a.data for a in self.shape.data)  # type: ignore[attr-defined]

    @property
    def rank(self) -> int:
        return len(self.shape.data)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<[" + ", ".join(str(d) for d in self.dims) + "], ")
        printer.print_attribute(self.element_type)
        printer.print_string(">")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[ArrayAttr, Attribute]:
        with parser.in_angle_brackets():
            parser.parse_punctuation("[")
            dims: list[D.Dim] = []
            if parser.parse_optional_punctuation("]") is None:
                while True:
                    dims.append(_parse_dim_expr(parser))
                    if parser.parse_optional_punctuation(",") is None:
                        break
                parser.parse_punctuation("]")
            parser.parse_punctuation(",")
            elem = parser.parse_type()
        t = TensorType.of(dims, elem)
        return t.shape, t.element_type

    def verify(self) -> None:
        for d in self.dims:
            if isinstance(d, int) and d < 0:
                raise GraphShapeError(f"negative dimension {d} in tensor type")


def _parse_dim_expr(parser: AttrParser) -> D.Dim:
    factors: list[D.Dim] = []
    while True:
        value = parser.parse_optional_integer(allow_boolean=False, allow_negative=False)
        if value is None:
            ident = parser.parse_optional_identifier()
            if ident is None:
                parser.raise_error("expected a dimension (integer or symbol)")
            factors.append(ident)
        else:
            factors.append(value)
        if parser.parse_optional_punctuation("*") is None:
            break
    return D.product(factors)


def tensor(dims: Sequence[D.Dim], elem: Attribute) -> TensorType:
    return TensorType.of(dims, elem)


def is_float(t: Attribute) -> bool:
    return isinstance(t, FLOAT_TYPES)


def dtype_name(t: Attribute) -> str:
    return str(t)


# --------------------------------------------------------------------------- shape rules
def broadcast_dims(a: Sequence[D.Dim], b: Sequence[D.Dim], what: str = "operands") -> tuple[D.Dim, ...]:
    """numpy broadcasting on symbolic dims: equal, or one of them the literal 1."""
    out: list[D.Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise GraphShapeError(
                f"{what} do not broadcast: {list(a)} vs {list(b)} (dimension -{i}: {x} vs {y})")
    return tuple(reversed(out))


def normalize_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise GraphAttributeError(f"{what}: axis {axis} out of range for rank {rank}")
    return axis % rank


def is_int(t: Attribute) -> bool:
    """An integer element type (int8/uint8/int32/int64; i1 is bool)."""
    return isinstance(t, IntegerType) and t.width.data in (8, 32, 64)


def is_bool(t: Attribute) -> bool:
    return isinstance(t, IntegerType) and t.width.data == 1


def elem_kind(t: Attribute) -> str:
    """``dtypes.kind``'s letter for an element type: f(loat), i(nt), b(ool); '?' for others."""
    return "f" if is_float(t) else "i" if is_int(t) else "b" if is_bool(t) else "?"


def _require_float(op_name: str, *types: Attribute) -> None:
    """The op's operands have the element kinds its registry entry (``ir/opset.py``) allows
    (floats only for an op the registry does not know)."""
    d = opset.OPS.get(op_name.removeprefix("tessera."))
    allowed = d.kinds if d is not None else "f"
    for t in types:
        if elem_kind(t) in allowed:
            continue
        kinds = " or ".join(opset.KIND_NAMES[k] for k in allowed)
        raise GraphDtypeError(f"{op_name} needs {'floating-point' if allowed == 'f' else kinds} operands, got {t}")


def _operand_tensor(op_name: str, v) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise GraphDtypeError(f"{op_name}: operand of type {t} is not a !tessera.tensor")
    return t
