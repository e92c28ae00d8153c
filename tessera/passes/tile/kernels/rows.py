"""Shared machinery of the row-based kernels (elementwise, rowwise, reduce).

The iteration space is ``[lead..., C]``: rows (the product of the leading dims)
are split across threads, each row is walked in chunks of ``tiles[c]`` columns.
A *leaf* is a kernel input (possibly seen through reshape/transpose) broadcast to
the iteration space; per row it is read at an offset that is ``r * C`` for a
contiguous leaf, ``0`` for one broadcast over all rows, or the mixed-radix sum
of the row's index times the leaf's strides otherwise.  Its column stride is 1
(a vector per chunk) or 0 (one value per row).
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType, StringAttr, f32
from xdsl.ir import Block, BlockArgument, SSAValue

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.builder import Builder
from tessera.passes.tile.kernels.common import (
    KernelFn,
    KernelSig,
    StridedView,
    elementwise,
    for_claimed,
    reg_elem,
    row_major_strides,
    scalar_constant,
    tile_const,
    trace_view,
)


@dataclass
class Leaf:
    value: SSAValue
    view: StridedView        # broadcast to the iteration dims
    mode: str                # contig | bcast | general
    col_stride: int          # 1 or 0 (-1: a reversed last axis, read backwards from the row offset)
    elem: object


def broadcast_to(view: StridedView, dims: tuple[D.Dim, ...]) -> StridedView:
    pad = len(dims) - len(view.dims)
    vd = (1,) * pad + view.dims
    st = [0] * pad + list(view.strides)
    for i, (a, b_) in enumerate(zip(vd, dims)):
        if a == 1 and b_ != 1:
            st[i] = 0
        elif a != b_:
            raise ScheduleIllegalError(f"operand of shape {list(view.dims)} does not broadcast to {list(dims)}")
    return StridedView(view.arg, tuple(dims), tuple(st), view.offset)


def classify(view: StridedView, dims: tuple[D.Dim, ...]) -> tuple[str, int]:
    cs = view.strides[-1] if dims else 0
    if dims and dims[-1] == 1:
        cs = 0
    if cs not in (0, 1, -1):
        raise ScheduleIllegalError("a row kernel reads operands with unit, zero or -1 (reversed) column stride "
                                   f"(got {cs}); a transpose kernel must copy it first")
    lead = view.strides[:-1]
    if view.offset:   # a slice: read at its offset (RowCtx)
        return "general", int(cs)
    if all(st == 0 or d == 1 for st, d in zip(lead, dims[:-1])):
        return "bcast", int(cs)
    if cs == 1 and list(view.strides) == row_major_strides(dims):
        return "contig", 1
    return "general", int(cs)


def find_leaves(block: Block, dims: tuple[D.Dim, ...], compute_ops, extra=()) -> dict[SSAValue, Leaf]:
    """Every operand of ``compute_ops`` (and value of ``extra``) that traces to a kernel input."""
    leaves: dict[SSAValue, Leaf] = {}
    for op, operands in [(op, op.operands) for op in compute_ops] + [(None, tuple(extra))]:
        for v in operands:
            if v in leaves or (not isinstance(v, BlockArgument) and not isinstance(v.owner, (g.ReshapeOp,
                                                                                            g.TransposeOp,
                                                                                            g.SliceOp))):
                continue
            view = trace_view(v, block)
            if view is None:
                raise ScheduleIllegalError(f"operand of {op.name if op else 'a join'} is not a kernel input view")
            bv = broadcast_to(view, dims)
            mode, cs = classify(bv, dims)
            leaves[v] = Leaf(v, bv, mode, cs, v.type.element_type)
    return leaves


def register_dims(sig: KernelSig, dims, leaves: dict[SSAValue, Leaf]) -> None:
    for d in dims:
        sig.dim(d)
    for lf in leaves.values():
        if lf.mode == "general":
            for st in (*lf.view.strides[:-1], *lf.view.offset):
                sig.dim(st)


def row_digits(kf: KernelFn, b: Builder, r, lead) -> list:
    """Row ``r``'s coordinates along the leading dims ``lead`` (rows run over them row-major)."""
    digits, rem = [], r
    for i in reversed(range(len(lead))):
        size = kf.size(lead[i])
        digits.append(b.rem(rem, size) if i > 0 else rem)
        rem = b.div(rem, size) if i > 0 else 0
    digits.reverse()
    return digits


