"""Flash attention for the GPU lanes (ROCm and NVIDIA) as Tile IR, written per wave (warp).

The same Tile IR serves both lanes; the instruction record (from the schedule's ``mma``)
and the shared-memory space differ.  One workgroup takes one (batch, head, block of BQ
query rows); ``tile.program_id`` 0/1/2 = query block / head / batch.  Each of its W waves
owns R = m (the instruction's M) query rows; its Q fragments (A role, over the head dim
in steps of k) are packed from global memory once.  Per block of BKV keys (blocks past
the causal diagonal are never visited: the loop ends there):

  K (BKV x D) and V (BKV x Dv) are copied into shared memory by the whole workgroup;
  S = Q K^T: per n-column tile, ``tile.mma`` over D with K^T read as the B operand;
  x = S * scale [+ additive mask | select on a bool mask], masked with ``tile.mask``
      past the last key and (causal) past the diagonal: col <= row + diag;
  x goes to the wave's S tile in shared memory; ``tile.reduce max`` of its rows;
  m' = max(m, rowmax); p = exp(x - finite_or_zero(m')); alpha = exp(m - finite_or_zero(m'))
  p goes to the S tile (f32, for ``tile.reduce add``) and to the P tile (the input dtype:
      the A operand of the next product); l' = l * alpha + rowsum(p)
  O = O * alpha + P V: per n-column tile of Dv, ``tile.mma`` over the key block.

m, l and O are tiles in the accumulator's layout carried through the key loop (m and l
hold their row's value in every column).  Finally out = O / l (``safe_div`` for the
explicit op's zero rows, ``div`` -> NaN where it stands in for the composed form).
Everything accumulates in f32; the score matrix exists only one BKV block at a time.
"""
from __future__ import annotations

from math import sqrt

from xdsl.dialects.builtin import FloatAttr, StringAttr, f32
from xdsl.ir import SSAValue

from tessera.errors import SpecializeRequest
from tessera.ir import dims as D
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, int_array, str_array
from tessera.ir.builder import Builder
from tessera.mma.selector import MmaSelection
from tessera.passes.tile.kernels.attention import MAX_HEAD_DIM, analyse
from tessera.passes.tile.kernels.common import KernelSig, elementwise, gpu_ids, illegal, tile_const
from tessera.passes.tile.kernels.gemm import view

PAD = 8  # elements of padding per shared-memory row


def shared_bytes(R: int, waves: int, BKV: int, dp: int, dvp: int, elem_size: int = 2) -> int:
    """Shared memory of one workgroup (the schedule checks it against the arch's limit)."""
    return (BKV * (dp + PAD) + BKV * (dvp + PAD) + waves * R * (BKV + PAD)) * elem_size + waves * R * BKV * 4 \
        + 2 * waves * R * 4 + 4 * 16


