"""Graph IR ops of the reduction, scan and loss family (``tessera`` dialect, imported by
``graph.py`` into the dialect): ``logsumexp`` and ``log_softmax`` (row kernels over the last
axis), ``cumsum`` / ``cumprod`` (a scan along any axis), ``reduce_prod``.

The tracer puts a ``logsumexp`` / ``log_softmax`` over another axis between transposes, so these
ops only ever name the last axis; a scan keeps its axis (the kernel walks it in place).
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from xdsl.dialects.builtin import BoolAttr, Float64Type, IntegerAttr, IntegerType, f32
from xdsl.irdl import attr_def, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from tessera.errors import GraphDtypeError, GraphRankError, GraphResultTypeError, GraphShapeError
from tessera.ir.attrs import ints, ival
from tessera.ir.graph import (  # noqa: I001
    _FMT1,
    GraphOp,
    TensorType,
    _operand_tensor,
    _Reduce,
    _require_float,
    _Unary,
    infer_reduce,
    normalize_axis,
)


def _row_input(op) -> TensorType:
    t = _operand_tensor(op.name, op.input)
    _require_float(op.name, t.element_type)
    if t.rank < 1:
        raise GraphRankError(f"{op.name} needs rank >= 1")
    return t


@irdl_op_definition
class LogSumExpOp(GraphOp):
    """``log(sum(exp(x)))`` over the last axis, computed as ``m + log(sum(exp(x - m)))`` with m the
    row's maximum (0 where that is not finite, as scipy): [..., C] -> [...] (or [..., 1])."""

    name = "tessera.logsumexp"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    keepdims = attr_def(BoolAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _row_input(self)
        dims = list(t.dims[:-1]) + ([1] if self.keepdims.value.data else [])
        return TensorType.of(dims, t.element_type)


@irdl_op_definition
class LogSoftmaxOp(_Unary):
    """``x - logsumexp(x)`` over the last axis (one row kernel)."""

    name = "tessera.log_softmax"

    def infer_result_type(self) -> TensorType:
        return _row_input(self)


class _Scan(GraphOp):
    input = operand_def(TensorType)
    result = result_def(TensorType)
    axis = attr_def(IntegerAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1
    KIND: ClassVar[str] = ""

    def infer_result_type(self) -> TensorType:
        t = _row_input(self)
        normalize_axis(ival(self.axis), t.rank, self.name)
        return t


@irdl_op_definition
class CumsumOp(_Scan):
    """Running sum along ``axis`` (f32 accumulation for bf16/f16, f64 for f64)."""

    name = "tessera.cumsum"
    KIND: ClassVar[str] = "add"


@irdl_op_definition
class CumprodOp(_Scan):
    """Running product along ``axis`` (f32 accumulation for bf16/f16, f64 for f64)."""

    name = "tessera.cumprod"
    KIND: ClassVar[str] = "mul"


@irdl_op_definition
class ReduceProdOp(_Reduce):
    name = "tessera.reduce_prod"
    KIND: ClassVar[str] = "prod"


class _Logical(_Reduce):
    """Whether any (every) element over ``axes`` is nonzero (NaN counts as nonzero, as numpy's
    ``bool(nan)``): a float, int or bool input, a bool (i1) result."""

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        if not isinstance(t.element_type, IntegerType):   # bool and int inputs too
            _require_float(self.name, t.element_type)
        r = infer_reduce(self.name, t, ints(self.axes), bool(self.keepdims.value.data))
        return TensorType.of(list(r.dims), IntegerType(1))


@irdl_op_definition
class ReduceAnyOp(_Logical):
    name = "tessera.reduce_any"
    KIND: ClassVar[str] = "any"


@irdl_op_definition
class ReduceAllOp(_Logical):
    name = "tessera.reduce_all"
    KIND: ClassVar[str] = "all"


# the element type of argmax / argmin / top_k indices (numpy's argmax gives int64)
INDEX_ELEM = IntegerType(64)
INDEX_ELEM_NP = np.dtype(np.int64)   # the same, as the tracer's numpy dtype


class _Arg(GraphOp):
    """The index of the first maximum (minimum) over the last axis; a NaN counts as the extreme
    (numpy: the first NaN's index).  [..., C] -> [...] (or [..., 1])."""

    input = operand_def(TensorType)
    result = result_def(TensorType)
    keepdims = attr_def(BoolAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1
    KIND: ClassVar[str] = ""

    def infer_result_type(self) -> TensorType:
        t = _row_input(self)
        dims = list(t.dims[:-1]) + ([1] if self.keepdims.value.data else [])
        return TensorType.of(dims, INDEX_ELEM)


@irdl_op_definition
class ArgmaxOp(_Arg):
    name = "tessera.argmax"
    KIND: ClassVar[str] = "max"


@irdl_op_definition
class ArgminOp(_Arg):
    name = "tessera.argmin"
    KIND: ClassVar[str] = "min"


@irdl_op_definition
class TopKOp(GraphOp):
    """The ``k`` largest entries of each row (last axis) in descending order, ties by lower index, a
    NaN above +inf (torch.topk's order): values [..., k] of the input's dtype and their indices
    [..., k] (``INDEX_ELEM``)."""

    name = "tessera.top_k"
    input = operand_def(TensorType)
    values = result_def(TensorType)
    indices = result_def(TensorType)
    k = attr_def(IntegerAttr)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` functional-type(operands, results)"

    def infer_result_type(self) -> TensorType:
        t = _row_input(self)
        k = ival(self.k)
        last = t.dims[-1]
        if k < 1 or (isinstance(last, int) and k > last):
            raise GraphShapeError(f"{self.name}: k = {k} is out of range for rows of {last}")
        return TensorType.of(list(t.dims[:-1]) + [k], t.element_type)

    def verify_(self) -> None:
        super().verify_()
        want = TensorType.of(list(self.values.type.dims), INDEX_ELEM)
        if self.indices.type != want:
            raise GraphResultTypeError(f"{self.name}: indices type {self.indices.type}, expected {want}", op=self)


@irdl_op_definition
class CrossEntropyOp(GraphOp):
    """Per-row softmax cross-entropy of logits [..., C] (float) against integer class labels [...]
    (i8 / i32 / i64): ``loss = logsumexp(row) - row[label]`` and ``valid = 1`` where ``label != ignore_index`` (both 0 for an ignored row).  A
    label outside [0, C) other than ``ignore_index`` picks no logit: its loss is +inf.  Both results
    are [...] in the registers' type (f32, f64 for f64 logits)."""

    name = "tessera.cross_entropy"
    input = operand_def(TensorType)
    labels = operand_def(TensorType)
    loss = result_def(TensorType)
    valid = result_def(TensorType)
    ignore_index = attr_def(IntegerAttr)
    traits = traits_def(Pure())
    assembly_format = "$input `,` $labels attr-dict `:` functional-type(operands, results)"

    def infer_result_type(self) -> TensorType:
        t = _row_input(self)
        lt = _operand_tensor(self.name, self.labels)
        if not (isinstance(lt.element_type, IntegerType) and lt.element_type.width.data > 1):
            raise GraphDtypeError(f"{self.name}: labels must be integers, got {lt.element_type}")
        if tuple(lt.dims) != tuple(t.dims[:-1]):
            raise GraphShapeError(f"{self.name}: labels {list(lt.dims)} must have the logits' leading dims "
                                  f"{list(t.dims[:-1])}")
        elem = t.element_type if isinstance(t.element_type, Float64Type) else f32
        return TensorType.of(list(t.dims[:-1]), elem)

    def verify_(self) -> None:
        super().verify_()
        if self.valid.type != self.loss.type:
            raise GraphResultTypeError(f"{self.name}: valid type {self.valid.type} differs from loss "
                                       f"{self.loss.type}", op=self)


SCANS = (CumsumOp, CumprodOp)
ROW_LOG = (LogSumExpOp, LogSoftmaxOp)
ARGS = (ArgmaxOp, ArgminOp)
# row kernels whose results are not row-shaped (one value, or k, per row): no epilogue
ROW_REDUCING = (LogSumExpOp, ArgmaxOp, ArgminOp, TopKOp, CrossEntropyOp)
ROWS_OPS = [LogSumExpOp, LogSoftmaxOp, CumsumOp, CumprodOp, ReduceProdOp, ArgmaxOp, ArgminOp, ReduceAnyOp, ReduceAllOp,
            TopKOp, CrossEntropyOp]
NEW_REDUCTIONS = (ReduceProdOp, ReduceAnyOp, ReduceAllOp)

__all__ = ["LogSumExpOp", "LogSoftmaxOp", "CumsumOp", "CumprodOp", "ReduceProdOp", "ReduceAnyOp", "ReduceAllOp", "NEW_REDUCTIONS", "ArgmaxOp", "ArgminOp", "TopKOp", "CrossEntropyOp", "SCANS",
           "ROW_LOG", "ARGS", "ROW_REDUCING", "ROWS_OPS", "INDEX_ELEM",
           "INDEX_ELEM_NP"]
