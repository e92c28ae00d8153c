"""Row kernel of ``top_k`` over the last axis (a ``rowwise`` group whose row op is
``graph_rows.TopKOp``; ``rowwise.generate`` hands it here), with the fused elementwise prologue.

The order is: a NaN above everything, then descending values, equal values by lower index (a
stable descending sort; torch.topk's order).  Selection, k rounds per row over the cached row; the
round after picking (pv, pi) considers only the entries ordered after it:

  eligible(v, i) = v is the same as pv (equal, or both NaN) ? i > pi : max(v, pv) is the same as pv

with numpy's NaN-keeping max (so a NaN pv admits every non-NaN value, a finite pv no NaN), all
written with the tile fns ``same`` / ``max`` on 0.0 / 1.0 flags.  Round j:

  pass A: m = the maximum of the eligible entries (ineligible ones -inf; a NaN stays);
  pass B: the first eligible column whose value is the same as m (argrows' negated-index max);
  store m and that column at [row, j]; they are the next round's (pv, pi).

The first round starts from (NaN, -1), which makes every entry eligible.  O(k n) per row; indices
are converted to ``graph_rows.INDEX_ELEM`` (int64) as they are stored.
"""
from __future__ import annotations

from tessera.ir.attrs import ival
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.argrows import column_indices
from tessera.passes.tile.kernels.common import elementwise, mask_cols, splat_row, tile_const
from tessera.passes.tile.kernels.logrows import RowSetup, _reduce

NEG_INF = float("-inf")
STABLE = True   # equal values by lower index (a test plants False: ties no longer excluded by index)


def generate(kop, prologue, op, epilogue):
    S = RowSetup(kop, prologue, op, epilogue, row_shaped=False)
    b, C, chunk, reg = S.b, S.C, S.chunk, S.reg
    k = ival(op.k)
    which = {id(v): i for i, v in enumerate(S.outs)}
    ew = elementwise

    def eligible(bc, v, idx, pv, pi):
        s = ew(bc, "same", [v, pv])
        after = ew(bc, "same", [ew(bc, "max", [idx, ew(bc, "add", [pi, tile_const(bc, 0.5, reg)])]), idx])
        below = ew(bc, "same", [ew(bc, "max", [v, pv]), pv])
        if not STABLE:
            after = tile_const(bc, 1.0, reg)
        # s ? after : below, and s implies below: below - s * (1 - after)
        return ew(bc, "sub", [below, ew(bc, "mul", [s, ew(bc, "sub", [tile_const(bc, 1.0, reg), after])])])

    def row_step(br, r, _c):
        ctx = S.row_ctx(br, r)

        def pick(bj, j, carried):
            pv, pi = carried

            def max_body(bc, c, acc):
                xv, left = S.x_chunk(bc, ctx, c)
                el = eligible(bc, xv, column_indices(bc, chunk, c, reg), pv, pi)
                cand = mask_cols(bc, ew(bc, "mask_select", [xv, el]), left, NEG_INF)
                return [ew(bc, "max", [acc[0], cand])]

            m = _reduce(bj, "max", bj.for_(0, C, chunk, max_body, [splat_row(bj, chunk, NEG_INF, reg)])[0])

            def find_body(bc, c, acc):
                xv, left = S.x_chunk(bc, ctx, c)
                idx = column_indices(bc, chunk, c, reg)
                hit = ew(bc, "mul", [eligible(bc, xv, idx, pv, pi), ew(bc, "same", [xv, m])])
                cand = mask_cols(bc, ew(bc, "mask_select", [ew(bc, "neg", [idx]), hit]), left, NEG_INF)
                return [ew(bc, "select_max", [acc[0], cand])]

            first = ew(bj, "neg", [_reduce(bj, "max", bj.for_(0, C, chunk, find_body,
                                                              [splat_row(bj, chunk, NEG_INF, reg)])[0])])
            at = bj.add(bj.mul(r, k), j)
            for res, val in ((op.values, m), (op.indices, first)):
                if id(res) in which:
                    S.store_one(bj, at, val, which[id(res)])
            return [m, first]

        br.for_(0, k, 1, pick, [tile_const(br, float("nan"), reg), tile_const(br, -1.0, reg)])
        return []

    R.for_rows(S.kf, b, S.nrows, row_step)
    return S.finish()
