"""``fuse-elementwise``: trees of elementwise ops whose intermediate values have one
use and the output's shape become one ``elementwise`` group: one loop nest, no
intermediate tensors.  A single-use slice with a unit step along the last axis feeding
the tree joins it: the kernel reads the slice's input in place (strides and an offset); so does
a single-use ``take`` along any axis but the last (``kernels/gather_leaf.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph as g
from tessera.ir.attrs import ints, ival
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.outline import is_elementwise, outline, single_use
from tessera.passes.graph.outline_kernels import operand_reshapes
from tessera.passes.util import function_blocks


def _take_in_place(op, shape) -> bool:
    """A take whose rows are contiguous pieces of its input rows (not along the last axis) and
    whose shape is the group's: the kernel reads it through its indices."""
    return (isinstance(op, g.TakeOp) and ival(op.axis) < op.input.type.rank - 1
            and tuple(op.result.type.dims) == tuple(shape))


def _grow(op, shape, group: list, block) -> None:
    """Add the tree of producers feeding ``op`` (an explicit work list: a chain of thousands of
    ops must not recurse once per op)."""
    seen = set(group)
    work = [op]
    while work:
        cur = work.pop()
        for v in cur.operands:
            p = v.owner
            if getattr(p, "parent", None) is not block:
                continue
            if isinstance(p, g.ConstantOp) and single_use(v):
                group.append(p)
            elif isinstance(p, g.SliceOp) and single_use(v) and ints(p.steps)[-1] in (1, -1) and p not in seen:
                seen.add(p)          # read in place: a strided view with an offset (column stride 1 or -1)
                group.append(p)
            elif _take_in_place(p, shape) and single_use(v) and p not in seen:
                seen.add(p)          # read in place: rows of its input through the indices
                group.append(p)
                group.extend(r for r in operand_reshapes(p, block) if r not in seen)
                seen.update(group)
            elif is_elementwise(p) and single_use(v) and p.results[0].type.dims == shape and p not in seen:
                seen.add(p)
                group.append(p)
                work.append(p)


@register
@dataclass(frozen=True)
class FuseElementwise(TesseraPass):
    """Group trees of same-shape elementwise ops (single-use intermediates) into one loop nest."""

    name = "fuse-elementwise"
    kind = "graph-transform"
    consumes = ()
    produces = ("tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        for block in function_blocks(module):
            for op in reversed(list(block.ops)):
                if op.parent is block and is_elementwise(op):
                    group = [op]
                    _grow(op, op.results[0].type.dims, group, block)
                    outline(group, "elementwise")
