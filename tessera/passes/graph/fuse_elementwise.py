"""``fuse-elementwise``: trees of elementwise ops whose intermediate values have one
use and the output's shape become one ``elementwise`` group: one loop nest, no
intermediate tensors.  A single-use slice with a unit step along the last axis feeding
the tree joins it: the kernel reads the slice's input in place (strides and an offset)."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph as g
from tessera.ir.attrs import ints
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.outline import generated, is_elementwise, outline, single_use
from tessera.passes.util import function_blocks


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
            elif isinstance(p, g.SliceOp) and single_use(v) and ints(p.steps)[-1] == 1 and p not in seen:
                seen.add(p)          # read in place: a strided view with an offset (unit column stride)
                group.append(p)
            elif is_elementwise(p) and single_use(v) and p.results[0].type.dims == shape and p not in seen:
                seen.add(p)
                group.append(p)
                work.append(p)
            elif p not in seen and (gen := generated(v)) is not None:   # an iota-made mask of another shape
                for q in gen:
                    if q not in seen:
                        seen.add(q)
                        group.append(q)


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
