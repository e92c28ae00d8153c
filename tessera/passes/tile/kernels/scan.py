"""Scans (``cumsum`` / ``cumprod``) along one axis of a contiguous input: the ``scan`` kernel kind.

The input is seen as ``[outer, L, inner]`` with L the scanned axis.  Every output element is the
running sum (product) of the elements before it along L, in order -- the order numpy's
``np.add.accumulate`` uses, so an f32 scan gives numpy's f32 result.  Registers are f32 for
bf16 / f16 inputs (each output rounded once as it is stored) and f64 for f64.

- ``inner > 1``: work items are (outer index, chunk of inner columns), handed out to threads; each
  walks L with a [1, chunk] vector accumulator, loading and storing one vector per step.
- ``inner == 1`` (the last axis): rows are handed out to threads; each walks its row one element
  at a time (a scalar loop: Tile IR has no lane shuffles for an in-register prefix scan yet).
"""
from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, row_major_strides, trace_view
from tessera.passes.util import register_elem

INCLUSIVE = True   # each output includes its own element (a test plants False: an off-by-one scan)


def scan_of(kop, what: str = "a scan kernel"):
    """The kernel's one cumsum/cumprod and its input seen as ``[outer, L, inner]``:
    ``(op, view, dims, axis, outer, L, inner)``; refused unless it is alone and reads a contiguous input."""
    name = kop.sym_name.data
    block = kop.body.block
    scans = [o for o in block.ops if isinstance(o, g.SCANS)]
    if len(scans) != 1 or list(block.last_op.operands) != [scans[0].result]:
        raise ScheduleIllegalError(f"kernel {name}: {what} holds one cumsum/cumprod")
    op = scans[0]
    view = trace_view(op.input, block)
    xd = tuple(op.input.type.dims)
    if view is None or list(view.strides) != row_major_strides(xd) or view.offset:
        raise ScheduleIllegalError(f"kernel {name}: {what} reads a contiguous input (a transpose kernel copies "
                                   "it first)")
    ax = ival(op.axis) % len(xd)
    return op, view, xd, ax, D.product(xd[:ax]), xd[ax], D.product(xd[ax + 1:])


def generate(kop: s.KernelOp):
    R.check_rows_schedule(kop)
    op, view, xd, ax, outer, length, inner = scan_of(kop)
    kind = op.KIND                      # add | mul
    init = 0.0 if kind == "add" else 1.0
    chunk = R.chunk_of(kop)
    elem, out_elem = op.input.type.element_type, op.result.type.element_type
    sig = KernelSig(kop.sym_name.data, reg=register_elem(kop))
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    for d in (outer, length, inner):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    reg = kf.reg
    O, L, I = kf.size(outer), kf.size(length), kf.size(inner)

    def view_at(bb, buf, off, width, cols, el):
        v = t.ViewOp.create(operands=[kf.buffer_args[buf], bb.c(off), bb.c(0), bb.c(1), bb.c(1), bb.c(cols)],
                            result_types=[t.view_type(1, width, el, "global")])
        bb.op(v)
        return v.result

    def start(bb, width):
        z = t.ConstantOp.create(attributes={"value": FloatAttr(init, reg)}, result_types=[t.tile_type(1, width, reg)])
        bb.op(z)
        return z.result

    def step(bb, off, cols, width, acc):
        """acc op x at ``off``, stored there in the output; the new accumulator."""
        ld = t.LoadOp.create(operands=[view_at(bb, view.arg, off, width, cols, elem)],
                             result_types=[t.tile_type(1, width, reg)])
        bb.op(ld)
        new = elementwise(bb, kind, [acc, ld.result])
        bb.op(t.StoreOp.create(operands=[new if INCLUSIVE else acc, view_at(bb, out_buf, off, width, cols, out_elem)]))
        return [new]

    if inner == 1:
        def row(br, r, _c):
            base = br.mul(r, L)
            br.for_(0, L, 1, lambda bc, i, carried: step(bc, bc.add(base, i), 1, 1, carried[0]), [start(br, 1)])
            return []

        R.for_rows(kf, b, O, row)
    else:
        nchunks = b.ceil_div(I, chunk)

        def item(bi, w, _c):
            o = bi.div(w, nchunks)
            c = bi.mul(bi.rem(w, nchunks), chunk)
            cols = bi.sub(I, c)
            base = bi.add(bi.mul(o, bi.mul(L, I)), c)
            bi.for_(0, L, 1, lambda bc, i, carried: step(bc, bc.add(base, bc.mul(i, I)), cols, chunk, carried[0]),
                    [start(bi, chunk)])
            return []

        R.for_rows(kf, b, b.mul(O, nchunks), item)
    return kf.finish(), sig.dims, 0, []
