"""Flash attention as Tile IR: the N x N score matrix never exists.

One work item is (batch, head, block of BQ query rows); each goes to whichever thread
claims it next from the team's work counter (``tile.claim``: causal items differ in cost,
and cores in speed).  Per item, in the thread's workspace (all O(block)):

  Q panel   BQ x D        packed once (tile.async_copy, a_panel)
  for each block of BKV keys (blocks above the causal diagonal are skipped, not masked):
    K^T panel D x BKV     packed (b_panel)
    S  = Q K^T            register tiles of tile.mma over D -> S scratch (BQ x BKV)
    online softmax, row by row with tile.reduce / tile.elementwise:
        s = S[r] * scale (+ additive mask | select on a bool mask), masked past the causal edge
        m' = max(m, max(s));  p = exp(s - m');  alpha = exp(m - m')
        l = l * alpha + sum(p);  O[r] *= alpha (the rescale);  P[r] = p
    V panel BKV x Dv      packed (b_panel)
    O += P V              register tiles starting from the real O (tile.fragment_pack)
  out[r] = O[r] / l[r]    (0, or NaN when standing in for the composed form, if l = 0)

Everything accumulates in f32; bf16 inputs are converted while packing.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import FloatAttr, IntegerType, StringAttr, f32

from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, str_array
from tessera.ir.builder import Builder
from tessera.mma.selector import record_by_id
from tessera.passes.tile.kernels.common import (ALIGN, KernelSig, elementwise, for_claimed, illegal, tile_const,
                                                trace_view)
from tessera.passes.tile.kernels.rows import broadcast_to

MAX_HEAD_DIM = 256


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


def analyse(kop: s.KernelOp) -> AttentionPlan:
    name = kop.sym_name.data
    block = kop.body.block
    att = [o for o in block.ops if isinstance(o, g.AttentionOp)]
    if len(att) != 1 or list(block.last_op.operands) != [att[0].result]:
        raise illegal(name, "an attention kernel holds one tessera.attention")
    op = att[0]
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
                         op.masked_rows.data == "zero", ((B, H, SQ, DH), (B, HKV, SK, DH), DV))


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
    NRW = NR * W
    U = kop.unroll.value.data
    if BQ % MR or BKV % NRW:
        raise illegal(name, f"query block {BQ} must be a multiple of MR={MR} and key block {BKV} of NR*W={NRW}")
    qt = op.q.type
    (B, H, SQ, DH), (_, HKV, SK, _), DV = plan.dims
    for d in (DH, DV):
        if isinstance(d, int) and d > MAX_HEAD_DIM:
            raise illegal(name, f"head dims are at most {MAX_HEAD_DIM} (the scratch is sized for it), got {d}")
    # symbolic head dims: scratch is sized for the maximum and the launch checks the bound
    limits = [f"{d}<={MAX_HEAD_DIM}" for d in (DH, DV) if not isinstance(d, int)]
    DHMAX = DH if isinstance(DH, int) else MAX_HEAD_DIM
    DVMAX = DV if isinstance(DV, int) else MAX_HEAD_DIM
    views, mask_view, bool_mask = plan.views, plan.mask_view, plan.bool_mask
    scale, causal, zero_rows = plan.scale, plan.causal, plan.zero_rows
    elem = qt.element_type
    out_elem = op.result.type.element_type
    Dp = DHMAX  # the k extent of S = Q K^T (panels need no padding along k)
    DVp = -(-DVMAX // NRW) * NRW
    OCH = 4 * W  # columns of O handled per step of the row loops
    BKVp = BKV

    sig = KernelSig(name)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    for d in (B, H, HKV, SQ, SK, DH, DV):
        sig.dim(d)
    for v in list(views.values()) + ([mask_view] if mask_view is not None else []):
        for st in v.strides:
            sig.dim(st)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    nB, nH, nHKV, nSQ, nSK, nD, nDV = (kf.size(d) for d in (B, H, HKV, SQ, SK, DH, DV))

    # ---- workspace (per thread, O(block))
    qpack = kf.alloc(b, BQ * Dp, f32, "l2")
    kpack = kf.alloc(b, Dp * BKVp, f32, "l2")
    sbuf = kf.alloc(b, BQ * BKV, f32, "l1")
    ppack = kf.alloc(b, BQ * BKV, f32, "l2")
    vpack = kf.alloc(b, BKV * DVp, f32, "l2")
    obuf = kf.alloc(b, BQ * DVp, f32, "l2")
    mbuf = kf.alloc(b, BQ, f32, "l1")
    lbuf = kf.alloc(b, BQ, f32, "l1")
    workspace = sum(-(-n * 4 // ALIGN) * ALIGN for n in (BQ * Dp, Dp * BKVp, BQ * BKV, BQ * BKV, BKV * DVp,
                                                          BQ * DVp, BQ, BQ))

    nqb = b.ceil_div(nSQ, BQ)
    total = b.mul(b.mul(nB, nH), nqb)
    group = b.div(nH, b.max(nHKV, 1))

    def view(bb: Builder, src, el, space, shape, off, rs, cs, rows, cols):
        v = t.ViewOp.create(operands=[src, bb.c(off), bb.c(rs), bb.c(cs), bb.c(rows), bb.c(cols)],
                            result_types=[t.view_type(shape[0], shape[1], el, space)])
        bb.op(v)
        return v.result

    def load(bb: Builder, v, shape, el=f32, pad: float = 0.0):
        attrs = {"pad": FloatAttr(pad, f32)} if pad != 0.0 else {}
        ld = t.LoadOp.create(operands=[v], attributes=attrs, result_types=[t.tile_type(shape[0], shape[1], el)])
        bb.op(ld)
        return ld.result

    def store(bb: Builder, value, v):
        bb.op(t.StoreOp.create(operands=[value, v]))

    def pack(bb: Builder, src, dst, layout: str, panel: int):
        tok = t.AsyncCopyOp.create(operands=[src, dst, bb.c(0)], attributes={
            "layout": StringAttr(layout), "panel": i64_attr(panel), "kpack": i64_attr(1)},
            result_types=[t.TokenType()])
        bb.op(tok)
        bb.op(t.WaitOp.create(operands=[tok.token]))

    frag_a = t.fragment((MR, NRW, 1), f32, f32, "a", "col_major", rec.family)
    frag_b = frag_a.with_role("b", "row_major")
    frag_c = t.fragment((MR, NRW, 1), f32, f32, "acc", "row_major", rec.family)

    def micro_gemm(bb: Builder, apack, a_space, bpack, b_space, rows, cols, kext, kpad, init, finish):
        """For every MR x NR*W tile of a rows x cols result: acc = init(); acc += A B over kext; finish(acc)."""
        def tile_ir(bi: Builder, ir, _c):
            def tile_jr(bj: Builder, jr, _c2):
                acc0 = init(bj, ir, jr)
                a_base = bj.mul(bj.div(ir, MR), bj.mul(MR, kpad))
                b_base = bj.mul(bj.div(jr, NRW), bj.mul(NRW, kpad))

                def step(bk: Builder, kk, acc):
                    av = view(bk, apack, f32, a_space, (MR, 1), bk.add(a_base, bk.mul(kk, MR)), 1, 1, MR, 1)
                    bv = view(bk, bpack, f32, b_space, (1, NRW), bk.add(b_base, bk.mul(kk, NRW)), 1, 1, 1, NRW)
                    fa = bk.op(t.FragmentPackOp.create(operands=[av], result_types=[frag_a])).results[0]
                    fb = bk.op(t.FragmentPackOp.create(operands=[bv], result_types=[frag_b])).results[0]
                    return bk.op(t.MmaOp.create(operands=[fa, fb, acc], result_types=[frag_c])).results[0]

                kmain = bj.mul(bj.div(kext, U), U)

                def unrolled(bk, kk, c):
                    acc = c[0]
                    for u in range(U):
                        acc = step(bk, bk.add(kk, u), acc)
                    return [acc]

                acc = bj.for_(0, kmain, U, unrolled, [acc0])[0]
                acc = bj.for_(kmain, kext, 1, lambda bk, kk, c: [step(bk, kk, c[0])], [acc])[0]
                un = bj.op(t.FragmentUnpackOp.create(operands=[acc], result_types=[t.tile_type(MR, NRW, f32)]))
                finish(bj, ir, jr, un.results[0])
                return []
            bi.for_(0, cols, NRW, tile_jr)
            return []
        bb.for_(0, rows, MR, tile_ir)

    def zero_frag(bb, ir, jr):
        return bb.op(t.FragmentZeroOp.create(result_types=[frag_c])).results[0]

    def item(bi: Builder, w, _c):
        bidx = bi.div(w, bi.mul(nH, nqb))
        h = bi.rem(bi.div(w, nqb), nH)
        qb = bi.rem(w, nqb)
        q0 = bi.mul(qb, BQ)
        bq = bi.min(BQ, bi.sub(nSQ, q0))
        kvh = bi.div(h, bi.max(group, 1))

        def off(bb, v, hh, row):
            return bb.add(bb.add(bb.mul(bidx, kf.size(v.strides[0])), bb.mul(hh, kf.size(v.strides[1]))),
                          bb.mul(row, kf.size(v.strides[2])))

        qv, kv_, vv = views["q"], views["k"], views["v"]
        pack(bi, view(bi, buf[qv.arg], elem, "global", (BQ, Dp), off(bi, qv, h, q0), kf.size(qv.strides[2]),
                      kf.size(qv.strides[3]), bq, nD), qpack, "a_panel", MR)
        # m = -inf, l = 0, O = 0
        ninf = elementwise(bi, "add", [_const_row(bi, BQ, 0.0), tile_const(bi, float("-inf"))])
        store(bi, ninf, view(bi, mbuf, f32, "l1", (1, BQ), 0, 0, 1, 1, BQ))
        store(bi, _const_row(bi, BQ, 0.0), view(bi, lbuf, f32, "l1", (1, BQ), 0, 0, 1, 1, BQ))

        def zero_o(bz, r, _c2):
            def chunk(bc, c0, _c3):
                store(bc, _const_row(bc, OCH, 0.0), view(bc, obuf, f32, "l2", (1, OCH), bc.add(bc.mul(r, DVp), c0),
                                                         0, 1, 1, bc.sub(DVp, c0)))
                return []
            bz.for_(0, nDV, OCH, chunk)
            return []
        bi.for_(0, BQ, 1, zero_o)

        kv_end = bi.min(nSK, bi.add(q0, bq)) if causal else nSK
        if scale is None:
            dtile = bi.op(t.SplatIndexOp.create(operands=[bi.c(nD)], result_types=[t.tile_type(1, 1, f32)])).results[0]
            scale_tile = elementwise(bi, "rsqrt", [dtile])
        else:
            scale_tile = tile_const(bi, scale)

        def kv_block(bk: Builder, j0, _c2):
            nk = bk.min(BKV, bk.sub(kv_end, j0))
            # K^T block: element (d, j) of k[b, kvh, j0 + j, d]
            pack(bk, view(bk, buf[kv_.arg], elem, "global", (Dp, BKV), off(bk, kv_, kvh, j0),
                          kf.size(kv_.strides[3]), kf.size(kv_.strides[2]), nD, nk), kpack, "b_panel", NRW)

            def s_store(bs, ir, jr, val):
                store(bs, val, view(bs, sbuf, f32, "l1", (MR, NRW), bs.add(bs.mul(ir, BKV), jr), BKV, 1,
                                    bs.sub(bq, ir), bs.sub(nk, jr)))
            micro_gemm(bk, qpack, "l2", kpack, "l2", bq, nk, nD, nD, zero_frag, s_store)

            def row(br: Builder, r, _c3):
                srow = load(br, view(br, sbuf, f32, "l1", (1, BKV), br.mul(r, BKV), 0, 1, 1, nk), (1, BKV),
                            pad=float("-inf"))
                x = elementwise(br, "mul", [srow, scale_tile])
                if mask_view is not None:
                    mv = mask_view
                    mcs = mv.strides[3]
                    moff = br.add(br.add(br.add(br.mul(bidx, kf.size(mv.strides[0])),
                                                br.mul(h, kf.size(mv.strides[1]))),
                                         br.mul(br.add(q0, r), kf.size(mv.strides[2]))),
                                  br.mul(j0, kf.size(mcs)))
                    mel = op.mask.type.element_type
                    width = 1 if mcs == 0 else BKV
                    mt = load(br, view(br, buf[mv.arg], mel, "global", (1, width), moff, 0, kf.size(mcs), 1, nk),
                              (1, width))  # in registers every value is f32 (a bool reads as 0.0 / 1.0)
                    x = elementwise(br, "mask_select" if bool_mask else "add", [x, mt])
                valid = nk
                if causal:  # top-left alignment: key j is visible to query i when j <= i
                    valid = br.max(br.min(nk, br.sub(br.add(br.add(q0, r), 1), j0)), 0)
                x = br.op(t.MaskOp.create(operands=[x, br.c(valid)], attributes={"pad": FloatAttr(float("-inf"), f32)},
                                          result_types=[x.type])).results[0]
                mview = view(br, mbuf, f32, "l1", (1, 1), r, 0, 0, 1, 1)
                lview = view(br, lbuf, f32, "l1", (1, 1), r, 0, 0, 1, 1)
                m_old = load(br, mview, (1, 1))
                rmax = br.op(t.ReduceOp.create(operands=[x], attributes={"kind": StringAttr("max"),
                                                                        "axis": i64_attr(1)},
                                               result_types=[t.tile_type(1, 1, f32)])).results[0]
                m_new = elementwise(br, "max", [m_old, rmax])
                m_safe = elementwise(br, "finite_or_zero", [m_new])
                p = elementwise(br, "exp", [elementwise(br, "sub", [x, m_safe])])
                alpha = elementwise(br, "exp", [elementwise(br, "sub", [m_old, m_safe])])
                psum = br.op(t.ReduceOp.create(operands=[p], attributes={"kind": StringAttr("add"),
                                                                        "axis": i64_attr(1)},
                                               result_types=[t.tile_type(1, 1, f32)])).results[0]
                l_new = elementwise(br, "add", [elementwise(br, "mul", [load(br, lview, (1, 1)), alpha]), psum])
                store(br, m_new, mview)
                store(br, l_new, lview)
                store(br, p, view(br, sbuf, f32, "l1", (1, BKV), br.mul(r, BKV), 0, 1, 1, BKV))
                rescale_row(br, obuf, r, alpha, DVp, nDV, OCH)
                return []
            bk.for_(0, bq, 1, row)
            # P (= S scratch, now probabilities) and V into panels; O += P V from the real O
            pack(bk, view(bk, sbuf, f32, "l1", (BQ, BKV), 0, BKV, 1, bq, nk), ppack, "a_panel", MR)
            pack(bk, view(bk, buf[vv.arg], elem, "global", (BKV, DVp), off(bk, vv, kvh, j0), kf.size(vv.strides[2]),
                          kf.size(vv.strides[3]), nk, nDV), vpack, "b_panel", NRW)

            def o_view(bo, ir, jr):
                return view(bo, obuf, f32, "l2", (MR, NRW), bo.add(bo.mul(ir, DVp), jr), DVp, 1, MR, NRW)

            def o_init(bo, ir, jr):
                return bo.op(t.FragmentPackOp.create(operands=[o_view(bo, ir, jr)], result_types=[frag_c])).results[0]

            micro_gemm(bk, ppack, "l2", vpack, "l2", bq, nDV, nk, nk, o_init,
                       lambda bo, ir, jr, val: store(bo, val, o_view(bo, ir, jr)))
            return []

        bi.for_(0, kv_end, BKV, kv_block)

        def finish(bf: Builder, r, _c2):
            lr = load(bf, view(bf, lbuf, f32, "l1", (1, 1), r, 0, 0, 1, 1), (1, 1))
            out_row = bf.mul(bf.add(bf.mul(bf.add(bf.mul(bidx, nH), h), nSQ), bf.add(q0, r)), nDV)

            def chunk(bc, c0, _c3):
                left = bc.sub(nDV, c0)
                orow = load(bc, view(bc, obuf, f32, "l2", (1, OCH), bc.add(bc.mul(r, DVp), c0), 0, 1, 1, left),
                            (1, OCH))
                res = elementwise(bc, "safe_div" if zero_rows else "div", [orow, lr])
                store(bc, res, view(bc, buf[out_buf], out_elem, "global", (1, OCH), bc.add(out_row, c0), 0, 1, 1,
                                     left))
                return []
            bf.for_(0, nDV, OCH, chunk)
            return []
        bi.for_(0, bq, 1, finish)
        return []

    for_claimed(b, 0, total, lambda bw, w: item(bw, w, None))   # one phase: items go to free threads
    fn = kf.finish()
    fn.attributes["limits"] = str_array(limits)
    return fn, sig.dims, workspace, []


def rescale_row(b: Builder, obuf, r, alpha, stride: int, ncols, chunk: int) -> None:
    """O[r] *= alpha: the accumulator follows the running maximum (flash attention's rescale)."""
    def step(bc, c0, _c):
        v = t.ViewOp.create(operands=[obuf, bc.c(bc.add(bc.mul(r, stride), c0)), bc.c(0), bc.c(1), bc.c(1),
                                      bc.c(bc.sub(stride, c0))], result_types=[t.view_type(1, chunk, f32, "l2")])
        bc.op(v)
        ld = bc.op(t.LoadOp.create(operands=[v.result], result_types=[t.tile_type(1, chunk, f32)]))
        bc.op(t.StoreOp.create(operands=[elementwise(bc, "mul", [ld.results[0], alpha]), v.result]))
        return []
    b.for_(0, ncols, chunk, step)


def _const_row(b: Builder, n: int, value: float):
    op = t.ConstantOp.create(attributes={"value": FloatAttr(value, f32)}, result_types=[t.tile_type(1, n, f32)])
    b.op(op)
    return op.result


__all__ = ["AttentionPlan", "analyse", "generate", "D"]
