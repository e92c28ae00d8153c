"""GEMMs with few rows against a transposed B read in place (schedule parallel ``n``):
``C = epilogue(A @ B)`` with A [M, K] (rows contiguous along k) and B = X.T for a row-major
X [N, K] -- logits against a tied embedding table, a decode step's projections.  With a few
rows such a GEMM is bound by reading B once, and the BLIS nest (kernels/gemm.py) packs B into
panels through a transposing copy and splits A's few rows among threads (8 rows: one thread
did three quarters of the work).  Here each column n of C is a dot product of X's row n with
every row of A, NC columns at a time:

  for n in this thread's columns (runs claimed from the team's work counter), NC at a time:
      for m0 in row blocks of MT rows (then the remaining rows one at a time):
          acc_j[MT, W] = sum over k in steps of W of  A[m0:m0+MT, k:k+W] * X[n+j, k:k+W]   (j < NC)
          C[m0:m0+MT, n+j] = epilogue(row sums of acc_j)

X's rows are read from memory once (the next row block finds them in L1), A stays in the cache,
nothing is packed; the k tail reads as 0.  One A load serves NC columns: MT=4, NC=2 (8
accumulators, 6 loads per 8 FMAs) measured 1.7x the earlier MT=8, NC=1 (9 loads per 8 FMAs)
on 16 x 4000 x 1024 in cache, one Zen 4 thread (3.1-3.6 ms against 6.3); rows past the last
whole block run as single rows, unmasked (M=5: 3.3 ms against 8.0).

Sizes are symbolic, so the kernel decides at run time: M <= MAX_ROWS runs this nest, a larger
M the BLIS nest of kernels/gemm.py with B panels shared by the team (parallel ``m``), both in
one function (``Split``).
"""
from __future__ import annotations

from xdsl.dialects import scf
from xdsl.dialects.builtin import Float32Type, FloatAttr, StringAttr
from xdsl.ir import Block, Region

from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import elementwise, illegal

MAX_ROWS = 16   # at most this many rows run the dot nest
MT = 4          # rows per block (the rows past the last whole block run one at a time)
NC = 2          # columns per block: MT * NC accumulator registers, MT + NC loads per k step
K_TAIL = True   # the last, partial vector of k is read (a test plants False)
EDGES = True    # the rows past the last MT block and the columns past the last NC pair run (a plant: False)
AHEAD = 4       # X's row n + AHEAD is prefetched while row n is read (0: none)


def fits(plan) -> bool:
    """Whether ``plan`` (gemm.analyse) is a GEMM this nest runs."""
    return (not plan.batch and plan.gather is None and plan.c0 is None and plan.b.strides[-2] == 1
            and plan.a.strides[-1] == 1 and isinstance(plan.in_elem, Float32Type)
            and isinstance(plan.out_elem, Float32Type) and not plan.a.taps)


class Split:
    """``if M <= MAX_ROWS: <the dot nest> else: <what is built into .otherwise>``: the BLIS code
    is built into ``otherwise`` (a builder of the else block), then ``finish`` adds the if."""

    def __init__(self, kop, kf, plan):
        if not fits(plan):
            raise illegal(kop.sym_name.data, "parallel n runs a 2-D f32 matmul against a transposed row-major B "
                                             "(no C0, no gather)")
        self.kop, self.kf, self.plan = kop, kf, plan
        self.else_block = Block()
        self.otherwise = kf.b.child(self.else_block)

    def finish(self, out_buf: int, views, epilogue) -> None:
        kf, b = self.kf, self.kf.b
        then_block = Block()
        emit(b.child(then_block), self.kop, kf, self.plan, out_buf, views, epilogue)
        then_block.add_op(scf.YieldOp())
        self.else_block.add_op(scf.YieldOp())
        small = b.cmp("sle", kf.size(self.plan.m), MAX_ROWS)
        b.op(scf.IfOp(small, [], Region(then_block), Region(self.else_block)))


