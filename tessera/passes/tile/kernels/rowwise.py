"""Row-wise kernels: softmax, layer_norm, rms_norm over the last axis, with an
elementwise prologue (applied as the row is read) and epilogue (as it is written).

Each thread owns whole rows; a row is read from memory once and its later passes
hit the cache (the first of them prefetches the row after next, so memory stays busy while
the cached row is computed):

  softmax    pass 1: running max (select_max per lane: a NaN reaches the sum below; masked tail = -inf)
             pass 2: e = exp(t - max), summed and kept in a per-thread scratch slot (two slots,
                     by row parity); the same column loop writes the previous row:
             pass 3: out = epilogue(e / sum) from the other slot, so the output's streaming
                     stores leave while exp is computed.  Rows longer than a slot take three
                     passes of their own and recompute e for the write.
  layer_norm pass 1: mean; pass 2: variance about the mean; pass 3: normalise, scale, shift
  rms_norm   pass 1: mean of squares; pass 2: normalise and scale

Per-lane partial sums live in a [1, chunk] tile carried through the column loop
and are reduced once per row, in a fixed order (so results do not depend on the
thread count).
"""
from __future__ import annotations

from xdsl.dialects.builtin import StringAttr, f32, f64
from xdsl.ir import OpResult

from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, mask_cols, splat_row, tile_const
from tessera.passes.util import register_elem
from tessera.passes.tile.kernels.typed import emit_iotas, row_digit

NEG_INF = float("-inf")
SCRATCH = 16384  # floats per slot of softmax's two per-thread scratch rows (128 KiB in all: L2)


def _split(block):
    ops = [o for o in block.ops if not isinstance(o, g.YieldOp)]
    norms = [o for o in ops if isinstance(o, g.ROWWISE)]
    if len(norms) != 1:
        raise ScheduleIllegalError(f"a rowwise kernel holds one softmax/layer_norm/rms_norm, found {len(norms)}")
    norm = norms[0]
    i = ops.index(norm)
    # the prologue is what the norm reads (computed per chunk as the row is read); an op before
    # the norm that it does not read (a constant only the epilogue uses, as a gradient's seed) is
    # the epilogue's
    deps, todo = set(), list(norm.operands)
    while todo:
        v = todo.pop()
        if isinstance(v, OpResult) and v.owner in ops and v.owner not in deps:
            deps.add(v.owner)
            todo.extend(v.owner.operands)
    return ([o for o in ops[:i] if o in deps], norm,
            [o for o in ops[:i] if o not in deps] + ops[i + 1:])


