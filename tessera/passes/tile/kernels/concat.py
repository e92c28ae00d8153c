"""Concatenation kernels.  A row-major tensor joined along ``axis`` is, seen as rows of
everything from ``axis`` on, a row made of one segment per operand: output row r is operand
0's row r, then operand 1's, ... .  Rows run in parallel; each segment is a vector copy (its
width may be symbolic: only the concatenated axis is static)."""
from __future__ import annotations

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir.attrs import ival
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, trace_view
from tessera.passes.util import register_elem


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    block = kop.body.block
    cats = [op for op in block.ops if isinstance(op, g.ConcatOp)]
    out = block.last_op.operands[0]
    if len(cats) != 1 or len(block.last_op.operands) != 1 or out is not cats[0].result:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a concat kernel yields one tessera.concat")
    cat = cats[0]
    axis = ival(cat.axis)
    dims = tuple(out.type.dims)
    elem = out.type.element_type
    views = [trace_view(v, block) for v in cat.inputs]
    if any(v is None or v.offset for v in views):
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a concat kernel reads whole kernel inputs")
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(elem)
    lead = dims[:axis]
    widths = [D.product(v.type.dims[axis:]) for v in cat.inputs]
    for d in (*lead, *widths):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    nrows = 1
    for d in lead:
        nrows = b.mul(nrows, kf.size(d))
    chunk = R.chunk_of(kop)
    leaves = [R.Leaf(v, view, "contig", 1, v.type.element_type) for v, view in zip(cat.inputs, views)]

    def row(br, r, _c):
        sizes = [kf.size(w) for w in widths]
        total = 0
        for w in sizes:
            total = br.add(total, w)
        out_off = br.mul(r, total)
        for lf, w in zip(leaves, sizes):
            base = br.mul(r, w)

            def body(bc, c, _c2, lf=lf, w=w, base=base, dst=out_off):
                left = bc.sub(w, c)
                v = R.load_leaf(kf, bc, lf, base, c, left, chunk)
                R.store_row(kf, bc, out_buf, elem, v, bc.add(dst, c), left, chunk)
                return []
            br.for_(0, w, chunk, body)
            out_off = br.add(out_off, w)
        return []

    R.for_rows(kf, b, nrows, row)
    return kf.finish(), sig.dims, 0, []


__all__ = ["generate"]
