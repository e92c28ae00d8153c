"""Elementwise kernels: one loop nest over the output, no intermediate tensors.

When every input is contiguous in the output's order or a single broadcast value,
the tensor is walked as one flat array cut into rows of ``FLAT_ROW`` elements
(so even a [N, 1] output vectorises); otherwise rows follow the output's leading
dims and each input is addressed per row (see ``rows.py``).

A join along the last axis inside the group (rotate-half ``concat([-x[..., h:], x[..., :h]])``
in RoPE) splits each row into its operands' column segments: segment i evaluates the tree
feeding operand i (its leaves read at the column less the segment's start) and then the rest
of the group with the join's value taken from it.  Nothing is materialised."""
from __future__ import annotations

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.passes.tile.kernels import gather_leaf
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
    compute = [o for o in block.ops if o is not yield_op and not isinstance(o, (g.ReshapeOp, g.TransposeOp, g.SliceOp,
                                                                                g.TakeOp))]
    chunk = R.chunk_of(kop)
    dims = tuple(out_dims) if out_dims else (1,)
    segments = _segments(kop, compute)
    if segments:
        cat, subs = segments
        inner = {o for sub in subs for o in sub}
        compute = [o for o in compute if o not in inner and o is not cat]
        seg_leaves = [R.find_leaves(block, tuple(v.type.dims), sub, extra=(v,)) for v, sub in zip(cat.inputs, subs)]
    leaves = R.find_leaves(block, dims, compute + [yield_op])
    takes = gather_leaf.find(kop.sym_name.data, block)   # takes read in place: per-row offsets through their indices
    iotas = any(isinstance(o, g.IotaOp) for o in compute)   # generators read the row / column indices
    flat = not segments and not takes and not iotas and all(
        lf.mode in ("contig",) or (lf.mode == "bcast" and lf.col_stride == 0) for lf in leaves.values())
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_bufs = [sig.buffer(o.type.element_type) for o in outs]
    if flat:
        total = D.product(dims)
        sig.dim(total)
    else:
        R.register_dims(sig, dims, leaves)
        for v, lv in zip(cat.inputs, seg_leaves) if segments else ():
            R.register_dims(sig, tuple(v.type.dims), lv)
        gather_leaf.register(sig, takes)
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
            offsets = {**ctx.offsets, **gather_leaf.offsets(kf, br, r, dims, takes)}
            out_off = br.mul(r, C)

        def col_body(bc, c, end, seg=None):
            left = bc.sub(end, c)
            vals = {v: R.load_leaf(kf, bc, lf, offsets[v], c, left, chunk)
                    for v, lf in [*leaves.items(), *((v, t[0]) for v, t in takes.items())]}
            if seg is not None:   # this segment's operand of the join, from its own leaves
                i, start, sub_offsets = seg
                cs = bc.sub(c, start)
                sub = {v: R.load_leaf(kf, bc, lf, sub_offsets[v], cs, left, chunk)
                       for v, lf in seg_leaves[i].items()}
                R.emit_ops(bc, subs[i], sub, kf.reg)
                vals[cat.result] = sub[cat.inputs[i]]
            if iotas:
                emit_iotas(bc, compute, vals, kf.reg, len(dims), lambda ax: (
                    (c, (1, chunk), 0, 1) if ax == len(dims) - 1 else (row_digit(bc, kf, r, dims, ax), (1, 1), 0, 0)))
            R.emit_ops(bc, compute, vals, kf.reg)
            for o, bi in zip(outs, out_bufs):
                R.store_row(kf, bc, bi, o.type.element_type, vals[o], bc.add(out_off, c), left, chunk, stream)
            return []

        if not segments:
            br.for_(0, row_len, chunk, lambda bc, c, _c2: col_body(bc, c, row_len))
            return []
        start = 0
        for i, v in enumerate(cat.inputs):
            end = start + v.type.dims[-1]
            so = R.RowCtx(kf, br, r, tuple(v.type.dims), seg_leaves[i]).offsets
            br.for_(start, end, chunk, lambda bc, c, _c2, i=i, start=start, end=end, so=so:
                    col_body(bc, c, end, (i, start, so)))
            start = end
        return []

    R.for_rows(kf, b, nrows, row_body)
    return kf.finish(), sig.dims, 0, []


def _segments(kop: s.KernelOp, compute: list):
    """The group's join along the last axis and, per operand, the ops computing it (in block
    order), or None without a join."""
    cats = [o for o in compute if isinstance(o, g.ConcatOp)]
    if not cats:
        return None
    cat = cats[0]
    if len(cats) > 1 or cat.axis.value.data != cat.result.type.rank - 1:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: an elementwise kernel holds at most one join, "
                                   "along the last axis")
    index = {o: i for i, o in enumerate(compute)}
    subs = []
    for v in cat.inputs:
        need, work = set(), [v]
        while work:
            u = work.pop()
            o = getattr(u, "owner", None)
            if o in index and o not in need:
                need.add(o)
                work.extend(o.operands)
        subs.append(sorted(need, key=index.__getitem__))
    return cat, subs


__all__ = ["generate", "StridedView"]
