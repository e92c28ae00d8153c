"""Flash-attention backward for the GPU lanes (NVIDIA ``mma.sync``; ROCm where the instruction
fits) as Tile IR written per wave: dQ, dK and dV of ``tessera.attention_grad`` with no S x S
buffer and no atomics.

The grid is [ceil(S / B), HKV + H, batch] workgroups of W waves, each wave owning R = m (the
instruction's M) rows of a block of B = W * m.  ``tile.program_id`` 1 picks the workgroup's job:

- y < HKV: the key block kb of kv head y.  Each wave's K and V rows (A fragments over the head
  dim) are packed from global memory once; dK and dV are accumulators carried through the loop
  over the G query heads of the group and the query blocks (from the diagonal's block on when
  causal: the blocks above it are skipped).  Per query block, Q and dO (B x D) are copied into
  shared memory, Delta = rowsum(dO * O) of its queries is recomputed (a ``tile.reduce`` over
  the head dim) and, with scores kept transposed (one key per row, one query per column):
      S^T = K Q^T (Q^T read from Q's rows);  P^T = exp(S^T * scale - lse[query]), masked past
      the last query and (causal) below the diagonal (``tile.mask`` side ge) -> 0
      dP^T = V dO^T;  dS^T = P^T * (dP^T - Delta[query])
      dV += P^T dO;  dK += dS^T Q       (P^T and dS^T go through shared memory as A operands)
  and finally dK * scale and dV are stored: one workgroup owns those rows, summed over the
  group's heads in one fixed order (deterministic; no atomics).
- y >= HKV: the query block qb of query head h = y - HKV.  Q and dO rows are A fragments packed
  once, Delta of its rows recomputed, lse read per row; per key block (up to the diagonal when
  causal) K and V are copied into shared memory and
      S = Q K^T;  P = exp(S * scale - lse);  dP = dO V^T;  dS = P * (dP - Delta);  dQ += dS K
  then dQ * scale is stored.

P and dS are rounded to the input dtype as operands of the next product (flash attention's
trade); every product accumulates in f32.  The log-sum-exp is the forward's (its second result,
``kernels/gpu_attention.py``), natural units; a call without it (``attention_backward`` with no
``lse=``) and a mask are refused by name.  The packed result's slots are written to the yielded
parts' own buffers (``attention_backward.result_parts``).
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
from tessera.passes.tile.kernels.attention import MAX_HEAD_DIM
from tessera.passes.tile.kernels.attention_backward import analyse, lse_at
from tessera.passes.tile.kernels.common import KernelSig, elementwise, gpu_ids, illegal, tile_const
from tessera.passes.tile.kernels.gemm import view

PAD = 8  # elements of padding per shared-memory row


def shared_bytes(R: int, waves: int, dpx: int, elem_size: int = 2) -> int:
    """Shared memory of one workgroup: two B x D staging blocks (Q, dO or K, V), the waves' P^T and
    dS^T (B x B, input dtype), the Delta reduction scratch and vector (f32)."""
    B = R * waves
    return (2 * B * (dpx + PAD) + 2 * B * (B + PAD)) * elem_size + (waves * R * 16 + 2 * B) * 4 + 64


def generate(kop: s.KernelOp, sel: MmaSelection):
    name = kop.sym_name.data
    op, views, mask_view, parts = analyse(kop)
    rec = sel.record
    im, in_, ik = rec.shape
    wave = rec.lanes or 32
    BQ, BKV = kop.tile_sizes["q"], kop.tile_sizes["kv"]
    W = BQ // im
    if kop.parallel.data != "bh*kv*q":
        raise illegal(name, "the GPU attention backward runs a grid of key blocks and query blocks (parallel 'bh*kv*q')")
    if BQ != BKV or BQ % im or BQ % max(in_, ik) or kop.threads.value.data != W * wave:
        raise illegal(name, f"query block {BQ} / key block {BKV} / {kop.threads.value.data} threads are not one "
                            f"block of whole {rec.id} tiles of {wave}-lane waves")
    if mask_view is not None:
        raise illegal(name, f"attention_grad with a mask has no {rec.target} kernel yet (causal and unmasked do)")
    if op.lse is None:
        raise illegal(name, f"attention_grad on {rec.target} reads the forward's log-sum-exp: differentiate "
                            "attention with tessera.grad, or pass lse= to attention_backward")
    (B, H, S, DH), HKV = op.q.type.dims, op.k.type.dims[1]
    if not isinstance(DH, int):
        raise SpecializeRequest(f"kernel {name}: the GPU attention backward needs a static head dim ({DH} is "
                                "symbolic)", symbols=[str(DH)])
    if DH > MAX_HEAD_DIM:
        raise illegal(name, f"head dims are at most {MAX_HEAD_DIM}, got {DH}")
    G = op.result.type.dims[2] - 2
    space = {"rocm": "lds", "nvidia": "smem"}[rec.target]
    elem = op.q.type.element_type
    out_elem = op.result.type.element_type
    nkk = -(-DH // ik)                # k-steps over the head dim (S and dP)
    ndt = -(-DH // in_)               # n-tiles over the head dim (dQ, dK, dV)
    DPX = max(nkk * ik, ndt * in_)
    PX, PP = DPX + PAD, BQ + PAD
    scale = op.scale.value.data if op.scale is not None else 1.0 / sqrt(DH)
    causal = bool(op.causal.value.data)

    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_bufs = [sig.buffer(out_elem) for _ in parts]
    for d in (B, H, HKV, S, DH):
        sig.dim(d)
    for v in views.values():
        for st in (*v.strides, *v.offset):
            sig.dim(st)
    kf = sig.build()
    b = kf.b
    buf = kf.buffer_args
    _, nH, nHKV, nS, nD = (kf.size(d) for d in (B, H, HKV, S, DH))
    lse_buf, lse_elem = buf[op.lse.index], op.lse.type.element_type

    blk, y, bidx, w = gpu_ids(b)
    s_a = kf.alloc(b, BQ * PX, elem, space)       # Q (dK/dV job) or K (dQ job)
    s_b = kf.alloc(b, BQ * PX, elem, space)       # dO or V
    s_p = kf.alloc(b, W * im * PP, elem, space)   # the waves' P^T (A operand of dV)
    s_ds = kf.alloc(b, W * im * PP, elem, space)  # the waves' dS^T or dS (A operand of dK / dQ)
    s_red = kf.alloc(b, W * im * in_, f32, space)  # Delta's partial sums
    s_dd = kf.alloc(b, BQ, f32, space)            # Delta of the block's queries (dK/dV job)
    p_off = b.mul(w, im * PP)

    def strides(v):
        return [kf.size(st) for st in v.strides] + [kf.view_offset(b, v)]

    qs, ks, vs, os_, dos = (strides(views[n]) for n in ("q", "k", "v", "o", "do"))
    qbuf, kbuf, vbuf, obuf, dobuf = (buf[views[n].arg] for n in ("q", "k", "v", "o", "do"))

    def head_off(bb: Builder, st, hh, row):
        return bb.add(bb.add(bb.add(bb.mul(bidx, st[0]), bb.mul(hh, st[1])), bb.mul(row, st[2])), st[4])

    def out_at(bb: Builder, slot, kvh, row, lo):
        """(buffer, offset) of element (bidx, kvh, slot, row, 0) of the packed result, in the part
        holding slots lo.. (``attention_backward.result_parts``)."""
        i = next(i for i, (a, z) in enumerate(parts) if a <= lo < z)
        a, z = parts[i]
        rel = bb.sub(slot, a) if a else slot
        return buf[out_bufs[i]], bb.mul(bb.add(bb.mul(bb.add(bb.mul(bb.add(bb.mul(bidx, nHKV), kvh), z - a), rel),
                                                      nS), row), nD)

    frag_a = t.fragment(rec.shape, elem, f32, "a", sel.a_layout, rec.family)
    frag_b = t.fragment(rec.shape, elem, f32, "b", sel.b_layout, rec.family)
    frag_c = t.fragment(rec.shape, f32, f32, "acc", "row_major", rec.family)
    ctile = t.tile_type(im, in_, f32)

    def frag(bb: Builder, v, ft):
        return bb.op(t.FragmentPackOp.create(operands=[v], result_types=[ft])).results[0]

    def zero_frag(bb: Builder) -> SSAValue:
        return bb.op(t.FragmentZeroOp.create(result_types=[frag_c])).results[0]

    def unpack(bb: Builder, f) -> SSAValue:
        return bb.op(t.FragmentUnpackOp.create(operands=[f], result_types=[ctile])).results[0]

    def mma(bb: Builder, a, bv, c) -> SSAValue:
        return bb.op(t.MmaOp.create(operands=[a, bv, c], result_types=[frag_c])).results[0]

    def a_rows(bb: Builder, src, st, hh, row0, left):
        """A fragments of R rows x the head dim of a global tensor (zero past the rows / head dim)."""
        base = head_off(bb, st, hh, row0)
        return [frag(bb, view(bb, src, elem, "global", (im, ik), bb.add(base, bb.mul(kk * ik, st[3])), st[2], st[3],
                              left, DH - kk * ik), frag_a) for kk in range(nkk)]

    def copy(bb: Builder, src, st, hh, row0, dst):
        v = view(bb, src, elem, "global", (BQ, DPX), head_off(bb, st, hh, row0), st[2], st[3], bb.sub(nS, row0), DH)
        o = t.AsyncCopyOp.create(operands=[v, dst, bb.c(0)], attributes={
            "layout": StringAttr("row_major"), "panel": i64_attr(PX), "kpack": i64_attr(1)},
            result_types=[t.TokenType()])
        bb.op(o)
        return o.token

    def delta(bb: Builder, hh, row0, left) -> SSAValue:
        """Delta = rowsum(dO * O) of the wave's R rows from row0: an (R, n) tile, the row's value in
        every column (a ``tile.reduce`` through shared memory)."""
        zero_t = unpack(bb, zero_frag(bb))
        acc = unpack(bb, zero_frag(bb))
        dob, ob = head_off(bb, dos, hh, row0), head_off(bb, os_, hh, row0)
        for jd in range(ndt):
            ld = []
            for src, st, base in ((dobuf, dos, dob), (obuf, os_, ob)):
                v = view(bb, src, elem, "global", (im, in_), bb.add(base, bb.mul(jd * in_, st[3])), st[2], st[3],
                         left, DH - jd * in_)
                ld.append(bb.op(t.LoadOp.create(operands=[v], result_types=[ctile])).results[0])
            # acc + dO (read at acc's coordinates) is a tile of the wave: then times O
            acc = elementwise(bb, "add", [acc, elementwise(bb, "mul", [elementwise(bb, "add", [zero_t, ld[0]]),
                                                                         ld[1]])])
        red = view(bb, s_red, f32, space, (im, in_), bb.mul(w, im * in_), in_, 1, im, in_, align=4)
        bb.op(t.StoreOp.create(operands=[acc, red]))
        bb.op(t.BarrierOp.create())
        ld = bb.op(t.LoadOp.create(operands=[red], result_types=[ctile])).results[0]
        tot = bb.op(t.ReduceOp.create(operands=[ld], attributes={"kind": StringAttr("add"), "axis": i64_attr(1)},
                                      result_types=[t.tile_type(im, 1, f32)])).results[0]
        return elementwise(bb, "add", [unpack(bb, zero_frag(bb)), tot])

    def scores(bb: Builder, fa, src, jt) -> SSAValue:
        """fa (R x D, A fragments) times the transpose of the staged block's rows jt*n.. (B^T read
        from its rows): an (R, n) tile."""
        acc = zero_frag(bb)
        for kk in range(nkk):
            bt = view(bb, src, elem, space, (ik, in_), bb.add(bb.mul(jt, in_ * PX), kk * ik), 1, PX, ik, in_,
                      align=PAD)
            acc = mma(bb, fa[kk], frag(bb, bt, frag_b), acc)
        return unpack(bb, acc)

    def accumulate(bb: Builder, accs, a_src, a_off, b_src):
        """accs[jo] += A (R x B, the wave's rows of a_src) times the staged block b_src (B x D)."""
        out = []
        for jo in range(ndt):
            acc = accs[jo]
            for kk in range(0, BQ, ik):
                av = view(bb, a_src, elem, space, (im, ik), bb.add(a_off, kk), PP, 1, im, ik, align=PAD)
                bv = view(bb, b_src, elem, space, (ik, in_), kk * PX + jo * in_, PX, 1, ik, in_, align=PAD)
                acc = mma(bb, frag(bb, av, frag_a), frag(bb, bv, frag_b), acc)
            out.append(acc)
        return out

    def store_rows(bb: Builder, accs, mul, slot, kvh, row0, left, lo):
        ob, off = out_at(bb, slot, kvh, row0, lo)
        for jo in range(ndt):
            val = elementwise(bb, "mul", [unpack(bb, accs[jo]), tile_const(bb, mul)]) if mul != 1.0 else \
                unpack(bb, accs[jo])
            ov = view(bb, ob, out_elem, "global", (im, in_), bb.add(off, jo * in_), nD, 1, left, DH - jo * in_)
            bb.op(t.StoreOp.create(operands=[val, ov]))

    def mask(bb: Builder, x, cols, diag, side):
        operands = [x, bb.c(cols)] + ([bb.c(diag)] if causal else [])
        attrs = {"pad": FloatAttr(float("-inf"), f32)}
        if causal:
            attrs["side"] = StringAttr(side)
        return bb.op(t.MaskOp.create(operands=operands, attributes=attrs, result_types=[ctile])).results[0]

    # ------------------------------------------------------------------ dK, dV of one key block
    def key_job(bk: Builder):
        kvh = y
        j0 = bk.mul(blk, BKV)
        krow0 = bk.add(j0, bk.mul(w, im))          # this wave's first key
        keys_left = bk.sub(nS, krow0)
        ka = a_rows(bk, kbuf, ks, kvh, krow0, keys_left)
        va = a_rows(bk, vbuf, vs, kvh, krow0, keys_left)
        first = blk if causal else 0              # query blocks above the diagonal see none of these keys
        nqb = bk.ceil_div(nS, BQ)

        def head(bh: Builder, hg, carried):
            h = bh.add(bh.mul(kvh, G), hg)
            return bh.for_(first, nqb, 1, lambda bq, qb, c: query_block(bq, h, qb, c), list(carried))

        def query_block(bq: Builder, h, qb, carried):
            dk, dv = list(carried[:ndt]), list(carried[ndt:])
            q0 = bq.mul(qb, BQ)
            toks = [copy(bq, qbuf, qs, h, q0, s_a), copy(bq, dobuf, dos, h, q0, s_b)]
            bq.op(t.WaitOp.create(operands=toks, attributes={"outstanding": i64_attr(0)}))
            drow0 = bq.add(q0, bq.mul(w, im))
            dd = delta(bq, h, drow0, bq.sub(nS, drow0))    # the barrier in it also publishes the copies
            bq.op(t.StoreOp.create(operands=[dd, view(bq, s_dd, f32, space, (im, in_), bq.mul(w, im), 1, 0, im, 1)]))
            bq.op(t.BarrierOp.create())
            def col_tile(bq: Builder, jt, _c):   # a loop, not unrolled: one n-tile of queries live at a time
                col0 = bq.add(q0, bq.mul(jt, in_))
                x = elementwise(bq, "mul", [scores(bq, ka, s_a, jt), tile_const(bq, scale)])
                x = mask(bq, x, bq.sub(nS, col0), bq.sub(krow0, col0), "ge")   # query >= key
                lv = view(bq, lse_buf, lse_elem, "global", (1, in_), lse_at(bq, bidx, h, nH, nS, col0), 0, 1, 1,
                          bq.sub(nS, col0))
                lse = bq.op(t.LoadOp.create(operands=[lv], attributes={"pad": FloatAttr(float("inf"), f32)},
                                            result_types=[t.tile_type(1, in_, f32)])).results[0]
                p = elementwise(bq, "exp", [elementwise(bq, "sub", [x, lse])])
                dpt = scores(bq, va, s_b, jt)
                ddv = view(bq, s_dd, f32, space, (1, in_), bq.mul(jt, in_), 0, 1, 1, in_)
                ddt = bq.op(t.LoadOp.create(operands=[ddv], result_types=[t.tile_type(1, in_, f32)])).results[0]
                ds = dscores(bq, p, dpt, ddt)
                for src, val in ((s_p, p), (s_ds, ds)):
                    bq.op(t.StoreOp.create(operands=[val, view(bq, src, elem, space, (im, in_),
                                                               bq.add(p_off, bq.mul(jt, in_)), PP, 1, im, in_)]))
                return []
            bq.for_(0, BQ // in_, 1, col_tile)
            bq.op(t.BarrierOp.create())
            dv = accumulate(bq, dv, s_p, p_off, s_b)      # dV += P^T dO
            dk = accumulate(bq, dk, s_ds, p_off, s_a)     # dK += dS^T Q
            bq.op(t.BarrierOp.create())                   # the block is read before the next copies
            return dk + dv

        res = bk.for_(0, G, 1, head, [zero_frag(bk) for _ in range(2 * ndt)])
        store_rows(bk, res[:ndt], scale, G, kvh, krow0, keys_left, G)
        store_rows(bk, res[ndt:], 1.0, G + 1, kvh, krow0, keys_left, G + 1)
        return []

    # ------------------------------------------------------------------ dQ of one query block
    def query_job(bq: Builder):
        h = bq.sub(y, nHKV)
        kvh = bq.div(h, G)
        hg = bq.rem(h, G)
        q0 = bq.mul(blk, BQ)
        row0 = bq.add(q0, bq.mul(w, im))
        rows_left = bq.sub(nS, row0)
        qa = a_rows(bq, qbuf, qs, h, row0, rows_left)
        doa = a_rows(bq, dobuf, dos, h, row0, rows_left)
        dd = delta(bq, h, row0, rows_left)
        lv = view(bq, lse_buf, lse_elem, "global", (im, 1), lse_at(bq, bidx, h, nH, nS, row0), 1, 0, rows_left, 1)
        lse = bq.op(t.LoadOp.create(operands=[lv], attributes={"pad": FloatAttr(float("inf"), f32)},
                                    result_types=[t.tile_type(im, 1, f32)])).results[0]
        kv_end = bq.min(nS, bq.add(q0, BQ)) if causal else nS   # key blocks past the diagonal: skipped

        def key_block(bk: Builder, kb, carried):
            j0 = bk.mul(kb, BKV)
            toks = [copy(bk, kbuf, ks, kvh, j0, s_a), copy(bk, vbuf, vs, kvh, j0, s_b)]
            bk.op(t.WaitOp.create(operands=toks, attributes={"outstanding": i64_attr(0)}))
            bk.op(t.BarrierOp.create())
            def col_tile(bk: Builder, jt, _c):
                col0 = bk.add(j0, bk.mul(jt, in_))
                x = elementwise(bk, "mul", [scores(bk, qa, s_a, jt), tile_const(bk, scale)])
                x = mask(bk, x, bk.sub(nS, col0), bk.sub(row0, col0), "le")    # key <= query
                p = elementwise(bk, "exp", [elementwise(bk, "sub", [x, lse])])
                ds = dscores(bk, p, scores(bk, doa, s_b, jt), dd)
                bk.op(t.StoreOp.create(operands=[ds, view(bk, s_ds, elem, space, (im, in_),
                                                          bk.add(p_off, bk.mul(jt, in_)), PP, 1, im, in_)]))
                return []
            bk.for_(0, BKV // in_, 1, col_tile)
            bk.op(t.BarrierOp.create())
            out = accumulate(bk, list(carried), s_ds, p_off, s_a)   # dQ += dS K
            bk.op(t.BarrierOp.create())
            return out

        res = bq.for_(0, bq.ceil_div(kv_end, BKV), 1, key_block, [zero_frag(bq) for _ in range(ndt)])
        store_rows(bq, res, scale, hg, kvh, row0, rows_left, 0)
        return []

    b.if_(b.cmp("slt", y, nHKV), key_job, query_job)
    fn = kf.finish()
    # heads are static unless H == HKV (ir/graph_attention_grad.attention_groups)
    jobs = HKV + H if isinstance(H, int) and isinstance(HKV, int) else D.mul(2, H)
    fn.attributes["gpu.grid"] = str_array([D.ceil_extent(S, BQ), D.ceil_extent(jobs, 1), D.ceil_extent(B, 1)])
    fn.attributes["gpu.block"] = i64_attr(W * wave)
    fn.attributes["gpu.waves"] = int_array([W, 1])
    return fn, sig.dims, 0, []


def dscores(b: Builder, p, dp, delta):
    """dS = P * (dP - Delta) (the softmax vjp; the scale is applied to dQ and dK at the end)."""
    return elementwise(b, "mul", [p, elementwise(b, "sub", [dp, delta])])


__all__ = ["dscores", "generate", "shared_bytes"]
