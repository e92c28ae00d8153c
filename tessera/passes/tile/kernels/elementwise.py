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
from tessera.ir.attrs import str_array
from tessera.passes.tile.kernels.common import KernelSig, StridedView, for_claimed, row_major_strides
from tessera.passes.tile.kernels.typed import emit_iotas, row_digit
from tessera.passes.util import register_elem

FLAT_ROW = 4096


def generate(kop: s.KernelOp):
    """One loop nest per group of the kernel (one group unless ``fuse-multi-tensor`` merged several
    independent ones: then one claimed work list covers the rows of every group, one launch)."""
    R.check_rows_schedule(kop)
    block = kop.body.block
    yield_op = block.last_op
    outs = list(yield_op.operands)
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_bufs = [sig.buffer(o.type.element_type) for o in outs]
    groups = [_Group(kop, block, ops, [outs[j] for j in js], [out_bufs[j] for j in js], js)
              for ops, js in _components(block, outs)]
    for gr in groups:
        gr.register(sig)
    kf = sig.build()
    b = kf.b
    nrows_bodies = [gr.prepare(kf, b) for gr in groups]
    if len(groups) == 1:
        R.for_rows(kf, b, *nrows_bodies[0])
    else:
        _for_groups(kf, b, nrows_bodies)
    kfn = kf.finish()
    pairs = _inplace_pairs(groups, len(kop.inputs))
    if pairs:   # input i is read only at output j's index: the runtime may write j into a donated i
        kfn.attributes["inplace"] = str_array(sorted(pairs, key=lambda p: tuple(map(int, p.split(":")))))
    return kfn, sig.dims, 0, []


def _components(block, outs) -> list[tuple[list, list[int]]]:
    """The block's ops split into independent groups (connected through their values), each with
    the indices of the outputs it yields, in block order."""
    ops = [o for o in block.ops if o is not block.last_op]
    parent = {o: o for o in ops}

    def find(o):
        while parent[o] is not o:
            parent[o] = parent[parent[o]]
            o = parent[o]
        return o
    for o in ops:
        for v in o.operands:
            p = getattr(v, "owner", None)
            if p in parent:
                parent[find(p)] = find(o)
    comps: dict = {}
    for j, v in enumerate(outs):
        comps.setdefault(find(v.owner), []).append(j)
    if len(comps) == 1:
        return [(ops, list(range(len(outs))))]
    roots = {find(o) for o in ops}
    if roots - set(comps):
        raise ScheduleIllegalError("an elementwise kernel holds ops that feed none of its outputs")
    return [([o for o in ops if find(o) is r], js) for r, js in comps.items()]


def _inplace_pairs(groups, ninputs: int) -> list[str]:
    """``"i:j"`` where output j may be written into input i's buffer (the host program does so for
    a donated argument, runtime/cpu.py): input i is read by j's group alone, and there only at the
    element being written, so every element is read before it is overwritten, by the same thread."""
    reads = [gr.reads() for gr in groups]
    pairs = []
    for i in range(ninputs):
        readers = [k for k, (read, _) in enumerate(reads) if i in read]
        if len(readers) == 1 and i in reads[readers[0]][1]:
            pairs += [f"{i}:{j}" for j in sorted(groups[readers[0]].out_index)]
    return pairs


