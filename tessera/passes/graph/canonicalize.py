"""``canonicalize``: local Graph IR simplifications, to a fixed point.

- ``reshape(reshape(x))`` -> one reshape; a reshape to the input's own type -> x
- ``transpose(transpose(x))`` -> one transpose; the identity permutation -> x
- ``cast`` to the input's own type -> x; ``neg(neg(x))`` -> x
- ``softmax`` over a non-last axis -> transpose, softmax over the last axis, transpose back
- a reduction over non-contiguous axes -> successive reductions over contiguous runs
- elementwise ops move above a transpose of a GEMM's result (``sink_transpose.py``)
- pooling windows (slices) of a transposed GEMM result are taken before the transpose
  (``sink_transpose_pool.py``)
- a transpose whose same transpose is padded earlier reads the padded copy's interior
  (``reuse_padded.py``)
- ``where(c, t, t)`` (a broadcast) as an operand of a binary elementwise op whose other
  operand has the result's shape -> ``t``
- ``reshape(iota)`` of a 1-D iota that only adds unit dims (``pos[:, None]``) -> an iota of the
  reshaped shape along the kept axis: a generator again, so an epilogue computes it in registers
  (a causal mask ``pos[:, None] >= pos[None, :]`` is never stored; ``epilogue_dag.py``)
- unused pure Graph IR ops are removed
- a reshape, or a transpose or slice that keeps the last axis contiguous, with several uses is
  cloned per use: a view is free, so each consumer can read it through its own strides
  instead of one copy being materialised for all of them (q in RoPE: ``q * cos`` and both
  halves of ``rotate_half(q)``)
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.traits import Pure

from tessera.ir import graph as g
from xdsl.dialects.builtin import BoolAttr, i1

from tessera.ir.attrs import i64_attr, int_array, ints, ival
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.sink_transpose import sink_transpose
from tessera.passes.graph.sink_transpose_pool import sink_transpose_pool
from tessera.passes.graph.reuse_padded import reuse_padded
from tessera.passes.util import erase_dead, function_blocks, insert_before, replace_op


def _simplify_once(op) -> bool:
    if sink_transpose(op):
        return True
    if sink_transpose_pool(op):   # pooling windows of a transposed GEMM result
        return True
    if reuse_padded(op):          # a transpose whose twin is padded reads the pad's interior
        return True
    if isinstance(op, g.ReshapeOp):
        src = op.input
        if src.type == op.result.type:
            replace_op(op, [src])
            return True
        if _reshaped_iota(op):
            return True
        if isinstance(src.owner, g.ReshapeOp):
            new = g.ReshapeOp.create(operands=[src.owner.input], result_types=[op.result.type])
            new.location = op.location
            insert_before(op, new)
            replace_op(op, [new.result])
            return True
    if isinstance(op, g.TransposeOp):
        perm = op.permutation
        if perm == list(range(len(perm))):
            replace_op(op, [op.input])
            return True
        if isinstance(op.input.owner, g.TransposeOp):
            inner = op.input.owner.permutation
            new = g.TransposeOp.create(operands=[op.input.owner.input], result_types=[op.result.type],
                                       attributes={"perm": int_array([inner[p] for p in perm])})
            new.location = op.location
            insert_before(op, new)
            replace_op(op, [new.result])
            return True
    if isinstance(op, g.ELEMENTWISE_BINARY) and _drop_broadcast_where(op):
        return True
    if isinstance(op, g.CastOp) and op.input.type == op.result.type:
        replace_op(op, [op.input])
        return True
    if isinstance(op, g.NegOp) and isinstance(op.input.owner, g.NegOp):
        replace_op(op, [op.input.owner.input])
        return True
    if isinstance(op, g.SoftmaxOp):
        rank = op.input.type.rank
        axis = ival(op.axis) % rank
        if axis != rank - 1:
            perm = list(range(rank))
            perm[axis], perm[-1] = perm[-1], perm[axis]
            t_in = g.TransposeOp.create(operands=[op.input], attributes={"perm": int_array(perm)},
                                        result_types=[g.infer_transpose(op.input.type, perm)])
            sm = g.SoftmaxOp.create(operands=[t_in.result], attributes={"axis": i64_attr(rank - 1)},
                                    result_types=[t_in.result.type])
            t_out = g.TransposeOp.create(operands=[sm.result], attributes={"perm": int_array(perm)},
                                         result_types=[op.result.type])
            for new in (t_in, sm, t_out):
                new.location = op.location
            insert_before(op, t_in, sm, t_out)
            replace_op(op, [t_out.result])
            return True
    if isinstance(op, g.REDUCTIONS):
        axes = sorted(ints(op.axes))
        keep = bool(op.keepdims.value.data)
        runs = _runs(axes)
        if len(runs) > 1:
            # reduce the last run first, then the other axes, keeping dims; reshape drops them at the end
            v = op.input
            elem = op.result.type.element_type   # any / all: bool results
            inner = type(op).create(operands=[v], result_types=[g.TensorType.of(
                g.infer_reduce(op.name, v.type, runs[-1], True).dims, elem)],
                                    attributes={"axes": int_array(runs[-1]), "keepdims": BoolAttr(True, i1)})
            rest = [a for r in runs[:-1] for a in r]
            kept = g.TensorType.of(g.infer_reduce(op.name, inner.result.type, rest, True).dims, elem)
            outer = type(op).create(operands=[inner.results[0]], result_types=[kept],
                                    attributes={"axes": int_array(rest), "keepdims": BoolAttr(True, i1)})
            new_ops = [inner, outer]
            if not keep:
                new_ops.append(g.ReshapeOp.create(operands=[outer.results[0]], result_types=[op.result.type]))
            for new in new_ops:
                new.location = op.location
            insert_before(op, *new_ops)
            replace_op(op, [new_ops[-1].results[0]])
            return True
    return False


def _runs(axes: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for a in axes:
        if runs and runs[-1][-1] == a - 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs


def _keeps_last_axis(op) -> bool:
    if isinstance(op, g.TransposeOp):
        return op.permutation[-1] == len(op.permutation) - 1
    if isinstance(op, g.SliceOp):
        return ints(op.steps)[-1] == 1
    return True   # a reshape: strides over a contiguous source


def _split_shared_views(block) -> None:
    """Clone each multi-use view op (last axis kept) per use, consumers first, so chains of
    them split all the way down."""
    for op in reversed(list(block.ops)):
        if not isinstance(op, (g.ReshapeOp, g.TransposeOp, g.SliceOp)) or not _keeps_last_axis(op):
            continue
        uses = list(op.result.uses)
        for use in uses[1:]:
            user = use.operation
            if user.dialect_name() != "tessera":
                continue   # the function's return: one copy is made for it anyway
            clone = op.clone()
            insert_before(op, clone)
            ops = list(user.operands)
            ops[use.index] = clone.result
            user.operands = ops


def _reshaped_iota(op: g.ReshapeOp) -> bool:
    """``reshape(iota(n))`` to a shape of n and unit dims -> ``iota`` of that shape along n's axis."""
    it = op.input.owner
    dims = list(op.result.type.dims)
    if not isinstance(it, g.IotaOp) or it.result.type.rank != 1 or op.result.type.element_type != \
            it.result.type.element_type:
        return False
    n = it.result.type.dims[0]
    big = [i for i, d in enumerate(dims) if d != 1]
    if not isinstance(n, int) or any(not isinstance(d, int) for d in dims) or len(big) > 1 or (
            big and dims[big[0]] != n):
        return False
    new = g.IotaOp.create(attributes={"axis": i64_attr(big[0] if big else 0)}, result_types=[op.result.type])
    new.location = op.location
    insert_before(op, new)
    replace_op(op, [new.result])
    return True


