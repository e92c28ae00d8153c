"""A canonicalize rule (canonicalize.py calls it): elementwise ops move above a transpose of a
GEMM's result, so they can ride the GEMM's epilogue and the transpose copies the final value.

``u(transpose(y, p))`` -> ``transpose(u(y), p)`` and ``b(transpose(y, p), c)`` ->
``transpose(b(y, c'), p)`` where ``c'`` is ``c`` (broadcast against the transpose's result)
seen in y's axis order: a reshape when that only moves size-1 axes, else a reshape to the full
rank and a transpose.  Only where y is a matmul or an elementwise chain on one (an NCHW
convolution's GEMM result, transposed back from NHWC), and the transpose has no other use.
"""
from __future__ import annotations

from tessera.ir import graph as g
from tessera.ir.attrs import int_array
from tessera.passes.util import insert_before, replace_op

_UNARY = g.ELEMENTWISE_UNARY + (g.CastOp,)


def _on_gemm_chain(v) -> bool:
    seen = 0
    while seen < 64:
        o = v.owner
        if isinstance(o, g.MatmulOp):
            return True
        if isinstance(o, _UNARY):
            v = o.input
        elif isinstance(o, g.ELEMENTWISE_BINARY):
            full = [x for x in (o.lhs, o.rhs) if x.type.dims == o.result.type.dims]
            if not full:
                return False
            v = full[0]
        else:
            return False
        seen += 1
    return False


def _sinkable(v) -> bool:
    t = v.owner
    return isinstance(t, g.TransposeOp) and len(list(v.uses)) == 1 and _on_gemm_chain(t.input)


def _in_source_order(c, perm: list[int], at) -> object:
    """``c`` (broadcastable to the transpose's result) re-laid out for its input's axes."""
    r = len(perm)
    dims = (1,) * (r - c.type.rank) + tuple(c.type.dims)
    inv = [0] * r
    for i, p in enumerate(perm):
        inv[p] = i
    new = tuple(dims[inv[j]] for j in range(r))
    order = [inv[j] for j in range(r) if dims[inv[j]] != 1]
    if order == sorted(order):      # only size-1 axes move: the same elements in the same order
        op = g.ReshapeOp.create(operands=[c], result_types=[g.TensorType.of(list(new), c.type.element_type)])
        insert_before(at, op)
        return op.result
    if c.type.rank != r:
        rs = g.ReshapeOp.create(operands=[c], result_types=[g.TensorType.of(list(dims), c.type.element_type)])
        insert_before(at, rs)
        c = rs.result
    tr = g.TransposeOp.create(operands=[c], result_types=[g.TensorType.of(list(new), c.type.element_type)],
                              attributes={"perm": int_array(inv)})
    insert_before(at, tr)
    return tr.result


def sink_transpose(op) -> bool:
    """Apply the rule at ``op`` if it matches; return whether it changed the IR."""
    if isinstance(op, _UNARY):
        if not _sinkable(op.input):
            return False
        t = op.input.owner
        operands = [t.input]
    elif isinstance(op, g.ELEMENTWISE_BINARY):
        side = [x for x in (op.lhs, op.rhs) if _sinkable(x)]
        if not side or op.result.type.dims != side[0].type.dims or op.lhs == op.rhs:
            return False
        t = side[0].owner
        other = op.rhs if side[0] is op.lhs else op.lhs
        moved = other if other.type.rank == 0 else _in_source_order(other, t.permutation, op)
        operands = [t.input, moved] if side[0] is op.lhs else [moved, t.input]
    else:
        return False
    y = t.input
    new = type(op).create(operands=operands, attributes=dict(op.attributes),
                          result_types=[g.TensorType.of(list(y.type.dims), op.result.type.element_type)])
    new.location = op.location
    tr = g.TransposeOp.create(operands=[new.results[0]], result_types=[op.result.type],
                              attributes={"perm": int_array(t.permutation)})
    tr.location = t.location
    insert_before(op, new, tr)
    replace_op(op, [tr.result])
    return True


__all__ = ["sink_transpose"]
