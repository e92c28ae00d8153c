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
    Float8E4M3FNType,
    Float8E5M2Type,
    BoolAttr,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
)
from xdsl.ir import Attribute, Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    opt_operand_def,
    operand_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import IsTerminator, Pure

from tessera.errors import (
    GraphAttributeError,
    GraphDtypeError,
    GraphRankError,
    GraphResultTypeError,
    GraphShapeError,
)
from tessera.ir import dims as D
from tessera.ir.attrs import ints, ival

from tessera.ir.graph_types import (  # noqa: F401  (re-exported)
    FLOAT_TYPES, TensorType, _operand_tensor, _parse_dim_expr, _require_float, broadcast_dims, dtype_name,
    elem_kind, is_bool, is_float, is_int, normalize_axis, tensor,
)


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


def is_fp8(t: Attribute) -> bool:
    return isinstance(t, (Float8E4M3FNType, Float8E5M2Type))


def infer_matmul(a: TensorType, b: TensorType, out_elem: Attribute | None = None) -> TensorType:
    if a.rank < 2 or b.rank < 2:
        raise GraphRankError(f"tessera.matmul needs rank >= 2 operands, got ranks {a.rank} and {b.rank}")
    fp8 = is_fp8(a.element_type) or is_fp8(b.element_type)
    if a.element_type != b.element_type and not (is_fp8(a.element_type) and is_fp8(b.element_type)):
        raise GraphDtypeError(f"tessera.matmul operands disagree: {a.element_type} vs {b.element_type}")
    if not fp8:
        _require_float("tessera.matmul", a.element_type)
    if fp8 and not isinstance(out_elem, Float32Type):   # fp8 x fp8 (e4m3/e5m2 mixes too) -> f32 only
        raise GraphDtypeError(f"tessera.matmul: fp8 inputs ({a.element_type}, {b.element_type}) give f32, "
                              f"not {out_elem}")
    (m, k1), (k2, n) = a.dims[-2:], b.dims[-2:]
    if k1 != k2:
        raise GraphShapeError(f"tessera.matmul inner dimensions differ: {list(a.dims)} @ {list(b.dims)} ({k1} vs {k2})")
    batch = broadcast_dims(a.dims[:-2], b.dims[:-2], "tessera.matmul batch dimensions")
    elem = a.element_type
    if out_elem is not None and out_elem != elem:
        if isinstance(out_elem, Float32Type) and (fp8 or isinstance(elem, (BFloat16Type, Float16Type))):
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


# the later unary math ops and attention live beside (they import the classes above)
from tessera.ir.graph_math import (AbsOp, CeilOp, CosOp, Exp2Op, Expm1Op, FloorOp, Log1pOp, LogOp,  # noqa: E402
                                   ReciprocalOp, RoundOp, RsqrtOp, SigmoidOp, SignOp, SinOp, SquareOp)
from tessera.ir.graph_attention import MASKED_ROWS, AttentionOp, infer_attention  # noqa: E402,F401

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
from tessera.ir.graph_scatter import ScatterAddOp  # noqa: E402  (take's adjoint)
from tessera.ir.graph_attention_grad import AttentionGradOp  # noqa: E402  (attention's backward)

Graph = Dialect(
    "tessera",
    [*TYPED_OPS,
     MatmulOp, AddOp, SubOp, MulOp, DivOp, MaximumOp, NegOp, ExpOp, TanhOp, ErfOp, ReluOp, SiluOp, SqrtOp, GeluOp,
     SoftmaxOp, LayerNormOp, RmsNormOp, ReduceSumOp, ReduceMaxOp, ReduceMeanOp, TransposeOp, ReshapeOp,
     SliceOp, ConcatOp, CastOp, ConstantOp, AttentionOp, FusionOp, YieldOp, MinimumOp,
     LogOp, Log1pOp, Exp2Op, Expm1Op, SinOp, CosOp, SigmoidOp, AbsOp, SignOp, RsqrtOp, ReciprocalOp, FloorOp, CeilOp,
     RoundOp, SquareOp,
     TakeOp, TakeAlongAxisOp, OneHotOp,
     PadOp, ConvPatchesOp,
     ScatterAddOp, AttentionGradOp]
    + ROWS_OPS,
    [TensorType],
)


# keep IntegerType importable for dtype tables built on this module
__all__ = ["Graph", "TensorType", "IntegerType"]
