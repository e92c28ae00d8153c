"""Scans (``cumsum`` / ``cumprod``) on the GPU lanes, as Tile IR written per workgroup (the ``scan``
kernel kind; ``gpu_rows.generate`` hands it here).  The input is seen as ``[outer, L, inner]`` with L
the scanned axis, contiguous (as on the CPU lane, ``kernels/scan.py``); registers are f32, each output
rounded once as it is stored.

- ``inner == 1`` (the last axis): one workgroup per row, the row walked in ``[1, chunk]`` tiles;
  each chunk is one ``tile.scan`` after the carry of the chunks before it (the target lowering scans
  each thread's items, then the threads' totals with xor-shuffles and one shared-memory exchange);
  past the row's end the chunk is masked with the neutral value (0 / 1), so the carry is exact.  The
  fold order is a tree's, not numpy's left-to-right one: f32 sums differ from numpy's f32 ``cumsum``
  by rounding (both within the usual error of a sum of L terms of the float64 result).
- ``inner > 1``: one workgroup per (outer index, chunk of inner columns); each thread walks L with
  its columns' running values, loading and storing one vector per step: numpy's own order.
"""
from __future__ import annotations

from xdsl.dialects.builtin import StringAttr, f32

from tessera.ir import dims as D
from tessera.ir import tile as t
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, elementwise, mask_cols, splat_row
from tessera.passes.tile.kernels.common import tile_const
from tessera.passes.tile.kernels.scan import scan_of

INCLUSIVE = True   # each output includes its own element (a test plants False: an off-by-one scan)


def generate(kop):
    from tessera.passes.tile.kernels.gpu_rows import _finish, _program_id, _setup
    name, T, wave, chunk = _setup(kop, "scan")
    op, view, xd, ax, outer, length, inner = scan_of(kop, "a GPU scan kernel")
    kind = op.KIND
    init = 0.0 if kind == "add" else 1.0
    elem, out_elem = op.input.type.element_type, op.result.type.element_type
    sig = KernelSig(name, gpu=True)
    for v in kop.inputs:
        sig.buffer(v.type.element_type)
    out_buf = sig.buffer(out_elem)
    for d in (outer, length, inner):
        sig.dim(d)
    kf = sig.build()
    b = kf.b
    L, I = kf.size(length), kf.size(inner)
    r = _program_id(b)

    def view_at(bb, buf, off, cols, el):
        v = t.ViewOp.create(operands=[kf.buffer_args[buf], bb.c(off), bb.c(0), bb.c(1), bb.c(1), bb.c(cols)],
                            result_types=[t.view_type(1, chunk, el, "global")])
        bb.op(v)
        return v.result

    def load(bb, off, cols):
        ld = t.LoadOp.create(operands=[view_at(bb, view.arg, off, cols, elem)], result_types=[t.tile_type(1, chunk, f32)])
        bb.op(ld)
        return ld.result

    if inner == 1:
        base = b.mul(r, L)

        def step(bc, c, carried):
            left = bc.sub(L, c)
            x = mask_cols(bc, load(bc, bc.add(base, c), left), left, init)
            sc = t.ScanOp.create(operands=[x, carried[0]], attributes={"kind": StringAttr(kind)},
                                 result_types=[x.type, t.tile_type(1, 1, f32)])
            bc.op(sc)
            y = sc.result if INCLUSIVE else elementwise(bc, "div" if kind == "mul" else "sub", [sc.result, x])
            R.store_row(kf, bc, out_buf, out_elem, y, bc.add(base, c), left, chunk)
            return [sc.total]
        b.for_(0, L, chunk, step, [tile_const(b, init)])
        grid = [D.ceil_extent(outer, 1)]
    else:
        c = b.mul(_program_id(b, 1), chunk)
        left = b.sub(I, c)
        base = b.add(b.mul(r, b.mul(L, I)), c)

        def step(bc, i, carried):
            off = bc.add(base, bc.mul(i, I))
            new = elementwise(bc, kind, [carried[0], load(bc, off, left)])
            R.store_row(kf, bc, out_buf, out_elem, new if INCLUSIVE else carried[0], off, left, chunk)
            return [new]
        b.for_(0, L, 1, step, [splat_row(b, chunk, init)])
        grid = [D.ceil_extent(outer, 1), D.ceil_extent(inner, chunk)]
    return _finish(kf, kf.finish(), grid, T, wave), sig.dims, 0, []


__all__ = ["generate", "INCLUSIVE"]
