"""A GEMM epilogue that is a graph, not a chain: the matmul's result used more than once
(``where(y > 0, y, 0.1 * y)``), comparisons, ``where``, int / bool values, ``iota`` along the
output's rows or columns.  The whole epilogue is one ``("dag", ops, out, operands)`` step of
the plan, evaluated on each register tile by ``rows.emit_ops`` (the row kernels' evaluator),
with each kernel input it reads loaded as a broadcast tile of the output's shape."""
from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr, f32
from xdsl.ir import BlockArgument

from tessera.ir import graph as g
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.passes.tile.kernels.common import illegal, reg_elem, scalar_constant, trace_view
from tessera.passes.tile.kernels.typed import emit_iotas, typed_fn


def needs_dag(block, mm) -> bool:
    """Whether the ops after ``mm`` are not a plain chain: a typed op, a generator, or a value
    used twice."""
    after = list(block.ops)[list(block.ops).index(mm) + 1:]
    for op in after:
        if isinstance(op, (g.WhereOp, g.IotaOp)) or typed_fn(op) is not None:
            return True
    for op in [mm] + after:
        for r in op.results:
            if len({u.operation for u in r.uses}) > 1:   # y * y is a chain step ("self")
                return True
    return False


def analyse(kop, block, mm, plan, out_dims, operand_of) -> None:
    """``plan.epilogue`` = one dag step; ``operand_of(view)`` makes a broadcast Operand."""
    name = kop.sym_name.data
    ops = [o for o in block.ops if o is not mm and not isinstance(o, (g.YieldOp, g.ReshapeOp, g.TransposeOp,
                                                                       g.SliceOp, g.TakeOp))]
    produced = {mm.result} | {r for o in ops for r in o.results}
    yielded = list(block.last_op.values)
    if len(yielded) != 1 or yielded[0] not in produced:
        raise illegal(name, "a gemm kernel yields one value of its epilogue")
    operands = {}
    for op in ops:
        if not (isinstance(op, (g.ConstantOp, g.CastOp, g.WhereOp, g.IotaOp))
                or isinstance(op, g.ELEMENTWISE_UNARY + g.ELEMENTWISE_BINARY)):
            raise illegal(name, f"{op.name} cannot be fused into a gemm epilogue")
        if isinstance(op, g.IotaOp) and op.axis.value.data + len(out_dims) - op.result.type.rank < len(out_dims) - 2:
            raise illegal(name, "an iota along a batch axis cannot be fused into a gemm epilogue")
        for v in op.operands:
            if v in produced or v in operands:
                continue
            view = trace_view(v, block)
            if view is None or view.arg >= len(kop.inputs):
                raise illegal(name, f"epilogue operand of {op.name} is not a kernel input")
            operands[v] = operand_of(view)
    plan.epilogue = [("dag", ops, yielded[0], operands)]
    plan.out_elem = yielded[0].type.element_type


def apply(bf, kf, kop, st, val, shape, row, col, vr, vc, epi_offs, mm_result, load):
    """The epilogue graph on one R x C tile whose accumulators are ``val``."""
    from tessera.passes.tile.kernels.rows import emit_ops
    _, ops, out, operands = st
    R, C = shape
    vals = {mm_result: val}
    for v, operand in operands.items():
        vals[v] = load(bf, operand, reg_elem(kop.inputs[operand.arg].type.element_type, kf.reg))
    rank = len(mm_result.type.dims)

    def coord(axis):
        if axis == rank - 1:
            return col, (1, C), 0, 1
        if axis == rank - 2:
            return row, (R, 1), 1, 0
        raise illegal(kop.sym_name.data, "an iota along a batch axis in a gemm epilogue")
    rest = list(ops)
    for where, x, pad, drop in (_causal_wheres(ops, rank) if kf.sig.gpu else []):
        # the GPU lanes have no int / bool registers: the causal where is the tile's diagonal mask,
        # the row / column indices compared in registers (simt ``tile.mask``), never an int tile
        i = rest.index(where)
        head, rest = [o for o in rest[:i] if o not in drop], rest[i + 1:]
        emit_iotas(bf, head, vals, kf.reg, rank, coord)
        emit_ops(bf, head, vals, kf.reg)
        vals[where.result] = bf.op(t.MaskOp.create(
            operands=[vals[x], bf.c(C), bf.c(causal_diag(bf, row, col))],
            attributes={"pad": FloatAttr(pad, f32)}, result_types=[vals[x].type])).results[0]
        rest = [o for o in rest if o not in drop]
    emit_iotas(bf, rest, vals, kf.reg, rank, coord)
    emit_ops(bf, rest, vals, kf.reg)
    return vals[out]


def causal_diag(b, row, col):
    """Element (r, c) of the tile at (row, col) is kept when c <= r + diag, i.e. its output row
    row + r >= its column col + c: diag = row - col (the planted-bug test shifts it by one)."""
    return b.sub(row, col)


def _causal_wheres(ops, rank: int) -> list:
    """The ``where(row >= col, x, k)`` among ``ops`` (k a scalar constant; row / col iotas along the
    output's last two axes, compared with ``>=`` or ``<=`` swapped) as (where, x, k, ops it alone
    reads: the comparison and its iotas)."""
    from tessera.ir.graph_typed import GreaterEqualOp as ge, LessEqualOp as le
    inside = set(ops)

    def along(v, axis) -> bool:
        it = v.owner
        return (isinstance(it, g.IotaOp) and it in inside and it.result.type.dims[ival(it.axis)] != 1
                and ival(it.axis) + rank - it.result.type.rank == axis and len(list(v.uses)) == 1)
    out = []
    for w in ops:
        if not isinstance(w, g.WhereOp) or w.cond.owner not in inside or len(list(w.cond.uses)) != 1:
            continue
        cmp = w.cond.owner
        pair = (cmp.lhs, cmp.rhs) if isinstance(cmp, ge) else (cmp.rhs, cmp.lhs) if isinstance(cmp, le) else None
        k = w.on_false.owner
        pad = scalar_constant(k) if isinstance(k, g.ConstantOp) else None
        if pair is None or pad is None or w.on_true.type.dims != w.result.type.dims or not (along(pair[0], rank - 2) and along(pair[1], rank - 1)):
            continue
        drop = {cmp, pair[0].owner, pair[1].owner}
        if k in inside and len(list(w.on_false.uses)) == 1:
            drop.add(k)
        out.append((w, w.on_true, float(pad), drop))
    return out


def describe(st) -> str:
    return "dag[" + ", ".join(o.name.split(".", 1)[1] for o in st[1] if not isinstance(o, g.ConstantOp)) + "]"


def views(plan) -> list:
    return [op.view for st in plan.epilogue if st[0] == "dag" for op in st[3].values()]


def heavy(plan, heavy_fns) -> bool:
    return any(isinstance(o, g.ELEMENTWISE_UNARY) and g.elementwise_fn(o) in heavy_fns
               for st in plan.epilogue if st[0] == "dag" for o in st[1])


__all__ = ["needs_dag", "analyse", "apply", "describe", "views", "heavy", "BlockArgument", "t"]
