"""A matmul's epilogue as a graph (used by ``fuse-matmul-epilogue``): the elementwise ops that
read the matmul's result, directly or through each other, keep its shape, and end in one
value -- ``where(y > 0, y, 0.1 * y)`` reads ``y`` three times.  Taken only where the plain
chain cannot express it (a comparison, ``where``, a value used twice); operands from outside
come in as kernel inputs, except single-use constants and ``iota`` generators along the rows or
columns, which come along (computed in the epilogue, never stored)."""
from __future__ import annotations

from tessera.ir import graph as g
from tessera.passes.graph.outline import is_elementwise, single_use


def _dependents(v) -> set:
    out, work = set(), [v]
    while work:
        for u in list(work.pop().uses):
            if u.operation not in out:
                out.add(u.operation)
                work.extend(u.operation.results)
    return out


def _generator(v, rank: int) -> list | None:
    """The single-use ops computing ``v`` from iotas and constants alone (an iota only along the
    last two axes of a rank-``rank`` output), or None."""
    op = v.owner
    if not single_use(v) or not hasattr(op, "parent") or op.parent is None:
        return None
    if isinstance(op, g.ConstantOp):
        return [op]
    if isinstance(op, g.IotaOp):
        return [op] if op.axis.value.data + rank - op.result.type.rank >= rank - 2 else None
    if not is_elementwise(op) or not op.operands:
        return None
    out = []
    for o in op.operands:
        sub = _generator(o, rank)
        if sub is None:
            return None
        out += sub
    return out + [op]


def absorb(op, vals: set, inside: set, members: list, dependent: set, rank: int) -> bool:
    """Add ``op`` (elementwise, reading a value of the group ``vals``) to the group with what its
    other operands need computed inside (iota generators, single-use constants): False, and
    nothing added, when an operand reads the group through an op outside it (a cycle)."""
    extra = []
    for o in op.operands:
        if o in vals:
            continue
        if o.owner in dependent:
            return False
        gen = _generator(o, rank)
        if gen is not None and any(isinstance(x, g.IotaOp) for x in gen):
            extra += [x for x in gen if x not in inside]
        elif isinstance(o.owner, g.ConstantOp) and single_use(o):
            extra.append(o.owner)
    for x in extra + [op]:
        if x not in inside:
            inside.add(x)
            members.append(x)
    return True


def grow(mm: g.MatmulOp) -> list | None:
    """The epilogue graph of ``mm`` (ops in block order), or None where a plain chain (or nothing)
    serves."""
    block = mm.parent
    shape = mm.result.type.dims
    rank = len(shape)
    dependent = _dependents(mm.result)
    ops = list(block.ops)
    members: list = []
    inside: set = set()
    vals = {mm.result}
    typed = False
    for op in ops[ops.index(mm) + 1:]:
        if op not in dependent or not is_elementwise(op) or op.results[0].type.dims != shape:
            continue
        if not any(o in vals for o in op.operands):
            continue
        if not absorb(op, vals, inside, members, dependent, rank):
            continue
        vals.add(op.results[0])
        typed |= isinstance(op, (g.WhereOp,)) or getattr(op, "TILE_FN", None) is not None
    if not members:
        return None
    multi = any(len({u.operation for u in v.uses if u.operation in inside}) > 1 for v in vals)   # y * y is a chain
    outs = [v for v in vals if any(u.operation not in inside for u in v.uses)]
    if not (typed or multi) or len(outs) != 1 or mm.result in outs and len(vals) > 1:
        return None
    # keep only what the one output needs (a member feeding nothing of the output's is dropped)
    need, work = set(), [outs[0]]
    while work:
        v = work.pop()
        op = v.owner
        if op in inside and op not in need:
            need.add(op)
            work.extend(op.operands)
    if any(v.owner in inside and v.owner not in need for v in vals if v is not mm.result):
        return None
    return [m for m in members if m in need]
