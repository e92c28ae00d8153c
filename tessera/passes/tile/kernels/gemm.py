"""GEMM kernels: ``[batch] C = epilogue(A @ B [+ C0])`` as BLIS-style Tile IR.

The loop nest (schedule order ``b, n, k, m``): for each batch and each NC-block of
columns and KC-block of k, the B block is packed (``tile.async_copy`` into an
``l3`` panel of NR*W-column slivers); for each MC-block of rows, the A block is
packed (into an ``l2`` panel of MR-row slivers); then every MR x NR*W register
tile runs ``tile.mma`` over k on typed fragments (``tile.view`` ->
``tile.fragment_pack``), starting from ``tile.fragment_zero`` — or from the real
incoming accumulator C0, or from the partial sums of earlier k-blocks — and
the last k-block applies the fused epilogue and stores (masked at edges).

Two ways to share the work among threads (the schedule's parallel loop):

- ``m``: every thread walks every (batch, n-block, k-block) phase; the team packs the
  B panel together into shared staging (barrier), then the phase's rows are handed
  out from the team's work counter (``tile.claim``) in chunks of equal size, at least
  four per thread, so threads of equal speed reach the next barrier together and a core
  that runs slower (a busy sibling, a VM neighbour) takes fewer chunks instead of holding
  everyone there;
- ``b*m``: the (batch x row-tile) space is split into contiguous ranges; each thread
  packs its own panels and needs no barrier.

Either way every element is computed by the same sequence of instructions whatever
the thread count, or whichever thread takes its chunk.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import StringAttr, f32, f64
from xdsl.ir import SSAValue

from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.ir.builder import Builder
from tessera.mma.selector import MmaSelection
from tessera.passes.tile.kernels import gemm_dot, gemm_gather
from tessera.passes.tile.kernels import gemm_dag
from tessera.passes.tile.kernels import gemm_hoist
from tessera.passes.tile.kernels.common import (
    column_strips,
    pack_now,
    ALIGN,
    KernelFn,
    KernelSig,
    StridedView,
    claimed_phase_base,
    elementwise,
    for_claimed,
    illegal,
    tile_const,
)

from tessera.passes.tile.kernels.gemm_plan import GemmPlan, Operand, analyse  # noqa: F401 (re-exported)

LEGAL_ORDERS = (["b", "n", "k", "m"],)


@dataclass
class GemmConfig:
    sel: MmaSelection
    mr: int
    nr: int
    mc: int
    nc: int
    kc: int
    unroll: int
    w: int
    mode: str   # "m": rows split, B panels shared by the team; "b*m": batch x rows, private panels
    split: int = 0   # "m": row chunks per thread at least (0: 4); the schedule's split


def config(kop: s.KernelOp, sel: MmaSelection) -> GemmConfig:
    name = kop.sym_name.data
    if kop.loop_order not in LEGAL_ORDERS:
        raise illegal(name, f"gemm loop order {kop.loop_order} is not implemented; legal: {LEGAL_ORDERS}")
    if kop.staging.value.data != 1:
        raise illegal(name, "CPU gemm stages each panel once (staging = 1)")
    if kop.parallel.data not in ("m", "b*m", "none", "n"):
        raise illegal(name, f"CPU gemm parallel loop: 'm' (rows; B panels shared by the threads), 'b*m' (batch x "
                            f"rows; private panels), 'n' (few rows: columns, kernels/gemm_dot.py) or 'none', not "
                            f"{kop.parallel.data!r}")
    mr, nr = kop.reg_tile
    rec = sel.record
    w = rec.vector_width or kop.vector.value.data   # tile-register records (AMX): the arch's vectors
    if rec.vector_width and kop.vector.value.data != w:
        raise illegal(name, f"vector width {kop.vector.value.data} does not match {rec.id} ({w} lanes)")
    tiles = kop.tile_sizes
    kp = rec.k
    mc, nc, kc = tiles["m"], tiles["n"], tiles["k"]
    if mc % (mr * rec.m) or nc % (nr * rec.n) or kc % kp:
        raise illegal(name, f"cache blocks must be multiples of the register tile: MC={mc} (MR*M={mr * rec.m}), "
                            f"NC={nc} (NR*N={nr * rec.n}), KC={kc} (K of {rec.id}={kp})")
    return GemmConfig(sel, mr, nr, mc, nc, kc, kop.unroll.value.data, w,
                      "b*m" if kop.parallel.data == "none" else kop.parallel.data,
                      kop.split.value.data if kop.split is not None else 0)


def generate(kop: s.KernelOp, plan: GemmPlan, cfg: GemmConfig) -> tuple[object, list[D.Dim], int, list]:
    """Build the kernel; returns (func, dims, workspace bytes, extra output types)."""
    rec = cfg.sel.record
    kp = rec.k
    # a register tile is MR x NR instructions: MR*M rows by NR*N columns (M = 1 and N = the vector
    # width for vector FMA / dot-product records; 16 x 16 tiles for AMX)
    MR, NR, CN = cfg.mr * rec.m, cfg.nr, rec.n
    NRW = NR * CN
    tiles_amx = rec.register_file is not None
    # B's k elements interleave in groups of kpack; AMX reads B in VNNI pairs (4 bytes per k group)
    # while its k step (and the zero padding of each panel) is the instruction's K
    in_elem = plan.in_elem
    # the panels hold what the instruction reads: the inputs, or their exact f32 widening for a
    # record that runs bf16 on f32 FMA (packing converts)
    pack_elem = f32 if rec.widen == "f32" else in_elem
    esize = rec.packed_bytes
    bkpack = 4 // esize if tiles_amx else kp
    MC, NC, KC, U = cfg.mc, cfg.nc, cfg.kc, cfg.unroll
    out_elem = plan.out_elem
    # the record's accumulator (f32, or f64 for the f64 FMA records) is also the epilogue's register
    # type: the epilogue computes in the matmul's dtype, and a cast (to f64 too) ends it at the store
    acc_elem = f64 if rec.acc_dtype == "f64" else f32
    reg = acc_elem
    partial_needed = out_elem != acc_elem
    esz = 8 if acc_elem == f64 else 4

    sig = KernelSig(kop.sym_name.data, reg=reg)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    part_buf = sig.buffer(acc_elem) if partial_needed else out_buf
    extra_outputs = [g.TensorType.of((*plan.batch, plan.m, plan.n), acc_elem)] if partial_needed else []
    views = register_sizes(sig, plan)
    kf = sig.build()
    b = kf.b
    # parallel n: at most gemm_dot.MAX_ROWS rows run its dot nest, more this BLIS nest (as "m")
    split = gemm_dot.Split(kop, kf, plan) if cfg.mode == "n" else None
    b = split.otherwise if split else b
    buf = kf.buffer_args
    M, N, K = kf.size(plan.m), kf.size(plan.n), kf.size(plan.k)

    # workspace: A panel (MC x KC) and B panel (KC x NC), element type of the inputs
    a_elems, b_elems = MC * KC, KC * NC
    shared = cfg.mode in ("m", "n")
    apack = kf.alloc(b, a_elems, pack_elem, "l2")
    bpack = kf.alloc(b, b_elems, pack_elem, "team" if shared else "l3")
    workspace = _round(a_elems * esize) + (0 if shared else _round(b_elems * esize))
    # an epilogue with polynomial functions runs row by row from a scratch copy of the tile: one
    # copy of its code per tile shape instead of one per register (LLVM compile time)
    heavy = any(st[0] in ("un", "self") and st[1] in HEAVY_FNS for st in plan.epilogue) or \
        gemm_dag.heavy(plan, HEAVY_FNS)
    if heavy:
        escratch = kf.alloc(b, MR * NRW, acc_elem, "l1")
        workspace += _round(MR * NRW * esz)
    if plan.gather is not None:   # the gathered A block's rows, before packing
        a_stage = kf.alloc(b, a_elems, in_elem, "l2")
        workspace += _round(a_elems * gemm_gather.ELEM_BYTES[str(in_elem)])

    # ---- n-blocks: a B whose columns fit in NC is packed as one block (as before: one phase and
    # barrier per k-block); a wider one in blocks of half NC.  On a Zen 3 VM (NC = 1024, an eighth of
    # its L3), pairwise medians against numpy: 1 thread 2048^3 0.82-0.88 -> 0.98-1.00 and 4096^3 0.85 ->
    # 1.01 (512-column blocks against the 2048 of a quarter of L3); 2 threads 2048^3 0.94 -> 1.05
    nstep = b.select(b.cmp("sle", N, NC), b.c(NC), b.c(max(NC // 2 // NRW, 1) * NRW))

    # ---- thread partition
    batch_total = 1
    for d in plan.batch:
        batch_total = b.mul(batch_total, kf.size(d))
    mtiles = b.ceil_div(M, MR)
    if shared:
        # every thread walks every batch and k-block; B panels are packed by all threads together
        # into the team's staging and shared after a barrier; the rows of each (batch, n, k) phase
        # are handed out in chunks from the team's work counter (a slower core takes fewer)
        b_lo, b_hi = 0, batch_total
        # chunks of whole row tiles, at most one A block each, as many for every thread (at least
        # four: a slower core takes fewer) and of equal size (differing by one tile at most), so
        # threads of equal speed finish a phase together.  Chunks of a fixed MC rows left the last
        # one short and one thread a chunk ahead: 2048 rows in 120-row chunks gave 1080 rows to one
        # thread and 968 to the other.  A lone thread takes equal A blocks (nothing to balance).
        # (the schedule's split, when given, replaces the four: a tuned thread split)
        blocks = b.ceil_div(mtiles, MC // MR)          # A blocks the rows need
        per_thread = b.select(b.cmp("eq", kf.nthreads, 1), b.c(blocks),
                              b.c(b.max(b.ceil_div(blocks, kf.nthreads), cfg.split or 4)))
        nchunks = b.select(b.cmp("eq", mtiles, 0), b.c(0), b.c(b.mul(per_thread, kf.nthreads)))
        njc = b.ceil_div(N, nstep)
    else:
        # contiguous ranges of (batch x row tiles) per thread, each packing its own panels
        total = b.mul(batch_total, mtiles)
        per = b.ceil_div(total, kf.nthreads)
        lo = b.min(b.mul(kf.tid, per), total)
        hi = b.min(b.add(lo, per), total)
        mt_safe = b.max(mtiles, 1)
        b_lo = b.div(lo, mt_safe)
        b_hi = b.ceil_div(hi, mt_safe)

    def batch_offset(bb: Builder, bidx: SSAValue, v: StridedView) -> SSAValue | int:
        return batch_offset_of(bb, kf, plan, bidx, v)

    # k-blocks of equal size (at most KC, a multiple of the instruction's K): K = 1029 with
    # KC = 512 runs three blocks of 344 instead of 512 + 512 + 5 (a tail that is all overhead)
    nkb = b.max(b.ceil_div(K, KC), 1)
    kstep = b.max(b.mul(b.ceil_div(b.ceil_div(K, nkb), kp * U), kp * U), kp * U)
    kstep = b.min(kstep, KC)
    nkloop = b.ceil_div(b.max(K, 1), kstep)   # iterations of the k-block loop below
    taps = plan.a.taps
    if taps:   # an implicit-GEMM A (conv_patches): k-blocks within one tap, each one strided view
        kw_, cg, step_h, step_w = taps
        ntaps = D.canon(plan.k) // cg
        cstep = min(-(-(-(-cg // max(-(-cg // KC), 1))) // (kp * U)) * kp * U, KC)
        nk_tap = -(-cg // cstep)
        nkloop = ntaps * nk_tap   # (the view's channel offset is in off_a: batch_offset_of adds every view's offset)
    # a B shared by every batch entry is packed once per thread, one slot per k-block (gemm_hoist.py)
    bslot = gemm_hoist.plan_slots(plan, cfg.mode, tiles_amx or bkpack != kp, kp, U, NRW, KC, NC,
                                  cstep if taps else None, nkloop if taps else None)

    def k_blocks(bj: Builder, body) -> None:
        """``body(builder, pc, kc, k-block index, A's element offset of k-block pc)`` for every
        k-block: blocks of ``kstep``, or for an implicit-GEMM A the taps' blocks of ``cstep``."""
        if not taps:
            def plain(bp: Builder, pc: SSAValue, _c) -> None:
                body(bp, pc, bp.max(bp.min(kstep, bp.sub(K, pc)), 0), bp.div(pc, kstep), bp.mul(pc, kf.size(
                    plan.a.strides[-1])))
            # at least one k-block, so K == 0 still writes C (zeros or C0, then the epilogue)
            bj.for_(0, bj.max(K, 1), kstep, plain)
            return

        def per_tap(bt: Builder, tp: SSAValue, _c) -> None:
            toff = bt.add(bt.mul(bt.div(tp, kw_), step_h), bt.mul(bt.rem(tp, kw_), step_w))

            def block(bp: Builder, ci: SSAValue, _c2) -> None:
                body(bp, bp.add(bp.mul(tp, cg), ci), bp.min(cstep, bp.sub(cg, ci)),
                     bp.add(bp.mul(tp, nk_tap), bp.div(ci, cstep)), bp.add(toff, ci))
            bt.for_(0, cg, cstep, block)
        bj.for_(0, ntaps, 1, per_tap)

    def body_batch(bb: Builder, bi: SSAValue, _c) -> None:
        if shared:
            m_lo, m_hi = 0, M
        else:
            m_lo = bb.mul(bb.max(bb.sub(lo, bb.mul(bi, mtiles)), 0), MR)
            m_hi = bb.min(bb.mul(bb.sub(hi, bb.mul(bi, mtiles)), MR), M)
        off_a = batch_offset(bb, bi, plan.a)
        off_b = batch_offset(bb, bi, plan.b)
        off_c = bb.mul(bi, bb.mul(M, N))
        epi_offs = {}
        for v in views[2:]:
            epi_offs[id(v)] = batch_offset(bb, bi, v)
        sAm, sAk = kf.size(plan.a.strides[-2]), kf.size(plan.a.strides[-1])
        sBk, sBn = kf.size(plan.b.strides[-2]), kf.size(plan.b.strides[-1])

        def body_jc(bj: Builder, jc: SSAValue, _c) -> None:
            nc = bj.min(nstep, bj.sub(N, jc))

            def body_pc(bp: Builder, pc: SSAValue, kc, kidx, a_koff) -> None:
                kcp = bp.mul(bp.ceil_div(kc, kp), kp)
                if shared:  # this thread's share of the panel's NR*W-column slivers
                    npan = bp.ceil_div(nc, NRW)
                    pper = bp.ceil_div(npan, kf.nthreads)
                    p0 = bp.min(bp.mul(kf.tid, pper), npan)
                    p1 = bp.min(bp.add(p0, pper), npan)
                    c0 = bp.mul(p0, NRW)
                    ncols = bp.max(bp.sub(bp.min(bp.mul(p1, NRW), nc), c0), 0)
                    dst0 = bp.mul(c0, kcp)
                else:
                    c0, ncols, dst0 = 0, nc, (0 if bslot is None else bp.mul(kidx, bslot))
                slot0 = dst0 if bslot is not None else 0   # where this k-block's B starts in the panel

                def pack_b(bq: Builder):
                    bsrc = view(bq, buf[plan.b.arg], plan.b_elem or in_elem, "global", (KC, NC),
                                bq.add(off_b, bq.add(bq.mul(pc, sBk), bq.mul(bq.add(jc, c0), sBn))), sBk, sBn, kc,
                                ncols)
                    tok = t.AsyncCopyOp.create(operands=[bsrc, bpack, bq.c(dst0)], attributes={
                        "layout": StringAttr("b_panel"), "panel": i64_attr(NRW), "kpack": i64_attr(bkpack),
                        **({"kblock": i64_attr(kp)} if bkpack != kp else {})}, result_types=[t.TokenType()])
                    bq.op(tok)
                    bq.op(t.WaitOp.create(operands=[tok.token]))
                    return []
                if bslot is None:
                    pack_b(bp)
                else:   # packed for the thread's first batch entry, kept in its slot for the others
                    bp.if_(bp.cmp("eq", bi, b_lo), pack_b)
                if shared:
                    bp.op(t.BarrierOp.create())  # the whole panel is packed before anyone reads it
                first = bp.cmp("eq", pc, 0)
                last = bp.cmp("sge", bp.add(pc, kc), K)

                def body_ic(bi2: Builder, ic: SSAValue, _c, rows=MC) -> None:
                    mc = bi2.min(rows, bi2.sub(m_hi, ic))
                    if plan.gather is not None:
                        asrc = gemm_gather.stage(kf, bi2, plan.gather, a_stage, in_elem, bi2.add(off_a, bi2.mul(ic, sAm)),
                                                 sAm, pc, mc, kc, K, (MC, KC), cfg.w)
                    else:
                        asrc = view(bi2, buf[plan.a.arg], in_elem, "global", (MC, KC),
                                    bi2.add(off_a, bi2.add(bi2.mul(ic, sAm), a_koff)), sAm, sAk, mc, kc)
                    pack_now(bi2, asrc, apack, "a_panel", MR, kp)

                    def strip(bj2: Builder, jr, nrv: int) -> None:
                        def body_ir(br: Builder, ir: SSAValue, _c) -> None:
                            micro_tile(br, ic, ir, jc, jr, mc, nc, kc, kcp, pc, first, last, off_c, epi_offs, nrv,
                                       slot0)
                        bj2.for_(0, mc, MR, body_ir)

                    column_strips(bi2, nc, NRW, NR, CN, strip)

                if shared:
                    phase = bp.add(bp.mul(bp.add(bp.mul(bi, njc), bp.div(jc, nstep)), nkloop), kidx)

                    def chunk(bw: Builder, item):
                        lo = bw.mul(chunk_start(bw, item, mtiles, nchunks), MR)
                        hi = bw.mul(chunk_start(bw, bw.add(item, 1), mtiles, nchunks), MR)
                        body_ic(bw, lo, None, bw.sub(hi, lo))
                    for_claimed(bp, claimed_phase_base(bp, kf, phase, nchunks), nchunks, chunk)
                else:
                    bp.for_(m_lo, m_hi, MC, body_ic)
                if shared:
                    bp.op(t.BarrierOp.create())  # everyone is done with the panel before it is repacked

            k_blocks(bj, body_pc)

        bb.for_(0, N, nstep, body_jc)

    def micro_tile(br: Builder, ic, ir, jc, jr, mc, nc, kc, kcp, pc, first, last, off_c, epi_offs,
                   nrv: int, b_slot=0) -> None:
        cols = nrv * CN
        frag_a = t.fragment((MR, cols, kp), pack_elem, acc_elem, "a", rec.a_layout, rec.family)
        frag_b = frag_a.with_role("b", rec.b_layout)
        frag_c = t.fragment((MR, cols, kp), acc_elem, acc_elem, "acc", "row_major", rec.family)
        row = br.add(ic, ir)
        col = br.add(jc, jr)
        vr = br.sub(mc, ir)
        vc = br.sub(nc, jr)
        c_off = br.add(off_c, br.add(br.mul(row, N), col))
        part_view = view(br, buf[part_buf], acc_elem, "global", (MR, cols), c_off, N, 1, vr, vc)

        def init_first(bf: Builder):
            if plan.c0 is not None:
                v = plan.c0.view
                off = bf.add(epi_offs[id(v)], bf.add(bf.mul(row, kf.size(v.strides[-2])),
                                                     bf.mul(col, kf.size(v.strides[-1]))))
                cv = view(bf, buf[plan.c0.arg], acc_elem, "global", (MR, cols), off, kf.size(v.strides[-2]),
                          kf.size(v.strides[-1]), vr, vc)
                op = t.FragmentPackOp.create(operands=[cv], result_types=[frag_c])
            else:
                op = t.FragmentZeroOp.create(result_types=[frag_c])
            bf.op(op)
            return [op.result]

        def init_partial(bf: Builder):
            op = t.FragmentPackOp.create(operands=[part_view], result_types=[frag_c])
            bf.op(op)
            return [op.result]

        acc0 = br.if_(first, init_first, init_partial, [frag_c])[0]
        a_base = br.mul(br.div(ir, MR), br.mul(MR, kcp))
        b_base = br.add(b_slot, br.mul(br.div(jr, NRW), br.mul(NRW, kcp)))

        def step(bk: Builder, kk, acc: SSAValue) -> SSAValue:
            av = view(bk, apack, pack_elem, "l2", (MR, kp), bk.add(a_base, bk.mul(kk, MR)), kp, 1, MR, kp)
            # B: k x cols; (k, c) at b_base + kk*NRW + (k // g)*g*NRW + c*g + k % g for k groups of g = bkpack
            # (a row stride of 1 when one group spans the fragment's k, else the pitch of a k group)
            brs = 1 if bkpack == kp else bkpack * NRW
            bv = view(bk, bpack, pack_elem, "team" if shared else "l3", (kp, cols), bk.add(b_base, bk.mul(kk, NRW)),
                      brs, bkpack, kp, cols)
            fa = t.FragmentPackOp.create(operands=[av], result_types=[frag_a])
            fb = t.FragmentPackOp.create(operands=[bv], result_types=[frag_b])
            bk.op(fa)
            bk.op(fb)
            mma = t.MmaOp.create(operands=[fa.result, fb.result, acc], result_types=[frag_c])
            bk.op(mma)
            return mma.result

        kmain = br.mul(br.div(kcp, kp * U), kp * U)

        # A narrow tile has too few accumulators to hide the FMA latency: it keeps two (even
        # and odd k steps) and adds them at the end.
        # (AMX accumulators are tile registers: the 2x2 tile already fills the tile file.)
        chains = 2 if U > 1 and U % 2 == 0 and MR * nrv < 8 and not tiles_amx else 1
        accs0 = [acc0] + [br.op(t.FragmentZeroOp.create(result_types=[frag_c])).results[0]
                          for _ in range(chains - 1)]

        def unrolled(bk: Builder, kk, carried):
            accs = list(carried)
            for u in range(U):
                accs[u % chains] = step(bk, bk.add(kk, u * kp), accs[u % chains])
            return accs

        accs = br.for_(0, kmain, kp * U, unrolled, accs0) if U > 1 else accs0
        accs[0] = br.for_(kmain if U > 1 else 0, kcp, kp, lambda bk, kk, c: [step(bk, kk, c[0])], [accs[0]])[0]
        unpacked = []
        for a_ in accs:
            up = t.FragmentUnpackOp.create(operands=[a_], result_types=[t.tile_type(MR, cols, acc_elem)])
            br.op(up)
            unpacked.append(up.result)
        unpack = unpacked[0] if chains == 1 else elementwise(br, "add", unpacked)

        def finish(bf: Builder):
            if heavy:
                bf.op(t.StoreOp.create(operands=[unpack, view(bf, escratch, acc_elem, "l1", (MR, cols), 0, cols, 1,
                                                              MR, cols)]))

                def one_row(bw: Builder, r, _c):
                    ld = bw.op(t.LoadOp.create(operands=[view(bw, escratch, acc_elem, "l1", (1, cols), bw.mul(r, cols),
                                                              0, 1, 1, cols)], result_types=[t.tile_type(1, cols, acc_elem)]))
                    val = apply_epilogue(bw, kf, kop, plan, ld.results[0], (1, cols), bw.add(row, r), col, 1, vc,
                                         epi_offs)
                    out_row = view(bw, buf[out_buf], out_elem, "global", (1, cols), bw.add(c_off, bw.mul(r, N)), N, 1,
                                   1, vc)
                    bw.op(t.StoreOp.create(operands=[val, out_row]))
                    return []
                bf.for_(0, bf.min(MR, vr), 1, one_row)
                return
            val = apply_epilogue(bf, kf, kop, plan, unpack, (MR, cols), row, col, vr, vc, epi_offs)
            out_view = view(bf, buf[out_buf], out_elem, "global", (MR, cols), c_off, N, 1, vr, vc)
            bf.op(t.StoreOp.create(operands=[val, out_view]))

        def keep_partial(bf: Builder):
            bf.op(t.StoreOp.create(operands=[unpack, part_view]))

        br.if_(last, finish, keep_partial)

    b.for_(b_lo, b_hi, 1, body_batch)
    if split:
        split.finish(out_buf, views, apply_epilogue)
    fn = kf.finish()
    return fn, sig.dims, workspace, extra_outputs


def chunk_start(b: Builder, item, tiles, chunks):
    """The first row tile of chunk ``item`` when ``tiles`` row tiles are split into ``chunks``
    chunks of equal size (differing by one tile at most): floor(item * tiles / chunks)."""
    return b.div(b.mul(item, tiles), chunks)


def register_sizes(sig: KernelSig, plan: GemmPlan) -> list[StridedView]:
    """Register the GEMM's sizes and every operand view's strides as kernel size arguments;
    returns the views (A, B, C0 if any, then the epilogue operands)."""
    for d in (*plan.batch, plan.m, plan.n, plan.k):
        sig.dim(d)
    views = [plan.a, plan.b] + ([plan.c0.view] if plan.c0 else []) + [
        st[2].view for st in plan.epilogue if st[0] == "bin" and isinstance(st[2], Operand)] + gemm_dag.views(plan)
    for v in views:
        for st in (*v.strides, *v.offset):
            sig.dim(st)
    return views


def view(bb: Builder, src: SSAValue, elem, space, shape, off, rs, cs, rows, cols, align: int = 0) -> SSAValue:
    """``tile.view`` of ``src`` (operands may be Python ints)."""
    op = t.ViewOp.create(operands=[src, bb.c(off), bb.c(rs), bb.c(cs), bb.c(rows), bb.c(cols)],
                         result_types=[t.view_type(shape[0], shape[1], elem, space)],
                         attributes={"align": i64_attr(align)} if align > 1 else {})
    bb.op(op)
    return op.result


def batch_offset_of(bb: Builder, kf: KernelFn, plan: GemmPlan, bidx: SSAValue, v: StridedView) -> SSAValue | int:
    """Element offset of batch entry ``bidx`` (row-major over the batch dims) in view ``v``, from
    the buffer's start (a sliced view starts at its offset)."""
    off = kf.view_offset(bb, v)
    rem: SSAValue | int = bidx
    nbatch = len(plan.batch)
    for i in reversed(range(nbatch)):
        size = kf.size(plan.batch[i])
        idx = bb.rem(rem, size) if i > 0 else rem
        rem = bb.div(rem, size) if i > 0 else 0
        off = bb.add(off, bb.mul(idx, kf.size(v.strides[i])))
    return off


# epilogue functions that expand to a polynomial (tens of instructions per vector)
HEAVY_FNS = frozenset({"exp", "tanh", "erf", "silu", "gelu_tanh", "gelu_erf", "sigmoid", "log", "log1p", "exp2",
                       "expm1", "sin", "cos"})


def apply_epilogue(bf: Builder, kf: KernelFn, kop: s.KernelOp, plan: GemmPlan, val: SSAValue,
                   shape: tuple[int, int], row, col, vr, vc, epi_offs: dict) -> SSAValue:
    """The fused epilogue on an R x C tile of results at (row, col) with ``vr`` x ``vc`` valid:
    unary functions, and binary ones with a constant or a broadcast kernel input."""
    R, C = shape
    for st in plan.epilogue:
        if st[0] == "dag":
            mm = next(o for o in kop.body.block.ops if isinstance(o, g.MatmulOp))
            val = gemm_dag.apply(bf, kf, kop, st, val, shape, row, col, vr, vc, epi_offs, mm.result,
                                 lambda bb, operand, elem: _load_operand(bb, kf, kop, operand, R, C, row, col, vr,
                                                                         vc, epi_offs, elem))
        elif st[0] == "un":
            val = elementwise(bf, st[1], [val])
        elif st[0] == "self":
            val = elementwise(bf, st[1], [val, val])
        else:
            _, fn, operand, chain_lhs = st
            if isinstance(operand, float):
                other = tile_const(bf, operand, kf.reg)
            else:   # in the registers' type
                other = _load_operand(bf, kf, kop, operand, R, C, row, col, vr, vc, epi_offs, kf.reg)
            val = elementwise(bf, fn, [val, other] if chain_lhs else [other, val])
    return val


def _load_operand(bf, kf, kop, operand: Operand, R, C, row, col, vr, vc, epi_offs, elem):
    """An epilogue operand's R x C tile (broadcast where its shape is 1) in registers of ``elem``."""
    ov = operand.view
    r = 1 if operand.row_bcast else R
    c = 1 if operand.col_bcast else C
    rs = 0 if operand.row_bcast else kf.size(ov.strides[-2])
    cs = 0 if operand.col_bcast else kf.size(ov.strides[-1])
    off = bf.add(epi_offs[id(ov)], bf.add(bf.mul(row, rs), bf.mul(col, cs)))
    mem = kop.inputs[operand.arg].type.element_type
    vw = view(bf, kf.buffer_args[operand.arg], mem, "global", (r, c), off, rs, cs,
              1 if r == 1 else vr, 1 if c == 1 else vc)
    return bf.op(t.LoadOp.create(operands=[vw], result_types=[t.tile_type(r, c, elem)])).results[0]


def _round(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
