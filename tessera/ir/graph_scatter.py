"""Graph IR scatter: ``tessera.scatter_add``, the transpose of ``tessera.take``.

``%r = tessera.scatter_add %indices, %updates into %input {axis}``: with the result seen as
[P, n, Q] (the dims before ``axis``, the axis, the dims after) and the K indices flattened,
``r = input`` (zeros when no ``input`` is given), then for every k in order
``r[p, j(k), :] += updates[p, k, :]``.  ``updates`` has the dims of ``take(r, indices, axis)``:
``r.dims[:axis] + indices.dims + r.dims[axis + 1:]``.  Runtime indices follow the gathers' policy
(``ir/graph_index.py``): numpy's meaning in [-n, n), clamped into the axis outside, so the op is
exactly take's adjoint and no write leaves the array.  Duplicate indices are summed in index order
(the CPU kernel gives the same bits for any thread count).  The axis is static and >= 1.

The module is imported by ``graph.py``, which lists the op in the ``tessera`` dialect.
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerAttr
from xdsl.irdl import attr_def, irdl_op_definition, operand_def, opt_operand_def, result_def, traits_def
from xdsl.traits import Pure

from tessera.errors import GraphAttributeError, GraphDtypeError, GraphRankError, GraphShapeError
from tessera.ir.attrs import ival
from tessera.ir.graph import GraphOp, TensorType, _operand_tensor, _require_float, is_float
from tessera.ir.graph_index import is_index_type


@irdl_op_definition
class ScatterAddOp(GraphOp):
    """``input`` (or zeros) plus ``updates`` added at ``indices`` along ``axis`` (duplicates summed
    in index order; indices bounded as take bounds them)."""

    name = "tessera.scatter_add"
    indices = operand_def(TensorType)
    updates = operand_def(TensorType)
    input = opt_operand_def(TensorType)
    result = result_def(TensorType)
    axis = attr_def(IntegerAttr)
    traits = traits_def(Pure())
    assembly_format = ("$indices `,` $updates (`into` $input^ `:` type($input))? attr-dict `:` type($indices) `,` "
                       "type($updates) `->` type($result)")

    def infer_result_type(self) -> TensorType:
        i, u = _operand_tensor(self.name, self.indices), _operand_tensor(self.name, self.updates)
        if not is_index_type(i.element_type):
            raise GraphDtypeError(f"{self.name}: indices must be i32 or i64, got {i.element_type}")
        _require_float(self.name, u.element_type)
        r = _operand_tensor(self.name, self.input) if self.input is not None else self.result.type
        if not isinstance(r, TensorType) or not is_float(r.element_type) or r.element_type != u.element_type:
            raise GraphDtypeError(f"{self.name}: the result (and input) must have the updates' float type "
                                  f"{u.element_type}")
        ax = ival(self.axis)
        if not 0 <= ax < r.rank:
            raise GraphAttributeError(f"{self.name}: axis {ax} is out of range for rank {r.rank}")
        n = r.dims[ax]
        if not isinstance(n, int) or n < 1:
            raise GraphShapeError(f"{self.name}: the scattered axis {ax} must have a static size >= 1, got {n}")
        want = list(r.dims[:ax]) + list(i.dims) + list(r.dims[ax + 1:])
        if u.rank != len(want):
            raise GraphRankError(f"{self.name}: updates of rank {u.rank}, expected {len(want)} (the result's rank "
                                 f"with axis {ax} replaced by the indices' dims)")
        if list(u.dims) != want:
            raise GraphShapeError(f"{self.name}: updates {list(u.dims)}, expected {want}")
        return TensorType.of(list(r.dims), r.element_type)


__all__ = ["ScatterAddOp"]
