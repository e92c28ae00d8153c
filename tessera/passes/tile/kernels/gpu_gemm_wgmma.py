"""The GEMM kernel on ``wgmma`` (NVIDIA sm_90a): ``[batch] C = epilogue(A @ B [+ C0])`` as Tile IR.

Written per warpgroup (the schedule's ``vector`` is the record's 128 lanes): ``tile.program_id``
picks the BM x BN block of C, ``tile.wave_id`` the warpgroup's FM*64 x FN*n sub-tile.  Per
k-block of BK = 64 (128-byte rows of 16-bit elements; fp8 m64nNk32: BK = 128, and B is always
staged K-major — B^T's rows of k — since fp8 wgmma has no transpose immediates):

  A's block (BM x 64, k contiguous) is copied into shared memory with ``layout =
  "swizzle128"`` (the lowering places the 128-byte swizzle and the async-proxy fence), into one
  of ``staging`` buffers.  B's block is copied as it lies: a row-major B ([K, N], n
  contiguous) as BK rows of BN (BN/64 panels of 64 columns: 16-byte vector copies) and read
  MN-major; a B given transposed (k contiguous) as BN rows of k, read K-major.  Each
  warpgroup runs 4 k16 steps of FM x FN ``tile.mma`` on fragments packed from views of those
  blocks (A: rows of k; B: the k x n view, MN-major or K-major) — the lowering turns each view
  into a matrix descriptor — threading its accumulators.

Pipeline: the copy of block kb + d is issued while block kb is computed.  With ``staging`` S >= 3
the kernel keeps one wgmma group in flight across iterations (``wgmma.inflight`` = 1: the
lowering ends the body with ``wait_group 1``), so the stage a copy overwrites must be the one
the group *two* blocks back read, complete by that wait: d = S - 2.  With S = 2, d = 1 and the
body ends with ``wait_group 0``.

Then the accumulators are unpacked, the fused epilogue applied and stored (edges masked).
"""
from __future__ import annotations

from xdsl.dialects.builtin import StringAttr, f32
from xdsl.ir import SSAValue

from tessera.ir import dims as D
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, int_array, str_array
from tessera.ir.builder import Builder
from tessera.mma.selector import MmaSelection
from tessera.passes.tile.kernels import gpu_gemm_tma
from tessera.passes.tile.kernels.common import KernelSig, gpu_ids, illegal
from tessera.passes.tile.kernels.gemm import GemmPlan, apply_epilogue, batch_offset_of, register_sizes, view

BK_WGMMA = 64     # elements of k per staged row: 128 bytes, one swizzle row (128 fp8 elements)
INFLIGHT = 1      # wgmma groups kept in flight across k-blocks when staging >= 3


def prefetch_distance(stages: int, inflight: int) -> int:
    """How many k-blocks ahead the copies may run: the copy issued in iteration kb refills the
    stage of block kb - 1 - inflight, whose wgmma group the previous iteration's wait_group
    (``inflight`` left pending) completed, and every warpgroup passed the barrier since."""
    return stages - 1 - inflight


def k_steps(bk: int, ik: int) -> range:
    """The k offsets (elements) of a staged k-block's instructions: the record's K apart (16 for
    16-bit, 32 for fp8: 32 bytes of a 128-byte row either way)."""
    return range(0, bk, ik)


