"""``top_k`` over the last axis on the GPU lanes, as Tile IR written per workgroup (one workgroup per
row; ``gpu_rows.generate`` hands a ``rowwise`` group whose row op is ``graph_rows.TopKOp`` here).

The order is the CPU lane's (``kernels/topk.py``, whose :func:`~tessera.passes.tile.kernels.topk.above`
this kernel shares): a NaN above everything, then descending values, equal values by lower index.
That order is total over the row's entries (value, column), so the k best are found by k selection
steps, each taking the best entry that ranks *below* the one the previous step took (the first step
starts from a sentinel (NaN, -1) that ranks above every entry):

  step j:  eligible  = the columns ranking below (v[j-1], i[j-1])
           v[j]      = the maximum of the eligible values (numpy's max: a NaN stays)
           i[j]      = the minimum column among the eligible ones equal to v[j] (NaN matching NaN)

Each maximum / minimum is one ``tile.reduce`` (warp shuffles and one shared-memory exchange); the
row's chunks are masked past its end (a masked column is never eligible).  A row of at most one chunk,
or of at most ``gpu_rows.HELD`` chunks, is read once and kept in registers for every step; a longer
row is re-read twice per step (from L2).  Work is O(k n) per row, so k is bounded (``MAX_K``; above
it the schedule refuses the kernel with a coded error).  Column indices are carried in f32 registers
(exact below 2^24 columns) and stored as int64 by thread 0, the value in the input's dtype (it is one
of the row's values, so the store rounds nothing).
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerType, f32

from tessera.errors import ScheduleIllegalError
from tessera.ir.attrs import ival
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels import topk as CPU
from tessera.passes.tile.kernels.common import elementwise, mask_cols, splat_row, tile_const
from tessera.passes.tile.kernels.gpu_labels import _columns, _reduce
from tessera.passes.tile.kernels.typed import elementwise_typed

MAX_K = 128          # the largest k the GPU kernel takes (k selection steps over the row)
NEG_INF = float("-inf")
I1, I32 = IntegerType(1), IntegerType(32)
FIRST = True         # ties: the lowest eligible column (a test plants False: the highest)


def generate(kop, prologue, op, epilogue):
    from tessera.passes.tile.kernels.gpu_rowin import RowInput
    from tessera.passes.tile.kernels.gpu_rows import HELD
    outs = list(kop.body.block.last_op.operands)
    S = RowInput(kop, prologue, op, epilogue, [o.type.element_type for o in outs], "top_k")
    if not all(o in (op.values, op.indices) for o in outs):
        raise ScheduleIllegalError(f"kernel {S.name}: the GPU top_k kernel yields its values and indices only")
    k = ival(op.k)
    if k > MAX_K:
        raise ScheduleIllegalError(f"kernel {S.name}: top_k with k = {k} has no GPU kernel (k <= {MAX_K}); "
                                   'target="cpu" compiles it')
    kf, b, C, chunk, out_bufs = S.kf, S.b, S.C, S.chunk, S.out_bufs
    out_base = b.mul(S.r, k)
    fold, none = ("min", float("inf")) if FIRST else ("max", NEG_INF)

    def x_chunk(bc, c):
        x, left = S.chunk_at(bc, c, NEG_INF)
        return x, elementwise_typed(bc, "cvt", [_columns(bc, c, chunk, I32)], f32), left

    def program(b, held: int):
        cached = [x_chunk(b, i * chunk) for i in range(held)]

        def fold_row(bb, kind, pad, f):
            """``kind``-reduction over the row of f(x, col, left) (masked with ``pad`` past the end)."""
            if held:
                acc = None
                for x, col, left in cached:
                    val = mask_cols(bb, f(bb, x, col), left, pad)
                    acc = val if acc is None else elementwise(bb, kind, [acc, val])
                return _reduce(bb, kind, acc)

            def body(bc, c, carried):
                x, col, left = x_chunk(bc, c)
                return [elementwise(bc, kind, [carried[0], mask_cols(bc, f(bc, x, col), left, pad)])]
            return _reduce(bb, kind, bb.for_(0, C, chunk, body, [splat_row(bb, chunk, pad)])[0])

        def step(bs, j, carried):
            pv, pi = carried

            def eligible(bc, x, col):
                return CPU.above(bc, pv, pi, x, col)
            m = fold_row(bs, "max", NEG_INF, lambda bc, x, col: elementwise_typed(
                bc, "select", [eligible(bc, x, col), x, tile_const(bc, NEG_INF)], f32))
            m_nan = elementwise_typed(bs, "isnan", [m], I1)

            def candidate(bc, x, col):
                same = elementwise_typed(bc, "or", [elementwise_typed(bc, "cmp_eq", [x, m], I1), elementwise_typed(
                    bc, "and", [elementwise_typed(bc, "isnan", [x], I1), m_nan], I1)], I1)
                hit = elementwise_typed(bc, "and", [same, eligible(bc, x, col)], I1)
                return elementwise_typed(bc, "select", [hit, col, tile_const(bc, none)], f32)
            i = fold_row(bs, fold, none, candidate)
            off = bs.add(out_base, j)
            for o, buf in zip(outs, out_bufs):
                elem = o.type.element_type
                val = elementwise_typed(bs, "cvt", [i], elem) if o is op.indices else m
                R.store_row(kf, bs, buf, elem, val, off, 1, 1)
            return [m, i]
        b.for_(0, k, 1, step, [tile_const(b, float("nan")), tile_const(b, -1.0)])
        return []

    b.if_(b.cmp("sle", C, chunk), lambda b1: program(b1, 1), lambda be: be.if_(
        be.cmp("sle", C, HELD * chunk), lambda b2: program(b2, HELD), lambda bl: program(bl, 0)) and [])
    return S.finish()


__all__ = ["generate", "MAX_K"]
