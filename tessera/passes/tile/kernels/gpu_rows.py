"""Memory-bound kernels for the GPU lanes (ROCm and NVIDIA) as Tile IR, written per workgroup.

Kinds (``schedule-gpu`` schedules them with ``loops = [r, c]``, ``tiles = [1, chunk]``, chunk =
threads x V, V elements = 16 bytes of the narrowest tensor; ``passes/schedule/schedule_gpu_rows.py``):

- ``rowwise`` (softmax, layer_norm, rms_norm with an elementwise prologue / epilogue): one
  workgroup per row (``tile.program_id`` 0); the row is walked in ``[1, chunk]`` tiles, masked
  past its end, and each statistic is one ``tile.reduce`` of a per-thread accumulator tile:

    softmax     pass 1 max; pass 2 sum of exp(x - max); pass 3 out = epilogue(exp(x - max) / sum)
    log_softmax pass 1 max (s: clamped finite); pass 2 sum of exp(x - s); pass 3 x - s - log(sum)
    layer_norm  pass 1 mean; pass 2 variance about the mean; pass 3 normalise, scale, shift
    rms_norm    pass 1 mean of squares; pass 2 normalise and scale

  a row of at most one chunk, or of at most HELD = 2 chunks, is read once and kept in registers for
  every pass (four held chunks took softmax to 134 registers per thread, one 256-thread workgroup
  per SM; two take 80, three workgroups); a longer row is re-read by each pass (from L2 for rows of
  up to a few MB);
- ``reduce`` (sum / mean / max over a contiguous run of axes): over the last axes one workgroup per
  output element; with inner axes after them one workgroup per (outer index, chunk of inner
  columns), each thread folding its columns down the reduced rows (no exchange);
- ``elementwise`` (fused chains, as the CPU lane fuses them) and ``transpose`` (a copy through
  permuted strides): when every operand is contiguous or a single value, one workgroup per chunk
  of the flat tensor; otherwise one workgroup per row of the output.  A join along the last axis
  inside a chain (rotate-half ``concat([-x[..., h:], x[..., :h]])``), and a ``concat`` kernel of its
  own along the last axis, split each output row into the operands' column segments, as the CPU
  lane does (``kernels/elementwise.py``): segment i evaluates the ops feeding operand i with its
  leaves read at the column less the segment's start, then the rest of the chain.

The target lowering (``passes/target/gpu/simt_rows.py``) distributes each ``[1, chunk]`` tile over
the workgroup's threads (V consecutive columns each: 16-byte accesses, coalesced) and turns
``tile.reduce`` into warp shuffles plus one shared-memory exchange between waves.
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerType, StringAttr, UnitAttr, f32

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir.graph_rows import LogSoftmaxOp
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, int_array, ints, str_array
from tessera.ir.builder import INDEX
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import (
    KernelSig,
    elementwise,
    mask_cols,
    row_major_strides,
    splat_row,
    tile_const,
    trace_view,
)

KINDS = ("rowwise", "reduce", "elementwise", "transpose", "concat", "gather", "scan")
GPU_ROW_OPS = (g.SoftmaxOp, g.LayerNormOp, g.RmsNormOp, LogSoftmaxOp)
F32_MAX = 3.4028234663852886e38
HELD = 2          # chunks of a row kept in registers (4096 f16 / 2048 f32 columns with 256 threads)
GPU_REDUCTIONS = (g.ReduceSumOp, g.ReduceMeanOp, g.ReduceMaxOp)
NEG_INF = float("-inf")


def shift(b, x, mx):
    """x - max: softmax's exponent never exceeds 0 (the planted-bug test drops it)."""
    return elementwise(b, "sub", [x, mx])


def segment_col(b, c, start):
    """Output column c of a join's segment starting at ``start`` is its operand's column c - start
    (the planted-bug test drops the shift)."""
    return b.sub(c, start)


def _program_id(b, axis: int = 0):
    return b.op(t.ProgramIdOp.create(result_types=[INDEX], attributes={"axis": i64_attr(axis)})).results[0]


