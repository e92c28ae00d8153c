"""The scatter kernel: ``tessera.scatter_add`` (take's adjoint; the embedding table's gradient).

With the result seen as [P, n, Q] and the K indices flattened, the work is split into rows
(p, column block): a row owns columns [c0, c0 + chunk) of result slab p.  It first writes its
columns of every result row (the target's values, or zeros), then walks the indices in order
k = 0..K-1 and adds ``updates[p, k, c0:c0+chunk]`` into result row ``j(k)`` (the index bounded
by the gathers' policy, ``kernels/gather.bounded_index``).  Every result element is owned by
one row, and its sum is always taken in index order, so duplicate indices give the same bits
for any thread count and any claiming of rows; no write leaves the result whatever the index
values.  The sum is held in the result's dtype after each add (f32 registers for bf16 / f16).
"""
from __future__ import annotations

from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import Builder
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, reg_elem, single_op, splat_row
from tessera.passes.tile.kernels.gather import _copy, bounded_index, load_index, operand_arg
from tessera.passes.util import register_elem


def _load(kf, b: Builder, buf: int, elem, off, left, width: int):
    view = t.ViewOp.create(operands=[kf.buffer_args[buf], b.c(off), b.c(0), b.c(1), b.c(1), b.c(left)],
                           result_types=[t.view_type(1, width, elem, "global")])
    b.op(view)
    ld = t.LoadOp.create(operands=[view.result], result_types=[t.tile_type(1, width, reg_elem(elem, kf.reg))])
    b.op(ld)
    return ld.result


def walk_indices(b: Builder, count, body) -> None:
    """``body(builder, k, None)`` for k = 0..count-1 in order: the order every sum is taken in."""
    b.for_(0, count, 1, body)


def _single(kop: s.KernelOp) -> g.ScatterAddOp:
    return single_op(kop, g.ScatterAddOp, "a scatter kernel holds one scatter_add")


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    op = _single(kop)
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(op.result.type.element_type)
    out = op.result.type
    ax = ival(op.axis)
    n = out.dims[ax]
    elem = out.element_type
    P, K, Q = D.product(out.dims[:ax]), D.product(op.indices.type.dims), D.product(out.dims[ax + 1:])
    for d in (P, K, Q):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    name = kop.sym_name.data
    ib, ub = operand_arg(name, op, op.indices), operand_arg(name, op, op.updates)
    xb = operand_arg(name, op, op.input) if op.input is not None else None
    p_, k_, q_ = kf.size(P), kf.size(K), kf.size(Q)
    chunk = 1 if Q == 1 else R.chunk_of(kop)
    blocks = b.ceil_div(q_, chunk)

    def row(br: Builder, r, _c):
        p = br.div(r, blocks)
        c0 = br.mul(br.sub(r, br.mul(p, blocks)), chunk)
        left = br.sub(q_, c0)
        slab = br.mul(p, n)

        def init(bj: Builder, j, _c2):
            dst = bj.add(bj.mul(bj.add(slab, j), q_), c0)
            if xb is not None:
                _copy(kf, bj, elem, xb, dst, out_buf, dst, chunk, left)
            else:
                R.store_row(kf, bj, out_buf, elem, splat_row(bj, chunk, 0.0, kf.reg), dst, left, chunk)
            return []
        br.for_(0, n, 1, init)

        def add(bk: Builder, k, _c2):
            j = bounded_index(bk, load_index(kf, bk, ib, k), n)
            dst = bk.add(bk.mul(bk.add(slab, j), q_), c0)
            src = bk.add(bk.mul(bk.add(bk.mul(p, k_), k), q_), c0)
            acc = elementwise(bk, "add", [_load(kf, bk, out_buf, elem, dst, left, chunk),
                                          _load(kf, bk, ub, elem, src, left, chunk)])
            R.store_row(kf, bk, out_buf, elem, acc, dst, left, chunk)
            return []
        walk_indices(br, k_, add)
        return []

    R.for_rows(kf, b, b.mul(p_, blocks), row)
    return kf.finish(), sig.dims, 0, []


__all__ = ["generate"]
