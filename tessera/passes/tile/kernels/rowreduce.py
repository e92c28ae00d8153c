"""Row-reduction kernels (``fuse-row-reductions``): one row-shaped result computed from
last-axis reductions of the row and elementwise ops, rows in parallel.

Per row: one pass over the columns for each reduction, in dependency order (a reduction may
read the ones before it: the variance reads the mean), each computing its operand's elementwise
tree chunk by chunk from the row's inputs and accumulating it; the row-scalar ops (``[.., 1]``:
``rsqrt(var + eps)``) are computed once the reductions they read are known; a last pass computes
the result's tree and stores it.  The row stays in the cache between passes, so memory sees it
once where separate kernels read it once per reduction and write every intermediate.
"""
from __future__ import annotations

import math

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import OpResult

from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, mask_cols, splat_row
from tessera.passes.util import register_elem

# how each reduction combines, what a column past the row's end contributes
COMBINE = {g.ReduceSumOp: ("add", 0.0), g.ReduceMeanOp: ("add", 0.0), g.ReduceMaxOp: ("max", -math.inf)}


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    block = kop.body.block
    yield_op = block.last_op
    if len(yield_op.operands) != 1:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a rowreduce kernel yields one row-shaped result")
    out = yield_op.operands[0]
    dims = tuple(out.type.dims)
    ops = [o for o in block.ops if o is not yield_op]
    members = set(ops)
    reds = [o for o in ops if isinstance(o, tuple(COMBINE))]
    if not reds:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a rowreduce kernel holds a last-axis reduction")
    leaves = R.find_leaves(block, dims, ops + [yield_op])
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out.type.element_type)
    R.register_dims(sig, dims, leaves)
    kf = sig.build()
    b = kf.b
    reg = kf.reg
    chunk = R.chunk_of(kop)
    C = kf.size(dims[-1])
    nrows = 1
    for d in dims[:-1]:
        nrows = b.mul(nrows, kf.size(d))
    stream = R.stream_flag(b, b.mul(nrows, C))
    row_valued = {r for o in ops for r in o.results if tuple(r.type.dims) == dims}

    def cone(v, have) -> list:
        """The member ops computing ``v`` from the leaves and the values in ``have``, in order."""
        need, todo = set(), [v]
        while todo:
            x = todo.pop()
            if x in have or x in leaves or not isinstance(x, OpResult) or x.owner not in members:
                continue
            if x.owner not in need:
                need.add(x.owner)
                todo.extend(x.owner.operands)
        return [o for o in ops if o in need]

    def row_step(br, r, _c):
        ctx = R.RowCtx(kf, br, r, dims, leaves)
        have: dict = {}     # row-level values: reductions, row scalars, constants ([1, 1] tiles)
        done: set = set()

        def row_scalars():
            """Every row-scalar op (and constant) whose operands are known, once per row."""
            grew = True
            while grew:
                grew = False
                for o in ops:
                    if o in done or isinstance(o, tuple(COMBINE)) or any(x in row_valued for x in o.results):
                        continue
                    if not all(v in have or (v in leaves and leaves[v].col_stride == 0) for v in o.operands):
                        continue
                    vals = {v: have[v] if v in have else R.load_leaf(kf, br, leaves[v], ctx.offsets[v], 0, 1, chunk)
                            for v in o.operands}
                    R.emit_ops(br, [o], vals, reg)
                    have[o.results[0]] = vals[o.results[0]]
                    done.add(o)
                    grew = True

        def chunk_value(bc, c, left, v):
            todo = cone(v, have)
            vals = dict(have)
            for x in [v] + [x for o in todo for x in o.operands]:
                if x in leaves and x not in vals:
                    vals[x] = R.load_leaf(kf, bc, leaves[x], ctx.offsets[x], c, left, chunk)
            R.emit_ops(bc, todo, vals, reg)
            val = vals[v]
            return val if val.type.dims == (1, chunk) else R._widen(bc, val, chunk)

        row_scalars()
        for red in reds:
            fn, pad = COMBINE[type(red)]

            def body(bc, c, carried, red=red, fn=fn, pad=pad):
                left = bc.sub(C, c)
                val = mask_cols(bc, chunk_value(bc, c, left, red.input), left, pad)
                return [elementwise(bc, fn, [carried[0], val])]

            acc = br.for_(0, C, chunk, body, [splat_row(br, chunk, pad, reg)])[0]
            op = t.ReduceOp.create(operands=[acc], attributes={"kind": StringAttr(fn), "axis": i64_attr(1)},
                                   result_types=[t.tile_type(1, 1, reg)])
            br.op(op)
            total = op.result
            if isinstance(red, g.ReduceMeanOp):
                n = t.SplatIndexOp.create(operands=[br.c(C)], result_types=[t.tile_type(1, 1, reg)])
                br.op(n)
                total = elementwise(br, "div", [total, n.result])
            have[red.result] = total
            row_scalars()
        out_off = br.mul(r, C)

        def write(bc, c, _c2):
            left = bc.sub(C, c)
            R.store_row(kf, bc, out_buf, out.type.element_type, chunk_value(bc, c, left, out),
                        bc.add(out_off, c), left, chunk, stream)
            return []

        br.for_(0, C, chunk, write)
        return []

    R.for_rows(kf, b, nrows, row_step)
    return kf.finish(), sig.dims, 0, []


__all__ = ["generate"]
