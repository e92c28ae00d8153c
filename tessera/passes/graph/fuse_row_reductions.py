"""``fuse-row-reductions``: a row-shaped result computed from last-axis reductions of its own
row (``keepdims``) and elementwise ops, as one ``rowreduce`` kernel that reads each row a few
times from the cache instead of once per kernel from memory.

What it groups, written the way users and the backward rules write it:
``x - x.mean(-1, keepdims=True)``, a hand-written softmax (``exp(x - max) / sum``), softmax's
backward ``y * (g - sum(g * y))``, log_softmax's ``g - exp(y) * sum(g)``, the norms' backward
``r * (gh - mean(gh) - xhat * mean(gh * xhat))`` (reductions of reductions).  The group is the
operand tree of one row-shaped elementwise op: elementwise ops on rows (dims ``S``) or on row
scalars (``S[:-1] + (1,)``) and sum / mean / max over the last axis with ``keepdims``.  The kernel
has one result: a value of the tree also used elsewhere is recomputed inside (from a copy of its
ops) and still computed outside for its other users.  Float32 / float64 values
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
from tessera.passes.util import erase_dead, function_blocks

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
    if not any(isinstance(op, REDUCE) for op in group):
        return None
    return [op for op in block.ops if op in group]


def _private_copy(group: list, out_op) -> list:
    """The group as copies of its ops, so that a value it shares with the rest of the program (the
    norms' ``xhat``, read by dx's row and by dgamma's column sums) is recomputed inside instead of
    keeping the group out: the copies are placed before ``out_op``, which (and whatever only it
    used) then goes.  Constants are copied in by ``outline`` anyway."""
    mapping: dict = {}
    copies = []
    for op in group:
        new = op.clone(value_mapper=mapping)
        out_op.parent.insert_op_before(new, out_op)
        for old, r in zip(op.results, new.results):
            mapping[old] = r
        copies.append(new)
    block = out_op.parent
    out_op.results[0].replace_all_uses_with(copies[-1].results[0])
    erase_dead(block, set(group).__contains__)   # the originals nothing else reads (one reverse sweep)
    return copies


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
                    outline(_private_copy(group, op), "rowreduce")


__all__ = ["FuseRowReductions"]
