"""Row-wise kernels: softmax, layer_norm, rms_norm over the last axis, with an
elementwise prologue (applied as the row is read) and epilogue (as it is written).

Each thread owns whole rows; a row is read from memory once and its later passes
hit the cache (the first of them prefetches the row after next, so memory stays busy while
the cached row is computed):

  softmax    pass 1: running max (select_max per lane: a NaN reaches the sum below; masked tail = -inf)
             pass 2: e = exp(t - max), summed; stored into the output when it is f32
             pass 3: out = epilogue(e / sum) (e re-read from the output, or recomputed)
  layer_norm pass 1: mean; pass 2: variance about the mean; pass 3: normalise, scale, shift
  rms_norm   pass 1: mean of squares; pass 2: normalise and scale

Per-lane partial sums live in a [1, chunk] tile carried through the column loop
and are reduced once per row, in a fixed order (so results do not depend on the
thread count).
"""
from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr, StringAttr, f32

from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, tile_const

NEG_INF = float("-inf")
SCRATCH = 16384  # floats of per-thread scratch row (64 KiB: stays in L2)


def _split(block):
    ops = [o for o in block.ops if not isinstance(o, g.YieldOp)]
    norms = [o for o in ops if isinstance(o, g.ROWWISE)]
    if len(norms) != 1:
        raise ScheduleIllegalError(f"a rowwise kernel holds one softmax/layer_norm/rms_norm, found {len(norms)}")
    norm = norms[0]
    i = ops.index(norm)
    return ops[:i], norm, ops[i + 1:]


def _reduce(b, kind: str, tile_v):
    op = t.ReduceOp.create(operands=[tile_v], attributes={"kind": StringAttr(kind), "axis": i64_attr(1)},
                           result_types=[t.tile_type(1, 1, f32)])
    b.op(op)
    return op.result


def _mask(b, tile_v, cols, pad: float):
    op = t.MaskOp.create(operands=[tile_v, b.c(cols)], attributes={"pad": FloatAttr(pad, f32)},
                         result_types=[tile_v.type])
    b.op(op)
    return op.result


