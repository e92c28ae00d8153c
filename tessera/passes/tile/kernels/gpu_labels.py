"""Kernels of integer labels for the GPU lanes, as Tile IR written per workgroup (one workgroup
per row; ``gpu_rows.generate`` hands them here):

- ``cross_entropy`` (kind ``rowwise``): the row's label is read once as a ``[1, 1]`` int tile every
  thread holds; pass 1 folds the row's maximum (select_max) and the logit at the label's column
  (``select(cmp_eq(column, label), x, -inf)``, folded with max: -inf where no column is the
  label); pass 2 sums exp(x - s) with s the maximum clamped finite; ``loss = s + log(sum) - picked``,
  ``valid = 1 - (label == ignore_index)``, and an ignored row stores ``safe_div(loss, valid)`` = 0.
  A label outside [0, C) matches no column (nothing is read for it): its loss is +inf, as on the
  CPU lane (``kernels/xent.py``).
- ``one_hot`` (kind ``gather``): out[r, c] = ``cvt(cmp_eq(c, label[r]))`` for each chunk of the row.
- ``argmax`` / ``argmin`` (kind ``rowwise``, with its fused elementwise prologue: ``gpu_rowin.py``): pass 1 folds the row's maximum (minimum) as numpy's,
  keeping a NaN; pass 2 folds, with min, the column index (as f32: exact below 2^24 columns) of
  every item that equals it -- or is NaN when it is NaN -- and +inf elsewhere: the first match, as
  numpy's; stored as int64 by thread 0.
- ``take_along_axis`` (kind ``gather``; along the last axis, leading dims equal): one workgroup per
  row, each of its K indices read and bounded as ``take``'s, the value copied by thread 0 (a
  latency-bound loop: K is small where samplers use it).
- ``take`` (kind ``gather``; the embedding lookup): with the input seen as [P, n, Q] and the K indices
  flattened, output row (p, k) is input row (p, idx[k]), one workgroup per output row copying Q
  elements in chunks (16-byte accesses).  The index is read with ``tile.load_index`` and bounded as
  on the CPU lane (``kernels/gather.py``: numpy's meaning in [-n, n), clamped outside), so no read
  leaves the input whatever the index values.
"""
from __future__ import annotations

from xdsl.dialects.builtin import IntegerType, f32

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ival
from tessera.ir.strided import row_major_strides
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, mask_cols, splat_row, tile_const, trace_view
from tessera.passes.tile.kernels.typed import elementwise_typed

F32_MAX = 3.4028234663852886e38
NEG_INF = float("-inf")
BOOL = IntegerType(1)


def _contiguous(name: str, v, block, what: str):
    view = trace_view(v, block)
    if view is None or view.offset or list(view.strides) != row_major_strides(tuple(view.dims)):
        raise ScheduleIllegalError(f"kernel {name}: {what} on the GPU reads a contiguous kernel input")
    return view


def _row_view(kf, b, buf: int, off, width: int, cols, elem):
    v = t.ViewOp.create(operands=[kf.buffer_args[buf], b.c(off), b.c(0), b.c(1), b.c(1), b.c(cols)],
                        result_types=[t.view_type(1, width, elem, "global")])
    b.op(v)
    return v.result


def _load(b, view, elem, pad: float | None = None):
    from xdsl.dialects.builtin import FloatAttr
    attrs = {"pad": FloatAttr(pad, f32)} if pad else {}
    ld = t.LoadOp.create(operands=[view], attributes=attrs,
                         result_types=[t.tile_type(1, view.type.dims[1], elem)])
    b.op(ld)
    return ld.result


def _label(kf, b, buf: int, r, elem):
    """Label r as a [1, 1] tile of its own int type (every thread holds it)."""
    return _load(b, _row_view(kf, b, buf, r, 1, 1, elem), elem)


def _columns(b, c, chunk: int, elem):
    """A [1, chunk] int tile of the column indices c, c + 1, ..."""
    op = t.IndexOp.create(operands=[b.c(c)], attributes={"row_step": i64_attr(0), "col_step": i64_attr(1)},
                          result_types=[t.tile_type(1, chunk, elem)])
    b.op(op)
    return op.result


def _reduce(b, kind: str, v):
    from xdsl.dialects.builtin import StringAttr
    op = t.ReduceOp.create(operands=[v], attributes={"kind": StringAttr(kind), "axis": i64_attr(1)},
                           result_types=[t.tile_type(1, 1, f32)])
    b.op(op)
    return op.result