def _drop_broadcast_where(op) -> bool:
    """``where(c, t, t)`` is ``t`` broadcast to c's shape (the backward rules' broadcast, as the op set
    has no broadcast op): as an operand of a binary elementwise op whose other operand already has
    the result's shape, ``t`` itself broadcasts the same way.  The gradient of ``sum(f(x) * w)``
    then reads w, not a ones tensor made from the forward value."""
    a, b = op.operands
    for i, (v, other) in enumerate(((a, b), (b, a))):
        w = v.owner
        if (isinstance(w, g.WhereOp) and w.on_true is w.on_false and other.type.dims == op.results[0].type.dims
                and w.on_true.type.element_type == w.result.type.element_type):
            ops = list(op.operands)
            ops[i] = w.on_true
            op.operands = ops
            return True
    return False


def _is_pure_graph_op(op) -> bool:
    return op.dialect_name() == "tessera" and op.has_trait(Pure)


@register
@dataclass(frozen=True)
class Canonicalize(TesseraPass):
    """Local Graph IR simplifications (reshape/transpose/cast/neg folding, dead-op removal)."""

    name = "canonicalize"
    kind = "graph-transform"
    consumes = ("tessera.*",)
    produces = ("tessera.transpose", "tessera.softmax", "tessera.reshape", "tessera.reduce_sum", "tessera.reduce_max",
                "tessera.reduce_mean",
                "tessera.reduce_prod",
                "tessera.reduce_any", "tessera.reduce_all", "tessera.iota")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for block in function_blocks(op):
            changed = True
            while changed:
                changed = False
                for o in list(block.ops):
                    if o.parent is block and _simplify_once(o):
                        changed = True
                changed |= erase_dead(block, _is_pure_graph_op)
            _split_shared_views(block)