def _reduce(b, kind: str, tile_v):
    op = t.ReduceOp.create(operands=[tile_v], attributes={"kind": StringAttr(kind), "axis": i64_attr(1)},
                           result_types=[t.tile_type(1, 1, tile_v.type.element_type)])
    b.op(op)
    return op.result


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    block = kop.body.block
    yield_op = block.last_op
    prologue, norm, epilogue = _split(block)
    if isinstance(norm, g.ROW_LOG):   # logsumexp / log_softmax: kernels/logrows.py
        from tessera.passes.tile.kernels import logrows
        return logrows.generate(kop, prologue, norm, epilogue)
    if isinstance(norm, g.ARGS):      # argmax / argmin: kernels/argrows.py
        from tessera.passes.tile.kernels import argrows
        return argrows.generate(kop, prologue, norm, epilogue)
    if isinstance(norm, g.TopKOp):     # top_k: kernels/topk.py
        from tessera.passes.tile.kernels import topk
        return topk.generate(kop, prologue, norm, epilogue)
    if isinstance(norm, g.CrossEntropyOp):   # kernels/xent.py
        from tessera.passes.tile.kernels import xent
        return xent.generate(kop, prologue, norm, epilogue)
    x = norm.input
    dims = tuple(x.type.dims)
    outs = list(yield_op.operands)
    if len(outs) != 1 or outs[0].type.dims != dims:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a rowwise kernel yields one row-shaped result")
    out = outs[0]
    chunk = R.chunk_of(kop)
    vec_operands = [v for v in (getattr(norm, "scale", None), getattr(norm, "bias", None)) if v is not None]
    # the norm's own operands too: its input is a kernel input whenever no prologue op computes it
    # (a prologue of constants alone, as a gradient's seed, reads nothing)
    leaves = R.find_leaves(block, dims, prologue + epilogue + [norm, yield_op])
    for v in vec_operands:
        leaves.update(R.find_leaves(block, dims, [_Use(v)]))
    leaves.pop(norm.result, None)
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out.type.element_type)
    R.register_dims(sig, dims, leaves)
    kf = sig.build()
    b = kf.b
    C = kf.size(dims[-1])
    reg = kf.reg   # registers and softmax's scratch: f32 (f64 kernels: f64)
    scratch = kf.alloc(b, 2 * SCRATCH, reg, "l2") if isinstance(norm, g.SoftmaxOp) else None
    nrows = 1
    for d in dims[:-1]:
        nrows = b.mul(nrows, kf.size(d))
    stream = R.stream_flag(b, b.mul(nrows, C))
    eps = norm.eps.value.data if hasattr(norm, "eps") else 0.0

    class Row:
        """One row's leaf offsets, its output offset, and the offsets of the row two on (prefetched
        while this one is computed from the cache)."""

        def __init__(self, br, r):
            self.ctx = R.RowCtx(kf, br, r, dims, leaves)
            self.nxt = R.RowCtx(kf, br, br.add(r, 2), dims, leaves).offsets
            self.out_off = br.mul(r, C)
            self.r = r

    # the leaves each side reads: x (and the prologue's inputs) as the row is read; the epilogue's
    # inputs as it is written, which may be x itself or the norm's scale/bias (a residual such as
    # softmax(x) + x or layer_norm(x, s) * s)
    pro_leaves = [v for v in leaves if v == x or any(v in o.operands for o in prologue)]
    epi_leaves = [v for v in leaves if any(v in o.operands for o in epilogue + [yield_op])]

    def x_chunk(bc, row, c, pad: float = 0.0):
        left = bc.sub(C, c)
        vals = {v: R.load_leaf(kf, bc, leaves[v], row.ctx.offsets[v], c, left, chunk, pad if v == x else None)
                for v in pro_leaves}
        R.emit_ops(bc, prologue, vals, reg)
        xv = vals[x]
        if xv.type.dims != (1, chunk):
            xv = R._widen(bc, xv, chunk)
        return xv, left

    def finish_chunk(bc, row, c, left, yv):
        vals = {v: R.load_leaf(kf, bc, leaves[v], row.ctx.offsets[v], c, left, chunk) for v in epi_leaves}
        vals[norm.result] = yv
        if any(isinstance(o, g.IotaOp) for o in epilogue):   # a column-index mask (cross-entropy's backward)
            emit_iotas(bc, epilogue, vals, reg, len(dims), lambda ax: (
                (c, (1, chunk), 0, 1) if ax == len(dims) - 1 else (row_digit(bc, kf, row.r, dims, ax), (1, 1), 0, 0)))
        R.emit_ops(bc, epilogue, vals, reg)
        R.store_row(kf, bc, out_buf, out.type.element_type, vals[out], bc.add(row.out_off, c), left, chunk, stream)

    def accumulate(br, row, kind: str, pad: float, fn, prefetch: bool = False):
        """Sum (or max) over the row of fn(x chunk) -> [1, 1] tile."""
        init = splat_row(br, chunk, pad, reg)

        def body(bc, c, carried):
            if prefetch:
                R.prefetch_leaves(kf, bc, leaves, row.nxt, c, chunk)
            xv, left = x_chunk(bc, row, c, pad if kind == "max" else 0.0)
            val = fn(bc, xv)
            val = mask_cols(bc, val, left, pad)
            # softmax's maximum need not carry a NaN: one in the row reaches the sum of exp(x - max)
            # whatever the maximum is, so every output is NaN as numpy's; select_max is one vmaxps
            return [elementwise(bc, "add" if kind == "add" else "select_max", [carried[0], val])]

        acc = br.for_(0, C, chunk, body, [init])[0]
        return _reduce(br, kind, acc)

    if isinstance(norm, g.SoftmaxOp):
        _softmax(kf, b, nrows, C, chunk, scratch, Row, x_chunk, finish_chunk, accumulate,
                 lambda bc, row, c: R.prefetch_leaves(kf, bc, leaves, row.nxt, c, chunk))
        return kf.finish(), sig.dims, SCRATCH * 2 * (8 if reg == f64 else 4), []

    def row_step(br, r, _c):
        row = Row(br, r)
        ncols = _count_tile(br, C, reg)
        inv_n = elementwise(br, "recip", [ncols])
        if isinstance(norm, g.LayerNormOp):
            mean = elementwise(br, "mul", [accumulate(br, row, "add", 0.0, lambda bc, xv: xv), inv_n])
            var = elementwise(br, "mul", [accumulate(br, row, "add", 0.0, lambda bc, xv: elementwise(
                bc, "mul", [elementwise(bc, "sub", [xv, mean])] * 2), prefetch=True), inv_n])
        else:
            mean = None
            var = elementwise(br, "mul", [accumulate(br, row, "add", 0.0, lambda bc, xv: elementwise(
                bc, "mul", [xv, xv])), inv_n])
        rstd = elementwise(br, "rsqrt", [elementwise(br, "add", [var, tile_const(br, eps, reg)])])

        def write(bc, c, _c2):
            if mean is None:   # rms_norm: its only pass from the cache
                R.prefetch_leaves(kf, bc, leaves, row.nxt, c, chunk)
            xv, left = x_chunk(bc, row, c)
            y = elementwise(bc, "sub", [xv, mean]) if mean is not None else xv
            y = elementwise(bc, "mul", [y, rstd])
            for v, fn in ((getattr(norm, "scale", None), "mul"), (getattr(norm, "bias", None), "add")):
                if v is not None:
                    lf = leaves[v]
                    y = elementwise(bc, fn, [y, R.load_leaf(kf, bc, lf, row.ctx.offsets[v], c, left, chunk)])
            finish_chunk(bc, row, c, left, y)
            return []

        br.for_(0, C, chunk, write)
        return []

    R.for_rows(kf, b, nrows, row_step)
    return kf.finish(), sig.dims, 0, []


