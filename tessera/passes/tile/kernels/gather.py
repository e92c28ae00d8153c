"""Gather kernels (kind ``gather``): ``tessera.take``, ``tessera.take_along_axis`` and
``tessera.one_hot``.  Every index is read with ``tile.load_index`` and bounded before it
addresses anything (``bounded_index``: numpy's meaning in [-n, n), clamped outside), so no
read leaves the array whatever the index values.

take: with the input seen as [P, n, Q] (the dims before the axis, the axis, the dims after)
and the K indices flattened, output row (p, k) is input row (p, idx[k]): Q elements copied
with vector loads and stores, rows in parallel (the embedding lookup: one table row per
token).  take_along_axis: every output element reads its own index (a scalar copy per
element, rows of the output in parallel).  one_hot: each row is stored as zeros, then a 1 at
its label when the label is in [0, C).
"""
from __future__ import annotations

from xdsl.dialects import arith

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import INDEX, Builder
from tessera.ir.strided import row_major_strides
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelFn, KernelSig, reg_elem, single_op, splat_row, tile_const, trace_view
from tessera.passes.util import register_elem


D_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i8": 1}


def load_index(kf: KernelFn, b: Builder, buf: int, off):
    """The signed index at element ``off`` of kernel buffer ``buf`` (i32 or i64)."""
    return b.op(t.LoadIndexOp.create(operands=[kf.buffer_args[buf], b.c(off)], result_types=[INDEX])).result


def bounded_index(b: Builder, i, n: int):
    """The index policy: i in [-n, n) means what numpy means (i < 0 counts from the end);
    outside, it is clamped into [0, n - 1]."""
    wrapped = b.select(b.cmp("slt", i, 0), b.c(b.add(i, n)), i)
    return b.max(b.min(wrapped, n - 1), 0)


def _copy(kf: KernelFn, b: Builder, elem, src_buf: int, src, dst_buf: int, dst, width: int, left,
          stream=None) -> None:
    """``left`` (up to ``width``) elements from ``src`` to ``dst``, through the kernel's registers
    (exact: narrower floats widen to f32 and back, integers stay in integer lanes)."""
    view = t.ViewOp.create(operands=[kf.buffer_args[src_buf], b.c(src), b.c(0), b.c(1), b.c(1), b.c(left)],
                           result_types=[t.view_type(1, width, elem, "global")])
    b.op(view)
    ld = t.LoadOp.create(operands=[view.result], result_types=[t.tile_type(1, width, reg_elem(elem, kf.reg))])
    b.op(ld)
    R.store_row(kf, b, dst_buf, elem, ld.result, dst, left, width, stream)


def operand_arg(name: str, op, v) -> int:
    """The kernel input whose buffer holds operand ``v`` of ``op`` as it is (a kernel input, or
    a reshape of one: row-major, the same buffer)."""
    view = trace_view(v, op.parent)
    if view is None or view.offset or any(st != rm for d, st, rm in zip(view.dims, view.strides,
                                                                         row_major_strides(view.dims)) if d != 1):
        raise ScheduleIllegalError(f"kernel {name}: {op.name} reads kernel inputs (or reshapes of them) in place")
    return view.arg


def _single(kop: s.KernelOp):
    return single_op(kop, g.GATHERS, "a gather kernel holds one take, take_along_axis or one_hot")


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    op = _single(kop)
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(op.result.type.element_type)
    gen = {g.TakeOp: _take, g.TakeAlongAxisOp: _take_along_axis, g.OneHotOp: _one_hot}[type(op)]
    return gen(kop, op, sig, out_buf)


