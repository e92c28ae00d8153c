"""``fuse-row-reductions``: a row-shaped result computed from last-axis reductions of its own
row (``keepdims``) and elementwise ops, as one ``rowreduce`` kernel that reads each row a few
times from the cache instead of once per kernel from memory.

What it groups, written the way users and the backward rules write it:
``x - x.mean(-1, keepdims=True)``, a hand-written softmax (``exp(x - max) / sum``), softmax's
backward ``y * (g - sum(g * y))``, log_softmax's ``g - exp(y) * sum(g)``, the norms' backward
``r * (gh - mean(gh) - xhat * mean(gh * xhat))`` (reductions of reductions).  The group is the
operand tree of one row-shaped elementwise op: elementwise ops on rows (dims ``S``) or on row
scalars (``S[:-1] + (1,)``) and sum / mean / max over the last axis with ``keepdims``; a value
also used outside the tree stays outside (the kernel has one result).  Float32 / float64 values
(and the bool masks of comparisons and ``where`` between them) only.

The CPU lane runs it (``kernels/rowreduce.py``); GPU pipelines do not include the pass.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import Float32Type, Float64Type, ModuleOp, i1
from xdsl.ir import OpResult

from tessera.ir import graph as g
from tessera.ir.attrs import ints
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.outline import outline
from tessera.passes.util import function_blocks

ELEMENTWISE = g.ELEMENTWISE_UNARY + g.ELEMENTWISE_BINARY + (g.WhereOp,)   # comparisons and isnan included
REDUCE = (g.ReduceSumOp, g.ReduceMeanOp, g.ReduceMaxOp)


def _float(v) -> bool:
    return isinstance(v.type.element_type, (Float32Type, Float64Type))


def _row_reduction(op, dims) -> bool:
    """A sum / mean / max of a ``dims``-shaped value over its last axis, keeping it."""
    if not isinstance(op, REDUCE) or tuple(op.input.type.dims) != dims or not op.keepdims.value.data:
        return False
    return [a % len(dims) for a in ints(op.axes)] == [len(dims) - 1]


def _member(op, block, dims, scalar, elem) -> bool:
    if op.parent is not block or any(r.type.element_type not in (elem, i1) for r in op.results):
        return False
    if isinstance(op, ELEMENTWISE):
        return tuple(op.results[0].type.dims) in (dims, scalar)
    return _row_reduction(op, dims)


def _tree(out_op, block, dims) -> list | None:
    """The group computing ``out_op``'s result, or None when it holds no reduction."""
    scalar = dims[:-1] + (1,)
    elem = out_op.results[0].type.element_type
    group = {out_op}
    todo = list(out_op.operands)
    while todo:
        v = todo.pop()
        op = v.owner if isinstance(v, OpResult) else None
        if op is None or op in group or not _member(op, block, dims, scalar, elem):
            continue
        group.add(op)
        todo.extend(op.operands)
    # a value used outside the group is the group's input instead: drop its op, then whatever
    # only it used, until every member's uses are inside
    changed = True
    while changed:
        changed = False
        for op in list(group):
            if op is out_op:
                continue
            if any(u.operation not in group for u in op.results[0].uses):
                group.discard(op)
                changed = True
    if not any(isinstance(op, REDUCE) for op in group):
        return None
    # constants the group reads are copied in by ``outline``; order as the block has it
    return [op for op in block.ops if op in group]


@register
@dataclass(frozen=True)
class FuseRowReductions(TesseraPass):
    """Group a row-shaped result with the last-axis keepdims reductions of its row and the elementwise ops between them."""

    name = "fuse-row-reductions"
    kind = "graph-transform"
    consumes = ()
    produces = ("tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        for block in function_blocks(module):
            for op in reversed(list(block.ops)):
                if op.parent is not block or not isinstance(op, ELEMENTWISE) or not _float(op.results[0]):
                    continue
                dims = tuple(op.results[0].type.dims)
                if len(dims) < 2 or dims[-1] == 1:
                    continue
                group = _tree(op, block, dims)
                if group is not None and len(group) > 1:
                    outline(group, "rowreduce")


__all__ = ["FuseRowReductions"]
