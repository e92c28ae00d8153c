"""Row kernels of ``logsumexp`` and ``log_softmax`` over the last axis (a ``rowwise`` group whose
row op is one of ``graph.ROW_LOG``; ``rowwise.generate`` hands it here).

Per row, each pass reading x through the fused elementwise prologue:

  pass 1: m = the row's maximum (select_max per lane, masked tail = -inf), then the shift
          s = min(max(m, -MAX), MAX) with MAX the register type's largest finite value: a finite
          m is kept, an all -inf row shifts by -MAX (x - s = -inf, exp 0, sum 0: log gives -inf)
          and a +inf entry by MAX (exp(inf) = inf: the sum is inf), which is scipy's result where
          it shifts by 0 instead; a NaN maximum stays NaN (the row is NaN).  A NaN select_max drops
          reaches the sum.
  pass 2: sum of exp(x - s) (``exp``: x - s exceeds 88.7 only on a +inf entry, which must give inf)
  logsumexp:   one value per row, s + log(sum), stored at the row's index
  log_softmax: pass 3 writes (x - s) - log(sum) through the elementwise epilogue.

Sums are per-lane partial sums in a [1, chunk] tile reduced once per row in a fixed order; bf16 /
f16 inputs compute in f32 registers, f64 in f64.
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerType, StringAttr, f64

from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, mask_cols, splat_row, tile_const
from tessera.passes.tile.kernels.typed import elementwise_typed
from tessera.passes.util import register_elem

F32_MAX = 3.4028234663852886e38
F64_MAX = 1.7976931348623157e308


def _reduce(b, kind: str, tile_v):
    op = t.ReduceOp.create(operands=[tile_v], attributes={"kind": StringAttr(kind), "axis": i64_attr(1)},
                           result_types=[t.tile_type(1, 1, tile_v.type.element_type)])
    b.op(op)
    return op.result


class _Reads:
    """A stand-in op whose only operand is ``v`` (find_leaves scans operands)."""

    name = "reads"

    def __init__(self, v):
        self.operands = [v]


class RowSetup:
    """What a row kernel over the last axis with a fused elementwise prologue (and, for a row-shaped
    result, epilogue) needs: its signature, sizes, leaves, and ``x_chunk`` (the prologue applied to
    one chunk of a row).  Shared with ``argrows.py``."""

    def __init__(self, kop, prologue, op, epilogue, row_shaped: bool):
        block = kop.body.block
        yield_op = block.last_op
        self.x = x = op.input
        self.dims = dims = tuple(x.type.dims)
        outs = list(yield_op.operands)
        if row_shaped:
            ok = len(outs) == 1 and outs[0].type.dims == dims
        else:   # the op's own results (top_k: values and/or indices), no epilogue
            ok = 0 < len(outs) <= len(op.results) and all(o in op.results for o in outs) and not epilogue
        if not ok:
            raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a {op.name} kernel yields one result of its "
                                       "row op's shape (one value per row: no epilogue)")
        self.outs = outs
        self.out = outs[0]
        self.prologue, self.epilogue, self.op = prologue, epilogue, op
        self.chunk = R.chunk_of(kop)
        # the row op's own input (cross_entropy's labels, one per row, are read by its generator)
        leaves = R.find_leaves(block, dims, prologue + epilogue + ([_Reads(x)] if not prologue else []) + [yield_op])
        for res in op.results:
            leaves.pop(res, None)
        self.leaves = leaves
        sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
        for v in kop.inputs:
            sig.buffer(v.type.element_type)
        self.out_bufs = [sig.buffer(o.type.element_type) for o in outs]
        self.out_buf = self.out_bufs[0]
        R.register_dims(sig, dims, leaves)
        self.sig = sig
        self.kf = kf = sig.build()
        self.b = b = kf.b
        self.C = kf.size(dims[-1])
        self.reg = kf.reg
        nrows = 1
        for d in dims[:-1]:
            nrows = b.mul(nrows, kf.size(d))
        self.nrows = nrows
        self.stream = R.stream_flag(b, b.mul(nrows, self.C))
        self.pro_leaves = [v for v in leaves if v == x or any(v in o.operands for o in prologue)]
        self.epi_leaves = [v for v in leaves if any(v in o.operands for o in epilogue + [yield_op])]

    def x_chunk(self, bc, ctx, c, pad: float = 0.0):
        left = bc.sub(self.C, c)
        vals = {v: R.load_leaf(self.kf, bc, self.leaves[v], ctx.offsets[v], c, left, self.chunk,
                               pad if v == self.x else None) for v in self.pro_leaves}
        R.emit_ops(bc, self.prologue, vals, self.reg)
        xv = vals[self.x]
        if xv.type.dims != (1, self.chunk):
            xv = R._widen(bc, xv, self.chunk)
        return xv, left

    def row_ctx(self, br, r):
        return R.RowCtx(self.kf, br, r, self.dims, self.leaves)

    def store_one(self, br, r, value, which: int = 0) -> None:
        """Store a [1, 1] value at element r of the kernel's output ``which``."""
        elem = self.outs[which].type.element_type
        if isinstance(elem, IntegerType) and value.type.element_type != elem:   # indices: float -> int
            value = elementwise_typed(br, "cvt", [value], elem)
        view = t.ViewOp.create(operands=[self.kf.buffer_args[self.out_bufs[which]], br.c(r), br.c(0), br.c(1),
                                         br.c(1), br.c(1)], result_types=[t.view_type(1, 1, elem, "global")])
        br.op(view)
        br.op(t.StoreOp.create(operands=[value, view.result]))

    def finish(self):
        return self.kf.finish(), self.sig.dims, 0, []


