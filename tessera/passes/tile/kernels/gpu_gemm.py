"""GPU GEMM kernels (ROCm and NVIDIA): ``[batch] C = epilogue(A @ B [+ C0])`` as Tile IR.

The same Tile IR serves both GPU lanes; only the instruction record (from the
schedule's ``mma``) and the shared-memory space (``lds`` / ``smem``) differ.  The
code is written per wave (warp): ``tile.program_id`` picks the workgroup's
BM x BN block of C (axis 0: columns, 1: rows, 2: batch), ``tile.wave_id`` the
wave's FM*m x FN*n sub-tile.  Per k-block of BK:

  A (BM x BK) and B (BK x BN) are copied into shared memory by the whole workgroup
  (``tile.async_copy``, row-major with 8 elements of padding per row; edge blocks
  zero-filled by the views' valid extents), into one of ``staging`` buffers;
  with staging S >= 2, the copy of block kb + S - 1 is issued before block kb is
  computed, and ``tile.wait {outstanding}`` waits only for the oldest block;
  every wave packs its FM A and FN B fragments from shared memory and runs
  FM x FN ``tile.mma`` on typed fragments, threading its accumulators through
  the k loop — they start as ``tile.fragment_zero`` or as the real incoming C0.

Then each accumulator is unpacked, the fused epilogue applied (bias / activation /
scale), and stored with the edge rows and columns masked by the view's extent.
"""
from __future__ import annotations

from math import gcd

from xdsl.dialects.builtin import Float8E4M3FNType, Float8E5M2Type, StringAttr, f32
from xdsl.ir import SSAValue

from tessera.ir import dims as D
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, int_array, str_array
from tessera.ir.builder import Builder
from tessera.mma.selector import MmaSelection
from tessera.passes.tile.kernels import gemm_gather
from tessera.passes.tile.kernels.common import KernelSig, gpu_ids, illegal
from tessera.passes.tile.kernels.gemm import GemmPlan, apply_epilogue, batch_offset_of, register_sizes, view

PAD = 8  # elements of padding per shared-memory row (16 bytes: rows start in different banks)


