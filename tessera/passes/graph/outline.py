"""Wrap a set of Graph IR ops into one ``tessera.fusion`` group (shared by the fusion passes)."""
from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Block, Operation, Region, SSAValue

from tessera.ir import graph as g


def outline(ops: Sequence[Operation], kind: str) -> g.FusionOp:
    """Move ``ops`` (in block order, same block) into a fusion op placed at the last one.

    Inputs are the values used inside and defined outside; outputs are the values
    defined inside and used outside (or returned)."""
    ops = sorted(ops, key=lambda o: list(o.parent.ops).index(o))  # type: ignore[union-attr]
    inside = set(ops)
    inputs: list[SSAValue] = []
    consts: dict[SSAValue, Operation] = {}
    for o in ops:
        for v in o.operands:
            if v.owner in inside or v in inputs or v in consts:
                continue
            if isinstance(v.owner, g.ConstantOp):
                consts[v] = v.owner.clone()  # constants are copied in, never passed as tensors
            else:
                inputs.append(v)
    outputs: list[SSAValue] = []
    for o in ops:
        for r in o.results:
            if any(u.operation not in inside for u in r.uses):
                outputs.append(r)
    block = Block(arg_types=[v.type for v in inputs])
    anchor = ops[-1]
    parent = anchor.parent
    fusion = g.FusionOp.create(operands=inputs, result_types=[r.type for r in outputs],
                               attributes={"kind": StringAttr(kind)}, regions=[Region(block)])
    fusion.location = anchor.location
    parent.insert_op_after(fusion, anchor)  # type: ignore[union-attr]
    mapping: dict[SSAValue, SSAValue] = dict(zip(inputs, block.args))
    for v, c in consts.items():
        block.add_op(c)
        mapping[v] = c.results[0]
    for r, new in zip(outputs, fusion.outputs):
        r.replace_all_uses_with(new)
    # restore uses inside the group (replace_all_uses_with redirected them too)
    for r, new in zip(outputs, fusion.outputs):
        for use in list(new.uses):
            if use.operation in inside:
                use.operation.operands[use.index] = r
    for o in ops:
        o.detach()
        for i, v in enumerate(list(o.operands)):
            if v in mapping:
                o.operands[i] = mapping[v]
        block.add_op(o)
    block.add_op(g.YieldOp.create(operands=list(outputs)))
    return fusion


def generated(v: SSAValue) -> list | None:
    """The single-use ops computing ``v`` from ``tessera.iota`` generators and constants alone
    (``tril``'s mask, a causal mask), in dependency order, or None.  A fused kernel computes them
    from its loop indices, whatever their shape broadcasts to."""
    op = v.owner
    if not single_use(v) or getattr(op, "parent", None) is None:
        return None
    if isinstance(op, g.IotaOp):
        return [op]
    if isinstance(op, g.ConstantOp):
        return [op]
    if not is_elementwise(op):
        return None
    out = []
    for o in op.operands:
        sub = generated(o)
        if sub is None:
            return None
        out += [x for x in sub if x not in out]
    return out + [op] if any(isinstance(x, g.IotaOp) for x in out) else None


def single_use(v: SSAValue) -> bool:
    return len(list(v.uses)) == 1


def is_elementwise(op: Operation) -> bool:
    return isinstance(op, g.ELEMENTWISE_UNARY + g.ELEMENTWISE_BINARY + g.ELEMENTWISE_OTHER) or (
        isinstance(op, g.CastOp))
