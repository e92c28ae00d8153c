"""``fuse-elementwise``: trees of elementwise ops whose intermediate values have one
use and the output's shape become one ``elementwise`` group: one loop nest, no
intermediate tensors.  A single-use slice with a unit step along the last axis feeding
the tree joins it: the kernel reads the slice's input in place (strides and an offset); so
do a reshape of a kernel input, a single-use ``take`` along any axis but the last
(``kernels/gather_leaf.py``), and one join along the last axis whose operands are such trees
(computed per column segment: rotate-half in RoPE is one kernel)."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph as g
from tessera.ir.attrs import ints, ival
from tessera.ir.strided import StridedView
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.outline import generated, is_elementwise, outline, single_use
from tessera.passes.graph.outline_kernels import operand_reshapes
from tessera.passes.graph.returned_outputs import returned_besides_one
from tessera.passes.util import function_blocks, view_through_all


def _view_chain(v, block) -> list | None:
    """The single-use reshape/transpose/slice ops between ``v`` and a kernel input (a value no
    Graph IR op of this block computes), when their composite view reads rows with a unit
    column stride; else None."""
    chain, u = [], v
    while isinstance(u.owner, (g.ReshapeOp, g.TransposeOp, g.SliceOp)) and single_use(u) and u.owner.parent is block:
        chain.append(u.owner)
        u = u.owner.input
    if not chain or isinstance(u.owner, g.GraphOp):
        return None
    view = view_through_all(StridedView.contiguous(0, u.type.dims), reversed(chain))
    if view is None:
        return None
    if view.dims and view.strides[-1] != 1 and view.dims[-1] != 1:
        return None
    return chain


def _take_in_place(op, shape) -> bool:
    """A take whose rows are contiguous pieces of its input rows (not along the last axis) and
    whose shape is the group's: the kernel reads it through its indices."""
    return (isinstance(op, g.TakeOp) and ival(op.axis) < op.input.type.rank - 1
            and tuple(op.result.type.dims) == tuple(shape))


def _grow(op, shape, group: list, block) -> None:
    """Add the tree of producers feeding ``op`` (an explicit work list: a chain of thousands of
    ops must not recurse once per op).  One join along the last axis may come in: the trees
    feeding its operands (of their own shapes) come with it."""
    seen = set(group)
    work = [(op, shape, False)]
    joined = any(isinstance(o, g.ConcatOp) for o in group)
    while work:
        cur, shape, in_join = work.pop()
        for v in cur.operands:
            p = v.owner
            if getattr(p, "parent", None) is not block:
                continue
            chain = _view_chain(v, block) if p not in seen else None
            if isinstance(p, g.ConstantOp) and single_use(v):
                group.append(p)
            elif chain:
                seen.update(chain)   # views of a kernel input, read in place through their strides
                group.extend(chain)
            elif isinstance(p, g.SliceOp) and single_use(v) and ints(p.steps)[-1] in (1, -1) and p not in seen:
                seen.add(p)          # read in place: a strided view with an offset (column stride 1 or -1)
                group.append(p)
            elif not in_join and _take_in_place(p, shape) and single_use(v) and p not in seen:
                seen.add(p)          # read in place: rows of its input through the indices
                group.append(p)
                group.extend(r for r in operand_reshapes(p, block) if r not in seen)
                seen.update(group)
            elif (is_elementwise(p) and (single_use(v) or not in_join and returned_besides_one(v))   # (returned_outputs.py)
                  and p.results[0].type.dims == shape and p not in seen
                  and not (in_join and isinstance(p, g.IotaOp))):   # (an iota in a segment would read the wrong column)
                seen.add(p)
                group.append(p)
                work.append((p, shape, in_join))
            elif (isinstance(p, g.ConcatOp) and not joined and single_use(v) and p not in seen
                  and p.result.type.dims == shape and p.axis.value.data == len(shape) - 1
                  and all(isinstance(u.owner, g.SliceOp) and ints(u.owner.steps)[-1] == 1
                          or is_elementwise(u.owner) and not isinstance(u.owner, g.IotaOp)
                          or not isinstance(u.owner, g.GraphOp) for u in p.inputs)
                  and len(set(p.inputs)) == len(p.inputs)):
                joined = True        # computed per column segment (kernels/elementwise.py)
                seen.add(p)
                group.append(p)
                for u in p.inputs:
                    q = u.owner
                    chain = _view_chain(u, block) if q not in seen else None
                    if chain:
                        seen.update(chain)
                        group.extend(chain)
                    elif isinstance(q, (g.SliceOp,)) and single_use(u) and q not in seen:
                        seen.add(q)
                        group.append(q)
                    elif is_elementwise(q) and single_use(u) and q not in seen:
                        seen.add(q)
                        group.append(q)
                        work.append((q, tuple(u.type.dims), True))   # (no take inside a segment)
            elif not in_join and p not in seen and (gen := generated(v)) is not None:   # an iota-made mask
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
