"""Graph IR: the ``tessera`` dialect — the math on whole tensors.

Tensor types carry symbolic dimensions (``!tessera.tensor<[M, 1024], f32>``) so one
kernel serves many sizes.  Every op infers its result type from its operands with
one function (:func:`infer_result_type`); the verifier compares the declared result
type against it, and the tracer uses the same function to build the IR, so the two
can never disagree.  Verifier failures raise coded ``Graph*Error``s.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    BoolAttr,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
)
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    attr_def,
    irdl_attr_definition,
    irdl_op_definition,
    opt_attr_def,
    opt_operand_def,
    operand_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import IsTerminator, Pure

from tessera.errors import (
    GraphAttributeError,
    GraphDtypeError,
    GraphRankError,
    GraphResultTypeError,
    GraphShapeError,
)
from tessera.ir import dims as D
from tessera.ir import opset
from tessera.ir.attrs import ints, ival

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
    """A signed integer element type (int8/int32/int64; i1 is bool)."""
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


# --------------------------------------------------------------------------- ops
class GraphOp(IRDLOperation):
    """Common verification: declared result type == inferred result type."""

    def infer_result_type(self) -> TensorType:  # pragma: no cover - every op overrides
        raise NotImplementedError

    def verify_(self) -> None:
        inferred = self.infer_result_type()
        declared = self.results[0].type
        if declared != inferred:
            raise GraphResultTypeError(
                f"{self.name}: declared result type {declared} but operands imply {inferred}", op=self)


_FMT2 = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)"
_FMT1 = "$input attr-dict `:` functional-type(operands, results)"


@irdl_op_definition
class MatmulOp(GraphOp):
    """``[..., M, K] @ [..., K, N] -> [..., M, N]`` with numpy batch broadcasting.

    Inputs share one float dtype; the result has that dtype, or f32 when the inputs
    are bf16/f16 (``out_dtype=float32``)."""

    name = "tessera.matmul"
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = _FMT2

    def infer_result_type(self) -> TensorType:
        a, b = _operand_tensor(self.name, self.lhs), _operand_tensor(self.name, self.rhs)
        return infer_matmul(a, b, self.result.type.element_type if isinstance(self.result.type, TensorType) else None)


def infer_matmul(a: TensorType, b: TensorType, out_elem: Attribute | None = None) -> TensorType:
    if a.rank < 2 or b.rank < 2:
        raise GraphRankError(f"tessera.matmul needs rank >= 2 operands, got ranks {a.rank} and {b.rank}")
    if a.element_type != b.element_type:
        raise GraphDtypeError(f"tessera.matmul operands disagree: {a.element_type} vs {b.element_type}")
    _require_float("tessera.matmul", a.element_type)
    (m, k1), (k2, n) = a.dims[-2:], b.dims[-2:]
    if k1 != k2:
        raise GraphShapeError(f"tessera.matmul inner dimensions differ: {list(a.dims)} @ {list(b.dims)} ({k1} vs {k2})")
    batch = broadcast_dims(a.dims[:-2], b.dims[:-2], "tessera.matmul batch dimensions")
    elem = a.element_type
    if out_elem is not None and out_elem != elem:
        if isinstance(out_elem, Float32Type) and isinstance(elem, (BFloat16Type, Float16Type)):
            elem = out_elem
        else:
            raise GraphDtypeError(f"tessera.matmul: result dtype {out_elem} not allowed for {a.element_type} inputs "
                                  "(same dtype, or f32 for bf16/f16 inputs)")
    return TensorType.of((*batch, m, n), elem)


class _Binary(GraphOp):
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = _FMT2

    def infer_result_type(self) -> TensorType:
        a, b = _operand_tensor(self.name, self.lhs), _operand_tensor(self.name, self.rhs)
        return infer_binary(self.name, a, b)


def infer_binary(name: str, a: TensorType, b: TensorType) -> TensorType:
    if a.element_type != b.element_type:
        raise GraphDtypeError(f"{name} operands disagree: {a.element_type} vs {b.element_type}")
    _require_float(name, a.element_type)
    return TensorType.of(broadcast_dims(a.dims, b.dims, f"{name} operands"), a.element_type)


@irdl_op_definition
class AddOp(_Binary):
    name = "tessera.add"
    FN: ClassVar[str] = "add"


@irdl_op_definition
class SubOp(_Binary):
    name = "tessera.sub"
    FN: ClassVar[str] = "sub"


@irdl_op_definition
class MulOp(_Binary):
    name = "tessera.mul"
    FN: ClassVar[str] = "mul"


@irdl_op_definition
class DivOp(_Binary):
    name = "tessera.div"
    FN: ClassVar[str] = "div"


@irdl_op_definition
class MaximumOp(_Binary):
    name = "tessera.maximum"
    FN: ClassVar[str] = "max"


class _Unary(GraphOp):
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        _require_float(self.name, t.element_type)
        return t


@irdl_op_definition
class NegOp(_Unary):
    name = "tessera.neg"
    FN: ClassVar[str] = "neg"


@irdl_op_definition
class ExpOp(_Unary):
    name = "tessera.exp"
    FN: ClassVar[str] = "exp"


@irdl_op_definition
class TanhOp(_Unary):
    name = "tessera.tanh"
    FN: ClassVar[str] = "tanh"


@irdl_op_definition
class ErfOp(_Unary):
    name = "tessera.erf"
    FN: ClassVar[str] = "erf"


@irdl_op_definition
class ReluOp(_Unary):
    name = "tessera.relu"
    FN: ClassVar[str] = "relu"


@irdl_op_definition
class SiluOp(_Unary):
    name = "tessera.silu"
    FN: ClassVar[str] = "silu"


@irdl_op_definition
class SqrtOp(_Unary):
    name = "tessera.sqrt"
    FN: ClassVar[str] = "sqrt"


@irdl_op_definition
class LogOp(_Unary):
    name = "tessera.log"
    FN: ClassVar[str] = "log"


@irdl_op_definition
class Log1pOp(_Unary):
    name = "tessera.log1p"
    FN: ClassVar[str] = "log1p"


@irdl_op_definition
class Exp2Op(_Unary):
    name = "tessera.exp2"
    FN: ClassVar[str] = "exp2"


@irdl_op_definition
class Expm1Op(_Unary):
    name = "tessera.expm1"
    FN: ClassVar[str] = "expm1"


@irdl_op_definition
class SinOp(_Unary):
    name = "tessera.sin"
    FN: ClassVar[str] = "sin"


@irdl_op_definition
class CosOp(_Unary):
    name = "tessera.cos"
    FN: ClassVar[str] = "cos"


@irdl_op_definition
class SigmoidOp(_Unary):
    name = "tessera.sigmoid"
    FN: ClassVar[str] = "sigmoid"


@irdl_op_definition
class AbsOp(_Unary):
    name = "tessera.abs"
    FN: ClassVar[str] = "abs"


@irdl_op_definition
class SignOp(_Unary):
    name = "tessera.sign"
    FN: ClassVar[str] = "sign"


@irdl_op_definition
class RsqrtOp(_Unary):
    name = "tessera.rsqrt"
    FN: ClassVar[str] = "rsqrt"


@irdl_op_definition
class ReciprocalOp(_Unary):
    name = "tessera.reciprocal"
    FN: ClassVar[str] = "recip"


@irdl_op_definition
class FloorOp(_Unary):
    name = "tessera.floor"
    FN: ClassVar[str] = "floor"


@irdl_op_definition
class CeilOp(_Unary):
    name = "tessera.ceil"
    FN: ClassVar[str] = "ceil"


@irdl_op_definition
class RoundOp(_Unary):
    name = "tessera.round"
    FN: ClassVar[str] = "round"


@irdl_op_definition
class SquareOp(_Unary):
    name = "tessera.square"
    FN: ClassVar[str] = "square"


@irdl_op_definition
class MinimumOp(_Binary):
    name = "tessera.minimum"
    FN: ClassVar[str] = "min"


GELU_APPROXIMATIONS = ("tanh", "erf")


@irdl_op_definition
class GeluOp(_Unary):
    """GELU; ``approximate`` is ``"tanh"`` or ``"erf"`` (exact)."""

    name = "tessera.gelu"
    approximate = attr_def(StringAttr)

    FN: ClassVar[str] = "gelu"

    def infer_result_type(self) -> TensorType:
        if self.approximate.data not in GELU_APPROXIMATIONS:
            raise GraphAttributeError(f"tessera.gelu approximate={self.approximate.data!r}; "
                                      f"legal: {', '.join(GELU_APPROXIMATIONS)}")
        return super().infer_result_type()


@irdl_op_definition
class SoftmaxOp(_Unary):
    name = "tessera.softmax"
    axis = attr_def(IntegerAttr)

    def infer_result_type(self) -> TensorType:
        t = super().infer_result_type()
        normalize_axis(ival(self.axis), t.rank, self.name)
        return t


class _Norm(GraphOp):
    """Normalisation over the last axis with optional per-feature scale (and bias)."""

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    eps = attr_def(FloatAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def _check_vec(self, v, t: TensorType, what: str) -> None:
        if v is None:
            return
        vt = _operand_tensor(self.name, v)
        if vt.element_type != t.element_type:
            raise GraphDtypeError(f"{self.name}: {what} dtype {vt.element_type} differs from input {t.element_type}")
        if vt.dims != (t.dims[-1],):
            raise GraphShapeError(f"{self.name}: {what} must have shape [{t.dims[-1]}], got {list(vt.dims)}")


@irdl_op_definition
class LayerNormOp(_Norm):
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the last axis."""

    name = "tessera.layer_norm"
    input = operand_def(TensorType)
    scale = opt_operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    assembly_format = ("$input (`scale` $scale^ `:` type($scale))? (`bias` $bias^ `:` type($bias))? attr-dict "
                       "`:` type($input) `->` type($result)")

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        _require_float(self.name, t.element_type)
        if t.rank < 1:
            raise GraphRankError(f"{self.name} needs rank >= 1")
        self._check_vec(self.scale, t, "scale")
        self._check_vec(self.bias, t, "bias")
        return t


