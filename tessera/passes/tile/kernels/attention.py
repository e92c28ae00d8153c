"""Flash attention as Tile IR: the N x N score matrix never exists.

One work item is (batch, head, block of BQ query rows); each goes to whichever thread
claims it next from the team's work counter (``tile.claim``: causal items differ in cost,
and cores in speed).  The scores are kept transposed, one key per row and one query per
column, so the online softmax's statistics run down columns (vertical max and sum over
whole vectors, no horizontal reductions) and the probabilities are already in place as
the A operand of O += P V.  Per item, in the thread's workspace (all O(block)):

  Q^T panel  D x BQ        packed once (tile.async_copy, b_panel)
  for each block of BKV keys (blocks above the causal diagonal are skipped, not masked):
    K panel  BKV x D       packed (a_panel); the next block's K and V rows are prefetched
                           during S^T's row tiles
    S^T = K Q^T * scale * log2 e   register tiles of tile.mma over D -> S scratch (BKV x BQ),
                           in log2 units (an additive mask is scaled by log2 e as it is read)
    online softmax over strips of NR*W query columns (tile.elementwise; masks loaded
    per key, the causal edge by tile.mask {side = "ge"}):
        m' = max(m, max_j s_j);  alpha = 2^(m - m');  p_j = 2^(s_j - m') (in place)
        l = l * alpha + sum_j p_j
    V panel  BKV x Dv      packed (b_panel)
    O = O * alpha + P V    register tiles reading P where S^T lies; the rescale is part
                           of each tile's finish
  (causal, in a block that the diagonal crosses: S^T tiles whose every key is past their
  every query are not computed, the softmax strips stop at their last query's key, and each
  O tile's k loop at its own last query's key)
  out[r] = O[r] * (1 / l[r])  (0, or NaN when standing in for the composed form, if l = 0)
  lse[r] = m[r] ln 2 + log l[r]  only when the op has its second result (a gradient in the same
                           program reads it): one value per row, +inf where l = 0

Everything accumulates in f32 (float64 tensors: f64, on the f64 FMA record); bf16 inputs are
converted while packing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects.builtin import FloatAttr, IntegerType, StringAttr, f32, f64

from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, str_array
from tessera.ir.builder import Builder
from tessera.mma.selector import record_by_id
from tessera.passes.tile.kernels.common import (ALIGN, KernelSig, elementwise, for_claimed, illegal, mask_cols,
                                                splat_row, tile_const, trace_view)
from tessera.passes.tile.kernels.rows import broadcast_to
from tessera.passes.tile.kernels.attention_tiles import Tiles

MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634   # scores are kept in log2 units: the softmax's exponentials are 2^x
LN2 = 0.6931471805599453


@dataclass
class AttentionPlan:
    """What both attention generators (CPU and GPU) read off the kernel's one ``tessera.attention``."""

    op: g.AttentionOp
    views: dict                      # q, k, v -> StridedView of a kernel input
    mask_view: object                # StridedView broadcast to [B, H, SQ, SK], or None
    bool_mask: bool
    scale: float | None              # None: 1/sqrt(D)
    causal: bool
    zero_rows: bool                  # fully-masked rows give 0 (explicit op) rather than NaN (composed form)
    dims: tuple                      # (B, H, SQ, D), (_, HKV, SK, _), DV
    heads_inner: bool = False        # output written [B, SQ, H, DV] (a transpose(0, 2, 1, 3) of it, fused)
    lse_index: int | None = None     # the log-sum-exp result's place among the kernel's outputs, if written


