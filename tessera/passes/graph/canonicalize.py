"""``canonicalize``: local Graph IR simplifications, to a fixed point.

- ``reshape(reshape(x))`` -> one reshape; a reshape to the input's own type -> x
- ``transpose(transpose(x))`` -> one transpose; the identity permutation -> x
- ``cast`` to the input's own type -> x; ``neg(neg(x))`` -> x
- unused pure Graph IR ops are removed
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.traits import Pure

from tessera.ir import graph as g
from tessera.ir.attrs import int_array
from tessera.passes.base import TesseraPass, register
from tessera.passes.util import erase_dead, insert_before, replace_op


def _simplify_once(op) -> bool:
    if isinstance(op, g.ReshapeOp):
        src = op.input
        if src.type == op.result.type:
            replace_op(op, [src])
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
    if isinstance(op, g.CastOp) and op.input.type == op.result.type:
        replace_op(op, [op.input])
        return True
    if isinstance(op, g.NegOp) and isinstance(op.input.owner, g.NegOp):
        replace_op(op, [op.input.owner.input])
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
    consumes = ()
    produces = ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in op.walk():
            if not isinstance(f, func.FuncOp) or not f.body.blocks:
                continue
            block = f.body.block
            changed = True
            while changed:
                changed = False
                for o in list(block.ops):
                    if o.parent is block and _simplify_once(o):
                        changed = True
                changed |= erase_dead(block, _is_pure_graph_op)