def _splat(b, chunk: int, value: float):
    c = tile_const(b, value)
    z = t.ConstantOp.create(attributes={"value": FloatAttr(0.0, f32)}, result_types=[t.tile_type(1, chunk, f32)])
    b.op(z)
    return elementwise(b, "add", [z.result, c])


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    block = kop.body.block
    yield_op = block.last_op
    prologue, norm, epilogue = _split(block)
    x = norm.input
    dims = tuple(x.type.dims)
    outs = list(yield_op.operands)
    if len(outs) != 1 or outs[0].type.dims != dims:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a rowwise kernel yields one row-shaped result")
    out = outs[0]
    chunk = R.chunk_of(kop)
    vec_operands = [v for v in (getattr(norm, "scale", None), getattr(norm, "bias", None)) if v is not None]
    leaves = R.find_leaves(block, dims, prologue + epilogue + ([norm] if not prologue else []) + [yield_op])
    for v in vec_operands:
        leaves.update(R.find_leaves(block, dims, [_Use(v)]))
    leaves.pop(norm.result, None)
    sig = KernelSig(kop.sym_name.data)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out.type.element_type)
    R.register_dims(sig, dims, leaves)
    kf = sig.build()
    b = kf.b
    C = kf.size(dims[-1])
    scratch = kf.alloc(b, SCRATCH, f32, "l2") if isinstance(norm, g.SoftmaxOp) else None
    nrows = 1
    for d in dims[:-1]:
        nrows = b.mul(nrows, kf.size(d))
    stream = R.stream_flag(b, b.mul(nrows, C))
    eps = norm.eps.value.data if hasattr(norm, "eps") else 0.0

    def row(br, r, _c):
        ctx = R.RowCtx(kf, br, r, dims, leaves)
        nxt = R.RowCtx(kf, br, br.add(r, 2), dims, leaves).offsets   # two rows on, prefetched in a later pass
        out_off = br.mul(r, C)

        def x_chunk(bc, c, pad: float = 0.0):
            left = bc.sub(C, c)
            vals = {v: R.load_leaf(kf, bc, lf, ctx.offsets[v], c, left, chunk, pad if v == x else None)
                    for v, lf in leaves.items() if v not in vec_operands}
            R.emit_ops(bc, prologue, vals)
            xv = vals[x]
            if xv.type.dims != (1, chunk):
                xv = R._widen(bc, xv, chunk)
            return xv, left

        def finish_chunk(bc, c, left, yv):
            vals = {v: R.load_leaf(kf, bc, lf, ctx.offsets[v], c, left, chunk)
                    for v, lf in leaves.items() if v not in vec_operands and v != x}
            vals[norm.result] = yv
            R.emit_ops(bc, epilogue, vals)
            R.store_row(kf, bc, out_buf, out.type.element_type, vals[out], bc.add(out_off, c), left, chunk, stream)

        def accumulate(kind: str, pad: float, fn, prefetch: bool = False):
            """Sum (or max) over the row of fn(x chunk) -> [1, 1] tile."""
            init = _splat(br, chunk, pad)

            def body(bc, c, carried):
                if prefetch:
                    R.prefetch_leaves(kf, bc, leaves, nxt, c, chunk)
                xv, left = x_chunk(bc, c, pad if kind == "max" else 0.0)
                val = fn(bc, xv)
                val = _mask(bc, val, left, pad)
                # softmax's maximum need not carry a NaN: one in the row reaches the sum of exp(x - max)
                # whatever the maximum is, so every output is NaN as numpy's; select_max is one vmaxps
                return [elementwise(bc, "add" if kind == "add" else "select_max", [carried[0], val])]

            acc = br.for_(0, C, chunk, body, [init])[0]
            return _reduce(br, kind, acc)

        if isinstance(norm, g.SoftmaxOp):
            mx = accumulate("max", NEG_INF, lambda bc, xv: xv)
            # e = exp(t - max) is kept in a per-thread scratch row (cache resident) when the row fits,
            # so the output is written once (streamed when large); longer rows recompute e in pass 3.
            fits = br.cmp("sle", C, SCRATCH)

            def scratch_view(bc, c, left):
                v = t.ViewOp.create(operands=[scratch, bc.c(c), bc.c(0), bc.c(1), bc.c(1), bc.c(left)],
                                    result_types=[t.view_type(1, chunk, f32, "l2")])
                bc.op(v)
                return v.result

            def exp_sum(bc, c, carried):
                R.prefetch_leaves(kf, bc, leaves, nxt, c, chunk)
                xv, left = x_chunk(bc, c)
                e = elementwise(bc, "exp_bounded", [elementwise(bc, "sub", [xv, mx])])   # x - max <= 0
                e = _mask(bc, e, left, 0.0)

                def keep(bs):
                    bs.op(t.StoreOp.create(operands=[e, scratch_view(bs, c, left)]))

                bc.if_(fits, keep)
                return [elementwise(bc, "add", [carried[0], e])]

            ssum = _reduce(br, "add", br.for_(0, C, chunk, exp_sum, [_splat(br, chunk, 0.0)])[0])
            inv = elementwise(br, "recip", [ssum])

            def write(bc, c, _c2):
                left = bc.sub(C, c)

                def from_scratch(bs):
                    ld = t.LoadOp.create(operands=[scratch_view(bs, c, left)], result_types=[t.tile_type(1, chunk, f32)])
                    bs.op(ld)
                    return [ld.result]

                def recompute(bs):
                    xv, _ = x_chunk(bs, c)
                    return [elementwise(bs, "exp_bounded", [elementwise(bs, "sub", [xv, mx])])]

                e = bc.if_(fits, from_scratch, recompute, [t.tile_type(1, chunk, f32)])[0]
                finish_chunk(bc, c, left, elementwise(bc, "mul", [e, inv]))
                return []

            br.for_(0, C, chunk, write)
        else:
            ncols = _count_tile(br, C)
            inv_n = elementwise(br, "recip", [ncols])
            if isinstance(norm, g.LayerNormOp):
                mean = elementwise(br, "mul", [accumulate("add", 0.0, lambda bc, xv: xv), inv_n])
                var = elementwise(br, "mul", [accumulate("add", 0.0, lambda bc, xv: elementwise(
                    bc, "mul", [elementwise(bc, "sub", [xv, mean])] * 2), prefetch=True), inv_n])
            else:
                mean = None
                var = elementwise(br, "mul", [accumulate("add", 0.0, lambda bc, xv: elementwise(
                    bc, "mul", [xv, xv])), inv_n])
            rstd = elementwise(br, "rsqrt", [elementwise(br, "add", [var, tile_const(br, eps)])])

            def write(bc, c, _c2):
                if mean is None:   # rms_norm: its only pass from the cache
                    R.prefetch_leaves(kf, bc, leaves, nxt, c, chunk)
                xv, left = x_chunk(bc, c)
                y = elementwise(bc, "sub", [xv, mean]) if mean is not None else xv
                y = elementwise(bc, "mul", [y, rstd])
                for v, fn in ((getattr(norm, "scale", None), "mul"), (getattr(norm, "bias", None), "add")):
                    if v is not None:
                        lf = leaves[v]
                        y = elementwise(bc, fn, [y, R.load_leaf(kf, bc, lf, ctx.offsets[v], c, left, chunk)])
                finish_chunk(bc, c, left, y)
                return []

            br.for_(0, C, chunk, write)
        return []

    R.for_rows(kf, b, nrows, row)
    return kf.finish(), sig.dims, (SCRATCH * 4 if scratch is not None else 0), []


class _Use:
    """A stand-in op whose only operand is ``v`` (to find a leaf for a norm's scale/bias)."""

    name = "use"

    def __init__(self, v):
        self.operands = [v]


def _count_tile(b, C):
    """The row length as a [1, 1] f32 tile (C is an index value)."""
    op = t.SplatIndexOp.create(operands=[b.c(C)], result_types=[t.tile_type(1, 1, f32)])
    b.op(op)
    return op.result