def generate(kop: s.KernelOp, plan: GemmPlan, sel: MmaSelection):
    name = kop.sym_name.data
    rec = sel.record
    im, in_, ik = rec.shape
    tiles = kop.tile_sizes
    BM, BN, BK = tiles["m"], tiles["n"], tiles["k"]
    FM, FN = kop.reg_tile
    S = kop.staging.value.data
    wave = rec.lanes or 128
    eb = 1 if rec.k == 32 else 2            # fp8 (k32) or 16-bit (k16) elements
    row = BK_WGMMA * 2 // eb                # elements per 128-byte swizzled row
    if BK != row:
        raise illegal(name, f"a wgmma gemm stages k-blocks of {row} (128-byte swizzled rows); tile-k={BK}")
    if BM % (FM * im) or BN % (FN * in_):
        raise illegal(name, f"blocks {BM}x{BN} are not whole warpgroup tiles of {FM}x{FN} {rec.id}")
    if S < 2:
        raise illegal(name, "a wgmma gemm double-buffers its k-blocks (staging >= 2)")
    inflight = INFLIGHT if S >= 3 else 0      # wgmma groups left in flight at the end of an iteration
    dist = prefetch_distance(S, inflight)     # k-blocks the copies run ahead of the wgmma
    WM, WN = BM // (FM * im), BN // (FN * in_)
    if kop.threads.value.data != WM * WN * wave or kop.vector.value.data != wave:
        raise illegal(name, f"threads {kop.threads.value.data} != {WM}x{WN} warpgroups of {wave}")
    in_elem, out_elem = plan.in_elem, plan.out_elem
    # B read MN-major (imm-trans-b) when its n is contiguous: staged with 16-byte copies as it lies.
    # fp8 wgmma has no transpose immediates: B is always staged K-major (B^T's rows of k)
    b_mn = D.canon(plan.b.strides[-1]) == 1 and in_ % 64 == 0 and eb == 2
    b_elem = plan.b_elem or in_elem
    tma = kop.copy_engine is not None and kop.copy_engine.data == "tma"     # the copy engine (gpu_gemm_tma.py)
    if tma and S < 3:
        raise illegal(name, "copy_engine=tma runs a ring of 3 or 4 stages")

    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    views = register_sizes(sig, plan)
    if tma:
        if eb == 1 and b_elem != in_elem:
            raise illegal(name, "copy_engine=tma maps one element type per GEMM here (not an e4m3 x e5m2 mix)")
        maps = gpu_gemm_tma.maps(name, sig, plan, b_mn, eb, str(in_elem), BM, BN, BK)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    M, N, K = kf.size(plan.m), kf.size(plan.n), kf.size(plan.k)
    sAm, sAk = kf.size(plan.a.strides[-2]), kf.size(plan.a.strides[-1])
    sBk, sBn = kf.size(plan.b.strides[-2]), kf.size(plan.b.strides[-1])

    bx, by, bz, w = gpu_ids(b)
    wm, wn = b.div(w, WN), b.rem(w, WN)
    m0, n0 = b.mul(by, BM), b.mul(bx, BN)
    smem_a = kf.alloc(b, S * BM * BK, in_elem, "smem")
    smem_b = kf.alloc(b, S * BN * BK, b_elem, "smem")
    off_a = batch_offset_of(b, kf, plan, bz, plan.a)
    off_b = batch_offset_of(b, kf, plan, bz, plan.b)
    off_c = b.mul(bz, b.mul(M, N))
    epi_offs = {id(v): batch_offset_of(b, kf, plan, bz, v) for v in views[2:]}

    frag_a = t.fragment(rec.shape, in_elem, f32, "a", sel.a_layout, rec.family)
    frag_b = t.fragment(rec.shape, b_elem, f32, "b", sel.b_layout, rec.family)
    frag_c = t.fragment(rec.shape, f32, f32, "acc", "row_major", rec.family)
    wrow = b.add(m0, b.mul(wm, FM * im))
    wcol = b.add(n0, b.mul(wn, FN * in_))
    rows = [b.add(wrow, i * im) for i in range(FM)]
    cols = [b.add(wcol, j * in_) for j in range(FN)]

    accs0: list[SSAValue] = []
    for i in range(FM):
        for j in range(FN):
            if plan.c0 is not None:
                v = plan.c0.view
                rs, cs = kf.size(v.strides[-2]), kf.size(v.strides[-1])
                off = b.add(epi_offs[id(v)], b.add(b.mul(rows[i], rs), b.mul(cols[j], cs)))
                cv = view(b, buf[plan.c0.arg], f32, "global", (im, in_), off, rs, cs, b.sub(M, rows[i]),
                          b.sub(N, cols[j]))
                o = t.FragmentPackOp.create(operands=[cv], result_types=[frag_c])
            else:
                o = t.FragmentZeroOp.create(result_types=[frag_c])
            b.op(o)
            accs0.append(o.results[0])

    def copy(bb: Builder, kb, stage) -> list[SSAValue]:
        k0 = bb.mul(kb, BK)
        av = view(bb, buf[plan.a.arg], in_elem, "global", (BM, BK), bb.add(off_a, bb.add(bb.mul(m0, sAm),
                  bb.mul(k0, sAk))), sAm, sAk, bb.sub(M, m0), bb.sub(K, k0))
        boff = bb.add(off_b, bb.add(bb.mul(n0, sBn), bb.mul(k0, sBk)))
        if b_mn:     # BK rows of BN, n contiguous: BN/64 swizzled panels
            bv = view(bb, buf[plan.b.arg], in_elem, "global", (BK, BN), boff, sBk, sBn, bb.sub(K, k0), bb.sub(N, n0))
        else:        # B^T: row n of the block is column n of B (its k elements)
            bv = view(bb, buf[plan.b.arg], b_elem, "global", (BN, BK), boff, sBn, sBk, bb.sub(N, n0), bb.sub(K, k0))
        toks = []
        for src, dst, size in ((av, smem_a, BM * BK), (bv, smem_b, BN * BK)):
            o = t.AsyncCopyOp.create(operands=[src, dst, bb.c(bb.mul(stage, size))], attributes={
                "layout": StringAttr("swizzle128"), "panel": i64_attr(BK), "kpack": i64_attr(1)},
                result_types=[t.TokenType()])
            bb.op(o)
            toks.append(o.token)
        return toks

    def compute(bb: Builder, stage, accs: list[SSAValue]) -> list[SSAValue]:
        accs = list(accs)
        abase = bb.add(bb.mul(stage, BM * BK), bb.mul(bb.mul(wm, FM * im), BK))
        bbase = bb.add(bb.mul(stage, BN * BK), bb.mul(bb.mul(wn, FN * in_), BK))   # panels of 64 x BK, too
        for kk in k_steps(BK, ik):
            fa, fb = [], []
            for i in range(FM):
                av = view(bb, smem_a, in_elem, "smem", (im, ik), bb.add(abase, i * im * BK + kk), BK, 1, im, ik,
                          align=8)
                o = t.FragmentPackOp.create(operands=[av], result_types=[frag_a])
                bb.op(o)
                fa.append(o.results[0])
            for j in range(FN):
                if b_mn:    # k x n from the panels: row kk of panel (n / 64), 64 n a row (n past 64: next panel)
                    bv = view(bb, smem_b, in_elem, "smem", (ik, in_), bb.add(bbase, j * in_ * BK + kk * 64), 64, 1,
                              ik, in_, align=8)
                else:       # k x n, column n at row n of the block: row stride 1, column stride BK
                    bv = view(bb, smem_b, b_elem, "smem", (ik, in_), bb.add(bbase, j * in_ * BK + kk), 1, BK, ik,
                              in_, align=8)
                o = t.FragmentPackOp.create(operands=[bv], result_types=[frag_b])
                bb.op(o)
                fb.append(o.results[0])
            for i in range(FM):
                for j in range(FN):
                    o = t.MmaOp.create(operands=[fa[i], fb[j], accs[i * FN + j]], result_types=[frag_c])
                    bb.op(o)
                    accs[i * FN + j] = o.results[0]
        return accs

    def wait(bb: Builder, toks, outstanding: int) -> None:
        bb.op(t.WaitOp.create(operands=list(toks), attributes={"outstanding": i64_attr(outstanding)}))
        bb.op(t.BarrierOp.create())

    nk = b.ceil_div(K, BK)
    nacc = len(accs0)
    if tma:
        ring = gpu_gemm_tma.TmaStaging(b, kf, S, smem_a, smem_b, m0, n0, nk, BM, BN, BK, eb, b_mn)
        for st in range(dist):
            ring.fill(b, st, st)

        def tma_body(bb: Builder, kb, carried):
            bb.op(t.BarrierOp.create())     # every warpgroup's group of block kb - 2 is complete: refill its stage
            nxt = bb.add(kb, dist)
            ring.fill(bb, nxt, bb.rem(nxt, S))
            ring.wait(bb, kb)
            return compute(bb, bb.rem(kb, S), list(carried))
        accs = b.for_(0, nk, 1, tma_body, accs0)
    else:
        toks0: list[SSAValue] = []
        for st in range(dist):
            toks0 += copy(b, st, st)

        def body(bb: Builder, kb, carried):
            accs, toks = list(carried[:nacc]), list(carried[nacc:])
            wait(bb, toks[:2], 2 * (dist - 1))
            nxt = bb.add(kb, dist)
            new = copy(bb, nxt, bb.rem(nxt, S))
            out = compute(bb, bb.rem(kb, S), accs)
            return out + toks[2:] + new
        accs = b.for_(0, nk, 1, body, accs0 + toks0)[:nacc]

    for i in range(FM):
        for j in range(FN):
            up = t.FragmentUnpackOp.create(operands=[accs[i * FN + j]], result_types=[t.tile_type(im, in_, f32)])
            b.op(up)
            vr, vc = b.sub(M, rows[i]), b.sub(N, cols[j])
            val = apply_epilogue(b, kf, kop, plan, up.result, (im, in_), rows[i], cols[j], vr, vc, epi_offs)
            ov = view(b, buf[out_buf], out_elem, "global", (im, in_), b.add(off_c, b.add(b.mul(rows[i], N), cols[j])),
                      N, 1, vr, vc)
            b.op(t.StoreOp.create(operands=[val, ov]))

    fn = kf.finish()
    batch = D.product(plan.batch) if plan.batch else 1
    fn.attributes["gpu.grid"] = str_array([D.ceil_extent(plan.n, BN), D.ceil_extent(plan.m, BM),
                                           D.ceil_extent(batch, 1)])
    fn.attributes["gpu.block"] = i64_attr(WM * WN * wave)
    fn.attributes["gpu.waves"] = int_array([WM, WN])
    fn.attributes["wgmma.inflight"] = i64_attr(inflight)
    if tma:
        fn.attributes["tma.maps"] = gpu_gemm_tma.map_attr(maps)
    return fn, sig.dims, 0, []
