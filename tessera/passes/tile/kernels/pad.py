"""Pad kernels (``tessera.pad``).  The output is written row by row (rows: everything but the
last axis, in parallel).  Output row r maps to one input row: each padded leading axis maps
its index o to ``o - lo`` clamped (edge) or mirrored (reflect); in constant mode a row
outside the input is the constant throughout.  Within a row the input's run is a vector copy
at column ``lo``; the last axis's pads are the constant (vector stores) or, for edge and
reflect, element copies from their mapped columns."""
from __future__ import annotations

from xdsl.dialects import arith

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir.attrs import ints
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, StridedView, splat_row, trace_view
from tessera.passes.util import register_elem


def _map(b, mode: str, j, n):
    """The input index of (output index - lo) ``j`` on an axis of ``n`` (edge / reflect); ``n`` an
    int or a run-time size."""
    if mode == "edge":
        return b.min(b.max(j, 0), b.sub(n, 1))
    j = b.select(b.cmp("slt", b.c(j), b.c(0)), b.c(b.sub(0, j)), b.c(j))    # reflect: -j below 0
    return b.select(b.cmp("sge", j, b.c(n)), b.c(b.sub(b.sub(b.add(n, n), 2), j)), j)   # 2n - 2 - j past the end


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    block = kop.body.block
    pads_ = [op for op in block.ops if isinstance(op, g.PadOp)]
    out = block.last_op.operands[0]
    if len(pads_) != 1 or len(block.last_op.operands) != 1 or out is not pads_[0].result:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a pad kernel yields one tessera.pad")
    op = pads_[0]
    view = trace_view(op.input, block)
    if view is None:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a pad kernel reads a kernel input view")
    mode, value = op.mode.data, op.value.value.data
    p = ints(op.pads)
    widths = [(p[2 * i], p[2 * i + 1]) for i in range(len(p) // 2)]
    dims = tuple(out.type.dims)
    in_dims = tuple(op.input.type.dims)
    if mode == "constant":   # an unpadded, contiguous last axis joins the one before (longer rows)
        while (len(widths) > 1 and widths[-1] == (0, 0) and isinstance(dims[-1], int) and view.strides[-1] == 1
               and D.canon(view.strides[-2]) == dims[-1]):
            c = dims[-1]
            widths = widths[:-2] + [(widths[-2][0] * c, widths[-2][1] * c)]
            dims = dims[:-2] + (D.mul(dims[-2], c),)
            in_dims = in_dims[:-2] + (D.mul(in_dims[-2], c),)
            view = StridedView(view.arg, in_dims, view.strides[:-2] + (1,), view.offset)
    elem = out.type.element_type
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(elem)
    for d in (*dims, *in_dims, *view.strides, *view.offset):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    reg = kf.reg
    chunk = R.chunk_of(kop)
    lead, (llo, lhi) = widths[:-1], widths[-1]
    C_out = kf.size(dims[-1])
    C = kf.size(in_dims[-1])
    cs = view.strides[-1]
    vec = R.Leaf(op.input, view, "general", 1, op.input.type.element_type)
    one = R.Leaf(op.input, view, "general", 0, op.input.type.element_type)
    nrows = 1
    for d in dims[:-1]:
        nrows = b.mul(nrows, kf.size(d))

    def fill(bb, off, count):
        def body(bc, c, _c):
            R.store_row(kf, bc, out_buf, elem, splat_row(bc, chunk, value, reg), bc.add(off, c), bc.sub(count, c),
                        chunk)
            return []
        bb.for_(0, count, chunk, body)

    def copy_row(bb, src, dst):
        if cs == 1:
            def body(bc, c, _c):
                left = bc.sub(C, c)
                v = R.load_leaf(kf, bc, vec, src, c, left, chunk)
                R.store_row(kf, bc, out_buf, elem, v, bc.add(dst, bc.add(llo, c)), left, chunk)
                return []
            bb.for_(0, C, chunk, body)
        else:
            def body(bc, c, _c):
                v = R.load_leaf(kf, bc, one, bc.add(src, bc.mul(c, kf.size(cs))), 0, 1, chunk)
                R.store_row(kf, bc, out_buf, elem, v, bc.add(dst, bc.add(llo, c)), 1, chunk)
                return []
            bb.for_(0, C, 1, body)
        if mode == "constant":
            if llo:
                fill(bb, dst, llo)
            if lhi:
                fill(bb, bb.add(dst, bb.add(llo, C)), lhi)
            return
        n = C   # the input's last axis: a symbolic size at run time (not its name)
        for start, count in ((0, llo), (bb.add(llo, n), lhi)):
            if not count:
                continue

            def body(bc, c, _c, start=start):
                col = _map(bc, mode, bc.sub(bc.add(c, start), llo), n)
                v = R.load_leaf(kf, bc, one, bc.add(src, bc.mul(col, kf.size(cs))), 0, 1, chunk)
                R.store_row(kf, bc, out_buf, elem, v, bc.add(dst, bc.add(c, start)), 1, chunk)
                return []
            bb.for_(0, count, 1, body)

    def row(br, r, _c):
        dst = br.mul(r, C_out)
        digits = R.row_digits(kf, br, r, dims[:len(lead)])
        src = kf.view_offset(br, view)
        inside = None
        for i, (o, (lo, hi)) in enumerate(zip(digits, lead)):
            j = o
            if lo or hi:
                j = br.sub(o, lo)
                if mode == "constant":
                    ni = kf.size(in_dims[i])
                    ok = br.op(arith.AndIOp(br.cmp("sge", j, 0), br.cmp("slt", j, ni))).results[0]
                    inside = ok if inside is None else br.op(arith.AndIOp(inside, ok)).results[0]
                    j = br.min(br.max(j, 0), br.sub(ni, 1))   # keep the address in range either way
                else:
                    j = _map(br, mode, j, kf.size(in_dims[i]))
            if view.strides[i] != 0:
                src = br.add(src, br.mul(j, kf.size(view.strides[i])))
        if inside is None:
            copy_row(br, src, dst)
        else:
            br.if_(inside, lambda bt: copy_row(bt, src, dst), lambda be: fill(be, dst, C_out))
        return []

    R.for_rows(kf, b, nrows, row)
    return kf.finish(), sig.dims, 0, []


__all__ = ["generate"]
