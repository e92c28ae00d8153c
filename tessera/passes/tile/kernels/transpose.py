"""Transpose kernels: the output is written row by row; the input is read through
the permuted strides (one element at a time when the permutation moves the last
axis, a vector per chunk when it keeps it).  A reshape of the copied value that
strides cannot express is free: the copy is written in row-major order."""
from __future__ import annotations

from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, trace_view
from tessera.passes.util import register_elem


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    block = kop.body.block
    out = block.last_op.operands[0]
    if len(block.last_op.operands) != 1:
        raise ScheduleIllegalError("a transpose kernel yields one tensor")
    # a reshape of the copied value: the copy is written in row-major order, which is the
    # reshaped tensor's layout too
    while isinstance(out.owner, g.ReshapeOp) and trace_view(out, block) is None:
        out = out.owner.input
    view = trace_view(out, block)
    if view is None:
        raise ScheduleIllegalError("a transpose kernel copies a kernel input seen through transposes/reshapes")
    dims = tuple(out.type.dims)
    elem = out.type.element_type
    lf = R.Leaf(out, view, "general", 1, elem)
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(elem)
    R.register_dims(sig, dims, {out: lf})
    last = sig.dim(view.strides[-1])
    kf = sig.build()
    b = kf.b
    C = kf.size(dims[-1])
    nrows = 1
    for d in dims[:-1]:
        nrows = b.mul(nrows, kf.size(d))
    cs = kf.size(last)
    chunk = R.chunk_of(kop)

    def row(br, r, _c):
        ctx = R.RowCtx(kf, br, r, dims, {out: lf})
        base = ctx.offsets[out]
        out_off = br.mul(r, C)
        if view.strides[-1] == 1:
            def body(bc, c, _c2):
                left = bc.sub(C, c)
                v = R.load_leaf(kf, bc, lf, base, c, left, chunk)
                R.store_row(kf, bc, out_buf, elem, v, bc.add(out_off, c), left, chunk)
                return []
            br.for_(0, C, chunk, body)
        else:
            def body(bc, c, _c2):
                src = t.ViewOp.create(operands=[kf.buffer_args[view.arg], bc.c(bc.add(base, bc.mul(c, cs))),
                                                bc.c(0), bc.c(0), bc.c(1), bc.c(1)],
                                      result_types=[t.view_type(1, 1, elem, "global")])
                bc.op(src)
                ld = t.LoadOp.create(operands=[src.result], result_types=[t.tile_type(1, 1, elem)])
                bc.op(ld)
                dst = t.ViewOp.create(operands=[kf.buffer_args[out_buf], bc.c(bc.add(out_off, c)), bc.c(0),
                                                bc.c(1), bc.c(1), bc.c(1)],
                                      result_types=[t.view_type(1, 1, elem, "global")])
                bc.op(dst)
                bc.op(t.StoreOp.create(operands=[ld.result, dst.result]))
                return []
            br.for_(0, C, 1, body)
        return []

    R.for_rows(kf, b, nrows, row)
    return kf.finish(), sig.dims, 0, []


__all__ = ["generate", "g"]