def generate(kop, prologue, op, epilogue):
    lse = isinstance(op, g.ROW_LOG[0])
    S = RowSetup(kop, prologue, op, epilogue, row_shaped=not lse)
    kf, b, C, chunk, reg, leaves, out = S.kf, S.b, S.C, S.chunk, S.reg, S.leaves, S.out
    big = F64_MAX if reg == f64 else F32_MAX
    x_chunk = S.x_chunk

    def row_step(br, r, _c):
        ctx = S.row_ctx(br, r)
        nxt = S.row_ctx(br, br.add(r, 2)).offsets

        def max_body(bc, c, carried):
            xv, left = x_chunk(bc, ctx, c, float("-inf"))
            xv = mask_cols(bc, xv, left, float("-inf"))
            return [elementwise(bc, "select_max", [carried[0], xv])]

        mx = _reduce(br, "max", br.for_(0, C, chunk, max_body, [splat_row(br, chunk, float("-inf"), reg)])[0])
        shift = elementwise(br, "min", [elementwise(br, "max", [mx, tile_const(br, -big, reg)]),
                                        tile_const(br, big, reg)])

        def sum_body(bc, c, carried):
            R.prefetch_leaves(kf, bc, leaves, nxt, c, chunk)
            xv, left = x_chunk(bc, ctx, c)
            e = mask_cols(bc, elementwise(bc, "exp", [elementwise(bc, "sub", [xv, shift])]), left, 0.0)
            return [elementwise(bc, "add", [carried[0], e])]

        ssum = _reduce(br, "add", br.for_(0, C, chunk, sum_body, [splat_row(br, chunk, 0.0, reg)])[0])
        log_sum = elementwise(br, "log", [ssum])
        if lse:
            S.store_one(br, r, elementwise(br, "add", [log_sum, shift]))
            return []

        def write(bc, c, _c2):
            xv, left = x_chunk(bc, ctx, c)
            y = elementwise(bc, "sub", [elementwise(bc, "sub", [xv, shift]), log_sum])
            vals = {v: R.load_leaf(kf, bc, leaves[v], ctx.offsets[v], c, left, chunk) for v in S.epi_leaves}
            vals[op.result] = y
            R.emit_ops(bc, epilogue, vals, reg)
            R.store_row(kf, bc, S.out_buf, out.type.element_type, vals[out], bc.add(bc.mul(r, C), c), left, chunk,
                        S.stream)
            return []

        br.for_(0, C, chunk, write)
        return []

    R.for_rows(kf, b, S.nrows, row_step)
    return S.finish()