def _take(kop, op, sig: KernelSig, out_buf: int):
    x, idx = op.input.type, op.indices.type
    ax = ival(op.axis)
    n = x.dims[ax]
    elem = x.element_type
    P, K, Q = D.product(x.dims[:ax]), D.product(idx.dims), D.product(x.dims[ax + 1:])
    for d in (P, K, Q):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    xb, ib = operand_arg(kop.sym_name.data, op, op.input), operand_arg(kop.sym_name.data, op, op.indices)
    p_, k_, q_ = kf.size(P), kf.size(K), kf.size(Q)
    chunk = 1 if Q == 1 else R.chunk_of(kop)
    stream = R.stream_flag(b, b.mul(b.mul(p_, k_), q_), D_BYTES.get(str(elem), 4)) if chunk > 1 else None

    def row(br: Builder, r, _c):
        p = br.div(r, k_)
        k = br.sub(r, br.mul(p, k_))
        j = bounded_index(br, load_index(kf, br, ib, k), n)
        src = br.mul(br.add(br.mul(p, n), j), q_)
        dst = br.mul(r, q_)
        if chunk == 1:
            _copy(kf, br, elem, xb, src, out_buf, dst, 1, 1)
            return []

        def body(bc: Builder, c, _c2):
            _copy(kf, bc, elem, xb, bc.add(src, c), out_buf, bc.add(dst, c), chunk, bc.sub(q_, c), stream)
            return []
        br.for_(0, q_, chunk, body)
        return []

    R.for_rows(kf, b, b.mul(p_, k_), row)
    return kf.finish(), sig.dims, 0, []


def _strides(dims, out_dims) -> list:
    """Row-major strides of ``dims``, 0 on an axis broadcast to ``out_dims``."""
    return [0 if d == 1 and o != 1 else st for d, o, st in zip(dims, out_dims, row_major_strides(dims))]


def _take_along_axis(kop, op, sig: KernelSig, out_buf: int):
    x, idx, out = op.input.type, op.indices.type, op.result.type
    ax = ival(op.axis)
    n = x.dims[ax]
    elem = x.element_type
    dims = tuple(out.dims)
    xs, is_ = _strides(x.dims, dims), _strides(idx.dims, dims)
    for d in (*dims, *xs, *is_):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    xb, ib = operand_arg(kop.sym_name.data, op, op.input), operand_arg(kop.sym_name.data, op, op.indices)
    last = len(dims) - 1
    C = kf.size(dims[-1])
    nrows = 1
    for d in dims[:-1]:
        nrows = b.mul(nrows, kf.size(d))

    def row(br: Builder, r, _c):
        digits, rem = [], r
        for k in reversed(range(last)):
            size = kf.size(dims[k])
            digits.append(br.rem(rem, size) if k > 0 else rem)
            rem = br.div(rem, size) if k > 0 else 0
        digits.reverse()
        x_row = i_row = 0
        for k, dg in enumerate(digits):
            if k != ax:
                x_row = br.add(x_row, br.mul(dg, kf.size(xs[k])))
            i_row = br.add(i_row, br.mul(dg, kf.size(is_[k])))
        out_row = br.mul(r, C)

        def body(bc: Builder, c, _c2):
            j = bounded_index(bc, load_index(kf, bc, ib, bc.add(i_row, bc.mul(c, kf.size(is_[last])))), n)
            src = bc.add(x_row, bc.mul(j, kf.size(xs[ax])))
            if ax != last:
                src = bc.add(src, bc.mul(c, kf.size(xs[last])))
            _copy(kf, bc, elem, xb, src, out_buf, bc.add(out_row, c), 1, 1)
            return []
        br.for_(0, C, 1, body)
        return []

    R.for_rows(kf, b, nrows, row)
    return kf.finish(), sig.dims, 0, []


def _one_hot(kop, op, sig: KernelSig, out_buf: int):
    out = op.result.type
    elem = out.element_type
    C = out.dims[-1]
    rows = D.product(out.dims[:-1])
    sig.dim(rows)
    kf = sig.build()
    b = kf.b
    chunk = R.chunk_of(kop)
    lb = operand_arg(kop.sym_name.data, op, op.input)

    def row(br: Builder, r, _c):
        base = br.mul(r, C)

        def body(bc: Builder, c, _c2):
            R.store_row(kf, bc, out_buf, elem, splat_row(bc, chunk, 0.0, kf.reg), bc.add(base, c), bc.sub(C, c),
                        chunk)
            return []
        br.for_(0, C, chunk, body)
        lab = load_index(kf, br, lb, r)
        hit = br.op(arith.AndIOp(br.cmp("sge", lab, 0), br.cmp("slt", lab, C))).results[0]

        def one(bt: Builder):
            R.store_row(kf, bt, out_buf, elem, tile_const(bt, 1.0, kf.reg), bt.add(base, lab), 1, 1)
        br.if_(hit, one)
        return []

    if C:
        R.for_rows(kf, b, kf.size(rows), row)
    return kf.finish(), sig.dims, 0, []


__all__ = ["generate", "load_index", "bounded_index", "operand_arg"]
