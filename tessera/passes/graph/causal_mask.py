"""A causal mask written in the graph, as ``fuse-attention`` sees it:
``where(row >= col, s, -inf)`` (or ``col <= row``) where ``row`` / ``col`` are ``tessera.iota``
along the score's last two axes (``row + 0`` too: ``tril``'s form), single-use, with the
score's shape in those axes -- top-left alignment: query i keeps keys j <= i, which is
``tessera.attention``'s ``causal``."""
from __future__ import annotations

from tessera.ir import graph as g
from tessera.ir import graph_typed as gt
from tessera.passes.graph.outline import single_use
from tessera.passes.tile.kernels.common import scalar_constant


def _iota_axis(v, rank: int, dims) -> tuple[int, list] | None:
    """(the score axis the iota runs along, its ops) for an iota (or iota + 0) of the score's last
    two dims."""
    ops = []
    op = v.owner
    if isinstance(op, g.AddOp) and single_use(v):
        for a, c in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
            if isinstance(c.owner, g.ConstantOp) and scalar_constant(c.owner) == 0 and single_use(c):
                ops += [op, c.owner]
                v, op = a, a.owner
                break
        else:
            return None
    if not (isinstance(op, g.IotaOp) and single_use(v)):
        return None
    it = op.result.type
    if it.rank < 2 or tuple(it.dims[-2:]) != tuple(dims[-2:]) or any(d != 1 for d in it.dims[:-2]):
        return None
    return op.axis.value.data + rank - it.rank, ops + [op]


def match(x, rank: int):
    """For the softmax input ``x``: (the masked scores, the mask's ops, consumers first) or None."""
    w = x.owner
    if not (isinstance(w, g.WhereOp) and single_use(x) and single_use(w.cond)):
        return None
    neg = w.on_false.owner
    if not (isinstance(neg, g.ConstantOp) and scalar_constant(neg) == float("-inf") and single_use(w.on_false)):
        return None
    cmp = w.cond.owner
    if isinstance(cmp, gt.GreaterEqualOp):
        row_v, col_v = cmp.lhs, cmp.rhs
    elif isinstance(cmp, gt.LessEqualOp):
        row_v, col_v = cmp.rhs, cmp.lhs
    else:
        return None
    dims = w.on_true.type.dims
    r, c = _iota_axis(row_v, rank, dims), _iota_axis(col_v, rank, dims)
    if r is None or c is None or r[0] != rank - 2 or c[0] != rank - 1 or w.result.type.dims != dims:
        return None
    return w.on_true, [w, neg, cmp] + r[1] + c[1]