def row_pad(esize: int) -> int:
    """Padding elements per shared row: PAD, at least 16 bytes (fp8: 16), so padded rows keep
    16-byte vector (cp.async) alignment."""
    return max(PAD, 16 // esize)


def generate(kop: s.KernelOp, plan: GemmPlan, sel: MmaSelection):
    """Build the kernel; returns (func, dims, workspace bytes, extra output types)."""
    name = kop.sym_name.data
    rec = sel.record
    gemm_gather.refuse_on_gpu(name, plan, rec.target)
    if rec.family == "wgmma":     # NVIDIA sm_90a warpgroup MMA from swizzled shared memory
        from tessera.passes.tile.kernels import gpu_gemm_wgmma
        return gpu_gemm_wgmma.generate(kop, plan, sel)
    im, in_, ik = rec.shape
    tiles = kop.tile_sizes
    BM, BN, BK = tiles["m"], tiles["n"], tiles["k"]
    FM, FN = kop.reg_tile
    S = kop.staging.value.data
    wave = rec.lanes or 32
    if kop.loop_order != ["b", "m", "n", "k"] or kop.parallel.data != "b*m*n":
        raise illegal(name, "a GPU gemm runs loops [b, m, n, k] with the grid over b*m*n")
    if BM % (FM * im) or BN % (FN * in_) or BK % ik:
        raise illegal(name, f"blocks {BM}x{BN}x{BK} are not whole wave tiles of {FM}x{FN} {rec.id}")
    WM, WN = BM // (FM * im), BN // (FN * in_)
    if kop.threads.value.data != WM * WN * wave or kop.vector.value.data != wave:
        raise illegal(name, f"threads {kop.threads.value.data} != {WM}x{WN} waves of {wave}")
    space = {"rocm": "lds", "nvidia": "smem"}[rec.target]
    in_elem, out_elem = plan.in_elem, plan.out_elem
    b_elem = plan.b_elem or in_elem       # B's own element type (fp8 e4m3 x e5m2)
    pad = row_pad(1 if isinstance(in_elem, (Float8E4M3FNType, Float8E5M2Type)) else 2)
    PA, PB = BK + pad, BN + pad

    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    views = register_sizes(sig, plan)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    M, N, K = kf.size(plan.m), kf.size(plan.n), kf.size(plan.k)
    sAm, sAk = kf.size(plan.a.strides[-2]), kf.size(plan.a.strides[-1])
    sBk, sBn = kf.size(plan.b.strides[-2]), kf.size(plan.b.strides[-1])

    bx, by, bz, w = gpu_ids(b)
    wm, wn = b.div(w, WN), b.rem(w, WN)
    m0, n0 = b.mul(by, BM), b.mul(bx, BN)
    lds_a = kf.alloc(b, S * BM * PA, in_elem, space)
    lds_b = kf.alloc(b, S * BK * PB, b_elem, space)
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
        """Stage k-block ``kb`` of A and B into shared-memory buffer ``stage`` (collective)."""
        k0 = bb.mul(kb, BK)
        av = view(bb, buf[plan.a.arg], in_elem, "global", (BM, BK), bb.add(off_a, bb.add(bb.mul(m0, sAm),
                  bb.mul(k0, sAk))), sAm, sAk, bb.sub(M, m0), bb.sub(K, k0))
        bv = view(bb, buf[plan.b.arg], b_elem, "global", (BK, BN), bb.add(off_b, bb.add(bb.mul(k0, sBk),
                  bb.mul(n0, sBn))), sBk, sBn, bb.sub(K, k0), bb.sub(N, n0))
        toks = []
        for src, dst, size, pitch in ((av, lds_a, BM * PA, PA), (bv, lds_b, BK * PB, PB)):
            o = t.AsyncCopyOp.create(operands=[src, dst, bb.c(bb.mul(stage, size))], attributes={
                "layout": StringAttr("row_major"), "panel": i64_attr(pitch), "kpack": i64_attr(1)},
                result_types=[t.TokenType()])
            bb.op(o)
            toks.append(o.token)
        return toks

    def compute(bb: Builder, stage, accs: list[SSAValue]) -> list[SSAValue]:
        accs = list(accs)
        abase = bb.add(bb.mul(stage, BM * PA), bb.mul(bb.mul(wm, FM * im), PA))
        bbase = bb.add(bb.mul(stage, BK * PB), bb.mul(wn, FN * in_))
        for kk in range(0, BK, ik):
            fa, fb = [], []
            for i in range(FM):
                av = view(bb, lds_a, in_elem, space, (im, ik), bb.add(abase, i * im * PA + kk), PA, 1, im, ik,
                          align=gcd(pad, gcd(PA, kk) if kk else PA))
                o = t.FragmentPackOp.create(operands=[av], result_types=[frag_a])
                bb.op(o)
                fa.append(o.results[0])
            for j in range(FN):
                bv = view(bb, lds_b, b_elem, space, (ik, in_), bb.add(bbase, kk * PB + j * in_), PB, 1, ik, in_,
                          align=gcd(pad, gcd(PB, j * in_) if j else PB))
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
    if S == 1:
        def body1(bb: Builder, kb, carried):
            wait(bb, copy(bb, kb, 0), 0)
            out = compute(bb, 0, list(carried))
            bb.op(t.BarrierOp.create())   # everyone has read the buffer before it is refilled
            return out
        accs = b.for_(0, nk, 1, body1, accs0)
    else:
        toks0: list[SSAValue] = []
        for st in range(S - 1):   # blocks past the end have an empty extent: they copy zeros
            toks0 += copy(b, st, st)
        nacc = len(accs0)

        def body(bb: Builder, kb, carried):
            accs, toks = list(carried[:nacc]), list(carried[nacc:])
            wait(bb, toks[:2], 2 * (S - 2))
            nxt = bb.add(kb, S - 1)
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
    return fn, sig.dims, 0, []
