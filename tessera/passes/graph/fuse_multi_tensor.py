"""``fuse-multi-tensor``: independent elementwise groups become one kernel (one launch).

An optimizer step updates every parameter with the same few elementwise ops; each parameter's
update is one ``elementwise`` group (``fuse-elementwise``), so a model of 150 tensors would launch
150 kernels, each too short to use the threads well.  This pass merges elementwise groups that do
not read each other's results into one ``tessera.fusion`` (kind ``elementwise``) whose body holds
each group's ops side by side; the elementwise generator (``kernels/elementwise.py``) emits one
loop nest per group and hands the rows of every group out from one work list: one launch over a
list of buffers ("multi-tensor"), no copy into a concatenated buffer.

Groups are merged in block order.  A batch grows while the next elementwise group reads nothing
the batch computes; an op that reads a batch result closes the batch first (the merged group sits
at its last member, so every reader of a member still comes after it).  Only groups that compute
in one register type are merged (an f32 group next to an f64 one would otherwise compute in f64).
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, Region

from tessera.ir import graph as g
from tessera.passes.base import TesseraPass, register
from tessera.passes.util import function_blocks, register_elem

MAX_GROUPS = 256   # groups per merged kernel (its code grows with them; LLVM compiles it as one function)


def _candidate(op) -> bool:
    return isinstance(op, g.FusionOp) and op.kind.data == "elementwise"


def merge(batch: list) -> g.FusionOp:
    """One fusion holding ``batch``'s bodies (independent elementwise groups, block order), placed at
    the last; its inputs are the members' (each value once), its outputs theirs in order."""
    inputs = []
    for f in batch:
        inputs += [v for v in f.inputs if v not in inputs]
    block = Block(arg_types=[v.type for v in inputs])
    arg = dict(zip(inputs, block.args))
    yields = []
    for f in batch:
        body = f.body.block
        for a, v in zip(body.args, f.inputs):
            a.replace_all_uses_with(arg[v])
        ops = list(body.ops)
        yields += list(ops[-1].operands)
        for o in ops[:-1]:
            o.detach()
            block.add_op(o)
    block.add_op(g.YieldOp.create(operands=yields))
    anchor = batch[-1]
    fused = g.FusionOp.create(operands=inputs, result_types=[r.type for f in batch for r in f.outputs],
                              attributes={"kind": StringAttr("elementwise")}, regions=[Region(block)])
    fused.location = anchor.location
    anchor.parent.insert_op_after(fused, anchor)
    olds = [r for f in batch for r in f.outputs]
    for old, new in zip(olds, fused.outputs):
        old.replace_all_uses_with(new)
    for f in reversed(batch):
        f.detach()
        f.erase()
    return fused


@register
@dataclass(frozen=True)
class FuseMultiTensor(TesseraPass):
    """Merge independent elementwise groups into one kernel (one launch over many tensors)."""

    name = "fuse-multi-tensor"
    kind = "graph-transform"
    consumes = ("tessera.fusion", "tessera.yield")   # several groups in, one out
    produces = ("tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        for block in function_blocks(module):
            batch: list = []
            made: set = set()     # the batch's results
            reg = None

            def close():
                if len(batch) > 1:
                    merge(batch)
                batch.clear()
                made.clear()
            for op in list(block.ops):
                reads_batch = any(v in made for v in op.operands)
                if reads_batch:
                    close()
                if _candidate(op):
                    r = register_elem(op)
                    if batch and (r != reg or len(batch) >= MAX_GROUPS):
                        close()
                    reg = r
                    batch.append(op)
                    made.update(op.outputs)
            close()
