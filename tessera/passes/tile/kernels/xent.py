"""Row kernel of ``cross_entropy`` (``graph_rows.CrossEntropyOp``; ``rowwise.generate`` hands it
here): per row of logits, with their fused elementwise prologue, and the row's integer label y
(read once per row from a contiguous [rows] buffer and converted to the registers' float type):

  pass 1: m = the row's maximum (select_max) and p = the logit at column y (a running max of
          ``mask_select(x, same(column, y))``: -inf where no column is y); the shift s is logrows'
          clamp of m (an all -inf row gives -inf, a +inf logit +inf);
  pass 2: the sum of exp(x - s);
  loss  = (s + log(sum)) - p, valid = 1 - same(y, ignore_index), and an ignored row stores
          ``safe_div(loss, valid)`` = 0 whatever its logits hold.

Neither a one-hot row nor the softmax is ever formed.  A label outside [0, C) other than
ignore_index matches no column (no memory is read for it): p = -inf, the loss +inf.
"""
from __future__ import annotations

from tessera.errors import ScheduleIllegalError
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.argrows import column_indices
from tessera.passes.tile.kernels.common import elementwise as ew
from tessera.passes.tile.kernels.common import mask_cols, row_major_strides, splat_row, tile_const, trace_view
from tessera.passes.tile.kernels.logrows import F32_MAX, F64_MAX, RowSetup, _reduce
from tessera.passes.tile.kernels.typed import elementwise_typed

NEG_INF = float("-inf")
PICK = True   # the picked logit enters the loss (a test plants False: the loss is logsumexp alone)


def generate(kop, prologue, op, epilogue):
    S = RowSetup(kop, prologue, op, epilogue, row_shaped=False)
    b, C, chunk, reg = S.b, S.C, S.chunk, S.reg
    block = kop.body.block
    lv = trace_view(op.labels, block)
    ldims = tuple(op.labels.type.dims)
    if lv is None or lv.offset or list(lv.strides) != row_major_strides(ldims):
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: cross_entropy reads contiguous labels")
    lbuf, lelem = S.kf.buffer_args[lv.arg], op.labels.type.element_type
    big = F64_MAX if str(reg) == "f64" else F32_MAX
    ignore = float(ival(op.ignore_index))
    which = {id(v): i for i, v in enumerate(S.outs)}

    def row_step(br, r, _c):
        ctx = S.row_ctx(br, r)
        view = t.ViewOp.create(operands=[lbuf, br.c(r), br.c(0), br.c(1), br.c(1), br.c(1)],
                               result_types=[t.view_type(1, 1, lelem, "global")])
        br.op(view)
        ld = t.LoadOp.create(operands=[view.result], result_types=[t.tile_type(1, 1, lelem)])
        br.op(ld)
        y = elementwise_typed(br, "cvt", [ld.result], reg)   # the label as a float (exact below 2^24 in f32)

        def max_body(bc, c, carried):
            xv, left = S.x_chunk(bc, ctx, c, NEG_INF)
            xv = mask_cols(bc, xv, left, NEG_INF)
            hit = ew(bc, "same", [column_indices(bc, chunk, c, reg), y])
            picked = mask_cols(bc, ew(bc, "mask_select", [xv, hit]), left, NEG_INF)
            return [ew(bc, "select_max", [carried[0], xv]), ew(bc, "max", [carried[1], picked])]

        acc_m, acc_p = br.for_(0, C, chunk, max_body, [splat_row(br, chunk, NEG_INF, reg)] * 2)
        m, p = _reduce(br, "max", acc_m), _reduce(br, "max", acc_p)
        shift = ew(br, "min", [ew(br, "max", [m, tile_const(br, -big, reg)]), tile_const(br, big, reg)])

        def sum_body(bc, c, carried):
            xv, left = S.x_chunk(bc, ctx, c)
            e = mask_cols(bc, ew(bc, "exp", [ew(bc, "sub", [xv, shift])]), left, 0.0)
            return [ew(bc, "add", [carried[0], e])]

        ssum = _reduce(br, "add", br.for_(0, C, chunk, sum_body, [splat_row(br, chunk, 0.0, reg)])[0])
        lse = ew(br, "add", [ew(br, "log", [ssum]), shift])
        loss = ew(br, "sub", [lse, p]) if PICK else lse
        valid = ew(br, "sub", [tile_const(br, 1.0, reg), ew(br, "same", [y, tile_const(br, ignore, reg)])])
        for res, val in ((op.loss, ew(br, "safe_div", [loss, valid])), (op.valid, valid)):
            if id(res) in which:
                S.store_one(br, r, val, which[id(res)])
        return []

    R.for_rows(S.kf, b, S.nrows, row_step)
    return S.finish()
