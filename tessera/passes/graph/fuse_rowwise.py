"""``fuse-rowwise``: softmax / layer_norm / rms_norm over the last axis, with their
elementwise producers (a prologue applied as the row is read) and consumers (an
epilogue applied as it is written), into one ``rowwise`` group: one pass over
memory, the row kept in cache.

A softmax over another axis is left alone here (it becomes its own kernel with
transposes around it, see ``canonicalize``).
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph as g
from tessera.ir.attrs import ival
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.outline import generated, outline, single_use
from tessera.passes.util import function_blocks


def _is_last_axis(op) -> bool:
    if isinstance(op, g.SoftmaxOp):
        return ival(op.axis) % op.input.type.rank == op.input.type.rank - 1
    return True


def _prologue(v, shape, group: list) -> None:
    """Elementwise producers of ``v`` of the same shape, used only here (a work list, not
    recursion: a prologue may be a chain of thousands of ops)."""
    work = [v]
    while work:
        v = work.pop()
        op = v.owner
        if not (isinstance(op, g.ELEMENTWISE_UNARY + g.ELEMENTWISE_BINARY + g.ELEMENTWISE_OTHER) and single_use(v)
                and op.results[0].type.dims == shape and op.parent is not None
                and not isinstance(op.parent.parent_op(), g.FusionOp)):
            continue
        group.append(op)
        for o in reversed(list(op.operands)):   # where's three, a binary op's two, a unary op's one
            if isinstance(o.owner, g.ConstantOp) and single_use(o):
                group.append(o.owner)
            elif o.type.dims == shape:
                work.append(o)
            elif (gen := generated(o)) is not None:   # an iota-made mask of another shape
                group.extend(x for x in gen if x not in group)


def _reads_full_rows(tree: list, shape) -> bool:
    """Whether an epilogue operand tree reads a row-shaped value from outside itself: the row
    kernel loads only the row input and the chain's direct operands, so such a tree stays out
    (cross-entropy's ``where(iota == label, ..)`` reads only iotas, constants and the labels)."""
    inside = {r for op in tree for r in op.results}
    return any(o not in inside and o.type.dims == shape for op in tree for o in op.operands)


def _epilogue(v, group: list, operand_trees: bool = False) -> None:
    """The single-use elementwise chain consuming ``v``; with ``operand_trees`` (softmax and the
    norms, whose kernel computes iotas in its epilogue) also the same-shape elementwise trees
    feeding the chain's other operands (cross-entropy's backward: ``p - where(iota == label)``)."""
    while single_use(v):
        user = next(iter(v.uses)).operation
        if isinstance(user, g.CastOp):
            group.append(user)
            return
        if not isinstance(user, g.ELEMENTWISE_UNARY + g.ELEMENTWISE_BINARY + g.ELEMENTWISE_OTHER):
            return
        if user.results[0].type.dims != v.type.dims:
            return
        for other in user.operands:
            if other != v and isinstance(other.owner, g.ConstantOp) and single_use(other):
                group.append(other.owner)
            elif operand_trees and other != v and other.type.dims == v.type.dims:
                tree: list = []
                _prologue(other, v.type.dims, tree)
                if not _reads_full_rows(tree, v.type.dims):
                    group.extend(tree)
        group.append(user)
        v = user.results[0]


@register
@dataclass(frozen=True)
class FuseRowwise(TesseraPass):
    """Group each last-axis softmax/layer_norm/rms_norm/log_softmax/logsumexp with its elementwise producers and consumers."""

    name = "fuse-rowwise"
    kind = "graph-transform"
    consumes = ()
    produces = ("tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        for block in function_blocks(module):
            for op in list(block.ops):
                if isinstance(op, g.ROWWISE) and op.parent is block and _is_last_axis(op):
                    group = [op]
                    _prologue(op.input, op.input.type.dims, group)
                    if not isinstance(op, g.ROW_REDUCING):   # logsumexp's / argmax's result is not row-shaped
                        _epilogue(op.result, group, isinstance(op, (g.SoftmaxOp, g.LayerNormOp, g.RmsNormOp)))
                    outline(group, "rowwise")
