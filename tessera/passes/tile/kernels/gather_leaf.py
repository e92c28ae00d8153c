"""A ``tessera.take`` read in place by an elementwise kernel (fuse-elementwise lets one in
when the gathered axis is not the input's last, so each row of the iteration space is a
contiguous piece of one input row).  Per row of the output, the leaf's offset is

    sum(p digits * input strides) + bounded(idx[k]) * stride of the axis + sum(q digits * strides)

where the row's digits split into p (the input dims before the axis), k (the indices' dims,
flattened row-major) and q (the input dims after the axis, but the last).  The columns are
then read with vector loads at unit stride, like any contiguous leaf."""
from __future__ import annotations

from xdsl.ir import Block

from tessera.ir import graph as g
from tessera.ir.attrs import ival
from tessera.ir.builder import Builder
from tessera.ir.strided import StridedView, row_major_strides
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelFn, KernelSig
from tessera.passes.tile.kernels.gather import bounded_index, load_index, operand_arg


def find(name: str, block: Block) -> dict:
    """Leaves for the takes in an elementwise kernel's block: value -> (Leaf, take op, index buffer)."""
    out = {}
    for op in block.ops:
        if isinstance(op, g.TakeOp):
            x = op.input.type
            view = StridedView.contiguous(operand_arg(name, op, op.input), x.dims)
            out[op.result] = (R.Leaf(op.result, view, "gather", 1, x.element_type), op,
                              operand_arg(name, op, op.indices))
    return out


def register(sig: KernelSig, leaves: dict) -> None:
    for lf, op, _ in leaves.values():
        for d in (*lf.view.strides, *row_major_strides(op.indices.type.dims)):
            sig.dim(d)


def offsets(kf: KernelFn, b: Builder, r, dims, leaves: dict) -> dict:
    """The row offset of each take leaf for row ``r`` of the iteration space ``dims``."""
    if not leaves:
        return {}
    digits = R.row_digits(kf, b, r, dims[:-1])
    out = {}
    for v, (lf, op, ib) in leaves.items():
        ax, m = ival(op.axis), op.indices.type.rank
        xs = lf.view.strides
        ist = row_major_strides(op.indices.type.dims)
        off, k = 0, 0
        for pos, dg in enumerate(digits):
            if pos < ax:
                off = b.add(off, b.mul(dg, kf.size(xs[pos])))
            elif pos < ax + m:
                k = b.add(k, b.mul(dg, kf.size(ist[pos - ax])))
            else:
                off = b.add(off, b.mul(dg, kf.size(xs[pos - m + 1])))
        j = bounded_index(b, load_index(kf, b, ib, k), op.input.type.dims[ax])
        out[v] = b.add(off, b.mul(j, kf.size(xs[ax])))
    return out


__all__ = ["find", "register", "offsets"]
