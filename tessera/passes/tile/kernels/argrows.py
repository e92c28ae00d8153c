"""Row kernels of ``argmax`` / ``argmin`` over the last axis (a ``rowwise`` group whose row op is
one of ``graph.ARGS``; ``rowwise.generate`` hands it here), with the fused elementwise prologue.

Per row, two passes over x:

  pass 1: m = the row's maximum (minimum) as numpy's: per-lane ``max`` (``min``), which keeps a NaN,
          and a ``tile.reduce`` that keeps it too; the masked tail reads -inf (+inf).
  pass 2: the first column whose value is m -- or is NaN when m is (numpy: the first NaN's index):
          per lane ``same(x, m)`` selects -(column index) (``mask_select``: -inf where not a match;
          column indices are a ``tile.constant`` with a step plus the chunk's start), a running
          ``select_max`` keeps the lowest matching column, the masked tail is -inf; the row's
          maximum of those negated indices is the first index.

The index is computed in the float registers (exact below 2^24 columns in f32) and converted to
``graph_rows.INDEX_ELEM`` (int64) as it is stored.
"""
from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr

from tessera.ir import tile as t
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import elementwise, mask_cols, splat_row
from tessera.passes.tile.kernels.logrows import RowSetup, _reduce

NEG_INF, POS_INF = float("-inf"), float("inf")
# the per-lane extreme of pass 1: numpy's max / min, which keep a NaN (tests plant select_max here)
EXTREME = {"max": "max", "min": "min"}
FIRST = True   # the first matching index on ties (a test plants False: the last one)


def column_indices(b, chunk: int, c, reg):
    """A [1, chunk] tile of c, c + 1, ..., c + chunk - 1 (c: an index value)."""
    iota = t.ConstantOp.create(attributes={"value": FloatAttr(0.0, reg), "step": FloatAttr(1.0, reg)},
                               result_types=[t.tile_type(1, chunk, reg)])
    b.op(iota)
    start = t.SplatIndexOp.create(operands=[b.c(c)], result_types=[t.tile_type(1, 1, reg)])
    b.op(start)
    return elementwise(b, "add", [iota.result, start.result])


def generate(kop, prologue, op, epilogue):
    S = RowSetup(kop, prologue, op, epilogue, row_shaped=False)
    b, C, chunk, reg = S.b, S.C, S.chunk, S.reg
    kind = op.KIND                         # max | min
    pad = NEG_INF if kind == "max" else POS_INF

    def row_step(br, r, _c):
        ctx = S.row_ctx(br, r)

        def ext_body(bc, c, carried):
            xv, left = S.x_chunk(bc, ctx, c, pad)
            return [elementwise(bc, EXTREME[kind], [carried[0], mask_cols(bc, xv, left, pad)])]

        m = _reduce(br, kind, br.for_(0, C, chunk, ext_body, [splat_row(br, chunk, pad, reg)])[0])

        def find_body(bc, c, carried):
            xv, left = S.x_chunk(bc, ctx, c)
            idx = column_indices(bc, chunk, c, reg)
            neg_idx = elementwise(bc, "neg", [idx]) if FIRST else idx
            cand = mask_cols(bc, elementwise(bc, "mask_select", [neg_idx, elementwise(bc, "same", [xv, m])]),
                             left, NEG_INF)
            return [elementwise(bc, "select_max", [carried[0], cand])]

        first = _reduce(br, "max", br.for_(0, C, chunk, find_body, [splat_row(br, chunk, NEG_INF, reg)])[0])
        S.store_one(br, r, elementwise(br, "neg", [first]) if FIRST else first)
        return []

    R.for_rows(S.kf, b, S.nrows, row_step)
    return S.finish()