def emit(b, kop, kf, plan, out_buf: int, views, epilogue) -> None:
    """The dot nest into builder ``b``; ``epilogue`` is gemm.apply_epilogue."""
    from tessera.passes.tile.kernels.gemm import view
    W = kop.vector.value.data
    buf, reg = kf.buffer_args, kf.reg
    M, N, K = kf.size(plan.m), kf.size(plan.n), kf.size(plan.k)
    sAm, sBn = kf.size(plan.a.strides[-2]), kf.size(plan.b.strides[-1])
    off_a, off_b = kf.view_offset(b, plan.a), kf.view_offset(b, plan.b)
    epi_offs = {id(v): kf.view_offset(b, v) for v in views[2:]}
    ahead = b.mul(AHEAD, sBn)

    def block_rows(bm, m0, ns, brows, rows):
        """Rows m0 .. m0 + rows - 1 (``rows`` static: MT, or 1 for the rows past the last whole
        block) of the columns ``ns`` (X rows ``brows``): one A load per row and k step serves
        every column."""
        arow = bm.add(off_a, bm.mul(m0, sAm))

        def step(bk, kk, acc, cols=W):
            av = view(bk, buf[plan.a.arg], plan.in_elem, "global", (rows, W), bk.add(arow, kk), sAm, 1, rows, cols)
            a = bk.op(t.LoadOp.create(operands=[av], result_types=[t.tile_type(rows, W, reg)])).results[0]
            out = []
            for brow, c in zip(brows, acc):
                xv = view(bk, buf[plan.b.arg], plan.in_elem, "global", (1, W), bk.add(brow, kk), 0, 1, 1, cols)
                if AHEAD:
                    pv = view(bk, buf[plan.b.arg], plan.in_elem, "global", (1, W), bk.add(bk.add(brow, kk), ahead),
                              0, 1, 1, W)
                    bk.op(t.PrefetchOp.create(operands=[pv]))
                x = bk.op(t.LoadOp.create(operands=[xv], result_types=[t.tile_type(1, W, reg)])).results[0]
                out.append(elementwise(bk, "add", [c, elementwise(bk, "mul", [a, x])]))
            return out

        zero = bm.op(t.ConstantOp.create(attributes={"value": FloatAttr(0.0, reg)},
                                         result_types=[t.tile_type(rows, W, reg)])).results[0]
        kfull = bm.mul(bm.div(K, W), W)
        acc = bm.for_(0, kfull, W, step, [zero] * len(ns))     # whole vectors: no masks
        acc = bm.if_(bm.cmp("slt", kfull, K) if K_TAIL else bm.cmp("slt", K, 0),
                     lambda bt: step(bt, kfull, acc, bt.sub(K, kfull)), lambda be: list(acc), [c.type for c in acc])
        for n, c in zip(ns, acc):
            red = bm.op(t.ReduceOp.create(operands=[c], attributes={"kind": StringAttr("add"), "axis": i64_attr(1)},
                                          result_types=[t.tile_type(rows, 1, reg)])).results[0]
            val = epilogue(bm, kf, kop, plan, red, (rows, 1), m0, n, rows, 1, epi_offs)
            out = view(bm, buf[out_buf], plan.out_elem, "global", (rows, 1), bm.add(bm.mul(m0, N), n), N, 1, rows, 1)
            bm.op(t.StoreOp.create(operands=[val, out]))

    def columns(bn, n, width):
        """Columns n .. n + width - 1 (width static), every row block."""
        ns = [n] + [bn.add(n, j) for j in range(1, width)]
        brows = [bn.add(off_b, bn.mul(c, sBn)) for c in ns]
        mfull = bn.mul(bn.div(M, MT), MT)
        bn.for_(0, mfull, MT, lambda bm, m0, _c2: block_rows(bm, m0, ns, brows, MT))
        if EDGES:
            bn.for_(mfull, M, 1, lambda bm, m0, _c2: block_rows(bm, m0, ns, brows, 1))
        return []

    def run(bw, lo, hi):
        whole = bw.add(lo, bw.mul(bw.div(bw.sub(hi, lo), NC), NC))
        bw.for_(lo, whole, NC, lambda bn, n, _c: columns(bn, n, NC))
        if NC > 1 and EDGES:
            bw.for_(whole, hi, 1, lambda bn, n, _c: columns(bn, n, 1))
        return []

    R.for_row_runs(kf, b, N, run)


__all__ = ["fits", "Split", "emit", "MAX_ROWS"]