def _reduce(b, kind: str, v):
    op = t.ReduceOp.create(operands=[v], attributes={"kind": StringAttr(kind), "axis": i64_attr(1)},
                           result_types=[t.tile_type(1, 1, f32)])
    b.op(op)
    return op.result


def _finish(kf, fn, grid: list[str], threads: int, wave: int):
    fn.attributes["gpu.grid"] = str_array(grid + ["1"] * (3 - len(grid)))
    fn.attributes["gpu.block"] = i64_attr(threads)
    fn.attributes["gpu.waves"] = int_array([threads // wave, 1])
    fn.attributes["gpu.rows"] = UnitAttr()
    return fn


def _setup(kop: s.KernelOp, kind: str):
    R.check_rows_schedule(kop)
    name = kop.sym_name.data
    from tessera.passes.util import register_elem
    if register_elem(kop) != f32:
        raise ScheduleIllegalError(f"kernel {name}: float64 has no GPU lowering (the GPU lanes compute in f32)")
    return name, kop.threads.value.data, kop.vector.value.data, R.chunk_of(kop)


def generate(kop: s.KernelOp):
    kind = kop.kind.data
    if kind == "gather":
        return _gather(kop)
    if kind == "scan":
        from tessera.passes.tile.kernels import gpu_scan
        return gpu_scan.generate(kop)
    if kind == "rowwise":
        return _rowwise(kop)
    if kind == "reduce":
        return _reduction(kop)
    if kind == "transpose":
        return _transpose(kop)
    return _elementwise(kop)


# --------------------------------------------------------------------------- rowwise
def _rowwise(kop: s.KernelOp):
    from tessera.passes.tile.kernels.rowwise import _Use, _split
    name, T, wave, chunk = _setup(kop, "rowwise")
    block = kop.body.block
    yield_op = block.last_op
    prologue, norm, epilogue = _split(block)
    if isinstance(norm, g.CrossEntropyOp):
        from tessera.passes.tile.kernels import gpu_labels
        return gpu_labels.cross_entropy(kop, prologue, norm, epilogue)
    if isinstance(norm, g.ARGS):
        from tessera.passes.tile.kernels import gpu_labels
        return gpu_labels.arg_extreme(kop, prologue, norm, epilogue)
    if isinstance(norm, g.TopKOp):
        from tessera.passes.tile.kernels import gpu_topk
        return gpu_topk.generate(kop, prologue, norm, epilogue)
    if not isinstance(norm, GPU_ROW_OPS):
        raise ScheduleIllegalError(f"kernel {name}: {norm.name} has no GPU row kernel")
    x = norm.input
    dims = tuple(x.type.dims)
    out = yield_op.operands[0]
    vec_operands = [v for v in (getattr(norm, "scale", None), getattr(norm, "bias", None)) if v is not None]
    leaves = R.find_leaves(block, dims, prologue + epilogue + ([norm] if not prologue else []) + [yield_op])
    for v in vec_operands:
        leaves.update(R.find_leaves(block, dims, [_Use(v)]))
    leaves.pop(norm.result, None)
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out.type.element_type)
    R.register_dims(sig, dims, leaves)
    kf = sig.build()
    b = kf.b
    C = kf.size(dims[-1])
    r = _program_id(b)
    offsets = R.RowCtx(kf, b, r, dims, leaves).offsets
    out_off = b.mul(r, C)
    pro_leaves = [v for v in leaves if v == x or any(v in o.operands for o in prologue)]
    epi_leaves = [v for v in leaves if any(v in o.operands for o in epilogue + [yield_op])]
    eps = norm.eps.value.data if hasattr(norm, "eps") else 0.0

    def x_chunk(bc, c, pad: float = 0.0):
        left = bc.sub(C, c)
        vals = {v: R.load_leaf(kf, bc, leaves[v], offsets[v], c, left, chunk, pad if v == x else None)
                for v in pro_leaves}
        R.emit_ops(bc, prologue, vals, f32)
        xv = vals[x]
        if xv.type.dims != (1, chunk):
            xv = R._widen(bc, xv, chunk)
        return xv, left

    def write(bc, c, left, yv):
        vals = {v: R.load_leaf(kf, bc, leaves[v], offsets[v], c, left, chunk) for v in epi_leaves}
        vals[norm.result] = yv
        R.emit_ops(bc, epilogue, vals, f32)
        R.store_row(kf, bc, out_buf, out.type.element_type, vals[out], bc.add(out_off, c), left, chunk)

    def program(b, held: int):
        """The row's passes; ``held`` > 0: the row fits that many chunks, read once and kept in registers
        (chunks past the row's end are all masked: they read and write nothing)."""
        cached = [x_chunk(b, i * chunk) for i in range(held)]

        def accumulate(kind: str, pad: float, f):
            if held:
                acc = None
                for xv, left in cached:
                    val = mask_cols(b, f(b, xv), left, pad)
                    acc = val if acc is None else elementwise(b, kind, [acc, val])
                return _reduce(b, kind, acc)

            def body(bc, c, carried):
                xv, left = x_chunk(bc, c, pad if kind == "max" else 0.0)
                val = mask_cols(bc, f(bc, xv), left, pad)
                return [elementwise(bc, kind, [carried[0], val])]
            return _reduce(b, kind, b.for_(0, C, chunk, body, [splat_row(b, chunk, pad)])[0])

        def write_pass(f):
            for i, (xv, left) in enumerate(cached):
                write(b, i * chunk, left, f(b, xv, i * chunk, left))
            if held:
                return

            def body(bc, c, _c):
                xv, left = x_chunk(bc, c)
                write(bc, c, left, f(bc, xv, c, left))
                return []
            b.for_(0, C, chunk, body)

        if isinstance(norm, LogSoftmaxOp):    # x - s - log(sum exp(x - s)), s = the maximum clamped finite
            mx = accumulate("max", NEG_INF, lambda bc, xv: xv)
            sh = elementwise(b, "min", [elementwise(b, "max", [mx, tile_const(b, -F32_MAX)]),
                                        tile_const(b, F32_MAX)])
            ssum = accumulate("add", 0.0, lambda bc, xv: elementwise(bc, "exp_bounded", [shift(bc, xv, sh)]))
            lse = elementwise(b, "add", [sh, elementwise(b, "log", [ssum])])
            write_pass(lambda bc, xv, c, left: elementwise(bc, "sub", [xv, lse]))
        elif isinstance(norm, g.SoftmaxOp):
            mx = accumulate("max", NEG_INF, lambda bc, xv: xv)
            ssum = accumulate("add", 0.0, lambda bc, xv: elementwise(bc, "exp_bounded", [shift(bc, xv, mx)]))
            inv = elementwise(b, "recip", [ssum])
            write_pass(lambda bc, xv, c, left: elementwise(bc, "mul", [
                elementwise(bc, "exp_bounded", [shift(bc, xv, mx)]), inv]))
        else:
            nt = t.SplatIndexOp.create(operands=[b.c(C)], result_types=[t.tile_type(1, 1, f32)])
            b.op(nt)
            inv_n = elementwise(b, "recip", [nt.result])
            if isinstance(norm, g.LayerNormOp):
                mean = elementwise(b, "mul", [accumulate("add", 0.0, lambda bc, xv: xv), inv_n])
                var = elementwise(b, "mul", [accumulate("add", 0.0, lambda bc, xv: elementwise(
                    bc, "mul", [elementwise(bc, "sub", [xv, mean])] * 2)), inv_n])
            else:
                mean = None
                var = elementwise(b, "mul", [accumulate("add", 0.0, lambda bc, xv: elementwise(bc, "mul", [xv, xv])),
                                             inv_n])
            rstd = elementwise(b, "rsqrt", [elementwise(b, "add", [var, tile_const(b, eps)])])

            def normalise(bc, xv, c, left):
                y = elementwise(bc, "sub", [xv, mean]) if mean is not None else xv
                y = elementwise(bc, "mul", [y, rstd])
                for v, fn in ((getattr(norm, "scale", None), "mul"), (getattr(norm, "bias", None), "add")):
                    if v is not None:
                        y = elementwise(bc, fn, [y, R.load_leaf(kf, bc, leaves[v], offsets[v], c, left, chunk)])
                return y
            write_pass(normalise)
        return []

    # rows of at most one chunk (2048 f16 / 1024 f32 columns with 256 threads) or HELD chunks are read
    # once and kept in registers; longer rows loop over their chunks in every pass
    b.if_(b.cmp("sle", C, chunk), lambda b1: program(b1, 1), lambda be: be.if_(
        be.cmp("sle", C, HELD * chunk), lambda b4: program(b4, HELD), lambda bl: program(bl, 0)) and [])
    nrows = D.product(dims[:-1])
    return _finish(kf, kf.finish(), [D.ceil_extent(nrows, 1)], T, wave), sig.dims, 0, []


def _gather(kop: s.KernelOp):
    from tessera.passes.tile.kernels import gpu_labels
    ops = [o for o in kop.body.block.ops if not isinstance(o, (g.YieldOp, g.ReshapeOp))]
    if len(ops) != 1 or not isinstance(ops[0], (g.OneHotOp, g.TakeOp, g.TakeAlongAxisOp)):
        names = ", ".join(o.name for o in ops)
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data} ({names}): the GPU lanes have one_hot, take and "
                                   'take_along_axis gather kernels only; target="cpu" compiles it')
    if isinstance(ops[0], g.TakeAlongAxisOp):
        return gpu_labels.take_along_axis(kop, ops[0])
    if isinstance(ops[0], g.TakeOp):
        return gpu_labels.take(kop, ops[0])
    return gpu_labels.one_hot(kop, ops[0])