def generate(kop: s.KernelOp, sel: MmaSelection):
    name = kop.sym_name.data
    plan = analyse(kop)
    op = plan.op
    rec = sel.record
    im, in_, ik = rec.shape
    wave = rec.lanes or 32
    BQ, BKV = kop.tile_sizes["q"], kop.tile_sizes["kv"]
    W = BQ // im
    if kop.loop_order != ["bh", "q", "kv"] or kop.parallel.data != "bh*q":
        raise illegal(name, "GPU attention runs loops [bh, q, kv] with the grid over bh*q")
    if BQ % im or BKV % max(in_, ik) or kop.threads.value.data != W * wave:
        raise illegal(name, f"query block {BQ} / key block {BKV} / {kop.threads.value.data} threads are not "
                            f"whole {rec.id} tiles of {wave}-lane waves")
    (B, H, SQ, DH), (_, HKV, SK, _), DV = plan.dims
    dyn = [str(d) for d in (DH, DV) if not isinstance(d, int)]
    if dyn:   # fragments per row live in registers: the head dims are compile-time facts on the GPU
        raise SpecializeRequest(f"kernel {name}: the GPU attention kernel needs static head dims "
                                f"({', '.join(dyn)} are symbolic)", symbols=dyn)
    if DH > MAX_HEAD_DIM or DV > MAX_HEAD_DIM:
        raise illegal(name, f"head dims are at most {MAX_HEAD_DIM}, got {DH} and {DV}")
    space = {"rocm": "lds", "nvidia": "smem"}[rec.target]
    elem = op.q.type.element_type
    out_elem = op.result.type.element_type
    nkk = -(-DH // ik)                      # k-steps of S = Q K^T
    DP = nkk * ik
    DVP = -(-DV // in_) * in_
    PK, PV, PP = DP + PAD, DVP + PAD, BKV + PAD
    scale = plan.scale if plan.scale is not None else 1.0 / sqrt(DH)

    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    lse_elem = op.lse.type.element_type if plan.lse_index is not None else None
    outs = [sig.buffer(out_elem)] + ([sig.buffer(lse_elem)] if lse_elem is not None else [])
    if plan.lse_index == 0:
        outs.reverse()
    out_buf, lse_buf = outs[0], (outs[1] if lse_elem is not None else None)
    for d in (B, H, HKV, SQ, SK):
        sig.dim(d)
    for v in list(plan.views.values()) + ([plan.mask_view] if plan.mask_view is not None else []):
        for st in (*v.strides, *v.offset):
            sig.dim(st)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    _, nH, nHKV, nSQ, nSK = (kf.size(d) for d in (B, H, HKV, SQ, SK))   # B only sizes the grid

    qb, h, bidx, w = gpu_ids(b)
    kvh = b.div(h, b.max(b.div(nH, b.max(nHKV, 1)), 1))
    q0 = b.mul(qb, BQ)
    row0 = b.add(q0, b.mul(w, im))             # this wave's first query row
    s_k = kf.alloc(b, BKV * PK, elem, space)
    s_v = kf.alloc(b, BKV * PV, elem, space)
    s_s = kf.alloc(b, W * im * BKV, f32, space)
    s_p = kf.alloc(b, W * im * PP, elem, space)
    s_off = b.mul(w, im * BKV)
    p_off = b.mul(w, im * PP)

    def strides(v):   # [batch, head, row, col] strides, then the view's offset (a sliced q/k/v)
        return [kf.size(st) for st in v.strides] + [kf.view_offset(b, v)]

    qv, kv_, vv = plan.views["q"], plan.views["k"], plan.views["v"]
    qs, ks, vs = strides(qv), strides(kv_), strides(vv)

    def head_off(bb: Builder, st, hh, row):
        return bb.add(bb.add(bb.add(bb.mul(bidx, st[0]), bb.mul(hh, st[1])), bb.mul(row, st[2])), st[4])

    frag_a = t.fragment(rec.shape, elem, f32, "a", sel.a_layout, rec.family)
    frag_b = t.fragment(rec.shape, elem, f32, "b", sel.b_layout, rec.family)
    frag_c = t.fragment(rec.shape, f32, f32, "acc", "row_major", rec.family)
    ctile = t.tile_type(im, in_, f32)

    def frag(bb: Builder, v, ft):
        return bb.op(t.FragmentPackOp.create(operands=[v], result_types=[ft])).results[0]

    def zero_tile(bb: Builder) -> SSAValue:
        z = bb.op(t.FragmentZeroOp.create(result_types=[frag_c])).results[0]
        return bb.op(t.FragmentUnpackOp.create(operands=[z], result_types=[ctile])).results[0]

    # Q fragments: this wave's R rows x D, zero outside the valid rows / head dim
    qbase = head_off(b, qs, h, row0)
    rows_left = b.sub(nSQ, row0)
    qa = [frag(b, view(b, buf[qv.arg], elem, "global", (im, ik), b.add(qbase, b.mul(kk * ik, qs[3])), qs[2], qs[3],
                       rows_left, DH - kk * ik), frag_a) for kk in range(nkk)]
    nvt = DVP // in_
    m0 = elementwise(b, "add", [zero_tile(b), tile_const(b, float("-inf"))])
    l0 = zero_tile(b)
    o0 = [zero_tile(b) for _ in range(nvt)]
    kv_end = b.min(nSK, b.add(q0, BQ)) if plan.causal else nSK   # top-left alignment: key j <= query i
    nkb = b.ceil_div(kv_end, BKV)

    def copy(bb: Builder, src, st, cols, dst, pitch, j0):
        v = view(bb, src, elem, "global", (BKV, cols), head_off(bb, st, kvh, j0), st[2], st[3], bb.sub(nSK, j0),
                 DH if dst is s_k else DV)
        o = t.AsyncCopyOp.create(operands=[v, dst, bb.c(0)], attributes={
            "layout": StringAttr("row_major"), "panel": i64_attr(pitch), "kpack": i64_attr(1)},
            result_types=[t.TokenType()])
        bb.op(o)
        return o.token

    def body(bb: Builder, kb, carried):
        m_old, l_old, o_old = carried[0], carried[1], list(carried[2:])
        j0 = bb.mul(kb, BKV)
        toks = [copy(bb, buf[kv_.arg], ks, DP, s_k, PK, j0), copy(bb, buf[vv.arg], vs, DVP, s_v, PV, j0)]
        bb.op(t.WaitOp.create(operands=toks, attributes={"outstanding": i64_attr(0)}))
        bb.op(t.BarrierOp.create())
        xs = []
        for jt in range(BKV // in_):
            acc = bb.op(t.FragmentZeroOp.create(result_types=[frag_c])).results[0]
            for kk in range(nkk):         # K^T as B: element (d, j) of K at s_k[j * PK + d]
                kt = view(bb, s_k, elem, space, (ik, in_), jt * in_ * PK + kk * ik, 1, PK, ik, in_, align=PAD)
                acc = bb.op(t.MmaOp.create(operands=[qa[kk], frag(bb, kt, frag_b), acc],
                                           result_types=[frag_c])).results[0]
            x = bb.op(t.FragmentUnpackOp.create(operands=[acc], result_types=[ctile])).results[0]
            x = elementwise(bb, "mul", [x, tile_const(bb, scale)])
            col0 = bb.add(j0, jt * in_)
            if plan.mask_view is not None:
                mv = plan.mask_view
                ms = strides(mv)
                moff = bb.add(head_off(bb, ms, h, row0), bb.mul(col0, ms[3]))
                mel = op.mask.type.element_type
                mt = bb.op(t.LoadOp.create(operands=[view(bb, buf[mv.arg], mel, "global", (im, in_), moff, ms[2],
                                                          ms[3], rows_left, bb.sub(nSK, col0))],
                                           result_types=[t.tile_type(im, in_, f32)])).results[0]
                x = elementwise(bb, "mask_select" if plan.bool_mask else "add", [x, mt])
            operands = [x, bb.c(bb.sub(nSK, col0))]
            if plan.causal:                # keep col <= row + (row0 - col0)
                operands.append(bb.c(bb.sub(row0, col0)))
            x = bb.op(t.MaskOp.create(operands=operands, attributes={"pad": FloatAttr(float("-inf"), f32)},
                                      result_types=[ctile])).results[0]
            bb.op(t.StoreOp.create(operands=[x, view(bb, s_s, f32, space, (im, in_), bb.add(s_off, jt * in_), BKV, 1,
                                                     im, in_)]))
            xs.append(x)
        bb.op(t.BarrierOp.create())
        s_tile = view(bb, s_s, f32, space, (im, BKV), s_off, BKV, 1, im, BKV, align=4)

        def row_reduce(kind: str, pad: float):
            ld = bb.op(t.LoadOp.create(operands=[s_tile], attributes={"pad": FloatAttr(pad, f32)} if pad else {},
                                       result_types=[t.tile_type(im, BKV, f32)])).results[0]
            return bb.op(t.ReduceOp.create(operands=[ld], attributes={"kind": StringAttr(kind), "axis": i64_attr(1)},
                                           result_types=[t.tile_type(im, 1, f32)])).results[0]

        m_new = elementwise(bb, "max", [m_old, row_reduce("max", float("-inf"))])
        m_safe = elementwise(bb, "finite_or_zero", [m_new])
        alpha = elementwise(bb, "exp", [elementwise(bb, "sub", [m_old, m_safe])])
        bb.op(t.BarrierOp.create())       # every lane has read its row of S before P overwrites it
        for jt, x in enumerate(xs):
            p = elementwise(bb, "exp", [elementwise(bb, "sub", [x, m_safe])])
            bb.op(t.StoreOp.create(operands=[p, view(bb, s_s, f32, space, (im, in_), bb.add(s_off, jt * in_), BKV, 1,
                                                     im, in_)]))
            bb.op(t.StoreOp.create(operands=[p, view(bb, s_p, elem, space, (im, in_), bb.add(p_off, jt * in_), PP, 1,
                                                     im, in_)]))
        bb.op(t.BarrierOp.create())
        l_new = elementwise(bb, "add", [elementwise(bb, "mul", [l_old, alpha]), row_reduce("add", 0.0)])
        o_new = []
        for jo in range(nvt):
            acc = bb.op(t.FragmentZeroOp.create(result_types=[frag_c])).results[0]
            for kk in range(0, BKV, ik):
                pa = view(bb, s_p, elem, space, (im, ik), bb.add(p_off, kk), PP, 1, im, ik, align=PAD)
                vb = view(bb, s_v, elem, space, (ik, in_), kk * PV + jo * in_, PV, 1, ik, in_, align=PAD)
                acc = bb.op(t.MmaOp.create(operands=[frag(bb, pa, frag_a), frag(bb, vb, frag_b), acc],
                                           result_types=[frag_c])).results[0]
            pv = bb.op(t.FragmentUnpackOp.create(operands=[acc], result_types=[ctile])).results[0]
            o_new.append(elementwise(bb, "add", [rescale(bb, o_old[jo], alpha), pv]))
        bb.op(t.BarrierOp.create())       # K, V and P are read before the next block's copies
        return [m_new, l_new] + o_new

    res = b.for_(0, nkb, 1, body, [m0, l0] + o0)
    l_fin = res[1]
    if plan.heads_inner:   # [B, SQ, H, DV]: rows H * DV apart
        out_base, out_rs = b.mul(b.add(b.mul(b.add(b.mul(bidx, nSQ), row0), nH), h), DV), b.mul(nH, DV)
    else:                  # [B, H, SQ, DV]
        out_base, out_rs = b.mul(b.add(b.mul(b.add(b.mul(bidx, nH), h), nSQ), row0), DV), DV
    for jo in range(nvt):
        val = elementwise(b, "safe_div" if plan.zero_rows else "div", [res[2 + jo], l_fin])
        ov = view(b, buf[out_buf], out_elem, "global", (im, in_), b.add(out_base, jo * in_), out_rs, 1, rows_left,
                  DV - jo * in_)
        b.op(t.StoreOp.create(operands=[val, ov]))
    if lse_buf is not None:   # [B, H, SQ] f32: m + log l (natural units here), +inf on a fully masked row
        lse = row_lse(b, res[0], l_fin)
        lv = view(b, buf[lse_buf], lse_elem, "global", (im, in_), b.add(b.mul(b.add(b.mul(bidx, nH), h), nSQ), row0),
                  1, 0, rows_left, 1)
        b.op(t.StoreOp.create(operands=[lse, lv]))   # m, l are (im, in_) tiles with equal columns: column 0

    fn = kf.finish()
    fn.attributes["gpu.grid"] = str_array([D.ceil_extent(SQ, BQ), D.ceil_extent(H, 1), D.ceil_extent(B, 1)])
    fn.attributes["gpu.block"] = i64_attr(W * wave)
    fn.attributes["gpu.waves"] = int_array([W, 1])
    return fn, sig.dims, 0, []


def row_lse(b: Builder, m: SSAValue, l: SSAValue) -> SSAValue:
    """A row's log-sum-exp from its running maximum m and sum l (natural units: S is not scaled by
    log2 e here): m - log(1 / l), so that a row with every key masked (l = 0) gets +inf."""
    inv = elementwise(b, "safe_div", [tile_const(b, 1.0), l])
    return elementwise(b, "sub", [elementwise(b, "finite_or_zero", [m]), elementwise(b, "log", [inv])])


def rescale(b: Builder, o: SSAValue, alpha: SSAValue) -> SSAValue:
    """O * alpha: the accumulator follows the running maximum (flash attention's rescale)."""
    return elementwise(b, "mul", [o, alpha])


__all__ = ["generate", "rescale", "row_lse", "shared_bytes"]