def for_row_runs(kf: KernelFn, b: Builder, total, body) -> None:
    """``body(builder, lo, hi)`` for runs of rows lo..hi-1 (never empty) of about an eighth of a
    thread's share, handed out from the team's work counter (a slower core takes fewer runs)."""
    run = b.max(b.ceil_div(total, b.mul(kf.nthreads, 8)), 1)
    for_claimed(b, 0, b.ceil_div(total, run), lambda bw, item: body(
        bw, bw.mul(item, run), bw.min(bw.mul(bw.add(item, 1), run), total)))


def for_rows(kf: KernelFn, b: Builder, total, body) -> None:
    """``body(builder, r, None)`` for r in 0..total-1, in the runs of ``for_row_runs``."""
    for_row_runs(kf, b, total, lambda bw, lo, hi: bw.for_(lo, hi, 1, body))


class RowCtx:
    """Per-row offsets of every leaf, computed once per row."""

    def __init__(self, kf: KernelFn, b: Builder, r, dims, leaves: dict[SSAValue, Leaf]):
        self.kf, self.b, self.r = kf, b, r
        C = kf.size(dims[-1])
        self.C = C
        self.offsets: dict[SSAValue, object] = {}
        lead = dims[:-1]
        digits = None
        for v, lf in leaves.items():
            if lf.mode == "contig":
                self.offsets[v] = b.mul(r, C)
            elif lf.mode == "bcast":
                self.offsets[v] = 0
            else:
                if digits is None:
                    digits = row_digits(kf, b, r, lead)
                off = kf.view_offset(b, lf.view)
                for dgt, st in zip(digits, lf.view.strides[:-1]):
                    if st != 0:
                        off = b.add(off, b.mul(dgt, kf.size(st)))
                self.offsets[v] = off


def prefetch_leaves(kf: KernelFn, b: Builder, leaves: dict[SSAValue, Leaf], offsets: dict, c, chunk: int) -> None:
    """``tile.prefetch`` the chunk at column c of every row-varying leaf, at ``offsets`` (a later
    row's, from its RowCtx): issued while the current row is computed from the cache."""
    for v, lf in leaves.items():
        if lf.mode == "bcast" or lf.col_stride != 1 or v not in offsets:
            continue
        view = t.ViewOp.create(operands=[kf.buffer_args[lf.view.arg], b.c(b.add(offsets[v], c)), b.c(0), b.c(1),
                                         b.c(1), b.c(chunk)], result_types=[t.view_type(1, chunk, lf.elem, "global")])
        b.op(view)
        b.op(t.PrefetchOp.create(operands=[view.result]))


def load_leaf(kf: KernelFn, b: Builder, lf: Leaf, row_off, c, cols_left, chunk: int, pad: float | None = None):
    buf = kf.buffer_args[lf.view.arg]
    width = chunk if lf.col_stride != 0 else 1
    off = b.add(row_off, c) if lf.col_stride == 1 else b.sub(row_off, c) if lf.col_stride == -1 else row_off
    view = t.ViewOp.create(operands=[buf, b.c(off), b.c(0), b.c(lf.col_stride), b.c(1),
                                     b.c(cols_left if width > 1 else 1)],
                           result_types=[t.view_type(1, width, lf.elem, "global")])
    b.op(view)
    attrs = {"pad": FloatAttr(pad, f32)} if pad is not None and pad != 0.0 else {}
    ld = t.LoadOp.create(operands=[view.result], attributes=attrs,   # registers: f32 (f64 kernels: f64),
                         result_types=[t.tile_type(1, width, reg_elem(lf.elem, kf.reg))])   # ints their own
    b.op(ld)
    return ld.result


# Results of at least this many bytes are written with streaming stores (they do not fit in
# the caches, so reading the destination lines first — what an ordinary store does — is wasted).
STREAM_MIN_BYTES = 8 << 20


