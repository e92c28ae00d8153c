"""Dual-B GEMM kernels: ``[batch] C = epilogue(A @ B1, A @ B3)`` in one pass, neither product
written (SwiGLU ``silu(x @ w1) * (x @ w3)``; the group comes from ``fuse-dual-gemm``).

The kernel is the GEMM of ``gemm.py`` (its A packing, cache blocks, k-blocks, thread split and
micro-kernel) with one change in its register tile: of the schedule's MR x NR tile (NR vectors
across), the first half of the vectors accumulates columns ``j..j+H`` of ``A @ B1`` and the
second half the same columns of ``A @ B3`` (H = NR/2 vectors; NR = 1 takes one vector of each).
B is packed interleaved to match: sliver p of the panel holds, for each k, H elements of B1's
columns p*H.. and then the same H of B3's, so one ``tile.mma`` per k step reads a 2H-wide B
fragment and the instruction stream is exactly the plain kernel's: MR broadcasts of A, NR vector
loads of B and MR*NR FMAs.  (A first form ran two ``tile.mma`` of H columns on one A fragment;
LLVM then kept the MR broadcasts live across both and spilled accumulators in the k loop: 0.36x
to 0.54x of two plain gemms.)  The interleaved rows are copied with ``tile.load`` /
``tile.store`` (a row of H elements at a time, unmasked for a whole sliver), so the target
lowering needs no new packing layout.  Records whose panels interleave k groups (AVX-512 BF16
dot products, AMX: ``kpack`` > 1) keep B1 and B3 in two plain ``b_panel`` panels and run the
two-``tile.mma`` form (``INTERLEAVE`` off runs that form on f32, for its test).

The last k-block stores the accumulator tile to an L1 scratch tile, applies the epilogue graph
to its two halves (row by row when it holds polynomial functions, as the plain kernel does: one
copy of their code per tile shape) and stores only its result.  The cache blocks are the plain
kernel's: an n-block packs NC/2 columns of each B (one panel of NC columns in all), a k-block
KC.  When K needs more than one k-block the pair's partial sums live in an f32 (f64) scratch of
[M, 2N] between k-blocks, as the plain kernel keeps its own partial sums in C (the launch always
declares it, sizes being symbolic, but nothing writes it then); at
the Llama sizes (K 512 and 1024, KC 1024 for f32) there is one k-block and nothing but the
result is written.

Threads share the work as the plain kernel's do, by the schedule's parallel loop: ``m`` (the
team packs each pair of B panels together, then claims chunks of rows) or ``b*m`` (contiguous
ranges of batch x row tiles, private panels, no barrier; chosen for a rank-3 product such as
the Llama block's [1, S, hidden]).  Not handled here (``fuse-dual-gemm`` does not form such
groups): A rows gathered inside the kernel (a shared ``take`` runs first, as its own kernel),
an implicit-GEMM (conv) A, an accumulator input C0.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import StringAttr, f32, f64
from xdsl.ir import Attribute, SSAValue

from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.ir.builder import Builder
from tessera.passes.tile.kernels.common import (
    column_strips,
    pack_now,
    KernelSig,
    StridedView,
    claimed_phase_base,
    for_claimed,
    illegal,
    reg_elem,
    trace_view,
)
from tessera.passes.tile.kernels.gemm_plan import Operand, broadcast_view
from tessera.passes.tile.kernels.gemm import (
    HEAVY_FNS,
    GemmConfig,
    _load_operand,
    _round,
    batch_offset_of,
    chunk_start,
    view,
)
from tessera.passes.tile.kernels.typed import emit_iotas


# one interleaved panel where the record allows (tests switch it off to run the two-panel form on f32)
INTERLEAVE = True


@dataclass
class DualPlan:
    a: StridedView
    b1: StridedView
    b3: StridedView
    batch: tuple[D.Dim, ...]
    m: D.Dim
    n: D.Dim
    k: D.Dim
    in_elem: Attribute
    out_elem: Attribute
    r1: SSAValue          # the two products (values of the kernel body)
    r3: SSAValue
    ops: list             # the epilogue graph, in block order
    out: SSAValue         # its one result (yielded)
    operands: dict        # value -> Operand: epilogue inputs, broadcast against the output
    c0 = None
    gather = None

    def describe(self) -> dict:
        return {"dual": True, "epilogue": ["dual[" + ", ".join(o.name.split(".", 1)[1] for o in self.ops
                                                                 if not isinstance(o, g.ConstantOp)) + "]"],
                "out_dtype": str(self.out_elem)}


def is_dual(kop: s.KernelOp) -> bool:
    return sum(isinstance(o, g.MatmulOp) for o in kop.body.block.ops) == 2


def analyse(kop: s.KernelOp) -> DualPlan:
    block = kop.body.block
    name = kop.sym_name.data
    m1, m3 = [o for o in block.ops if isinstance(o, g.MatmulOp)]
    a, a3 = trace_view(m1.lhs, block), trace_view(m3.lhs, block)
    b1, b3 = trace_view(m1.rhs, block), trace_view(m3.rhs, block)
    if None in (a, a3, b1, b3):
        raise illegal(name, "dual gemm operands must be kernel inputs seen through reshape/transpose")
    if (a.arg, a.dims, a.strides, a.offset) != (a3.arg, a3.dims, a3.strides, a3.offset) or a.taps:
        raise illegal(name, "the two matmuls of a dual gemm read one A")
    if m1.result.type != m3.result.type or m1.rhs.type.dims != m3.rhs.type.dims:
        raise illegal(name, "the two products of a dual gemm have one shape and dtype")
    out_dims = m1.result.type.dims
    batch, (m, n) = out_dims[:-2], out_dims[-2:]
    k = m1.lhs.type.dims[-1]
    ops = [o for o in block.ops if not isinstance(o, (g.MatmulOp, g.YieldOp, g.ReshapeOp, g.TransposeOp,
                                                         g.SliceOp))]
    produced = {m1.result, m3.result} | {r for o in ops for r in o.results}
    yielded = list(block.last_op.values)
    if len(yielded) != 1 or yielded[0] not in produced - {m1.result, m3.result}:
        raise illegal(name, "a dual gemm kernel yields one value of its epilogue")
    operands = {}
    for op in ops:
        if not (isinstance(op, (g.ConstantOp, g.CastOp, g.WhereOp, g.IotaOp))
                or isinstance(op, g.ELEMENTWISE_UNARY + g.ELEMENTWISE_BINARY)):
            raise illegal(name, f"{op.name} cannot be fused into a dual gemm epilogue")
        if isinstance(op, g.IotaOp) and op.axis.value.data + len(out_dims) - op.result.type.rank < len(out_dims) - 2:
            raise illegal(name, "an iota along a batch axis cannot be fused into a gemm epilogue")
        for v in op.operands:
            if v in produced or v in operands:
                continue
            vw = trace_view(v, block)
            if vw is None or vw.arg >= len(kop.inputs):
                raise illegal(name, f"epilogue operand of {op.name} is not a kernel input")
            ov = broadcast_view(vw, out_dims)
            operands[v] = Operand(vw.arg, ov.strides[-2] == 0, ov.strides[-1] == 0, ov)
    return DualPlan(broadcast_view(a, (*batch, m, k)), broadcast_view(b1, (*batch, k, n)),
                    broadcast_view(b3, (*batch, k, n)), batch, m, n, k, m1.lhs.type.element_type,
                    yielded[0].type.element_type, m1.result, m3.result, ops, yielded[0], operands)


def _register(sig: KernelSig, plan: DualPlan) -> list[StridedView]:
    for d in (*plan.batch, plan.m, plan.n, plan.k):
        sig.dim(d)
    views = [plan.a, plan.b1, plan.b3] + [o.view for o in plan.operands.values()]
    for v in views:
        for st in (*v.strides, *v.offset):
            sig.dim(st)
    return views


def epilogue(bf: Builder, kf, kop, plan: DualPlan, v1, v3, shape, row, col, vr, vc, epi_offs) -> SSAValue:
    """The epilogue graph on one R x C tile of each product."""
    from tessera.passes.tile.kernels.rows import emit_ops
    R, C = shape
    vals = {plan.r1: v1, plan.r3: v3}
    for v, operand in plan.operands.items():
        vals[v] = _load_operand(bf, kf, kop, operand, R, C, row, col, vr, vc, epi_offs,
                                reg_elem(kop.inputs[operand.arg].type.element_type, kf.reg))
    rank = len(plan.r1.type.dims)

    def coord(axis):
        if axis == rank - 1:
            return col, (1, C), 0, 1
        return row, (R, 1), 1, 0
    emit_iotas(bf, plan.ops, vals, kf.reg, rank, coord)
    emit_ops(bf, plan.ops, vals, kf.reg)
    return vals[plan.out]


def generate(kop: s.KernelOp, plan: DualPlan, cfg: GemmConfig) -> tuple[object, list[D.Dim], int, list]:
    """Build the kernel; returns (func, dims, workspace bytes, extra output types)."""
    rec = cfg.sel.record
    kp = rec.k
    MR, CN = cfg.mr * rec.m, rec.n
    HN = max(cfg.nr // 2, 1)          # vectors (instructions) across per product
    H = HN * CN                       # output columns of one register tile
    tiles_amx = rec.register_file is not None
    in_elem = plan.in_elem
    pack_elem = f32 if rec.widen == "f32" else in_elem
    esize = rec.packed_bytes
    bkpack = 4 // esize if tiles_amx else kp
    MC, KC, U = cfg.mc, cfg.kc, cfg.unroll
    NCO = max(cfg.nc // 2 // H, 1) * H      # output columns of one n-block (both panels: the plain NC)
    acc_elem = f64 if rec.acc_dtype == "f64" else f32
    esz = 8 if acc_elem == f64 else 4
    out_elem = plan.out_elem
    # partial sums between k-blocks: only where K may need more than one
    kstat = D.canon(plan.k)
    partial_needed = not (isinstance(kstat, int) and kstat <= KC)

    sig = KernelSig(kop.sym_name.data, reg=acc_elem)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    part_buf = sig.buffer(acc_elem) if partial_needed else None
    extra_outputs = [g.TensorType.of((*plan.batch, plan.m, D.mul(2, plan.n)), acc_elem)] if partial_needed else []
    views = _register(sig, plan)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    M, N, K = kf.size(plan.m), kf.size(plan.n), kf.size(plan.k)

    a_elems, b_elems = MC * KC, KC * NCO
    apack = kf.alloc(b, a_elems, pack_elem, "l2")
    shared = cfg.mode == "m"
    bspace = "team" if shared else "l3"
    bpack = kf.alloc(b, 2 * b_elems, pack_elem, bspace)   # B1's panel, then B3's
    workspace = _round(a_elems * esize) + (0 if shared else _round(2 * b_elems * esize))
    heavy = any(isinstance(o, g.ELEMENTWISE_UNARY) and g.elementwise_fn(o) in HEAVY_FNS for o in plan.ops)
    # the pair's accumulators as one MR x 2H tile (B1's columns, then B3's): the halves are read back
    escratch = kf.alloc(b, 2 * MR * H, acc_elem, "l1")
    workspace += _round(2 * MR * H * esz)
    # one k element per step (vector FMA records): one interleaved panel and one tile.mma; records
    # that interleave k groups in their panels (dot products, AMX) pack B1 and B3 apart
    interleaved = INTERLEAVE and kp == 1 and bkpack == 1

    def pack_interleaved(bp: Builder, bv: StridedView, src_off, sBk, sBn, dst0, ncols, kc, half: int) -> None:
        """Columns [0, ncols) of a kc x ncols block of B (``half`` 0: B1, 1: B3) into this thread's
        slivers: sliver p holds rows of 2H elements, H of B1's columns then the same H of B3's."""
        def sliver(bs: Builder, p, _c):
            vc = bs.min(H, bs.sub(ncols, bs.mul(p, H)))
            base = bs.add(dst0, bs.add(bs.mul(p, bs.mul(2 * H, kcp_of(bs, kc))), half * H))
            soff = bs.add(src_off, bs.mul(bs.mul(p, H), sBn))

            def rows(bb: Builder, valid):
                def krow(bk: Builder, kk, _c2):
                    src = view(bk, buf[bv.arg], in_elem, "global", (1, H), bk.add(soff, bk.mul(kk, sBk)), sBk, sBn,
                               1, valid)
                    ld = bk.op(t.LoadOp.create(operands=[src], result_types=[t.tile_type(1, H, pack_elem)]))
                    bk.op(t.StoreOp.create(operands=[ld.results[0], view(bk, bpack, pack_elem, bspace, (1, H),
                                                                         bk.add(base, bk.mul(kk, 2 * H)), 2 * H, 1,
                                                                         1, H)]))
                    return []
                bb.for_(0, kc, 1, krow)
                return []
            # a whole sliver copies unmasked rows (its width a constant); the edge one masks each row
            bs.if_(bs.cmp("sge", vc, H), lambda bb: rows(bb, H), lambda bb: rows(bb, vc))
            return []
        bp.for_(0, bp.ceil_div(ncols, H), 1, sliver)

    def kcp_of(bb: Builder, kc):
        return bb.mul(bb.ceil_div(kc, kp), kp)

    nstep = b.select(b.cmp("sle", N, NCO), b.c(NCO), b.c(max(NCO // 2 // H, 1) * H))
    batch_total = 1
    for d in plan.batch:
        batch_total = b.mul(batch_total, kf.size(d))
    mtiles = b.ceil_div(M, MR)
    blocks = b.ceil_div(mtiles, MC // MR)
    per_thread = b.select(b.cmp("eq", kf.nthreads, 1), b.c(blocks),
                          b.c(b.max(b.ceil_div(blocks, kf.nthreads), 4)))
    nchunks = b.select(b.cmp("eq", mtiles, 0), b.c(0), b.c(b.mul(per_thread, kf.nthreads)))
    b_lo, b_hi = 0, batch_total
    if not shared:   # contiguous ranges of (batch x row tiles) per thread, each packing its own panels
        total = b.mul(batch_total, mtiles)
        per = b.ceil_div(total, kf.nthreads)
        lo = b.min(b.mul(kf.tid, per), total)
        hi = b.min(b.add(lo, per), total)
        mt_safe = b.max(mtiles, 1)
        b_lo, b_hi = b.div(lo, mt_safe), b.ceil_div(hi, mt_safe)
    njc = b.ceil_div(N, nstep)
    nkb = b.max(b.ceil_div(K, KC), 1)
    kstep = b.max(b.mul(b.ceil_div(b.ceil_div(K, nkb), kp * U), kp * U), kp * U)
    kstep = b.min(kstep, KC)
    nkloop = b.ceil_div(b.max(K, 1), kstep)

    def body_batch(bb: Builder, bi: SSAValue, _c) -> None:
        if shared:
            m_lo, m_hi = 0, M
        else:
            m_lo = bb.mul(bb.max(bb.sub(lo, bb.mul(bi, mtiles)), 0), MR)
            m_hi = bb.min(bb.mul(bb.sub(hi, bb.mul(bi, mtiles)), MR), M)
        off_a = batch_offset_of(bb, kf, plan, bi, plan.a)
        offs_b = [batch_offset_of(bb, kf, plan, bi, v) for v in (plan.b1, plan.b3)]
        off_c = bb.mul(bi, bb.mul(M, N))
        off_p = bb.mul(bi, bb.mul(M, bb.mul(N, 2)))
        epi_offs = {id(v): batch_offset_of(bb, kf, plan, bi, v) for v in views[3:]}
        sAm, sAk = kf.size(plan.a.strides[-2]), kf.size(plan.a.strides[-1])

        def body_jc(bj: Builder, jc: SSAValue, _c) -> None:
            nc = bj.min(nstep, bj.sub(N, jc))

            def body_pc(bp: Builder, pc: SSAValue, _c2) -> None:
                kc = bp.max(bp.min(kstep, bp.sub(K, pc)), 0)
                kidx = bp.div(pc, kstep)
                kcp = bp.mul(bp.ceil_div(kc, kp), kp)
                if shared:   # this thread's share of both panels' H-column slivers
                    npan = bp.ceil_div(nc, H)
                    pper = bp.ceil_div(npan, kf.nthreads)
                    p0 = bp.min(bp.mul(kf.tid, pper), npan)
                    p1 = bp.min(bp.add(p0, pper), npan)
                    c0 = bp.mul(p0, H)
                    ncols = bp.max(bp.sub(bp.min(bp.mul(p1, H), nc), c0), 0)
                else:
                    c0, ncols = 0, nc
                for half, (bv, off_b) in enumerate(zip((plan.b1, plan.b3), offs_b)):
                    sBk, sBn = kf.size(bv.strides[-2]), kf.size(bv.strides[-1])
                    src_off = bp.add(off_b, bp.add(bp.mul(pc, sBk), bp.mul(bp.add(jc, c0), sBn)))
                    if interleaved:
                        pack_interleaved(bp, bv, src_off, sBk, sBn, bp.mul(c0, bp.mul(2, kcp)), ncols, kc, half)
                        continue
                    bsrc = view(bp, buf[bv.arg], in_elem, "global", (KC, NCO), src_off, sBk, sBn, kc, ncols)
                    tok = t.AsyncCopyOp.create(operands=[bsrc, bpack, bp.c(bp.add(half * b_elems, bp.mul(c0, kcp)))],
                                               attributes={"layout": StringAttr("b_panel"), "panel": i64_attr(H),
                                                           "kpack": i64_attr(bkpack),
                                                           **({"kblock": i64_attr(kp)} if bkpack != kp else {})},
                                               result_types=[t.TokenType()])
                    bp.op(tok)
                    bp.op(t.WaitOp.create(operands=[tok.token]))
                if shared:
                    bp.op(t.BarrierOp.create())  # both panels are packed before anyone reads them
                first = bp.cmp("eq", pc, 0)
                last = bp.cmp("sge", bp.add(pc, kc), K)

                def body_ic(bi2: Builder, ic: SSAValue, rows) -> None:
                    mc = bi2.min(rows, bi2.sub(m_hi, ic))
                    asrc = view(bi2, buf[plan.a.arg], in_elem, "global", (MC, KC),
                                bi2.add(off_a, bi2.add(bi2.mul(ic, sAm), bi2.mul(pc, sAk))), sAm, sAk, mc, kc)
                    pack_now(bi2, asrc, apack, "a_panel", MR, kp)

                    def strip(bj2: Builder, jr, nrv: int) -> None:
                        def body_ir(br: Builder, ir: SSAValue, _c) -> None:
                            micro_tile(br, ic, ir, jc, jr, mc, nc, kcp, first, last, off_c, off_p, epi_offs, nrv)
                        bj2.for_(0, mc, MR, body_ir)

                    # a narrower remainder tile where the panel keeps its halves apart (the interleaved
                    # sliver's B3 half starts H columns in: its edge tile is a masked full one)
                    column_strips(bi2, nc, H, HN, CN, strip, HN if interleaved else 1)

                if not shared:
                    bp.for_(m_lo, m_hi, MC, lambda bi2, ic, _c: body_ic(bi2, ic, MC))
                    return
                phase = bp.add(bp.mul(bp.add(bp.mul(bi, njc), bp.div(jc, nstep)), nkloop), kidx)

                def chunk(bw: Builder, item):
                    lo_ = bw.mul(chunk_start(bw, item, mtiles, nchunks), MR)
                    hi_ = bw.mul(chunk_start(bw, bw.add(item, 1), mtiles, nchunks), MR)
                    body_ic(bw, lo_, bw.sub(hi_, lo_))
                for_claimed(bp, claimed_phase_base(bp, kf, phase, nchunks), nchunks, chunk)
                bp.op(t.BarrierOp.create())  # everyone is done with the panels before they are repacked

            # at least one k-block, so K == 0 still writes C (the epilogue of zeros)
            bj.for_(0, bj.max(K, 1), kstep, body_pc)

        bb.for_(0, N, nstep, body_jc)

    def micro_tile(br: Builder, ic, ir, jc, jr, mc, nc, kcp, first, last, off_c, off_p, epi_offs,
                   nrv: int) -> None:
        cols = nrv * CN
        width = 2 * cols if interleaved else cols     # columns of one accumulator fragment
        frag_a = t.fragment((MR, width, kp), pack_elem, acc_elem, "a", rec.a_layout, rec.family)
        frag_b = frag_a.with_role("b", rec.b_layout)
        frag_c = t.fragment((MR, width, kp), acc_elem, acc_elem, "acc", "row_major", rec.family)
        row = br.add(ic, ir)
        col = br.add(jc, jr)
        vr = br.sub(mc, ir)
        vc = br.sub(nc, jr)
        c_off = br.add(off_c, br.add(br.mul(row, N), col))

        def half_view(bq: Builder, h: int, rows: int = MR, r=0):
            """Product ``h``'s R x cols tile (from row ``r``) in the pair's scratch tile."""
            return view(bq, escratch, acc_elem, "l1", (rows, cols), bq.add(h * cols, bq.mul(r, 2 * cols)), 2 * cols,
                        1, rows, cols)

        def part_view(bq: Builder, h: int):
            p_off = bq.add(off_p, bq.add(bq.mul(row, bq.mul(N, 2)), bq.add(col, bq.mul(h, N))))
            return view(bq, buf[part_buf], acc_elem, "global", (MR, cols), p_off, bq.mul(N, 2), 1, vr, vc)

        def load(bq: Builder, v, rows=MR):
            return bq.op(t.LoadOp.create(operands=[v], result_types=[t.tile_type(rows, cols, acc_elem)])).results[0]

        nacc = 1 if interleaved else 2

        def init_first(bf: Builder):
            return [bf.op(t.FragmentZeroOp.create(result_types=[frag_c])).results[0] for _ in range(nacc)]

        def init_partial(bf: Builder):
            if interleaved:   # the halves side by side in the scratch tile, packed as one fragment
                for h in (0, 1):
                    bf.op(t.StoreOp.create(operands=[load(bf, part_view(bf, h)), half_view(bf, h)]))
                whole = view(bf, escratch, acc_elem, "l1", (MR, width), 0, width, 1, MR, width)
                return [bf.op(t.FragmentPackOp.create(operands=[whole], result_types=[frag_c])).results[0]]
            return [bf.op(t.FragmentPackOp.create(operands=[part_view(bf, h)], result_types=[frag_c])).results[0]
                    for h in (0, 1)]

        if part_buf is None:
            accs0 = init_first(br)
        else:
            accs0 = br.if_(first, init_first, init_partial, [frag_c] * nacc)
        a_base = br.mul(br.div(ir, MR), br.mul(MR, kcp))
        pitch = 2 * H if interleaved else H           # a packed k row of the sliver
        b_base = br.mul(br.div(jr, H), br.mul(pitch, kcp))
        brs = 1 if bkpack == kp else bkpack * H

        def step(bk: Builder, kk, accs) -> list:
            av = view(bk, apack, pack_elem, "l2", (MR, kp), bk.add(a_base, bk.mul(kk, MR)), kp, 1, MR, kp)
            fa = bk.op(t.FragmentPackOp.create(operands=[av], result_types=[frag_a]))
            out = []
            for h, acc in enumerate(accs):
                bv = view(bk, bpack, pack_elem, bspace, (kp, width),
                          bk.add(h * b_elems, bk.add(b_base, bk.mul(kk, pitch))), brs, bkpack, kp, width)
                fb = bk.op(t.FragmentPackOp.create(operands=[bv], result_types=[frag_b]))
                out.append(bk.op(t.MmaOp.create(operands=[fa.results[0], fb.results[0], acc],
                                                result_types=[frag_c])).results[0])
            return out

        kmain = br.mul(br.div(kcp, kp * U), kp * U)

        def unrolled(bk: Builder, kk, carried):
            accs = list(carried)
            for u in range(U):
                accs = step(bk, bk.add(kk, u * kp), accs)
            return accs

        accs = br.for_(0, kmain, kp * U, unrolled, list(accs0)) if U > 1 else list(accs0)
        accs = br.for_(kmain if U > 1 else 0, kcp, kp, lambda bk, kk, c: step(bk, kk, list(c)), accs)
        tiles = [br.op(t.FragmentUnpackOp.create(operands=[a_], result_types=[t.tile_type(MR, width, acc_elem)]))
                 .results[0] for a_ in accs]
        if interleaved:
            br.op(t.StoreOp.create(operands=[tiles[0], view(br, escratch, acc_elem, "l1", (MR, width), 0, width, 1, MR,
                                                             width)]))
        elif heavy or part_buf is not None:
            for h in (0, 1):
                br.op(t.StoreOp.create(operands=[tiles[h], half_view(br, h)]))

        def finish(bf: Builder):
            if heavy:   # row by row: one copy of the polynomial code per tile shape
                def one_row(bw: Builder, r, _c):
                    pair = [load(bw, half_view(bw, h, 1, r), 1) for h in (0, 1)]
                    val = epilogue(bw, kf, kop, plan, pair[0], pair[1], (1, cols), bw.add(row, r), col, 1, vc,
                                   epi_offs)
                    bw.op(t.StoreOp.create(operands=[val, view(bw, buf[out_buf], out_elem, "global", (1, cols),
                                                               bw.add(c_off, bw.mul(r, N)), N, 1, 1, vc)]))
                    return []
                bf.for_(0, bf.min(MR, vr), 1, one_row)
                return
            pair = [load(bf, half_view(bf, h)) for h in (0, 1)] if interleaved else tiles
            val = epilogue(bf, kf, kop, plan, pair[0], pair[1], (MR, cols), row, col, vr, vc, epi_offs)
            bf.op(t.StoreOp.create(operands=[val, view(bf, buf[out_buf], out_elem, "global", (MR, cols), c_off, N, 1,
                                                       vr, vc)]))

        if part_buf is None:
            finish(br)
            return

        def keep_partial(bf: Builder):
            for h in (0, 1):
                bf.op(t.StoreOp.create(operands=[load(bf, half_view(bf, h)), part_view(bf, h)]))

        br.if_(last, finish, keep_partial)

    b.for_(b_lo, b_hi, 1, body_batch)
    return kf.finish(), sig.dims, workspace, extra_outputs