def cross_entropy(kop, prologue, op, epilogue):
    from tessera.passes.tile.kernels.gpu_rows import _finish, _program_id, _setup
    name, T, wave, chunk = _setup(kop, "rowwise")
    block = kop.body.block
    outs = list(block.last_op.operands)
    if prologue or epilogue or not all(o in (op.loss, op.valid) for o in outs):
        raise ScheduleIllegalError(f"kernel {name}: the GPU cross_entropy kernel fuses no elementwise op into it "
                                   "(its logits come from their own kernel)")
    xv = _contiguous(name, op.input, block, "cross_entropy")
    lv = _contiguous(name, op.labels, block, "cross_entropy")
    dims = tuple(op.input.type.dims)
    lelem, xelem = op.labels.type.element_type, op.input.type.element_type
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_bufs = [sig.buffer(o.type.element_type) for o in outs]
    for d in (D.product(dims[:-1]), dims[-1]):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    C = kf.size(dims[-1])
    r = _program_id(b)
    y = _label(kf, b, lv.arg, r, lelem)
    base = b.mul(r, C)
    neg_inf = tile_const(b, NEG_INF)

    def x_chunk(bc, c, pad):
        left = bc.sub(C, c)
        return mask_cols(bc, _load(bc, _row_view(kf, bc, xv.arg, bc.add(base, c), chunk, left, xelem), f32, pad),
                         left, pad), left

    def max_body(bc, c, carried):
        x, left = x_chunk(bc, c, NEG_INF)
        hit = elementwise_typed(bc, "cmp_eq", [_columns(bc, c, chunk, lelem), y], BOOL)
        picked = mask_cols(bc, elementwise_typed(bc, "select", [hit, x, neg_inf], f32), left, NEG_INF)
        return [elementwise(bc, "select_max", [carried[0], x]), elementwise(bc, "max", [carried[1], picked])]

    acc_m, acc_p = b.for_(0, C, chunk, max_body, [splat_row(b, chunk, NEG_INF)] * 2)
    m, p = _reduce(b, "max", acc_m), _reduce(b, "max", acc_p)
    shift = elementwise(b, "min", [elementwise(b, "max", [m, tile_const(b, -F32_MAX)]), tile_const(b, F32_MAX)])

    def sum_body(bc, c, carried):
        x, left = x_chunk(bc, c, 0.0)
        e = mask_cols(bc, elementwise(bc, "exp", [elementwise(bc, "sub", [x, shift])]), left, 0.0)
        return [elementwise(bc, "add", [carried[0], e])]

    ssum = _reduce(b, "add", b.for_(0, C, chunk, sum_body, [splat_row(b, chunk, 0.0)])[0])
    loss = elementwise(b, "sub", [elementwise(b, "add", [elementwise(b, "log", [ssum]), shift]), p])
    ignored = elementwise_typed(b, "cmp_eq", [y, tile_const(b, ival(op.ignore_index), lelem)], BOOL)
    valid = elementwise(b, "sub", [tile_const(b, 1.0), elementwise_typed(b, "cvt", [ignored], f32)])
    vals = {op.loss: elementwise(b, "safe_div", [loss, valid]), op.valid: valid}
    for o, buf in zip(outs, out_bufs):
        b.op(t.StoreOp.create(operands=[vals[o], _row_view(kf, b, buf, r, 1, 1, o.type.element_type)]))
    return _finish(kf, kf.finish(), [D.ceil_extent(D.product(dims[:-1]), 1)], T, wave), sig.dims, 0, []


FIRST = True   # the first matching column on ties (a test plants False: the last one)


def arg_extreme(kop, prologue, op, epilogue):
    from tessera.passes.tile.kernels.gpu_rowin import RowInput
    out_elem = op.result.type.element_type
    S = RowInput(kop, prologue, op, epilogue, [out_elem], op.name)
    if list(kop.body.block.last_op.operands) != [op.result]:
        raise ScheduleIllegalError(f"kernel {S.name}: the GPU {op.name} kernel yields its index only")
    b, C, chunk = S.b, S.C, S.chunk
    kind = op.KIND
    pad = NEG_INF if kind == "max" else float("inf")

    def ext_body(bc, c, carried):
        return [elementwise(bc, kind, [carried[0], S.chunk_at(bc, c, pad)[0]])]
    m = _reduce(b, kind, b.for_(0, C, chunk, ext_body, [splat_row(b, chunk, pad)])[0])
    m_nan = elementwise_typed(b, "isnan", [m], BOOL)
    fold, none = ("min", float("inf")) if FIRST else ("max", NEG_INF)

    def find_body(bc, c, carried):
        x, left = S.chunk_at(bc, c, 0.0)
        hit = elementwise_typed(bc, "or", [elementwise_typed(bc, "cmp_eq", [x, m], BOOL), elementwise_typed(
            bc, "and", [elementwise_typed(bc, "isnan", [x], BOOL), m_nan], BOOL)], BOOL)
        col = elementwise_typed(bc, "cvt", [_columns(bc, c, chunk, IntegerType(32))], f32)
        cand = mask_cols(bc, elementwise_typed(bc, "select", [hit, col, tile_const(bc, none)], f32), left, none)
        return [elementwise(bc, fold, [carried[0], cand])]
    first = _reduce(b, fold, b.for_(0, C, chunk, find_body, [splat_row(b, chunk, none)])[0])
    idx = elementwise_typed(b, "cvt", [first], out_elem)
    R.store_row(S.kf, b, S.out_bufs[0], out_elem, idx, S.r, 1, 1)
    return S.finish()