@irdl_op_definition
class RmsNormOp(_Norm):
    """``x / sqrt(mean(x^2) + eps) * scale`` over the last axis."""

    name = "tessera.rms_norm"
    input = operand_def(TensorType)
    scale = opt_operand_def(TensorType)
    assembly_format = "$input (`scale` $scale^ `:` type($scale))? attr-dict `:` type($input) `->` type($result)"

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        _require_float(self.name, t.element_type)
        if t.rank < 1:
            raise GraphRankError(f"{self.name} needs rank >= 1")
        self._check_vec(self.scale, t, "scale")
        return t


class _Reduce(GraphOp):
    input = operand_def(TensorType)
    result = result_def(TensorType)
    axes = attr_def(ArrayAttr)
    keepdims = attr_def(BoolAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        _require_float(self.name, t.element_type)
        axes = ints(self.axes)
        return infer_reduce(self.name, t, axes, bool(self.keepdims.value.data))


def infer_reduce(name: str, t: TensorType, axes: Sequence[int], keepdims: bool) -> TensorType:
    norm = sorted({normalize_axis(a, t.rank, name) for a in axes})
    if len(norm) != len(axes):
        raise GraphAttributeError(f"{name}: repeated axis in {list(axes)}")
    if not norm:
        raise GraphAttributeError(f"{name}: empty axes")
    out = [1 if i in norm else d for i, d in enumerate(t.dims)] if keepdims else \
        [d for i, d in enumerate(t.dims) if i not in norm]
    return TensorType.of(out, t.element_type)


@irdl_op_definition
class ReduceSumOp(_Reduce):
    name = "tessera.reduce_sum"
    KIND: ClassVar[str] = "sum"


@irdl_op_definition
class ReduceMaxOp(_Reduce):
    name = "tessera.reduce_max"
    KIND: ClassVar[str] = "max"


@irdl_op_definition
class ReduceMeanOp(_Reduce):
    name = "tessera.reduce_mean"
    KIND: ClassVar[str] = "mean"


@irdl_op_definition
class TransposeOp(GraphOp):
    name = "tessera.transpose"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    perm = attr_def(ArrayAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    @property
    def permutation(self) -> list[int]:
        return ints(self.perm)

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        return infer_transpose(t, self.permutation)


@irdl_op_definition
class SliceOp(GraphOp):
    """``input[start : start + size * step : step]`` along every axis (``starts``, nonzero
    ``steps``, and the result type's dims as the sizes; a negative step walks the axis backwards
    from its start).  A sliced axis of the input has a static size (the window must lie inside
    it); an axis taken whole (start 0, step 1, the same dim) may be symbolic.  CPU kernels read
    the input through its strides (negative ones for a negative step) and an offset."""

    name = "tessera.slice"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    starts = attr_def(ArrayAttr)
    steps = attr_def(ArrayAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        r = self.result.type
        if not isinstance(r, TensorType):
            raise GraphDtypeError("tessera.slice result is not a !tessera.tensor")
        starts, steps = ints(self.starts), ints(self.steps)
        if not (len(starts) == len(steps) == t.rank == r.rank):
            raise GraphAttributeError(f"tessera.slice: {len(starts)} starts and {len(steps)} steps for rank "
                                      f"{t.rank} -> {r.rank}")
        for ax, (n, m, a, st) in enumerate(zip(t.dims, r.dims, starts, steps)):
            if st == 0 or a < 0:
                raise GraphAttributeError(f"tessera.slice: axis {ax}: start {a} and step {st} (start >= 0, step != 0)")
            if n == m and a == 0 and st == 1:
                continue
            if not (isinstance(n, int) and isinstance(m, int)):
                raise GraphAttributeError(f"tessera.slice: axis {ax} is sliced, so its sizes must be static "
                                          f"({n} -> {m})")
            if m < 0 or (m > 0 and not 0 <= a + (m - 1) * st < n) or (m > 0 and a >= n):
                raise GraphAttributeError(f"tessera.slice: axis {ax}: {m} elements from {a} in steps of {st} "
                                          f"do not fit in {n}")
        return TensorType.of(list(r.dims), t.element_type)


@irdl_op_definition
class ConcatOp(GraphOp):
    """Operands joined along ``axis``: the same rank and element type, equal dims except along
    ``axis``, where each is static and the result's is their sum."""

    name = "tessera.concat"
    inputs = var_operand_def(TensorType)
    result = result_def(TensorType)
    axis = attr_def(IntegerAttr)
    traits = traits_def(Pure())
    assembly_format = "$inputs attr-dict `:` functional-type(operands, results)"

    def infer_result_type(self) -> TensorType:
        ts_ = [_operand_tensor(self.name, v) for v in self.inputs]
        if not ts_:
            raise GraphAttributeError("tessera.concat needs at least one operand")
        first = ts_[0]
        ax = ival(self.axis)
        if not 0 <= ax < first.rank:
            raise GraphAttributeError(f"tessera.concat: axis {ax} is out of range for rank {first.rank}")
        total = 0
        for i, t in enumerate(ts_):
            if t.rank != first.rank or t.element_type != first.element_type:
                raise GraphDtypeError(f"tessera.concat: operand {i} is {t}, operand 0 is {first}")
            if any(a != b for k, (a, b) in enumerate(zip(t.dims, first.dims)) if k != ax):
                raise GraphAttributeError(f"tessera.concat: operand {i} {list(t.dims)} differs from operand 0 "
                                          f"{list(first.dims)} off axis {ax}")
            if not isinstance(t.dims[ax], int):
                raise GraphAttributeError(f"tessera.concat: operand {i}'s size along axis {ax} must be static, "
                                          f"got {t.dims[ax]}")
            total += t.dims[ax]
        return TensorType.of([total if k == ax else d for k, d in enumerate(first.dims)], first.element_type)


def infer_transpose(t: TensorType, perm: Sequence[int]) -> TensorType:
    if sorted(perm) != list(range(t.rank)):
        raise GraphAttributeError(f"tessera.transpose: {list(perm)} is not a permutation of rank {t.rank}")
    return TensorType.of([t.dims[p] for p in perm], t.element_type)


@irdl_op_definition
class ReshapeOp(GraphOp):
    """Row-major reshape; the result type gives the new shape (same element count)."""

    name = "tessera.reshape"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        r = self.result.type
        if not isinstance(r, TensorType):
            raise GraphDtypeError("tessera.reshape result is not a !tessera.tensor")
        if r.element_type != t.element_type:
            raise GraphDtypeError("tessera.reshape cannot change the element type (use tessera.cast)")
        if D.product(t.dims) != D.product(r.dims):
            raise GraphShapeError(f"tessera.reshape: {list(t.dims)} and {list(r.dims)} differ in element count")
        return r


@irdl_op_definition
class CastOp(GraphOp):
    name = "tessera.cast"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        r = self.result.type
        if not isinstance(r, TensorType):
            raise GraphDtypeError("tessera.cast result is not a !tessera.tensor")
        _require_float(self.name, t.element_type, r.element_type)
        return TensorType.of(t.dims, r.element_type)


MASKED_ROWS = ("zero", "nan")


@irdl_op_definition
class AttentionOp(GraphOp):
    """``softmax(q @ k^T * scale [+ mask]) @ v`` over [batch, heads, seq, dim] tensors.

    Grouped-query: k and v may have fewer heads; query head h reads kv head
    h // (heads_q / heads_kv).  ``mask`` is boolean (i1: true = attend) or additive (the
    inputs' float type), broadcast to [batch, heads_q, seq_q, seq_k].  ``causal`` masks key j
    for query i when j > i (top-left alignment, as torch's scaled_dot_product_attention with
    is_causal=True).  A query row with every key masked gives 0 (``masked_rows = "zero"``)
    or NaN (``"nan"``: what the composed softmax form gives, used when the op stands in for it)."""

    name = "tessera.attention"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    mask = opt_operand_def(TensorType)
    scale = opt_attr_def(FloatAttr)  # absent: 1/sqrt(head dim)
    causal = attr_def(BoolAttr)
    masked_rows = attr_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = ("$q `,` $k `,` $v (`mask` $mask^ `:` type($mask))? attr-dict `:` type($q) `,` type($k) `,` "
                       "type($v) `->` type($result)")

    def infer_result_type(self) -> TensorType:
        q, k, v = (_operand_tensor(self.name, x) for x in (self.q, self.k, self.v))
        m = _operand_tensor(self.name, self.mask) if self.mask is not None else None
        if self.masked_rows.data not in MASKED_ROWS:
            raise GraphAttributeError(f"tessera.attention masked_rows={self.masked_rows.data!r}; legal: zero, nan")
        return infer_attention(q, k, v, m)


def infer_attention(q: TensorType, k: TensorType, v: TensorType, mask: TensorType | None) -> TensorType:
    from tessera.errors import AttentionHeadDimError, AttentionHeadsError, AttentionMaskError, AttentionSeqError
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank != 4:
            raise GraphRankError(f"tessera.attention: {name} must be [batch, heads, seq, dim], got rank {t.rank}")
    if not (q.element_type == k.element_type == v.element_type):
        raise GraphDtypeError("tessera.attention: q, k and v must share one dtype")
    _require_float("tessera.attention", q.element_type)
    (bq, hq, sq, dq), (bk, hk, sk, dk), (bv, hv, sv, dv) = q.dims, k.dims, v.dims
    if dq != dk:
        raise AttentionHeadDimError(f"tessera.attention: q head dim {dq} differs from k head dim {dk}")
    if (bk, hk, sk) != (bv, hv, sv):
        raise AttentionSeqError(f"tessera.attention: k is {list(k.dims)} but v is {list(v.dims)} (batch, heads and "
                                "sequence must match)")
    if bq != bk:
        raise AttentionSeqError(f"tessera.attention: batch of q ({bq}) and k ({bk}) differ")
    if hq != hk and not (isinstance(hq, int) and isinstance(hk, int) and hk > 0 and hq % hk == 0) and hk != 1:
        raise AttentionHeadsError(f"tessera.attention: {hq} query heads are not a multiple of {hk} key/value heads")
    if mask is not None:
        if not (isinstance(mask.element_type, IntegerType) and mask.element_type.width.data == 1) and \
                mask.element_type != q.element_type:
            raise AttentionMaskError(f"tessera.attention: mask dtype {mask.element_type}; use bool or {q.element_type}")
        try:
            shape = broadcast_dims(mask.dims, (bq, hq, sq, sk), "tessera.attention mask")
        except GraphShapeError as e:
            raise AttentionMaskError(e.message) from None
        if mask.rank > 4 or shape != (bq, hq, sq, sk):
            raise AttentionMaskError(f"tessera.attention: mask {list(mask.dims)} does not broadcast to "
                                     f"[{bq}, {hq}, {sq}, {sk}]")
    return TensorType.of((bq, hq, sq, dv), q.element_type)


@irdl_op_definition
class ConstantOp(GraphOp):
    """A constant tensor (``value`` is a dense attribute with static shape)."""

    name = "tessera.constant"
    value = attr_def(DenseIntOrFPElementsAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"

    def infer_result_type(self) -> TensorType:
        vt = self.value.type
        shape = list(vt.get_shape())  # type: ignore[attr-defined]
        if any(s < 0 for s in shape):
            raise GraphShapeError("tessera.constant needs a static shape")
        return TensorType.of(shape, vt.get_element_type())  # type: ignore[attr-defined]


@irdl_op_definition
class FusionOp(IRDLOperation):
    """A group of Graph IR ops that will become one kernel.

    ``kind`` names the kernel pattern (``gemm``, ``rowwise``, ``elementwise``,
    ``reduce``, ``transpose``, ``attention``); the region's arguments are the
    group's inputs and its ``tessera.yield`` gives the group's results."""

    name = "tessera.fusion"
    inputs = var_operand_def(TensorType)
    outputs = var_result_def(TensorType)
    kind = attr_def(StringAttr)
    body = region_def("single_block")
    assembly_format = "$kind `(` $inputs `)` attr-dict-with-keyword `:` functional-type($inputs, results) $body"

    def verify_(self) -> None:
        block = self.body.block
        if [a.type for a in block.args] != [v.type for v in self.inputs]:
            raise GraphResultTypeError("tessera.fusion block arguments must match its inputs", op=self)
        last = block.last_op
        if not isinstance(last, YieldOp):
            raise GraphResultTypeError("tessera.fusion body must end in tessera.yield", op=self)
        if [v.type for v in last.values] != [r.type for r in self.outputs]:
            raise GraphResultTypeError("tessera.fusion results must match its yield", op=self)


@irdl_op_definition
class YieldOp(IRDLOperation):
    name = "tessera.yield"
    values = var_operand_def()
    traits = traits_def(IsTerminator())
    assembly_format = "($values^ `:` type($values))? attr-dict"


def elementwise_fn(op: IRDLOperation) -> str:
    """The tile.elementwise function name of a Graph IR elementwise op."""
    if isinstance(op, GeluOp):
        return "gelu_" + op.approximate.data
    return op.FN  # type: ignore[attr-defined]


ELEMENTWISE_UNARY = (NegOp, ExpOp, TanhOp, ErfOp, ReluOp, SiluOp, GeluOp, SqrtOp,
                     LogOp, Log1pOp, Exp2Op, Expm1Op, SinOp, CosOp, SigmoidOp, AbsOp, SignOp, RsqrtOp, ReciprocalOp, FloorOp, CeilOp, RoundOp, SquareOp)
ELEMENTWISE_BINARY = (AddOp, SubOp, MulOp, DivOp, MaximumOp, MinimumOp)
REDUCTIONS = (ReduceSumOp, ReduceMaxOp, ReduceMeanOp)
ROWWISE = (SoftmaxOp, LayerNormOp, RmsNormOp)
# reductions, scans and the log-row ops live in graph_rows.py (it imports the classes above)
from tessera.ir.graph_rows import (ARGS, INDEX_ELEM, INDEX_ELEM_NP, NEW_REDUCTIONS, ROW_LOG,  # noqa: E402
                                   ROW_REDUCING, ROWS_OPS, SCANS, CrossEntropyOp, ReduceAllOp, ReduceAnyOp,
                                   ReduceProdOp, TopKOp)
REDUCTIONS = REDUCTIONS + NEW_REDUCTIONS
ROWWISE = ROWWISE + ROW_LOG + ARGS + (TopKOp, CrossEntropyOp)

# gathers (take, take_along_axis, one_hot) live in their own module, which imports the above
from tessera.ir.graph_index import GATHERS, OneHotOp, TakeAlongAxisOp, TakeOp  # noqa: E402

from tessera.ir.graph_typed import TYPED_BINARY, TYPED_OPS, TYPED_UNARY, IotaOp, WhereOp  # noqa: E402

ELEMENTWISE_UNARY += TYPED_UNARY
ELEMENTWISE_BINARY += TYPED_BINARY
ELEMENTWISE_OTHER = (WhereOp, IotaOp)   # elementwise with three operands / none

from tessera.ir.graph_nn import ConvPatchesOp, PadOp  # noqa: E402  (defined beside, on GraphOp)

Graph = Dialect(
    "tessera",
    [*TYPED_OPS,
     MatmulOp, AddOp, SubOp, MulOp, DivOp, MaximumOp, NegOp, ExpOp, TanhOp, ErfOp, ReluOp, SiluOp, SqrtOp, GeluOp,
     SoftmaxOp, LayerNormOp, RmsNormOp, ReduceSumOp, ReduceMaxOp, ReduceMeanOp, TransposeOp, ReshapeOp,
     SliceOp, ConcatOp, CastOp, ConstantOp, AttentionOp, FusionOp, YieldOp, MinimumOp,
     LogOp, Log1pOp, Exp2Op, Expm1Op, SinOp, CosOp, SigmoidOp, AbsOp, SignOp, RsqrtOp, ReciprocalOp, FloorOp, CeilOp,
     RoundOp, SquareOp,
     TakeOp, TakeAlongAxisOp, OneHotOp,
     PadOp, ConvPatchesOp]
    + ROWS_OPS,
    [TensorType],
)


# keep IntegerType importable for dtype tables built on this module
__all__ = ["Graph", "TensorType", "IntegerType"]