# --------------------------------------------------------------------------- reductions
def _reduction(kop: s.KernelOp):
    name, T, wave, chunk = _setup(kop, "reduce")
    block = kop.body.block
    red = [o for o in block.ops if isinstance(o, g.REDUCTIONS)]
    if len(red) != 1 or list(block.last_op.operands) != [red[0].result]:
        raise ScheduleIllegalError(f"kernel {name}: a reduce kernel holds one reduction")
    op = red[0]
    if not isinstance(op, GPU_REDUCTIONS):
        raise ScheduleIllegalError(f"kernel {name}: {op.name} has no GPU kernel")
    view = trace_view(op.input, block)
    xd = tuple(op.input.type.dims)
    axes = sorted(a % len(xd) for a in ints(op.axes))
    if view is None or list(view.strides) != row_major_strides(xd) or axes != list(range(axes[0], axes[-1] + 1)):
        raise ScheduleIllegalError(f"kernel {name}: {op.name} on the GPU reduces a contiguous run of axes of a "
                                   "contiguous tensor")
    outer, rlen, inner = D.product(xd[:axes[0]]), D.product(xd[axes[0]:axes[-1] + 1]), D.product(xd[axes[-1] + 1:])
    kind, pad = ("max", NEG_INF) if isinstance(op, g.ReduceMaxOp) else ("add", 0.0)
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_elem = op.result.type.element_type
    out_buf = sig.buffer(out_elem)
    for d in (outer, rlen, inner):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    Rn, In = kf.size(rlen), kf.size(inner)
    r = _program_id(b)
    lf = R.Leaf(op.input, view, "contig", 1, op.input.type.element_type)

    def mean(acc):
        if not isinstance(op, g.ReduceMeanOp):
            return acc
        n = t.SplatIndexOp.create(operands=[b.c(Rn)], result_types=[t.tile_type(1, 1, f32)])
        b.op(n)
        return elementwise(b, "div", [acc, n.result])

    def out_view(off, width, cols):
        ov = t.ViewOp.create(operands=[kf.buffer_args[out_buf], b.c(off), b.c(0), b.c(1), b.c(1), b.c(cols)],
                             result_types=[t.view_type(1, width, out_elem, "global")])
        b.op(ov)
        return ov.result

    if inner == 1:   # the last axes: one workgroup per row, the row in chunks folded across the workgroup
        base = b.mul(r, Rn)

        def body(bc, c, carried):
            left = bc.sub(Rn, c)
            xv = mask_cols(bc, R.load_leaf(kf, bc, lf, base, c, left, chunk, pad), left, pad)
            return [elementwise(bc, kind, [carried[0], xv])]
        acc = _reduce(b, kind, b.for_(0, Rn, chunk, body, [splat_row(b, chunk, pad)])[0])
        b.op(t.StoreOp.create(operands=[mean(acc), out_view(r, 1, 1)]))
        grid = [D.ceil_extent(outer, 1)]
    else:            # inner axes follow: one workgroup per (outer index, chunk of inner columns), rows summed
        c = b.mul(_program_id(b, 1), chunk)      # per thread, no exchange; coalesced along the inner axis
        left = b.sub(In, c)
        base = b.add(b.mul(r, b.mul(Rn, In)), c)

        def body(bc, rr, carried):
            return [elementwise(bc, kind, [carried[0], R.load_leaf(kf, bc, lf, bc.add(base, bc.mul(rr, In)), 0,
                                                                   left, chunk, pad)])]
        acc = b.for_(0, Rn, 1, body, [splat_row(b, chunk, pad)])[0]
        b.op(t.StoreOp.create(operands=[mean(acc), out_view(b.add(b.mul(r, In), c), chunk, left)]))
        grid = [D.ceil_extent(outer, 1), D.ceil_extent(inner, chunk)]
    return _finish(kf, kf.finish(), grid, T, wave), sig.dims, 0, []