def analyse(kop: s.KernelOp) -> AttentionPlan:
    name = kop.sym_name.data
    block = kop.body.block
    att = [o for o in block.ops if isinstance(o, g.AttentionOp)]
    if len(att) != 1:
        raise illegal(name, "an attention kernel holds one tessera.attention")
    op = att[0]
    out = list(block.last_op.operands)
    # the log-sum-exp (a gradient reads it): its own result buffer, at its place among the yields
    lse_index = out.index(op.lse) if op.lse is not None and op.lse in out else None
    if lse_index is not None:
        out.pop(lse_index)
    if len(out) == 1 and isinstance(out[0].owner, g.ReshapeOp):
        out = [out[0].owner.input]   # the result is written row-major: a reshape of it is the same bytes
    heads_inner = len(out) == 1 and isinstance(out[0].owner, g.TransposeOp) and out[0].owner.input == op.result \
        and out[0].owner.permutation == [0, 2, 1, 3]
    if out != [op.result] and not heads_inner:
        raise illegal(name, "an attention kernel yields its tessera.attention (or its [B, S, H, D] transpose), "
                            "reshaped or not")
    qt, kt, vt = op.q.type, op.k.type, op.v.type
    (B, H, SQ, DH), (_, HKV, SK, _), DV = qt.dims, kt.dims, vt.dims[3]
    views = {n: trace_view(v, block) for n, v in (("q", op.q), ("k", op.k), ("v", op.v))}
    if any(v is None for v in views.values()):
        raise illegal(name, "q, k and v must be kernel inputs seen through reshape/transpose")
    mask_view = None
    if op.mask is not None:
        mv = trace_view(op.mask, block)
        if mv is None:
            raise illegal(name, "the mask must be a kernel input")
        mask_view = broadcast_to(mv, (B, H, SQ, SK))
    return AttentionPlan(op, views, mask_view, op.mask is not None and isinstance(op.mask.type.element_type,
                                                                                   IntegerType),
                         op.scale.value.data if op.scale is not None else None, bool(op.causal.value.data),
                         op.masked_rows.data == "zero", ((B, H, SQ, DH), (B, HKV, SK, DH), DV), heads_inner,
                         lse_index)


