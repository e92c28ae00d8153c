"""Flash-attention backward as Tile IR: dQ, dK, dV with no S x S buffer.

One work item is (batch, kv head): it owns dK and dV of that head (and dQ of the query heads
sharing it), so threads need no atomics and every element is summed in one fixed order (the same
bits for any thread count).  Items go to free threads (``tile.claim``).  Per query head of the
group and block of BQ queries, in the thread's workspace (all O(block), the forward's layout:
scores kept transposed, one key per row, one query per column):

  Q^T, dO^T (D x BQ) and Q, dO (BQ x D) packed as B panels;  Delta = rowsum(dO * O) per query
  the log-sum-exp: read from the op's ``lse`` operand when the forward saved it (its second
  result, in the same program); else recomputed in pass 1, per key block:
      K panel, S^T = K Q^T * scale * log2 e, masked;  m' = max(m, max_j s_j),
      l = l * 2^(m - m') + sum_j 2^(s_j - m')
  pass 2, per key block (blocks above the causal diagonal are skipped in both passes):
      S^T again; P^T = 2^(S^T - lse) (saved; lse = +inf for a query with every key masked) or
      2^(S^T - m) / l (0 where masked, and for a query with every key masked)
      dP^T = V dO^T;  dS^T = P^T * (dP^T - Delta) * scale          (BKV x BQ scratch)
      dV[keys] += P^T dO, dK[keys] += dS^T Q   (into the result: this item's rows only)
      dQ += dS K                                (BQ x D scratch, written after the last block)

The result packs [B, HKV, G + 2, S, D] (``ir/graph_attention_grad.py``); where dQ, dK and dV are
taken by whole-slot slices only, ``outline-kernels`` puts the slices in this kernel's group and
each is written to a buffer of its own (``result_parts``: no copies out of a packed tensor).  f32 registers and
results (f64 for float64 tensors).  Register tiles, panels and the micro-GEMM are the forward's
(``attention_tiles.Tiles``); ``attention.causal_keys`` bounds the keys a strip of queries sees.
"""
from __future__ import annotations

import math

from xdsl.dialects.builtin import FloatAttr, IntegerType, StringAttr, f32, f64
from xdsl.ir import BlockArgument

from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ints, str_array
from tessera.ir.builder import Builder
from tessera.mma.selector import record_by_id
from tessera.passes.tile.kernels.attention import LOG2E, MAX_HEAD_DIM, causal_keys
from tessera.passes.tile.kernels.attention_tiles import Tiles
from tessera.passes.tile.kernels.common import (ALIGN, KernelSig, elementwise, for_claimed, illegal, splat_row,
                                                tile_const, trace_view)
from tessera.passes.tile.kernels.rows import broadcast_to


def analyse(kop: s.KernelOp):
    name = kop.sym_name.data
    block = kop.body.block
    ops = [o for o in block.ops if isinstance(o, g.AttentionGradOp)]
    if len(ops) != 1:
        raise illegal(name, "an attention backward kernel holds one tessera.attention_grad")
    op = ops[0]
    parts = result_parts(name, op, list(block.last_op.operands))
    views = {n: trace_view(getattr(op, n), block) for n in ("q", "k", "v", "o", "do")}
    if any(v is None for v in views.values()):
        raise illegal(name, "q, k, v, o and do must be kernel inputs seen through reshape/transpose")
    mask_view = None
    B, H, SQ, _ = op.q.type.dims
    if op.mask is not None:
        mv = trace_view(op.mask, block)
        if mv is None:
            raise illegal(name, "the mask must be a kernel input")
        mask_view = broadcast_to(mv, (B, H, SQ, SQ))
    if op.lse is not None and not (isinstance(op.lse, BlockArgument) and op.lse.owner is block):
        raise illegal(name, "the saved log-sum-exp must be a kernel input")
    return op, views, mask_view, parts


def result_parts(name: str, op: g.AttentionGradOp, out: list) -> list[tuple[int, int]]:
    """The slot range [lo, hi) of the packed result each yielded value holds: the packed result
    itself (0, G + 2), or its whole-slot slices, reshaped or not (``outline-kernels`` groups them
    in): each is a buffer of its own, [B, HKV, hi - lo, S, D] in row-major order."""
    G = op.result.type.dims[2] - 2
    parts = []
    for v in out:
        sl = v.owner.input.owner if isinstance(v.owner, g.ReshapeOp) else v.owner
        if v == op.result:
            parts.append((0, G + 2))
        elif isinstance(sl, g.SliceOp) and sl.input == op.result:
            lo = ints(sl.starts)[2]
            parts.append((lo, lo + sl.result.type.dims[2]))
        else:
            raise illegal(name, "an attention backward kernel yields its tessera.attention_grad or whole-slot "
                                "slices of it")
    for lo, hi in ((0, G), (G, G + 1), (G + 1, G + 2)):
        if not any(a <= lo and hi <= b for a, b in parts):
            raise illegal(name, f"slots {lo}..{hi - 1} of the attention gradient are not in one yielded value")
    return parts