def stream_flag(b: Builder, total_elems, elem_bytes: int = 4):
    """An i1: true when the kernel's result is large enough to stream."""
    return b.cmp("sge", b.c(total_elems), STREAM_MIN_BYTES // elem_bytes)


def store_row(kf: KernelFn, b: Builder, buf_index: int, elem, value, off, cols_left, chunk: int,
              stream=None) -> None:
    view = t.ViewOp.create(operands=[kf.buffer_args[buf_index], b.c(off), b.c(0), b.c(1), b.c(1), b.c(cols_left)],
                           result_types=[t.view_type(1, chunk, elem, "global")])
    b.op(view)
    vt = value.type
    if vt.dims != (1, chunk):  # broadcast a [1, 1] value across the chunk
        value = _widen(b, value, chunk)
    b.op(t.StoreOp.create(operands=[value, view.result] + ([stream] if stream is not None else [])))


def _widen(b: Builder, value, chunk: int):
    et = value.type.element_type
    zero = t.ConstantOp.create(attributes={"value": IntegerAttr(0, et) if isinstance(et, IntegerType)
                                           else FloatAttr(0.0, et)},
                               result_types=[t.tile_type(1, chunk, et)])
    b.op(zero)
    return elementwise(b, "add", [zero.result, value])


def round_fn(elem, reg) -> str | None:
    """The ``round_*`` tile function that gives a value in ``reg`` registers the rounding of a
    cast to ``elem``, or None where ``elem`` holds every ``reg`` value (or is not a float)."""
    order = {"bf16": 1, "f16": 1, "f32": 2, "f64": 3}
    e, r = str(elem), str(reg)
    return f"round_{e}" if e in order and order[e] < order.get(r, 0) else None


def emit_ops(b: Builder, ops, vals: dict, reg=f32) -> None:
    """Graph IR elementwise ops -> tile.elementwise on already-mapped values (registers of ``reg``).

    A value narrower than the registers that the kernel goes on computing with is rounded to
    what numpy holds (a value only stored is rounded by its store): a cast to its type, and in
    f64 registers any f32 / bf16 / f16 op's result to f32 -- the value an f32 kernel computes."""
    for op in ops:
        if isinstance(op, (g.ReshapeOp, g.TransposeOp, g.SliceOp)):
            continue
        if isinstance(op, g.ConstantOp):
            c = scalar_constant(op)
            if c is None:
                raise ScheduleIllegalError("only scalar constants are supported inside kernels")
            vals[op.result] = tile_const(b, c, reg_elem(op.result.type.element_type, reg))
        elif isinstance(op, g.CastOp):
            src, dst = op.input.type.element_type, op.result.type.element_type
            if isinstance(src, IntegerType) or isinstance(dst, IntegerType):   # int / bool lanes: convert
                vals[op.result] = elementwise_typed(b, "cvt", [vals[op.input]], reg_elem(dst, reg))
            else:
                vals[op.result] = vals[op.input]
        elif isinstance(op, g.IotaOp):
            if op.result not in vals:
                raise ScheduleIllegalError("tessera.iota in a kernel that does not provide its indices")
            continue
        elif typed_fn(op) is not None:   # comparisons, where, logic, integer ops (kernels/typed.py)
            vals[op.result] = emit_typed(b, op, vals, reg)
        elif isinstance(op, g.ELEMENTWISE_UNARY):
            vals[op.result] = elementwise(b, g.elementwise_fn(op), [vals[op.input]])
        elif isinstance(op, g.ELEMENTWISE_BINARY):
            vals[op.result] = elementwise(b, g.elementwise_fn(op), [vals[op.lhs], vals[op.rhs]])
        else:
            raise ScheduleIllegalError(f"{op.name} is not an elementwise op")
        if isinstance(op.result.type.element_type, IntegerType):
            continue
        narrow = round_fn(op.result.type.element_type, reg)
        # a cast rounds to its type; an op of a narrower type to f32 (in f64 registers; in f32 ones
        # bf16 / f16 ops keep computing in f32, as before)
        fn = narrow if isinstance(op, g.CastOp) else narrow and round_fn(f32, reg)
        if fn is not None and not all(isinstance(u.operation, g.YieldOp) for u in op.result.uses):
            vals[op.result] = elementwise(b, fn, [vals[op.result]])


def chunk_of(kop: s.KernelOp) -> int:
    return kop.tile_sizes["c"]


def check_rows_schedule(kop: s.KernelOp) -> None:
    if kop.loop_order != ["r", "c"]:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: row kernels run loops in order [r, c]")
    if kop.tile_sizes.get("r") != 1:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: row kernels take one row per step (tile r = 1)")
    if kop.tile_sizes["c"] % kop.vector.value.data:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: the column chunk must be a multiple of the "
                                   "vector width")


from tessera.passes.tile.kernels.typed import elementwise_typed, emit_typed, typed_fn  # noqa: E402

__all__ = ["Leaf", "find_leaves", "register_dims", "for_row_runs", "for_rows", "RowCtx", "load_leaf", "prefetch_leaves", "store_row",
           "emit_ops", "round_fn", "chunk_of", "check_rows_schedule", "StringAttr"]
