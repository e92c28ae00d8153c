"""``fuse-attention``: recognise ``softmax((q @ k^T) * scale [+ mask]) @ v`` and group attention.

A mask may also be a ``where(cond, scores, -inf)`` (or two nested, one of them causal, as
``jit(dynamic=)`` makes it): ``cond`` (bool, True = attend) becomes the attention's mask, and
the iota comparison ``i[:, None] >= j[None, :]`` (row index at least the column index: top-left
causal, whatever the two lengths) becomes ``causal``, whose blocks the kernel skips.  Inside
the where an additive float bias may stand (``where(.., s + bias, -inf)``: BERT's padding bias
under ``jit(dynamic=)``): with the causal mask it is the attention's mask; with the key-length
mask ``iota < L`` (L a runtime argument) the two become one float mask ``where(iota < L, bias,
-inf)``, the same scores wherever they are finite.  Any other condition with a bias is left
composed.

The composed form is rewritten into ``tessera.attention`` (with ``masked_rows = "nan"``: a
row whose every score is -inf gives NaN in the composed form, and so it does in the fused
kernel) only where the result is the same computation: rank-4 (or rank-3, seen as one batch)
float32 operands, a key
transpose of the last two dims, a scalar constant scale (``* c`` or ``/ c``), an additive
float mask, a softmax over the last axis, and single-use intermediates.  bf16 composed forms
are left alone: they round the scores to bf16 between ops, which the fused kernel does not.

Every ``tessera.attention`` (written or recognised) then becomes one ``attention`` group with
the reshape/transpose chains of its operands that are expressible as strides.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.ir import BlockArgument
from xdsl.traits import Pure
from xdsl.dialects.builtin import BoolAttr, Float32Type, FloatAttr, ModuleOp, StringAttr, f64, i1

from tessera.ir import graph as g
from tessera.ir.graph_typed import GreaterEqualOp, LessEqualOp, LessOp
from tessera.ir.attrs import int_array, ival
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.fuse_matmul_epilogue import _operand_views
from tessera.passes.graph.outline import outline, single_use
from tessera.passes.tile.kernels.common import scalar_constant
from tessera.passes.util import erase_dead, function_blocks


def _only_user(v):
    return next(iter(v.uses)).operation if single_use(v) else None


def _match(pv: g.MatmulOp):
    """pv = softmax(...) @ v  ->  (q, k, v, scale, mask, ops to erase) or None."""
    p = pv.lhs.owner
    rank = pv.result.type.rank
    if not isinstance(p, g.SoftmaxOp) or not single_use(pv.lhs) or rank not in (3, 4):
        return None
    if ival(p.axis) % rank != rank - 1 or not isinstance(pv.result.type.element_type, Float32Type):
        return None
    x = p.input
    chain = [p]
    mask = None
    causal = False
    if isinstance(x.owner, g.WhereOp) and single_use(x):
        # where(cond, scores, -inf): cond is the mask (True = attend); an iota comparison
        # "query row >= key column" is the causal mask, which the kernel applies by skipping blocks.
        # Two nested (a causal one and a mask: jit(dynamic=)'s key-length mask) are both taken.
        conds = []
        while isinstance(x.owner, g.WhereOp) and single_use(x) and len(conds) < 2:
            w = x.owner
            fill = scalar_constant(w.on_false.owner) if isinstance(w.on_false.owner, g.ConstantOp) else None
            if fill != float("-inf"):
                return None
            conds.append(w.cond)
            x = w.on_true
            chain.append(w)
        rest = [c for c in conds if not _row_ge_col(c)]
        if len(rest) > 1:
            return None
        causal = len(rest) < len(conds)
        mask = rest[0] if rest else None
        bias = _additive(x)
        if bias is not None:   # where(.., s + bias, -inf): BERT's padding bias under jit(dynamic=) or causal
            if mask is not None and not _key_length(mask):
                return None
            chain.append(x.owner)
            x = bias[1]
            # a key-length mask and a bias are one float mask, where(key < L, bias, -inf): the same
            # scores wherever they are finite (a padded key's scores come from zero-padded inputs)
            mask = bias[0] if mask is None else ("combine", mask, bias[0], chain[1].on_false)
        if not isinstance(x.owner, (g.MatmulOp, g.MulOp, g.DivOp)):
            return None
    elif isinstance(x.owner, g.AddOp) and single_use(x):
        bias = _additive(x)
        if bias is None:
            return None
        chain.append(x.owner)
        mask, x = bias
    scale = 1.0
    if isinstance(x.owner, (g.MulOp, g.DivOp)) and single_use(x):
        sop = x.owner
        for a, c in ((sop.lhs, sop.rhs), (sop.rhs, sop.lhs) if isinstance(sop, g.MulOp) else ()):
            cv = scalar_constant(c.owner) if not hasattr(c, "block") else None
            if cv is not None and isinstance(a.owner, g.MatmulOp):
                scale = cv if isinstance(sop, g.MulOp) else 1.0 / cv
                x = a
                chain.append(sop)
                break
        else:
            return None
    qk = x.owner
    if not isinstance(qk, g.MatmulOp) or not single_use(x):
        return None
    kt = qk.rhs.owner
    if not isinstance(kt, g.TransposeOp) or not single_use(qk.rhs) or kt.input.type.rank != rank:
        return None
    # k^T = transpose(x, perm) for any perm ending in a swap of the last two axes of k:
    # k = transpose(x, perm with its last two entries exchanged)
    perm = kt.permutation
    kperm = perm[:-2] + [perm[-1], perm[-2]]
    mask_rank = 0 if mask is None else max(m.type.rank for m in mask[1:3]) if isinstance(mask, tuple) else mask.type.rank
    if any(t.type.rank != rank for t in (qk.lhs, pv.rhs)) or mask_rank > rank:
        return None
    chain += [qk, kt]
    return qk.lhs, (kt.input, kperm), pv.rhs, scale, mask, chain, causal


def _additive(x):
    """(bias, scores) when ``x`` = scores + bias (single use, bias not a constant), else None."""
    add = x.owner
    if not (isinstance(add, g.AddOp) and single_use(x)):
        return None
    for a, m in ((add.lhs, add.rhs), (add.rhs, add.lhs)):
        if isinstance(a.owner, (g.MatmulOp, g.MulOp, g.DivOp)) and not isinstance(m.owner, g.ConstantOp):
            return m, a
    return None


def _key_length(cond) -> bool:
    """Whether ``cond`` is ``iota(last axis) < L`` with L a runtime scalar argument: the key-length
    mask ``jit(dynamic=)`` puts before a softmax over a padded axis."""
    op = cond.owner
    if not isinstance(op, LessOp) or not isinstance(op.rhs, BlockArgument) or op.rhs.type.rank != 0:
        return False
    it = op.lhs.owner
    return isinstance(it, g.IotaOp) and ival(it.axis) == it.result.type.rank - 1


def _row_ge_col(cond) -> bool:
    """Whether the bool ``cond`` is "row index >= column index" over its last two axes, built
    from iotas: ``i[:, None] >= j[None, :]`` (or ``j[None, :] <= i[:, None]``)."""
    op = cond.owner
    if isinstance(op, GreaterEqualOp):
        row, col = op.lhs, op.rhs
    elif isinstance(op, LessEqualOp):
        row, col = op.rhs, op.lhs
    else:
        return False
    if cond.type.rank < 2:
        return False

    def along(v, want: int) -> bool:
        """v holds its element's index along axis ``want`` (from the end) and is constant along
        the others: an iota, or a 1-D iota reshaped with unit dims around it."""
        full = v.type.dims
        it = v.owner
        if isinstance(it, g.IotaOp) and it.result.type.rank >= 2:
            return ival(it.axis) - it.result.type.rank == want
        while isinstance(v.owner, g.ReshapeOp):
            v = v.owner.input
        it = v.owner
        if not isinstance(it, g.IotaOp) or it.result.type.rank != 1:
            return False
        pos = len(full) + want
        return pos >= 0 and full[pos] == it.result.type.dims[0] and all(
            d == 1 for i, d in enumerate(full) if i != pos)
    return along(row, -2) and along(col, -1)


def _unsqueeze(v, new_ops: list):
    r = g.ReshapeOp.create(operands=[v], result_types=[g.TensorType.of((1, *v.type.dims), v.type.element_type)])
    new_ops.append(r)
    return r.result


def combined_mask(cond, bias, neg_inf, new_ops: list):
    """where(cond, bias, -inf): a key-length condition and an additive bias as one float mask."""
    dims = g.broadcast_dims(cond.type.dims, bias.type.dims, "attention mask")
    w = g.WhereOp.create(operands=[cond, bias, neg_inf], result_types=[g.TensorType.of(dims, bias.type.element_type)])
    new_ops.append(w)
    return w.result


def rewrite_composed(block) -> bool:
    changed = False
    for op in list(block.ops):
        if not (isinstance(op, g.MatmulOp) and op.parent is block):
            continue
        m = _match(op)
        if m is None:
            continue
        q, (kx, kperm), v, scale, mask, chain, causal = m
        new_ops = []
        if isinstance(mask, tuple):   # ("combine", key-length cond, bias, -inf): one float mask
            mask = combined_mask(*mask[1:], new_ops)
        if kperm == list(range(len(kperm))):
            k = kx
        else:
            kop = g.TransposeOp.create(operands=[kx], attributes={"perm": int_array(kperm)},
                                       result_types=[g.infer_transpose(kx.type, kperm)])
            new_ops.append(kop)
            k = kop.result
        if q.type.rank == 3:  # [heads, seq, dim]: seen as one batch of [1, heads, seq, dim]
            q, k, v = (_unsqueeze(x, new_ops) for x in (q, k, v))
            if mask is not None and mask.type.rank == 3:
                mask = _unsqueeze(mask, new_ops)
        try:
            rt = g.infer_attention(q.type, k.type, v.type, mask.type if mask is not None else None)
        except Exception:  # noqa: BLE001 - shapes the op does not take: leave the composed form
            continue
        att = g.AttentionOp(operands=[[q], [k], [v], [mask] if mask is not None else []], result_types=[rt, []],
                            attributes={"scale": FloatAttr(scale, f64), "causal": BoolAttr(causal, i1),
                                        "masked_rows": StringAttr("nan")})
        new_ops.append(att)
        result = att.result
        if rt != op.result.type:
            back = g.ReshapeOp.create(operands=[att.result], result_types=[op.result.type])
            new_ops.append(back)
            result = back.result
        for o in new_ops:
            o.location = chain[0].location
            block.insert_op_before(o, op)
        op.result.replace_all_uses_with(result)
        for dead in [op] + chain:
            dead.detach()
            dead.erase()
        changed = True
    if changed:   # a causal mask's iota comparison, no longer read (consumers go first: one pass)
        erase_dead(block, lambda o: o.dialect_name() == "tessera" and o.has_trait(Pure))
    return changed


@register
@dataclass(frozen=True)
class FuseAttention(TesseraPass):
    """Rewrite softmax((q @ k^T) * scale [+ mask]) @ v into tessera.attention; group every attention."""

    name = "fuse-attention"
    kind = "graph-transform"
    consumes = ("tessera.matmul", "tessera.softmax", "tessera.transpose", "tessera.mul", "tessera.div",
                "tessera.add", "tessera.constant", "tessera.where", "tessera.iota", "tessera.greater_equal",
                "tessera.less_equal")
    produces = ("tessera.attention", "tessera.reshape", "tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        for block in function_blocks(module):
            rewrite_composed(block)
            for op in list(block.ops):
                if isinstance(op, g.AttentionOp) and op.parent is block:
                    group = [op]
                    for v in (op.q, op.k, op.v):
                        _operand_views(v, group)
                    out = op.result
                    user = next(iter(out.uses)).operation if single_use(out) else None
                    if isinstance(user, g.TransposeOp) and user.permutation == [0, 2, 1, 3]:
                        group.append(user)   # heads merged back: the kernel writes [B, S, H, D] directly
                        out = user.result
                        user = next(iter(out.uses)).operation if single_use(out) else None
                    if isinstance(user, g.ReshapeOp):
                        group.append(user)   # written row-major: a reshape of the result is free
                    outline(group, "attention")
