"""Graph IR gathers: ``tessera.take``, ``tessera.take_along_axis``, ``tessera.one_hot``.

Index operands are i32 or i64 tensors; a take copies floats or i8 / i32 / i64 values.  Runtime indices follow one policy (every kernel and
the reference lane): an index in ``[-n, n)`` means what numpy means (negative counts from the
end); anything outside is clamped into the axis -- below ``-n`` reads element 0, at or past
``n`` element ``n - 1`` (jax.numpy's indexing does the same).  No read ever leaves the array.
The gathered axis has a static size of at least 1 (its size is compiled in).  ``one_hot``
compares: a label outside ``[0, num_classes)`` gives a row of zeros (as jax.nn.one_hot).

The module is imported by ``graph.py``, which lists these ops in the ``tessera`` dialect.
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerAttr, IntegerType
from xdsl.irdl import attr_def, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from tessera.errors import GraphAttributeError, GraphDtypeError, GraphRankError, GraphShapeError
from tessera.ir.attrs import ival
from tessera.ir.graph import GraphOp, TensorType, _operand_tensor, _require_float, is_float

_FMT = "$input `,` $indices attr-dict `:` functional-type(operands, results)"


def is_index_type(t) -> bool:
    return isinstance(t, IntegerType) and t.width.data in (32, 64)


def _require_index(op_name: str, t: TensorType) -> None:
    if not is_index_type(t.element_type):
        raise GraphDtypeError(f"{op_name}: indices must be i32 or i64, got {t.element_type}")


def _gathered_axis(op_name: str, x: TensorType, axis: int) -> None:
    if not 0 <= axis < x.rank:
        raise GraphAttributeError(f"{op_name}: axis {axis} is out of range for rank {x.rank}")
    n = x.dims[axis]
    if not isinstance(n, int) or n < 1:
        raise GraphShapeError(f"{op_name}: the gathered axis {axis} must have a static size >= 1, got {n}")


class _Gather(GraphOp):
    """A gather along ``axis`` of ``input`` by ``indices``: what take and take_along_axis share (a
    float or int table, i32 / i64 indices, a static gathered axis); ``result_dims`` differs."""

    input = operand_def(TensorType)
    indices = operand_def(TensorType)
    result = result_def(TensorType)
    axis = attr_def(IntegerAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT

    def result_dims(self, x: TensorType, i: TensorType, ax: int) -> list:  # pragma: no cover - overridden
        raise NotImplementedError

    def infer_result_type(self) -> TensorType:
        x, i = _operand_tensor(self.name, self.input), _operand_tensor(self.name, self.indices)
        _require_float(self.name, x.element_type)   # the registry's kinds: a float or int table
        _require_index(self.name, i)
        ax = ival(self.axis)
        _gathered_axis(self.name, x, ax)
        return TensorType.of(self.result_dims(x, i, ax), x.element_type)


@irdl_op_definition
class TakeOp(_Gather):
    """``numpy.take(input, indices, axis)``: axis ``axis`` of ``input`` replaced by the indices'
    dims (any rank, 0 included); each index picks a slice of ``input`` along the axis (the
    index policy of this module: numpy's meaning in range, clamped outside)."""

    name = "tessera.take"

    def result_dims(self, x: TensorType, i: TensorType, ax: int) -> list:
        return list(x.dims[:ax]) + list(i.dims) + list(x.dims[ax + 1:])


def along_axis_dims(op_name: str, x: TensorType, i: TensorType, ax: int) -> list:
    """The result dims of take_along_axis: off the axis the two broadcast (equal, or one is 1);
    on it, the indices' size."""
    if x.rank != i.rank:
        raise GraphRankError(f"{op_name}: indices of rank {i.rank} for an input of rank {x.rank} (they must match)")
    out = []
    for k, (a, b) in enumerate(zip(x.dims, i.dims)):
        if k == ax:
            out.append(b)
        elif a == b or b == 1:
            out.append(a)
        elif a == 1:
            out.append(b)
        else:
            raise GraphShapeError(f"{op_name}: input {list(x.dims)} and indices {list(i.dims)} do not broadcast "
                                  f"off axis {ax} (dimension {k}: {a} vs {b})")
    return out


@irdl_op_definition
class TakeAlongAxisOp(_Gather):
    """``numpy.take_along_axis(input, indices, axis)``: result[..., j, ...] = input[..., indices[..., j,
    ...], ...] with the other axes broadcast (the index policy of this module)."""

    name = "tessera.take_along_axis"

    def result_dims(self, x: TensorType, i: TensorType, ax: int) -> list:
        return along_axis_dims(self.name, x, i, ax)


@irdl_op_definition
class OneHotOp(GraphOp):
    """``labels[..., None] == arange(C)`` as the result's float type: [..., C] rows of zeros with
    a 1 at each label (none for a label outside [0, C)).  C is the result's static last dim."""

    name = "tessera.one_hot"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` functional-type(operands, results)"

    def infer_result_type(self) -> TensorType:
        i = _operand_tensor(self.name, self.input)
        _require_index(self.name, i)
        r = self.result.type
        if not isinstance(r, TensorType) or r.rank != i.rank + 1:
            raise GraphDtypeError(f"{self.name}: the result must be a !tessera.tensor of rank {i.rank + 1}")
        if not is_float(r.element_type):
            raise GraphDtypeError(f"{self.name}: the result must be floating-point, got {r.element_type}")
        c = r.dims[-1]
        if not isinstance(c, int):
            raise GraphShapeError(f"{self.name}: num_classes (the result's last dim) must be static, got {c}")
        return TensorType.of(list(i.dims) + [c], r.element_type)


GATHERS = (TakeOp, TakeAlongAxisOp, OneHotOp)

__all__ = ["TakeOp", "TakeAlongAxisOp", "OneHotOp", "GATHERS", "is_index_type", "along_axis_dims"]