# --------------------------------------------------------------------------- copies and chains
def _elementwise(kop: s.KernelOp):
    from tessera.passes.tile.kernels.typed import emit_iotas, row_digit
    name, T, wave, chunk = _setup(kop, "elementwise")
    block = kop.body.block
    yield_op = block.last_op
    outs = list(yield_op.operands)
    out_dims = outs[0].type.dims
    if any(o.type.dims != out_dims for o in outs):
        raise ScheduleIllegalError(f"kernel {name}: outputs of one elementwise kernel share a shape")
    compute = [o for o in block.ops if o is not yield_op and not isinstance(o, (g.ReshapeOp, g.TransposeOp,
                                                                                g.SliceOp))]
    for o in compute:
        if isinstance(o, g.TakeOp):
            raise ScheduleIllegalError(f"kernel {name}: {o.name} has no lowering inside a GPU elementwise kernel; "
                                       'target="cpu" compiles it')
    iotas = any(isinstance(o, g.IotaOp) for o in compute)    # computed from the row / column indices
    from tessera.passes.tile.kernels.elementwise import _segments
    segments = _segments(kop, compute)     # a join along the last axis: its operands' column segments
    seg_leaves = []
    if segments:
        cat, subs = segments
        inner = {o for sub in subs for o in sub}
        compute = [o for o in compute if o not in inner and o is not cat]
        seg_leaves = [R.find_leaves(block, tuple(v.type.dims), sub, extra=(v,)) for v, sub in zip(cat.inputs, subs)]
    dims = tuple(out_dims) if out_dims else (1,)
    leaves = R.find_leaves(block, dims, compute + [yield_op])
    flat = not segments and not iotas and all(lf.mode == "contig" or (lf.mode == "bcast" and lf.col_stride == 0)
                                              for lf in leaves.values())
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_bufs = [sig.buffer(o.type.element_type) for o in outs]
    total = D.product(dims)
    if flat:
        sig.dim(total)
    else:
        R.register_dims(sig, dims, leaves)
        for v, lv in zip(segments[0].inputs, seg_leaves) if segments else ():
            R.register_dims(sig, tuple(v.type.dims), lv)
    kf = sig.build()
    b = kf.b

    def chunk_at(bc, c, row_len, offsets, out_off, seg=None):
        left = bc.sub(row_len, c)
        vals = {v: R.load_leaf(kf, bc, lf, offsets[v], c, left, chunk) for v, lf in leaves.items()}
        if iotas:      # an iota along the last axis: the chunk's columns; along another: the row's coordinate
            emit_iotas(bc, compute, vals, f32, len(dims), lambda ax: (
                (c, (1, chunk), 0, 1) if ax == len(dims) - 1 else (row_digit(bc, kf, r, dims, ax), (1, 1), 0, 0)))
        if seg is not None:    # this segment's operand of the join, from its own leaves at column c - start
            i, start, sub_offsets = seg
            cs = segment_col(bc, c, start)
            sub = {v: R.load_leaf(kf, bc, lf, sub_offsets[v], cs, left, chunk) for v, lf in seg_leaves[i].items()}
            R.emit_ops(bc, subs[i], sub, f32)
            vals[cat.result] = sub[cat.inputs[i]]
        R.emit_ops(bc, compute, vals, f32)
        for o, bi in zip(outs, out_bufs):
            R.store_row(kf, bc, bi, o.type.element_type, vals[o], bc.add(out_off, c), left, chunk)
        return []

    if flat:   # one workgroup per chunk of the flat tensor
        N = kf.size(total)
        c = b.mul(_program_id(b), chunk)
        chunk_at(b, c, N, {v: 0 for v in leaves}, 0)
        grid = [D.ceil_extent(total, chunk)]
    else:      # one workgroup per row of the output, the row in chunks (per segment of a join)
        C = kf.size(dims[-1])
        r = _program_id(b)     # chunk_at's iotas read it
        offsets = R.RowCtx(kf, b, r, dims, leaves).offsets
        out_off = b.mul(r, C)
        if not segments:
            b.for_(0, C, chunk, lambda bc, c, _c: chunk_at(bc, c, C, offsets, out_off))
        else:
            start = 0
            for i, v in enumerate(cat.inputs):
                end = start + v.type.dims[-1]
                so = R.RowCtx(kf, b, r, tuple(v.type.dims), seg_leaves[i]).offsets
                b.for_(start, end, chunk, lambda bc, c, _c, i=i, start=start, end=end, so=so:
                       chunk_at(bc, c, end, offsets, out_off, (i, start, so)))
                start = end
        grid = [D.ceil_extent(D.product(dims[:-1]), 1)]
    return _finish(kf, kf.finish(), grid, T, wave), sig.dims, 0, []


