"""Row kernel of ``top_k`` over the last axis (a ``rowwise`` group whose row op is
``graph_rows.TopKOp``; ``rowwise.generate`` hands it here), with the fused elementwise prologue.

The order is: a NaN above everything, then descending values, equal values by lower index (a
stable descending sort; torch.topk's order).  Entry (a, ia) *ranks above* entry (b, ib) when

  above = a > b  or  (a is NaN and b is not)  or  (a is the same as b (equal, or both NaN) and ia < ib)

One pass per row, with a running k-best list in the thread's workspace: ``vals`` / ``idx`` hold
the best entries seen so far, sorted (slot 0 a sentinel (NaN, -1) that ranks above everything,
slots 1..k the list, the empty ones (-inf, BIG): below every real entry, a real -inf included, as
BIG is past every column).  The row is read in groups of SUB vectors:

  group test:   does any column of the group rank above the list's k-th entry (its threshold),
                and is it not below the prefilter's floor?  One vector test per register; most
                groups of a long row fail it, and cost just that;
  vector test:  where a group passes, the same test per vector, then per column (earlier
                columns of the group may have raised the threshold);
  insert:       one pass over the list, from its end down, a vector at a time:
                new[j] = old[j] if old[j] ranks above the entry, else the entry if old[j - 1]
                does, else old[j - 1]  (the list shifts down by one below the entry's place, and
                its last entry falls off).

Prefilter (rows of at least 4 L columns, L about 1.5 k): a first vector pass keeps each of L
lanes' maximum (lane l: the columns l mod L; numpy's max, a NaN stays), and a second list takes
the k best of those.  Each is a real entry of a distinct column, so their k-th (the floor) is at
most the row's k-th value: a column below the floor never enters, and on random rows about L
columns pass it (estimated: 52 of 8192 at k = 40, L = 64).

A data-dependent branch reads its flag through the workspace (the flag tile is stored as an
i64 and read back with ``tile.load_index``).  Columns come in increasing order, so a later column
that equals the threshold never enters (stable); without the prefilter about k (1 + ln(n / k))
entries of a random row are inserted.  Indices are kept in the float registers (exact below 2^24 columns in f32) and
converted to ``graph_rows.INDEX_ELEM`` (int64) as they are stored.  Rows are split across threads.
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerType

from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import INDEX
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.argrows import column_indices
from tessera.passes.tile.kernels.common import elementwise, mask_cols, splat_row, tile_const
from tessera.passes.tile.kernels.logrows import RowSetup, _reduce
from tessera.passes.tile.kernels.typed import elementwise_typed

NEG_INF = float("-inf")
BIG = float(1 << 24)   # the index of an empty slot: past every column (float indices are exact to 2^24)
I1, I64 = IntegerType(1), IntegerType(64)
STABLE = True   # equal values by lower index (a test plants False: equal values never rank above each other)
SHIFT = 1       # the entry below the insertion point moves down one slot (a test plants 0)
KTH = 0         # the threshold is the list's k-th entry, slot k + KTH (a test plants -1: the (k-1)-th)
SUB = 4            # vectors per group test
PREFILTER = True   # rows of at least 4 L columns skip columns below the L lanes' k-th maximum
FLOOR_KEEPS_EQUAL = True   # a column equal to that floor is still read (a test plants False)


def _typed(b, fn, ops):
    return elementwise_typed(b, fn, ops, I1)


def above(b, a, ia, v, iv):
    """An i1 tile: (a, ia) ranks above (v, iv) (broadcasting [1, 1] against [1, n])."""
    nan_a, nan_v = _typed(b, "isnan", [a]), _typed(b, "isnan", [v])
    gt = _typed(b, "or", [_typed(b, "cmp_gt", [a, v]), _typed(b, "and", [nan_a, _typed(b, "not", [nan_v])])])
    if not STABLE:
        return gt
    same = _typed(b, "or", [_typed(b, "cmp_eq", [a, v]), _typed(b, "and", [nan_a, nan_v])])
    return _typed(b, "or", [gt, _typed(b, "and", [same, _typed(b, "cmp_lt", [ia, iv])])])


def generate(kop, prologue, op, epilogue):
    S = RowSetup(kop, prologue, op, epilogue, row_shaped=False)
    kf, b, C, reg = S.kf, S.b, S.C, S.reg
    k = ival(op.k)
    G = kop.vector.value.data                   # columns per group test: one vector
    BW = 2 * G                                  # list slots per step of an insert
    nb = -(-k // BW)                            # steps over the list
    slots = 1 + nb * BW
    L = G * -(-(3 * k + 1) // (2 * G))          # lanes of the prefilter: about 1.5 k
    lists = [(kf.alloc(b, slots, reg, "workspace"), kf.alloc(b, slots, reg, "workspace")) for _ in range(2)]
    xs = kf.alloc(b, max(SUB * G, L), reg, "workspace")   # a passing group's values / the lanes' maxima
    flag = kf.alloc(b, 1, I64, "workspace")     # a branch's flag, read back as an index
    which = {id(v): i for i, v in enumerate(S.outs)}
    ew = elementwise

    def view(bb, buf, off, width, cols, elem=reg, space="workspace"):
        v = t.ViewOp.create(operands=[buf, bb.c(off), bb.c(0), bb.c(1), bb.c(1), bb.c(cols)],
                            result_types=[t.view_type(1, width, elem, space)])
        bb.op(v)
        return v.result

    def load(bb, buf, off, width, cols=None):
        ld = t.LoadOp.create(operands=[view(bb, buf, off, width, width if cols is None else cols)],
                             result_types=[t.tile_type(1, width, reg)])
        bb.op(ld)
        return ld.result

    def store(bb, value, buf, off, width, elem=reg):
        bb.op(t.StoreOp.create(operands=[value, view(bb, buf, off, width, width, elem)]))

    def if_any(bb, bits, then):
        """Run ``then(builder)`` when any lane of the i1 tile ``bits`` is set."""
        f = elementwise_typed(bb, "cvt", [bits], reg)
        if f.type.dims[1] > 1:
            f = _reduce(bb, "max", f)
        store(bb, elementwise_typed(bb, "cvt", [f], I64), flag, 0, 1, I64)
        hit = bb.op(t.LoadIndexOp.create(operands=[flag, bb.c(0)], result_types=[INDEX])).result
        bb.if_(bb.cmp("sgt", hit, 0), then)

    def threshold(bb, lst):
        return load(bb, lst[0], k + KTH, 1), load(bb, lst[1], k + KTH, 1)

    def insert(bb, lst, v, iv):
        def step(bs, it, _c):
            j0 = bs.mul(bs.sub(nb - 1, it), BW)          # from the list's end down
            old_v, old_i = load(bs, lst[0], bs.add(j0, 1), BW), load(bs, lst[1], bs.add(j0, 1), BW)
            prev_v = load(bs, lst[0], bs.add(j0, 1 - SHIFT), BW)
            prev_i = load(bs, lst[1], bs.add(j0, 1 - SHIFT), BW)
            keep, put = above(bs, old_v, old_i, v, iv), above(bs, prev_v, prev_i, v, iv)
            for buf, old, prev, new in ((lst[0], old_v, prev_v, v), (lst[1], old_i, prev_i, iv)):
                shifted = elementwise_typed(bs, "select", [put, ew(bs, "add", [splat_row(bs, BW, 0.0, reg), new]),
                                                           prev], reg)
                store(bs, elementwise_typed(bs, "select", [keep, old, shifted], reg), buf, bs.add(j0, 1), BW)
            return []
        bb.for_(0, nb, 1, step)

    def clear(bb, lst):
        store(bb, tile_const(bb, float("nan"), reg), lst[0], 0, 1)
        store(bb, tile_const(bb, -1.0, reg), lst[1], 0, 1)

        def body(bc, j0, _c2):
            store(bc, splat_row(bc, BW, NEG_INF, reg), lst[0], bc.add(j0, 1), BW)
            store(bc, splat_row(bc, BW, BIG, reg), lst[1], bc.add(j0, 1), BW)
            return []
        bb.for_(0, nb * BW, BW, body)

    def consider(bb, lst, n, c0, extra=None, base=0):
        """Each of the n values in ``xs`` from ``base`` on (columns c0, c0 + 1, ...) that ranks above
        the list's k-th entry (and passes ``extra``) goes into the list."""
        def element(be, j, _c3):
            v = load(be, xs, be.add(base, j), 1)
            iv = t.SplatIndexOp.create(operands=[be.add(c0, j)], result_types=[t.tile_type(1, 1, reg)])
            be.op(iv)
            tv, ti = threshold(be, lst)
            bits = above(be, v, iv.result, tv, ti)
            if extra is not None:
                bits = _typed(be, "and", [bits, extra(be, v)])
            if_any(be, bits, lambda bi: insert(bi, lst, v, iv.result))
            return []
        bb.for_(0, n, 1, element)

    def row_step(br, r, _c):
        ctx = S.row_ctx(br, r)

        def load_x(bc, c, width):
            left = bc.sub(C, c)
            vals_in = {v: R.load_leaf(kf, bc, S.leaves[v], ctx.offsets[v], c, left, width) for v in S.pro_leaves}
            R.emit_ops(bc, S.prologue, vals_in, reg)
            xv = vals_in[S.x]
            if xv.type.dims != (1, width):
                xv = R._widen(bc, xv, width)
            return mask_cols(bc, xv, left, NEG_INF), left     # past the row: -inf after every column

        # prefilter (rows of at least 4 L columns): the k-th best of L lanes' maxima (lane l: the
        # columns l mod L) is at most the row's k-th value, so a column below it never enters
        clear(br, lists[1])
        if PREFILTER:
            def lane_max(bc, c, acc):
                return [ew(bc, "max", [acc[0], load_x(bc, c, L)[0]])]   # numpy's max: a NaN stays

            def prefilter(bp):
                store(bp, bp.for_(0, C, L, lane_max, [splat_row(bp, L, NEG_INF, reg)])[0], xs, 0, L)
                consider(bp, lists[1], L, 0)
            br.if_(br.cmp("sge", C, 4 * L), prefilter)
        floor_v = load(br, lists[1][0], k, 1)       # -inf (no filter) when the prefilter did not run

        def not_below_floor(bb, v):
            nan_f, nan_v = _typed(bb, "isnan", [floor_v]), _typed(bb, "isnan", [v])
            below = _typed(bb, "cmp_gt" if FLOOR_KEEPS_EQUAL else "cmp_ge", [floor_v, v])
            return _typed(bb, "not", [_typed(bb, "or", [below, _typed(
                bb, "and", [nan_f, _typed(bb, "not", [nan_v])])])])

        clear(br, lists[0])

        def admit(bb, xv, c, width):
            tv, ti = threshold(bb, lists[0])
            return _typed(bb, "and", [above(bb, xv, column_indices(bb, width, c, reg), tv, ti),
                                      not_below_floor(bb, xv)])

        def group(bc, c, _c2):
            """SUB vectors of columns: one test; where it passes, a test per vector, then per column."""
            xv, left = load_x(bc, c, SUB * G)

            def passed(bp):
                store(bp, xv, xs, 0, SUB * G)
                def vector(bv, s0, _c3):     # s0: the vector's first column in the group
                    c1 = bv.add(c, s0)
                    if_any(bv, admit(bv, load(bv, xs, s0, G), c1, G), lambda bq: consider(
                        bq, lists[0], bq.min(G, bq.sub(left, s0)), c1, not_below_floor, s0))
                    return []
                bp.for_(0, SUB * G, G, vector)
                return []
            if_any(bc, admit(bc, xv, c, SUB * G), passed)
            return []
        br.for_(0, C, SUB * G, group)

        def emit(bc, j0, _c2):
            cols = bc.min(BW, bc.sub(k, j0))
            for res, buf in ((op.values, lists[0][0]), (op.indices, lists[0][1])):
                if id(res) not in which:
                    continue
                w = which[id(res)]
                elem = S.outs[w].type.element_type
                v = load(bc, buf, bc.add(j0, 1), BW, cols)
                if isinstance(elem, IntegerType):
                    v = elementwise_typed(bc, "cvt", [v], elem)
                R.store_row(kf, bc, S.out_bufs[w], elem, v, bc.add(bc.mul(r, k), j0), cols, BW)
            return []
        br.for_(0, k, BW, emit)
        return []

    R.for_rows(kf, b, S.nrows, row_step)
    return S.finish()