def _slot(b, r):
    """Where row r's e is kept in softmax's scratch: slot r % 2 (the previous row's is the other)."""
    return b.mul(b.rem(r, 2), SCRATCH)


def _softmax(kf, b, nrows, C, chunk, scratch, Row, x_chunk, finish_chunk, accumulate, prefetch) -> None:
    """Softmax rows, software-pipelined when a row fits a scratch slot: e = exp(x - max) of row r
    is summed and kept in slot r % 2 while the same column loop writes row r - 1 from the other
    slot, so the output's streaming stores leave while exp is computed instead of in a burst of
    their own.  Longer rows take three passes and recompute e for the write."""
    fits = b.cmp("sle", C, SCRATCH)
    reg = kf.reg

    def slot_view(bc, r, c, left):
        v = t.ViewOp.create(operands=[scratch, bc.c(bc.add(_slot(bc, r), c)), bc.c(0), bc.c(1),
                                      bc.c(1), bc.c(left)], result_types=[t.view_type(1, chunk, reg, "l2")])
        bc.op(v)
        return v.result

    def exp_of(bc, row, c, mx):
        xv, left = x_chunk(bc, row, c)
        return mask_cols(bc, elementwise(bc, "exp_bounded", [elementwise(bc, "sub", [xv, mx])]), left, 0.0), left  # x - max <= 0

    def write_chunk(bc, row, c, e, inv):
        finish_chunk(bc, row, c, bc.sub(C, c), elementwise(bc, "mul", [e, inv]))

    def from_slot(bc, r, c):
        ld = t.LoadOp.create(operands=[slot_view(bc, r, c, bc.sub(C, c))], result_types=[t.tile_type(1, chunk, reg)])
        bc.op(ld)
        return ld.result

    def row_max(bb, row):
        return accumulate(bb, row, "max", NEG_INF, lambda bc, xv: xv)

    def exp_pass(br, r, row, mx, prev=None, keep: bool = True):
        """1 / (sum of e over row r), e kept in the row's slot (``keep``); with ``prev = (r', row',
        inv')`` the same loop also writes row r'."""
        def body(bc, c, carried):
            prefetch(bc, row, c)
            e, left = exp_of(bc, row, c, mx)
            if keep:
                bc.op(t.StoreOp.create(operands=[e, slot_view(bc, r, c, left)]))
            if prev is not None:
                write_chunk(bc, prev[1], c, from_slot(bc, prev[0], c), prev[2])
            return [elementwise(bc, "add", [carried[0], e])]

        ssum = _reduce(br, "add", br.for_(0, C, chunk, body, [splat_row(br, chunk, 0.0, reg)])[0])
        return elementwise(br, "recip", [ssum])

    def write_pass(br, r, row, inv):
        br.for_(0, C, chunk, lambda bc, c, _c: write_chunk(bc, row, c, from_slot(bc, r, c), inv) or [])

    def pipelined(bp, lo, hi):
        first = Row(bp, lo)
        inv0 = exp_pass(bp, lo, first, row_max(bp, first))

        def step(bs, r, carried):
            row = Row(bs, r)
            return [exp_pass(bs, r, row, row_max(bs, row), (bs.sub(r, 1), Row(bs, bs.sub(r, 1)), carried[0]))]

        last = bp.sub(hi, 1)
        write_pass(bp, last, Row(bp, last), bp.for_(bp.add(lo, 1), hi, 1, step, [inv0])[0])

    def three_passes(bt, lo, hi):
        def step(bs, r, _c):
            row = Row(bs, r)
            mx = row_max(bs, row)
            inv = exp_pass(bs, r, row, mx, keep=False)
            bs.for_(0, C, chunk, lambda bc, c, _c2: write_chunk(bc, row, c, exp_of(bc, row, c, mx)[0], inv) or [])
            return []

        bt.for_(lo, hi, 1, step)

    R.for_row_runs(kf, b, nrows, lambda bw, lo, hi: bw.if_(fits, lambda bp: pipelined(bp, lo, hi),
                                                           lambda bt: three_passes(bt, lo, hi)))



class _Use:
    """A stand-in op whose only operand is ``v`` (to find a leaf for a norm's scale/bias)."""

    name = "use"

    def __init__(self, v):
        self.operands = [v]


def _count_tile(b, C, reg=f32):
    """The row length as a [1, 1] tile of ``reg`` (C is an index value)."""
    op = t.SplatIndexOp.create(operands=[b.c(C)], result_types=[t.tile_type(1, 1, reg)])
    b.op(op)
    return op.result
