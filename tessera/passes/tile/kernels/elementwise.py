"""Elementwise kernels: one loop nest over the output, no intermediate tensors.

When every input is contiguous in the output's order or a single broadcast value,
the tensor is walked as one flat array cut into rows of ``FLAT_ROW`` elements
(so even a [N, 1] output vectorises); otherwise rows follow the output's leading
dims and each input is addressed per row (see ``rows.py``)."""
from __future__ import annotations

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, StridedView
from tessera.passes.tile.kernels.typed import emit_iotas, row_digit
from tessera.passes.util import register_elem

FLAT_ROW = 4096


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    block = kop.body.block
    yield_op = block.last_op
    outs = list(yield_op.operands)
    out_dims = outs[0].type.dims
    if any(o.type.dims != out_dims for o in outs):
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: outputs of one elementwise kernel share a shape")
    compute = [o for o in block.ops if o is not yield_op and not isinstance(o, (g.ReshapeOp, g.TransposeOp, g.SliceOp))]
    chunk = R.chunk_of(kop)
    dims = tuple(out_dims) if out_dims else (1,)
    leaves = R.find_leaves(block, dims, compute + [yield_op])
    iotas = any(isinstance(o, g.IotaOp) for o in compute)   # generators read the row / column indices
    flat = not iotas and all(lf.mode in ("contig",) or (lf.mode == "bcast" and lf.col_stride == 0)
                             for lf in leaves.values())
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_bufs = [sig.buffer(o.type.element_type) for o in outs]
    if flat:
        total = D.product(dims)
        sig.dim(total)
    else:
        R.register_dims(sig, dims, leaves)
    kf = sig.build()
    b = kf.b
    if flat:
        T = kf.size(total)
        C = FLAT_ROW
        nrows = b.ceil_div(T, C)
    else:
        C = kf.size(dims[-1])
        nrows = 1
        for d in dims[:-1]:
            nrows = b.mul(nrows, kf.size(d))
    stream = R.stream_flag(b, T if flat else b.mul(nrows, C))

    def row_body(br, r, _c):
        if flat:
            row_len = br.min(C, br.sub(T, br.mul(r, C)))
            offsets = {v: (br.mul(r, C) if lf.mode == "contig" else 0) for v, lf in leaves.items()}
            out_off = br.mul(r, C)
        else:
            row_len = C
            ctx = R.RowCtx(kf, br, r, dims, leaves)
            offsets = ctx.offsets
            out_off = br.mul(r, C)

        def col_body(bc, c, _c2):
            left = bc.sub(row_len, c)
            vals = {v: R.load_leaf(kf, bc, lf, offsets[v], c, left, chunk) for v, lf in leaves.items()}
            if iotas:
                emit_iotas(bc, compute, vals, kf.reg, len(dims), lambda ax: (
                    (c, (1, chunk), 0, 1) if ax == len(dims) - 1 else (row_digit(bc, kf, r, dims, ax), (1, 1), 0, 0)))
            R.emit_ops(bc, compute, vals, kf.reg)
            for o, bi in zip(outs, out_bufs):
                R.store_row(kf, bc, bi, o.type.element_type, vals[o], bc.add(out_off, c), left, chunk, stream)
            return []

        br.for_(0, row_len, chunk, col_body)
        return []

    R.for_rows(kf, b, nrows, row_body)
    return kf.finish(), sig.dims, 0, []


__all__ = ["generate", "StridedView"]