def generate(kop: s.KernelOp):
    name = kop.sym_name.data
    plan = analyse(kop)
    op = plan.op
    if kop.loop_order != ["bh", "q", "kv"]:
        raise illegal(name, f"attention runs loops in order [bh, q, kv], not {kop.loop_order}")
    if kop.parallel.data not in ("bh*q", "none"):
        raise illegal(name, f"attention splits (batch x heads x query blocks) across threads: parallel 'bh*q' or "
                            f"'none', not {kop.parallel.data!r}")
    tiles = kop.tile_sizes
    BQ, BKV = tiles["q"], tiles["kv"]
    rec = record_by_id(kop.mma.data)
    MR, NR = kop.reg_tile
    W = rec.vector_width or 16
    F = f64 if rec.acc_dtype == "f64" else f32   # registers and scratch: f32 (float64 tensors: f64)
    esz = 8 if F == f64 else 4
    NRW = NR * W
    U = kop.unroll.value.data
    QUNIT = math.lcm(MR, NRW)  # query columns come in whole S^T tiles (NR*W) and whole O tiles (MR)
    if BQ % QUNIT or BKV % MR:
        raise illegal(name, f"query block {BQ} must be a multiple of lcm(MR, NR*W) = {QUNIT} and key block {BKV} "
                            f"of MR={MR}")
    qt = op.q.type
    (B, H, SQ, DH), (_, HKV, SK, _), DV = plan.dims
    for d in (DH, DV):
        if isinstance(d, int) and d > MAX_HEAD_DIM:
            raise illegal(name, f"head dims are at most {MAX_HEAD_DIM} (the scratch is sized for it), got {d}")
    # symbolic head dims: scratch is sized for the maximum and the launch checks the bound
    limits = [f"{d}<={MAX_HEAD_DIM}" for d in (DH, DV) if not isinstance(d, int)]
    Dp = DH if isinstance(DH, int) else MAX_HEAD_DIM   # the k extent of S^T = K Q^T (no padding along k)
    DVp = -(-(DV if isinstance(DV, int) else MAX_HEAD_DIM) // NRW) * NRW
    views, mask_view, bool_mask = plan.views, plan.mask_view, plan.bool_mask
    scale, causal, zero_rows = plan.scale, plan.causal, plan.zero_rows
    elem = qt.element_type
    out_elem = op.result.type.element_type
    OCH = 4 * W  # columns of O handled per step of the row loops
    CW = NRW     # query columns per strip of the softmax passes
    masked = causal or mask_view is not None
    # without a mask, S^T's register tiles also fold their column maxima into bm (the block's
    # maximum per query), and the softmax's max pass reads those instead of the scores: causal
    # strips whose queries see every key of the block take them, the ones the diagonal crosses
    # still compute the masked maximum from the scores
    fused_max = mask_view is None

    sig = KernelSig(name, reg=F)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    lse_elem = op.lse.type.element_type if plan.lse_index is not None else None
    outs = [sig.buffer(out_elem), sig.buffer(lse_elem)] if plan.lse_index is not None else [sig.buffer(out_elem)]
    if plan.lse_index == 0:
        outs.reverse()
    out_buf, lse_buf = outs[0], (outs[1] if plan.lse_index is not None else None)
    for d in (B, H, HKV, SQ, SK, DH, DV):
        sig.dim(d)
    for v in list(views.values()) + ([mask_view] if mask_view is not None else []):
        for st in (*v.strides, *v.offset):
            sig.dim(st)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    nB, nH, nHKV, nSQ, nSK, nD, nDV = (kf.size(d) for d in (B, H, HKV, SQ, SK, DH, DV))

    # ---- workspace (per thread, O(block))
    sizes = {"q": Dp * BQ, "k": BKV * Dp, "s": BKV * BQ, "v": BKV * DVp, "o": BQ * DVp, "m": BQ, "l": BQ, "a": BQ,
             "bm": BQ}
    spaces = {"s": "l1", "m": "l1", "l": "l1", "a": "l1", "bm": "l1"}
    ws = {k: kf.alloc(b, n, F, spaces.get(k, "l2")) for k, n in sizes.items()}
    workspace = sum(-(-n * esz // ALIGN) * ALIGN for n in sizes.values())

    # query blocks of equal size (at most BQ, whole S^T tiles): 1024 queries run 8 blocks of 128,
    # not 7 of 144 and one of 16 that computes 48 columns
    bqn = b.mul(b.ceil_div(b.ceil_div(nSQ, b.max(b.ceil_div(nSQ, BQ), 1)), NRW), NRW)
    nqb = b.ceil_div(nSQ, b.max(bqn, 1))
    total = b.mul(b.mul(nB, nH), nqb)
    group = b.div(nH, b.max(nHKV, 1))

    tl = Tiles(F, rec, MR, NRW, U)
    view, load, store, pack, strip, micro_gemm, panel_at = (tl.view, tl.load, tl.store, tl.pack, tl.strip,
                                                            tl.micro_gemm, tl.panel_at)

    def item(bi: Builder, w):
        bidx = bi.div(w, bi.mul(nH, nqb))
        h = bi.rem(bi.div(w, nqb), nH)
        qb = bi.rem(w, nqb)
        q0 = bi.mul(qb, bqn)
        bq = bi.min(bqn, bi.sub(nSQ, q0))
        # query columns of S^T computed (whole tiles; the Q^T panel is zero past bq), and query rows
        # of O (whole MR tiles: rows past bq, never written out, may read stale scratch past bqs)
        bqs = bi.mul(bi.ceil_div(bq, NRW), NRW)
        bqo = bi.mul(bi.ceil_div(bq, MR), MR)
        kvh = bi.div(h, bi.max(group, 1))

        def off(bb, v, hh, row):
            base = bb.add(bb.add(bb.mul(bidx, kf.size(v.strides[0])), bb.mul(hh, kf.size(v.strides[1]))),
                          bb.mul(row, kf.size(v.strides[2])))
            return bb.add(base, kf.view_offset(bb, v))   # a sliced q/k/v (a split of a fused qkv projection)

        qv, kv_, vv = views["q"], views["k"], views["v"]

        def zero_q(bz: Builder):  # a block of bq < bqs queries: query columns up to bqs read zeros
            strip(bz, BQ, nD, OCH, lambda bc, r, c0: store(
                bc, _const_row(bc, OCH, 0.0, F), view(bc, ws["q"], F, "l2", (1, OCH), bc.add(bc.mul(r, BQ), c0),
                                                   0, 1, 1, OCH)))
            return []
        bi.if_(bi.cmp("slt", bq, bqs), zero_q)
        # Q^T: element (d, i) of q[b, h, q0 + i, d]
        pack(bi, view(bi, buf[qv.arg], elem, "global", (Dp, BQ), off(bi, qv, h, q0), kf.size(qv.strides[3]),
                      kf.size(qv.strides[2]), nD, bq), ws["q"], "b_panel", NRW)
        # m = -inf, l = 0, O = 0
        ninf = splat_row(bi, BQ, float("-inf"), F)
        store(bi, ninf, view(bi, ws["m"], F, "l1", (1, BQ), 0, 0, 1, 1, BQ))
        store(bi, _const_row(bi, BQ, 0.0, F), view(bi, ws["l"], F, "l1", (1, BQ), 0, 0, 1, 1, BQ))
        strip(bi, DVp, bqo, OCH, lambda bc, r, c0: store(
            bc, _const_row(bc, OCH, 0.0, F), view(bc, ws["o"], F, "l2", (1, OCH), bc.add(bc.mul(r, DVp), c0),
                                               0, 1, 1, bc.sub(DVp, c0))))

        kv_end = bi.min(nSK, bi.add(q0, bq)) if causal else nSK
        if scale is None:
            dtile = bi.op(t.SplatIndexOp.create(operands=[bi.c(nD)], result_types=[t.tile_type(1, 1, F)])).results[0]
            scale_tile = elementwise(bi, "mul", [elementwise(bi, "rsqrt", [dtile]), tile_const(bi, LOG2E, F)])
        else:
            scale_tile = tile_const(bi, scale * LOG2E, F)

        def kv_block(bk: Builder, j0, _c2):
            nk = bk.min(BKV, bk.sub(kv_end, j0))
            # K block: element (j, d) of k[b, kvh, j0 + j, d]
            pack(bk, view(bk, buf[kv_.arg], elem, "global", (BKV, Dp), off(bk, kv_, kvh, j0), kf.size(kv_.strides[2]),
                          kf.size(kv_.strides[3]), nk, nD), ws["k"], "a_panel", MR)

            def k_at(ba, ir, kk):
                return ws["k"], "l2", ba.add(ba.mul(ir, nD), ba.mul(kk, MR)), 1  # panel ir/MR, column kk

            def s_store(bs, ir, jr, val):
                scaled = elementwise(bs, "mul", [val, scale_tile])
                store(bs, scaled, view(bs, ws["s"], F, "l1", (MR, NRW), bs.add(bs.mul(ir, BQ), jr), BQ, 1,
                                       bs.sub(nk, ir), NRW))
                if fused_max:
                    def fold(bf: Builder):
                        col = bf.op(t.ReduceOp.create(
                            operands=[scaled], attributes={"kind": StringAttr("select_max"), "axis": i64_attr(0)},
                            result_types=[t.tile_type(1, NRW, F)]))
                        bmv = view(bf, ws["bm"], F, "l1", (1, NRW), jr, 0, 1, 1, NRW)
                        store(bf, elementwise(bf, "select_max", [load(bf, bmv, (1, NRW)), col.results[0]]), bmv)
                    bs.if_(whole_keys(bs, ir, MR, nk), fold)
            if fused_max:
                strip(bk, bqs, 1, NRW, lambda bc, _r, c0: store(
                    bc, splat_row(bc, NRW, float("-inf"), F), view(bc, ws["bm"], F, "l1", (1, NRW), c0, 0, 1, 1, NRW)))
            # causal: a tile whose every key is past its every query (key j0 + ir > query q0 + jr + NR*W - 1)
            # is not computed; the softmax below masks whatever its scratch holds
            col0 = (lambda bc, ir: bc.mul(bc.div(bc.max(bc.sub(bc.add(j0, ir), q0), 0), NRW), NRW)) if causal else None
            def prefetch_next(bp: Builder, ir):
                # the next key block's rows of K and V (MR of each per row tile), fetched while this
                # block computes: its packing then reads the cache, not memory (one thread,
                # 4 x 1024 x 64: 1.5 % faster; a prefetch past the data is harmless).  One prefetch
                # per cache line of each row: the head dims may be symbolic.
                line = 64 // {"f64": 8, "F": 4}.get(str(elem), 2)
                for vw, n in ((kv_, nD), (vv, nDV)):
                    def lines(bl: Builder, c, _c3, vw=vw):
                        for r in range(MR):
                            row = off(bl, vw, kvh, bl.add(bl.add(j0, BKV), bl.add(ir, r)))
                            pv = view(bl, buf[vw.arg], elem, "global", (1, line), bl.add(row, c), 0, 1, 1, line)
                            bl.op(t.PrefetchOp.create(operands=[pv]))
                        return []
                    bp.for_(0, n, line, lines)
            micro_gemm(bk, k_at, lambda ba, jr, kk: panel_at(ba, ws["q"], nD, jr, kk), nk, bqs, nD, s_store, col0,
                       prefetch_next)

            def s_row(bj: Builder, j, c0):
                return view(bj, ws["s"], F, "l1", (1, CW), bj.add(bj.mul(j, BQ), c0), 0, 1, 1, CW)

            def logits(br: Builder, j, c0):
                """Scores of key j0 + j for queries q0 + c0 .. + CW, masked."""
                x = load(br, s_row(br, j, c0), (1, CW))
                if mask_view is not None:
                    mv = mask_view
                    ms = [kf.size(st) for st in mv.strides]
                    moff = br.add(br.add(br.add(br.mul(bidx, ms[0]), br.mul(h, ms[1])),
                                         br.mul(br.add(q0, c0), ms[2])), br.mul(br.add(j0, j), ms[3]))
                    width = 1 if mv.strides[2] == 0 else CW   # one value for every query, or one per query
                    mt = load(br, view(br, buf[mv.arg], op.mask.type.element_type, "global", (1, width), moff, 0,
                                       ms[2], 1, br.sub(bq, c0)), (1, width))  # a bool reads as 0.0 / 1.0
                    x = (elementwise(br, "mask_select", [x, mt]) if bool_mask else
                         elementwise(br, "add", [x, elementwise(br, "mul", [mt, tile_const(br, LOG2E, F)])]))
                if causal:  # top-left alignment: query i sees key j when j <= i, i.e. column c >= j0 + j - q0
                    diag = br.sub(br.add(j0, j), br.add(q0, c0))
                    x = br.op(t.MaskOp.create(operands=[x, br.c(CW), br.c(diag)], attributes={
                        "pad": FloatAttr(float("-inf"), F), "side": StringAttr("ge")},
                        result_types=[x.type])).results[0]
                return x

            def column_strip(bc: Builder, c0, _c3):
                stat = (lambda k: view(bc, ws[k], F, "l1", (1, CW), c0, 0, 1, 1, CW))
                m_old = load(bc, stat("m"), (1, CW))
                # causal: keys past the strip's last query are masked for all of it; the strip
                # still covers MR more (masked: P = 0 there), which O's row tiles that straddle
                # two strips read
                kn = causal_keys(bc, q0, j0, bc.add(c0, CW + straddle(MR)), nk) if causal else nk

                def max_row(bj: Builder, j, c):
                    x = logits(bj, j, c0)
                    if masked:  # the exp pass reads the masked scores back instead of masking again
                        store(bj, x, s_row(bj, j, c0))
                    # (select_max, as softmax's row kernel uses, measured 15 % slower here when causal)
                    return [elementwise(bj, "max", [c[0], x])]
                m_start, jlo = m_old, 0
                if fused_max:
                    nfull = bc.mul(bc.div(nk, MR), MR)   # keys in whole S^T tiles: their maxima are in bm
                    bmt = load(bc, view(bc, ws["bm"], F, "l1", (1, CW), c0, 0, 1, 1, CW), (1, CW))
                    if causal:   # bm holds unmasked scores: only for a strip whose every query sees every key
                        seen = sees_block(bc, q0, c0, j0, nk)
                        jlo = bc.select(seen, bc.c(nfull), bc.c(0))
                        bmt = mask_cols(bc, bmt, bc.select(seen, bc.c(CW), bc.c(0)), float("-inf"))
                    else:
                        jlo = nfull
                    m_start = elementwise(bc, "max", [m_old, bmt])
                m_new = bc.for_(jlo, kn, 1, max_row, [m_start])[0]
                m_safe = elementwise(bc, "finite_or_zero", [m_new])

                def p_row(bj: Builder, j, c):
                    # s - max <= 0 (or NaN; m_safe = 0 only where the maximum is not finite, and then the
                    # row's result is NaN or the fully-masked value whatever these lanes give)
                    p = elementwise(bj, "exp2_bounded",
                                    [elementwise(bj, "sub", [load(bj, s_row(bj, j, c0), (1, CW)), m_safe])])
                    store(bj, p, s_row(bj, j, c0))
                    return [elementwise(bj, "add", [c[0], p])]
                psum = bc.for_(0, kn, 1, p_row, [_const_row(bc, CW, 0.0, F)])[0]
                alpha = elementwise(bc, "exp2_bounded", [elementwise(bc, "sub", [m_old, m_safe])])
                store(bc, m_new, stat("m"))
                store(bc, alpha, stat("a"))
                store(bc, elementwise(bc, "add", [elementwise(bc, "mul", [load(bc, stat("l"), (1, CW)), alpha]),
                                                  psum]), stat("l"))
                return []
            bk.for_(0, bqs, CW, column_strip)

            # V block: element (j, e) of v[b, kvh, j0 + j, e]
            pack(bk, view(bk, buf[vv.arg], elem, "global", (BKV, DVp), off(bk, vv, kvh, j0), kf.size(vv.strides[2]),
                          kf.size(vv.strides[3]), nk, nDV), ws["v"], "b_panel", NRW)

            def v_at(ba, jr, kk):
                return panel_at(ba, ws["v"], nk, jr, kk)

            def p_at(ba, ir, kk):
                return ws["s"], "l1", ba.add(ba.mul(kk, BQ), ir), 1  # P[i, j] = S^T[j, i]

            def o_finish(bo, ir, jr, val):
                o_v = view(bo, ws["o"], F, "l2", (MR, NRW), bo.add(bo.mul(ir, DVp), jr), DVp, 1, MR, NRW)
                alpha = load(bo, view(bo, ws["a"], F, "l1", (MR, 1), ir, 1, 0, MR, 1), (MR, 1))
                store(bo, elementwise(bo, "add", [rescale(bo, load(bo, o_v, (MR, NRW)), alpha), val]), o_v)
            # causal: query row tile ir needs the keys up to its last query (the rest of P is 0)
            kext = (lambda bo, ir: causal_keys(bo, q0, j0, bo.add(ir, MR), nk)) if causal else nk
            micro_gemm(bk, p_at, v_at, bqo, nDV, kext, o_finish)
            return []

        bi.for_(0, kv_end, BKV, kv_block)

        def finish(bf: Builder, r, _c2):
            lr = load(bf, view(bf, ws["l"], F, "l1", (1, 1), r, 0, 0, 1, 1), (1, 1))
            # one division per row, then products (1/0 = inf keeps 0 * inf = NaN for a row with no keys)
            inv = elementwise(bf, "safe_div" if zero_rows else "div", [tile_const(bf, 1.0, F), lr])
            if plan.heads_inner:   # [B, SQ, H, DV]
                out_row = bf.mul(bf.add(bf.mul(bf.add(bf.mul(bidx, nSQ), bf.add(q0, r)), nH), h), nDV)
            else:                  # [B, H, SQ, DV]
                out_row = bf.mul(bf.add(bf.mul(bf.add(bf.mul(bidx, nH), h), nSQ), bf.add(q0, r)), nDV)

            if lse_buf is not None:
                mr = load(bf, view(bf, ws["m"], F, "l1", (1, 1), r, 0, 0, 1, 1), (1, 1))
                store(bf, row_lse(bf, mr, lr, F), view(bf, buf[lse_buf], lse_elem, "global", (1, 1),
                                    bf.add(bf.mul(bf.add(bf.mul(bidx, nH), h), nSQ), bf.add(q0, r)), 0, 0, 1, 1))

            def chunk(bc, c0, _c3):
                left = bc.sub(nDV, c0)
                orow = load(bc, view(bc, ws["o"], F, "l2", (1, OCH), bc.add(bc.mul(r, DVp), c0), 0, 1, 1, left),
                            (1, OCH))
                res = elementwise(bc, "mul", [orow, inv])
                store(bc, res, view(bc, buf[out_buf], out_elem, "global", (1, OCH), bc.add(out_row, c0), 0, 1, 1,
                                     left))
                return []
            bf.for_(0, nDV, OCH, chunk)
            return []
        bi.for_(0, bq, 1, finish)

    for_claimed(b, 0, total, item)   # one phase: items go to free threads
    fn = kf.finish()
    fn.attributes["limits"] = str_array(limits)
    return fn, sig.dims, workspace, []


def row_lse(b: Builder, m, l, F):
    """A row's log-sum-exp from its running maximum m (log2 units) and sum l: m ln 2 + log l, as
    m ln 2 - log(1 / l) so that a row with every key masked (l = 0, 1 / l taken as 0) gets +inf."""
    inv = elementwise(b, "safe_div", [tile_const(b, 1.0, F), l])
    return elementwise(b, "sub", [elementwise(b, "mul", [elementwise(b, "finite_or_zero", [m]), tile_const(b, LN2, F)]),
                                  elementwise(b, "log", [inv])])


def causal_keys(b: Builder, q0, j0, queries_end, nk):
    """How many keys of the block starting at key j0 (of nk) the queries before q0 + queries_end
    see under the causal mask (top-left alignment: query i sees key j when j <= i)."""
    return b.max(b.min(nk, b.sub(b.add(q0, queries_end), j0)), 0)


def whole_keys(b: Builder, ir, mr: int, nk):
    """Whether S^T's row tile at ir holds mr keys of the block's nk (a partial tile's rows past
    nk are not keys, and its column maxima are not folded into bm)."""
    return b.cmp("sle", b.add(ir, mr), nk)


def sees_block(b: Builder, q0, c0, j0, nk):
    """Whether every query of the strip at column c0 (query q0 + c0 on) sees every key of the
    block j0 .. j0 + nk - 1 under the causal mask: then the block's unmasked maxima are its."""
    return b.cmp("sle", b.add(j0, nk), b.add(b.add(q0, c0), 1))


def straddle(mr: int) -> int:
    """Extra keys a softmax strip covers past its last query: an O row tile of mr queries that
    straddles two strips reads P that far into the first one (masked there, so 0)."""
    return mr


def rescale(b: Builder, o_tile, alpha):
    """O * alpha: the accumulator follows the running maximum (flash attention's rescale)."""
    return elementwise(b, "mul", [o_tile, alpha])


def _const_row(b: Builder, n: int, value: float, elem=f32):
    op = t.ConstantOp.create(attributes={"value": FloatAttr(value, elem)}, result_types=[t.tile_type(1, n, elem)])
    b.op(op)
    return op.result


__all__ = ["LN2", "AttentionPlan", "analyse", "causal_keys", "row_lse", "generate", "rescale", "sees_block", "straddle", "whole_keys",
           "D"]