def one_hot(kop, op: g.OneHotOp):
    from tessera.passes.tile.kernels.gpu_rows import _finish, _program_id, _setup
    name, T, wave, chunk = _setup(kop, "gather")
    block = kop.body.block
    if list(block.last_op.operands) != [op.result]:
        raise ScheduleIllegalError(f"kernel {name}: the GPU one_hot kernel holds one one_hot")
    lv = _contiguous(name, op.input, block, "one_hot")
    lelem = op.input.type.element_type
    out_elem = op.result.type.element_type
    dims = tuple(op.result.type.dims)
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    for d in (D.product(dims[:-1]), dims[-1]):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    C = kf.size(dims[-1])
    r = _program_id(b)
    y = _label(kf, b, lv.arg, r, lelem)
    out_off = b.mul(r, C)

    def body(bc, c, _c):
        hit = elementwise_typed(bc, "cmp_eq", [_columns(bc, c, chunk, lelem), y], BOOL)
        R.store_row(kf, bc, out_buf, out_elem, elementwise_typed(bc, "cvt", [hit], f32), bc.add(out_off, c),
                    bc.sub(C, c), chunk)
        return []
    b.for_(0, C, chunk, body)
    return _finish(kf, kf.finish(), [D.ceil_extent(D.product(dims[:-1]), 1)], T, wave), sig.dims, 0, []


def take(kop, op: g.TakeOp):
    from tessera.passes.tile.kernels.gather import bounded_index, load_index, operand_arg
    from tessera.passes.tile.kernels.gpu_rows import _finish, _program_id, _setup
    name, T, wave, chunk = _setup(kop, "gather")
    block = kop.body.block
    if list(block.last_op.operands) != [op.result]:
        raise ScheduleIllegalError(f"kernel {name}: the GPU take kernel holds one take")
    x, idx = op.input.type, op.indices.type
    ax = ival(op.axis) % x.rank
    n = x.dims[ax]
    if not isinstance(n, int):
        raise ScheduleIllegalError(f"kernel {name}: take along a symbolic axis has no GPU kernel")
    elem = x.element_type
    P, K, Q = D.product(x.dims[:ax]), D.product(idx.dims), D.product(x.dims[ax + 1:])
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(elem)
    for d in (P, K, Q):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    xb, ib = operand_arg(name, op, op.input), operand_arg(name, op, op.indices)
    k_, q_ = kf.size(K), kf.size(Q)
    r = _program_id(b)
    p = b.div(r, k_)
    j = bounded_index(b, load_index(kf, b, ib, b.sub(r, b.mul(p, k_))), n)
    src = b.mul(b.add(b.mul(p, n), j), q_)
    dst = b.mul(r, q_)
    reg = elem if isinstance(elem, IntegerType) else f32

    def body(bc, c, _c):
        left = bc.sub(q_, c)
        v = _load(bc, _row_view(kf, bc, xb, bc.add(src, c), chunk, left, elem), reg)
        R.store_row(kf, bc, out_buf, elem, v, bc.add(dst, c), left, chunk)
        return []
    b.for_(0, q_, chunk, body)
    return _finish(kf, kf.finish(), [D.ceil_extent(D.product([P, K]), 1)], T, wave), sig.dims, 0, []


def take_along_axis(kop, op: g.TakeAlongAxisOp):
    """Along the last axis, leading dims equal: one workgroup per row, the row's K indices read one at
    a time (``tile.load_index``, bounded as ``take``'s) and each gathered value copied by thread 0."""
    from tessera.passes.tile.kernels.gather import bounded_index, load_index, operand_arg
    from tessera.passes.tile.kernels.gpu_rows import _finish, _program_id, _setup
    name, T, wave, _chunk = _setup(kop, "gather")
    x, idx = op.input.type, op.indices.type
    ax = ival(op.axis) % x.rank
    n = x.dims[ax]
    if ax != x.rank - 1 or tuple(x.dims[:-1]) != tuple(idx.dims[:-1]) or not isinstance(n, int):
        raise ScheduleIllegalError(f"kernel {name} (tessera.take_along_axis): the GPU kernel gathers along the "
                                   'last axis with equal leading dims; target="cpu" compiles it')
    elem = x.element_type
    P, K = D.product(x.dims[:-1]), idx.dims[-1]
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(elem)
    for d in (P, K):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    xb, ib = operand_arg(name, op, op.input), operand_arg(name, op, op.indices)
    k_ = kf.size(K)
    r = _program_id(b)
    reg = elem if isinstance(elem, IntegerType) else f32

    def body(bc, j, _c):
        at = bc.add(bc.mul(r, k_), j)
        i = bounded_index(bc, load_index(kf, bc, ib, at), n)
        v = _load(bc, _row_view(kf, bc, xb, bc.add(bc.mul(r, n), i), 1, 1, elem), reg)
        R.store_row(kf, bc, out_buf, elem, v, at, 1, 1)
        return []
    b.for_(0, k_, 1, body)
    return _finish(kf, kf.finish(), [D.ceil_extent(P, 1)], T, wave), sig.dims, 0, []


__all__ = ["cross_entropy", "one_hot", "take", "take_along_axis", "arg_extreme"]