def generate(kop: s.KernelOp):
    name = kop.sym_name.data
    op, views, mask_view, parts = analyse(kop)
    if kop.parallel.data not in ("bh", "none"):
        raise illegal(name, f"attention backward splits (batch x kv heads) across threads: parallel 'bh' or 'none', "
                            f"not {kop.parallel.data!r}")
    tiles = kop.tile_sizes
    BQ, BKV = tiles["q"], tiles["kv"]
    rec = record_by_id(kop.mma.data)
    MR, NR = kop.reg_tile
    W = rec.vector_width or 16
    F = f64 if rec.acc_dtype == "f64" else f32
    esz = 8 if F == f64 else 4
    NRW = NR * W
    CW = NRW
    OCH = 4 * W
    if BQ % math.lcm(MR, NRW) or BKV % MR:
        raise illegal(name, f"query block {BQ} must be a multiple of lcm(MR, NR*W) and key block {BKV} of MR={MR}")
    (B, H, S, DH), HKV = op.q.type.dims, op.k.type.dims[1]
    G = op.result.type.dims[2] - 2
    if isinstance(DH, int) and DH > MAX_HEAD_DIM:
        raise illegal(name, f"head dims are at most {MAX_HEAD_DIM} (the scratch is sized for it), got {DH}")
    limits = [] if isinstance(DH, int) else [f"{DH}<={MAX_HEAD_DIM}"]
    Dp = DH if isinstance(DH, int) else MAX_HEAD_DIM
    DPp = -(-Dp // NRW) * NRW
    elem = op.q.type.element_type
    out_elem = op.result.type.element_type
    scale = op.scale.value.data if op.scale is not None else None
    causal = bool(op.causal.value.data)
    bool_mask = mask_view is not None and isinstance(op.mask.type.element_type, IntegerType)
    masked = causal or mask_view is not None

    sig = KernelSig(name, reg=F)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_bufs = [sig.buffer(out_elem) for _ in parts]
    for d in (B, H, HKV, S, DH):
        sig.dim(d)
    for v in list(views.values()) + ([mask_view] if mask_view is not None else []):
        for st in (*v.strides, *v.offset):
            sig.dim(st)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    nB, nH, nHKV, nS, nD = (kf.size(d) for d in (B, H, HKV, S, DH))
    saved = op.lse is not None   # the forward's log-sum-exp is an input: no statistics pass

    # ---- workspace (per thread, O(block): nothing grows with the sequence)
    sizes = {"qt": Dp * BQ, "dot": Dp * BQ, "qb": BQ * DPp, "dob": BQ * DPp, "ka": BKV * Dp, "va": BKV * Dp,
             "kb": BKV * DPp, "s": BKV * BQ, "dp": BKV * BQ, "dq": BQ * DPp, "m": BQ, "l": BQ, "dd": BQ}
    spaces = {"s": "l1", "dp": "l1", "m": "l1", "l": "l1", "dd": "l1"}
    ws = {k: kf.alloc(b, n, F, spaces.get(k, "l2")) for k, n in sizes.items()}
    workspace = sum(-(-n * esz // ALIGN) * ALIGN for n in sizes.values())

    tl = Tiles(F, rec, MR, NRW, kop.unroll.value.data)
    view, load, store, pack, strip, micro_gemm, panel_at = (tl.view, tl.load, tl.store, tl.pack, tl.strip,
                                                            tl.micro_gemm, tl.panel_at)
    total = b.mul(nB, nHKV)

    def zeros(bb, n):
        return bb.op(t.ConstantOp.create(attributes={"value": FloatAttr(0.0, F)},
                                         result_types=[t.tile_type(1, n, F)])).results[0]

    def item(bi: Builder, w):
        bidx = bi.div(w, nHKV)
        kvh = bi.rem(w, nHKV)

        def off(bb, v, hh, row):
            base = bb.add(bb.add(bb.mul(bidx, kf.size(v.strides[0])), bb.mul(hh, kf.size(v.strides[1]))),
                          bb.mul(row, kf.size(v.strides[2])))
            return bb.add(base, kf.view_offset(bb, v))

        def out_at(bb, slot, row, lo):
            """(buffer, offset) of element (bidx, kvh, slot, row, 0) of the packed result, in the
            yielded part holding slots lo.. (slot: an int, or a value in that part's range)."""
            i = next(i for i, (a, z) in enumerate(parts) if a <= lo < z)
            a, z = parts[i]
            rel = bb.sub(slot, a) if a else slot
            return buf[out_bufs[i]], bb.mul(bb.add(bb.mul(bb.add(bb.mul(bb.add(bb.mul(bidx, nHKV), kvh), z - a), rel),
                                                          nS), row), nD)

        def zero_rows(bb, dst, space, pitch, rows, cols):
            strip(bb, pitch, rows, OCH, lambda bc, r, c0: store(
                bc, zeros(bc, OCH), view(bc, dst, F, space, (1, OCH), bc.add(bc.mul(r, pitch), c0), 0, 1, 1,
                                         bc.sub(cols, c0))))

        # dK and dV of this (batch, kv head) start at zero and are summed in place
        for slot in (G, G + 1):
            def zero_out(bz: Builder, r, _c, slot=slot):
                def chunk(bc, c0, _c2):
                    ob, o = out_at(bc, slot, r, slot)
                    store(bc, zeros(bc, OCH), view(bc, ob, out_elem, "global", (1, OCH), bc.add(o, c0), 0, 1, 1,
                                                   bc.sub(nD, c0)))
                    return []
                bz.for_(0, nD, OCH, chunk)
                return []
            bi.for_(0, nS, 1, zero_out)

        if scale is None:
            dtile = bi.op(t.SplatIndexOp.create(operands=[bi.c(nD)], result_types=[t.tile_type(1, 1, F)])).results[0]
            sc = elementwise(bi, "rsqrt", [dtile])
        else:
            sc = tile_const(bi, scale, F)
        sc2 = elementwise(bi, "mul", [sc, tile_const(bi, LOG2E, F)])

        def head(bh: Builder, hg, _c):
            h = bh.add(bh.mul(kvh, G), hg)
            bh.for_(0, nS, BQ, lambda bq_, q0, _c2: query_block(bq_, h, hg, q0) or [])
            return []

        def query_block(bq_: Builder, h, hg, q0):
            qv, kv_, vv, ov, dov = (views[n] for n in ("q", "k", "v", "o", "do"))
            bq = bq_.min(BQ, bq_.sub(nS, q0))
            bqs = bq_.mul(bq_.ceil_div(bq, NRW), NRW)
            bqo = bq_.mul(bq_.ceil_div(bq, MR), MR)

            def zero_t(bz: Builder):   # query columns past bq read zeros
                for k in ("qt", "dot"):
                    zero_rows(bz, ws[k], "l2", BQ, nD, BQ)
                return []
            bq_.if_(bq_.cmp("slt", bq, bqs), zero_t)
            for vw, k in ((qv, "qt"), (dov, "dot")):   # element (d, i) of x[b, h, q0 + i, d]
                pack(bq_, view(bq_, buf[vw.arg], elem, "global", (Dp, BQ), off(bq_, vw, h, q0), kf.size(vw.strides[3]),
                               kf.size(vw.strides[2]), nD, bq), ws[k], "b_panel", NRW)
            for vw, k in ((qv, "qb"), (dov, "dob")):   # element (i, d)
                pack(bq_, view(bq_, buf[vw.arg], elem, "global", (BQ, DPp), off(bq_, vw, h, q0),
                               kf.size(vw.strides[2]), kf.size(vw.strides[3]), bq, nD), ws[k], "b_panel", NRW)

            # Delta[i] = sum_d dO[i, d] * O[i, d]
            store(bq_, zeros(bq_, BQ), view(bq_, ws["dd"], F, "l1", (1, BQ), 0, 0, 1, 1, BQ))

            def delta(br: Builder, r, _c):
                def chunk(bc, c0, c):
                    x = [load(bc, view(bc, buf[vw.arg], elem, "global", (1, OCH), bc.add(off(bc, vw, h, bc.add(q0, r)),
                                                                                         bc.mul(c0, kf.size(vw.strides[3]))),
                                       0, kf.size(vw.strides[3]), 1, bc.sub(nD, c0)), (1, OCH)) for vw in (ov, dov)]
                    return [elementwise(bc, "add", [c[0], elementwise(bc, "mul", x)])]
                acc = br.for_(0, nD, OCH, chunk, [zeros(br, OCH)])[0]
                tot = br.op(t.ReduceOp.create(operands=[acc], attributes={"kind": StringAttr("add"), "axis": i64_attr(1)},
                                              result_types=[t.tile_type(1, 1, F)])).results[0]
                store(br, tot, view(br, ws["dd"], F, "l1", (1, 1), r, 0, 0, 1, 1))
                return []
            bq_.for_(0, bq, 1, delta)

            kv_end = keys_end(bq_, nS, q0, bq, causal)

            def k_at(ba, ir, kk):
                return ws["ka"], "l2", ba.add(ba.mul(ir, nD), ba.mul(kk, MR)), 1

            def scores(bk: Builder, j0, nk):
                """S^T of this key block into s, in log2 units."""
                pack(bk, view(bk, buf[kv_.arg], elem, "global", (BKV, Dp), off(bk, kv_, kvh, j0),
                              kf.size(kv_.strides[2]), kf.size(kv_.strides[3]), nk, nD), ws["ka"], "a_panel", MR)

                def s_store(bs, ir, jr, val):
                    store(bs, elementwise(bs, "mul", [val, sc2]), view(bs, ws["s"], F, "l1", (MR, NRW),
                                                                       bs.add(bs.mul(ir, BQ), jr), BQ, 1,
                                                                       bs.sub(nk, ir), NRW))
                micro_gemm(bk, k_at, lambda ba, jr, kk: panel_at(ba, ws["qt"], nD, jr, kk), nk, bqs, nD, s_store)

            def s_row(bj, buf_name, j, c0):
                return view(bj, ws[buf_name], F, "l1", (1, CW), bj.add(bj.mul(j, BQ), c0), 0, 1, 1, CW)

            def logits(br: Builder, j0, j, c0):
                """Scores of key j0 + j for queries q0 + c0 .. + CW, masked (-inf)."""
                x = load(br, s_row(br, "s", j, c0), (1, CW))
                if mask_view is not None:
                    ms = [kf.size(st) for st in mask_view.strides]
                    moff = br.add(br.add(br.add(br.mul(bidx, ms[0]), br.mul(h, ms[1])),
                                         br.mul(br.add(q0, c0), ms[2])), br.mul(br.add(j0, j), ms[3]))
                    width = 1 if mask_view.strides[2] == 0 else CW
                    mt = load(br, view(br, buf[mask_view.arg], op.mask.type.element_type, "global", (1, width), moff,
                                       0, ms[2], 1, br.sub(bq, c0)), (1, width))
                    x = (elementwise(br, "mask_select", [x, mt]) if bool_mask else
                         elementwise(br, "add", [x, elementwise(br, "mul", [mt, tile_const(br, LOG2E, F)])]))
                if causal:   # query i sees key j when j <= i
                    diag = br.sub(br.add(j0, j), br.add(q0, c0))
                    x = br.op(t.MaskOp.create(operands=[x, br.c(CW), br.c(diag)], attributes={
                        "pad": FloatAttr(float("-inf"), F), "side": StringAttr("ge")},
                        result_types=[x.type])).results[0]
                return x

            def stat(bc, k, c0):
                return view(bc, ws[k], F, "l1", (1, CW), c0, 0, 1, 1, CW)

            if saved:
                # m = the forward's log-sum-exp in log2 units (+inf, so P = 0, for columns past bq)
                lse_in = op.lse.index

                def lse_strip(bc: Builder, c0, _c):
                    x = load(bc, view(bc, buf[lse_in], op.lse.type.element_type, "global", (1, CW),
                                      lse_at(bc, bidx, h, nH, nS, bc.add(q0, c0)), 0, 1, 1, bc.sub(bq, c0)),
                             (1, CW), float("inf"))
                    store(bc, elementwise(bc, "mul", [x, tile_const(bc, LOG2E, F)]), stat(bc, "m", c0))
                    return []
                bq_.for_(0, bqs, CW, lse_strip)
            else:
                # ---- pass 1 (no saved log-sum-exp): m (finite) and 1 / l per query
                store(bq_, splat_row(bq_, BQ, float("-inf"), F), view(bq_, ws["m"], F, "l1", (1, BQ), 0, 0, 1, 1, BQ))
                store(bq_, zeros(bq_, BQ), view(bq_, ws["l"], F, "l1", (1, BQ), 0, 0, 1, 1, BQ))

                def stats_block(bk: Builder, j0, _c):
                    nk = bk.min(BKV, bk.sub(kv_end, j0))
                    scores(bk, j0, nk)

                    def column_strip(bc: Builder, c0, _c3):
                        kn = causal_keys(bc, q0, j0, bc.add(c0, CW), nk) if causal else nk
                        m_old = load(bc, stat(bc, "m", c0), (1, CW))

                        def max_row(bj, j, c):
                            x = logits(bj, j0, j, c0)
                            if masked:   # the sum pass reads the masked scores back
                                store(bj, x, s_row(bj, "s", j, c0))
                            return [elementwise(bj, "max", [c[0], x])]
                        m_new = bc.for_(0, kn, 1, max_row, [m_old])[0]
                        m_safe = elementwise(bc, "finite_or_zero", [m_new])

                        def p_row(bj, j, c):
                            d = elementwise(bj, "sub", [load(bj, s_row(bj, "s", j, c0), (1, CW)), m_safe])
                            return [elementwise(bj, "add", [c[0], elementwise(bj, "exp2_bounded", [d])])]
                        psum = bc.for_(0, kn, 1, p_row, [zeros(bc, CW)])[0]
                        alpha = elementwise(bc, "exp2_bounded", [elementwise(bc, "sub", [m_old, m_safe])])
                        store(bc, m_new, stat(bc, "m", c0))
                        store(bc, elementwise(bc, "add", [elementwise(bc, "mul", [load(bc, stat(bc, "l", c0), (1, CW)),
                                                                                 alpha]), psum]), stat(bc, "l", c0))
                        return []
                    bk.for_(0, bqs, CW, column_strip)
                    return []
                bq_.for_(0, kv_end, BKV, stats_block)

                def finalise(bc: Builder, c0, _c):
                    store(bc, elementwise(bc, "finite_or_zero", [load(bc, stat(bc, "m", c0), (1, CW))]), stat(bc, "m", c0))
                    store(bc, elementwise(bc, "safe_div", [splat_row(bc, CW, 1.0, F), load(bc, stat(bc, "l", c0), (1, CW))]),
                          stat(bc, "l", c0))
                    return []
                bq_.for_(0, bqs, CW, finalise)
            zero_rows(bq_, ws["dq"], "l2", DPp, bqo, DPp)

            # ---- pass 2: P, dS and the three products per key block
            def grad_block(bk: Builder, j0, _c):
                nk = bk.min(BKV, bk.sub(kv_end, j0))
                scores(bk, j0, nk)
                pack(bk, view(bk, buf[vv.arg], elem, "global", (BKV, Dp), off(bk, vv, kvh, j0),
                              kf.size(vv.strides[2]), kf.size(vv.strides[3]), nk, nD), ws["va"], "a_panel", MR)
                pack(bk, view(bk, buf[kv_.arg], elem, "global", (BKV, DPp), off(bk, kv_, kvh, j0),
                              kf.size(kv_.strides[2]), kf.size(kv_.strides[3]), nk, nD), ws["kb"], "b_panel", NRW)

                def p_strip(bc: Builder, c0, _c3):
                    m = load(bc, stat(bc, "m", c0), (1, CW))
                    il = None if saved else load(bc, stat(bc, "l", c0), (1, CW))

                    def p_row(bj, j, _c4):   # P = 2^(s - lse), or 2^(s - m) / l
                        p = elementwise(bj, "exp2_bounded", [elementwise(bj, "sub", [logits(bj, j0, j, c0), m])])
                        store(bj, p if saved else elementwise(bj, "mul", [p, il]), s_row(bj, "s", j, c0))
                        return []
                    if causal:   # keys past the strip's last query: P = 0 without the exponentials
                        kn = causal_keys(bc, q0, j0, bc.add(c0, CW), nk)
                        bc.for_(0, kn, 1, p_row)
                        bc.for_(kn, nk, 1, lambda bj, j, _c4: store(bj, zeros(bj, CW), s_row(bj, "s", j, c0)) or [])
                    else:
                        bc.for_(0, nk, 1, p_row)
                    return []
                bk.for_(0, bqs, CW, p_strip)

                def ds_store(bs, ir, jr, val):   # dS^T = P^T * (dP^T - Delta) * scale
                    p = load(bs, view(bs, ws["s"], F, "l1", (MR, NRW), bs.add(bs.mul(ir, BQ), jr), BQ, 1, MR, NRW),
                             (MR, NRW))
                    dd = load(bs, view(bs, ws["dd"], F, "l1", (1, NRW), jr, 0, 1, 1, NRW), (1, NRW))
                    ds = dscores(bs, p, val, dd, sc)
                    store(bs, ds, view(bs, ws["dp"], F, "l1", (MR, NRW), bs.add(bs.mul(ir, BQ), jr), BQ, 1,
                                       bs.sub(nk, ir), NRW))
                micro_gemm(bk, lambda ba, ir, kk: (ws["va"], "l2", ba.add(ba.mul(ir, nD), ba.mul(kk, MR)), 1),
                           lambda ba, jr, kk: panel_at(ba, ws["dot"], nD, jr, kk), nk, bqs, nD, ds_store)

                def accumulate(slot):
                    def fin(bo, ir, jr, val):
                        ob, o = out_at(bo, slot, bo.add(j0, ir), slot)
                        o_v = view(bo, ob, out_elem, "global", (MR, NRW), bo.add(o, jr), nD, 1, bo.sub(nk, ir),
                                   bo.sub(nD, jr))
                        store(bo, elementwise(bo, "add", [load(bo, o_v, (MR, NRW)), val]), o_v)
                    return fin
                # dV += P^T dO and dK += dS^T Q over this block's queries (k extent bq: no padding read)
                for src, panel, slot in (("s", "dob", G + 1), ("dp", "qb", G)):
                    micro_gemm(bk, lambda ba, ir, kk, src=src: (ws[src], "l1", ba.add(ba.mul(ir, BQ), kk), BQ),
                               lambda ba, jr, kk, panel=panel: panel_at(ba, ws[panel], bq, jr, kk), nk, nD, bq,
                               accumulate(slot))

                def dq_fin(bo, ir, jr, val):
                    d_v = view(bo, ws["dq"], F, "l2", (MR, NRW), bo.add(bo.mul(ir, DPp), jr), DPp, 1, MR, NRW)
                    store(bo, elementwise(bo, "add", [load(bo, d_v, (MR, NRW)), val]), d_v)
                # dQ += dS K: dS[i, j] = dS^T[j, i]
                micro_gemm(bk, lambda ba, ir, kk: (ws["dp"], "l1", ba.add(ba.mul(kk, BQ), ir), 1),
                           lambda ba, jr, kk: panel_at(ba, ws["kb"], nk, jr, kk), bqo, nD, nk, dq_fin)
                return []
            bq_.for_(0, kv_end, BKV, grad_block)

            def write(bw: Builder, r, _c):
                def chunk(bc, c0, _c2):
                    row = load(bc, view(bc, ws["dq"], F, "l2", (1, OCH), bc.add(bc.mul(r, DPp), c0), 0, 1, 1,
                                        bc.sub(nD, c0)), (1, OCH))
                    ob, o = out_at(bc, hg, bc.add(q0, r), 0)   # dQ's slots 0..G-1 lie in one part
                    store(bc, row, view(bc, ob, out_elem, "global", (1, OCH), bc.add(o, c0), 0, 1, 1,
                                        bc.sub(nD, c0)))
                    return []
                bw.for_(0, nD, OCH, chunk)
                return []
            bq_.for_(0, bq, 1, write)

        bi.for_(0, G, 1, head)

    for_claimed(b, 0, total, item)
    fn = kf.finish()
    fn.attributes["limits"] = str_array(limits)
    return fn, sig.dims, workspace, []


def dscores(b: Builder, p, dpt, delta, scale):
    """dS^T = P^T * (dP^T - Delta) * scale (Delta per query: a row broadcast down the keys)."""
    return elementwise(b, "mul", [elementwise(b, "mul", [p, elementwise(b, "sub", [dpt, delta])]), scale])


def lse_at(b: Builder, bidx, h, nh, ns, row):
    """Where query ``row`` of head ``h`` of batch ``bidx`` has its log-sum-exp in the [B, H, S] input."""
    return b.add(b.mul(b.add(b.mul(bidx, nh), h), ns), row)


def keys_end(b: Builder, n, q0, bq, causal: bool):
    """The keys a block of bq queries from q0 sees: all n, or (causal) those up to its last query;
    the key blocks past it are skipped."""
    return b.min(n, b.add(q0, bq)) if causal else n


__all__ = ["analyse", "dscores", "generate", "keys_end", "lse_at"]