def _transpose(kop: s.KernelOp):
    """A copy through permuted strides: rows of the output written with vector stores; the input read
    with vectors where the permutation keeps the last axis, element by element where it moves it."""
    name, T, wave, chunk = _setup(kop, "transpose")
    block = kop.body.block
    out = block.last_op.operands[0]
    while isinstance(out.owner, g.ReshapeOp) and trace_view(out, block) is None:
        out = out.owner.input
    view = trace_view(out, block)
    if view is None:
        raise ScheduleIllegalError(f"kernel {name}: a transpose kernel copies a kernel input seen through "
                                   "transposes/reshapes")
    dims = tuple(out.type.dims)
    elem = out.type.element_type
    lf = R.Leaf(out, view, "general", 1, elem)
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(elem)
    R.register_dims(sig, dims, {out: lf})
    last = sig.dim(view.strides[-1])
    kf = sig.build()
    b = kf.b
    C = kf.size(dims[-1])
    r = _program_id(b)
    base = R.RowCtx(kf, b, r, dims, {out: lf}).offsets[out]
    cs = kf.size(last)
    out_off = b.mul(r, C)
    reg = elem if isinstance(elem, IntegerType) else f32     # ints copied exactly, in their own lanes

    def body(bc, c, _c):
        left = bc.sub(C, c)
        src = t.ViewOp.create(operands=[kf.buffer_args[view.arg], bc.c(bc.add(base, bc.mul(c, cs))), bc.c(0),
                                        bc.c(cs), bc.c(1), bc.c(left)], result_types=[t.view_type(1, chunk, elem,
                                                                                                  "global")])
        bc.op(src)
        ld = t.LoadOp.create(operands=[src.result], result_types=[t.tile_type(1, chunk, reg)])
        bc.op(ld)
        R.store_row(kf, bc, out_buf, elem, ld.result, bc.add(out_off, c), left, chunk)
        return []
    b.for_(0, C, chunk, body)
    return _finish(kf, kf.finish(), [D.ceil_extent(D.product(dims[:-1]), 1)], T, wave), sig.dims, 0, []


__all__ = ["KINDS", "GPU_ROW_OPS", "GPU_REDUCTIONS", "generate", "shift"]