class _Group:
    """One loop nest over one output shape: the ops feeding some of the kernel's outputs."""

    def __init__(self, kop, block, ops, outs, out_bufs, out_index):
        self.kop, self.block, self.outs, self.out_bufs, self.out_index = kop, block, outs, out_bufs, out_index
        name = kop.sym_name.data
        out_dims = outs[0].type.dims
        if any(o.type.dims != out_dims for o in outs):
            raise ScheduleIllegalError(f"kernel {name}: outputs of one elementwise kernel share a shape")
        compute = [o for o in ops if not isinstance(o, (g.ReshapeOp, g.TransposeOp, g.SliceOp, g.TakeOp))]
        self.chunk = R.chunk_of(kop)
        self.dims = dims = tuple(out_dims) if out_dims else (1,)
        self.segments = _segments(kop, compute)
        self.seg_leaves = []
        if self.segments:
            cat, subs = self.segments
            inner = {o for sub in subs for o in sub}
            compute = [o for o in compute if o not in inner and o is not cat]
            self.seg_leaves = [R.find_leaves(block, tuple(v.type.dims), sub, extra=(v,))
                               for v, sub in zip(cat.inputs, subs)]
        self.compute = compute
        self.leaves = R.find_leaves(block, dims, compute, extra=tuple(outs))
        own = set(ops)
        self.takes = {v: t for v, t in gather_leaf.find(name, block).items() if t[1] in own}   # read in place
        self.iotas = any(isinstance(o, g.IotaOp) for o in compute)   # generators read the row / column indices
        self.flat = not self.segments and not self.takes and not self.iotas and all(
            lf.mode in ("contig",) or (lf.mode == "bcast" and lf.col_stride == 0) for lf in self.leaves.values())

    def register(self, sig: KernelSig) -> None:
        if self.flat:
            self.total = D.product(self.dims)
            sig.dim(self.total)
            return
        R.register_dims(sig, self.dims, self.leaves)
        for v, lv in zip(self.segments[0].inputs, self.seg_leaves) if self.segments else ():
            R.register_dims(sig, tuple(v.type.dims), lv)
        gather_leaf.register(sig, self.takes)

    def reads(self) -> tuple[set[int], set[int]]:
        """(the kernel inputs this group reads, those it reads only at the element its outputs
        write: a contiguous leaf in the outputs' order, no broadcast, transpose, join or gather)."""
        dense = row_major_strides(self.dims)
        other = {lf.view.arg for lf in self.leaves.values()
                 if lf.view.offset or lf.view.taps or list(lf.view.strides) != dense}
        other |= {lf.view.arg for lv in self.seg_leaves for lf in lv.values()}
        for lf, op, ib in self.takes.values():
            other |= {lf.view.arg, ib}
        read = {lf.view.arg for lf in self.leaves.values()} | other
        return read, read - other

    def prepare(self, kf, b):
        """(rows, row body) of this group: the work per row, for ``R.for_rows`` or a shared list."""
        flat, dims, chunk, leaves, takes = self.flat, self.dims, self.chunk, self.leaves, self.takes
        compute, outs, out_bufs, iotas = self.compute, self.outs, self.out_bufs, self.iotas
        segments, seg_leaves = self.segments, self.seg_leaves
        if segments:
            cat, subs = segments
        if flat:
            T = kf.size(self.total)
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
                        (c, (1, chunk), 0, 1) if ax == len(dims) - 1
                        else (row_digit(bc, kf, r, dims, ax), (1, 1), 0, 0)))
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

        return nrows, row_body


def _for_groups(kf, b, groups) -> None:
    """Every group's rows as one claimed work list (``for_claimed``: one phase, no barrier): group k
    hands out runs of about an eighth of a thread's share of its rows, items ``base_k ..``; a thread
    that claims an item finds its group by comparing with the bases (one launch for all groups)."""
    spans, base = [], 0
    for nrows, body in groups:
        run = b.max(b.ceil_div(nrows, b.mul(kf.nthreads, 8)), 1)
        count = b.ceil_div(nrows, run)
        spans.append((base, count, run, nrows, body))
        base = b.add(base, count)

    def item_body(bw, item):
        for lo_item, count, run, nrows, body in spans:
            k = bw.sub(item, lo_item)
            inside = bw.cmp("ult", k, count)   # unsigned: an item below this group's base wraps above
            bw.if_(inside, lambda bi, k=k, run=run, nrows=nrows, body=body: bi.for_(
                bi.mul(k, run), bi.min(bi.mul(bi.add(k, 1), run), nrows), 1, body) or [])
        return []
    for_claimed(b, 0, base, item_body)


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
