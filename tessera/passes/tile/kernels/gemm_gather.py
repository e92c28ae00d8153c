"""A GEMM whose A operand is a ``tessera.take`` of table rows (``table[ids] @ w``): the gathered
A is never written.  fuse-matmul-epilogue puts the take (along axis 0 of a 2-D table) in the
gemm group; the plan's A view then counts in rows of the logical A (k stride 0), and for each
MC x KC block the kernel copies the block's rows, each from table row ``bounded(ids[row])``, into
a thread-private staging buffer (cache resident) that the usual ``a_panel`` packing reads.  The
index policy is the gathers' (``kernels/gather.py``); no read leaves the table."""
from __future__ import annotations

from dataclasses import dataclass

from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import Builder
from tessera.ir.strided import StridedView, row_major_strides
from tessera.passes.tile.kernels.common import KernelFn
from tessera.passes.tile.kernels.gather import bounded_index, load_index, operand_arg

ELEM_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2}


@dataclass
class GatherA:
    table: int      # kernel input holding the [n, K] table
    idx: int        # kernel input holding the indices (any shape: the rows of A)
    n: int          # table rows (static)


def fusable(op) -> bool:
    """A take that may feed a GEMM's A in place: rows of a 2-D table (axis 0)."""
    return isinstance(op, g.TakeOp) and ival(op.axis) == 0 and op.input.type.rank == 2


def analyse(name: str, take) -> tuple[StridedView, GatherA]:
    """The row-unit view of the gathered A (dims of the take's result) and its record."""
    if not fusable(take):
        raise ScheduleIllegalError(f"kernel {name}: a gemm reads a tessera.take as A only along axis 0 of a "
                                   "2-D table")
    dims = tuple(take.result.type.dims)
    rows = row_major_strides(dims[:-1])
    view = StridedView(-1, dims, tuple(rows) + (0,))
    return view, GatherA(operand_arg(name, take, take.input), operand_arg(name, take, take.indices),
                         take.input.type.dims[0])


def stage(kf: KernelFn, b: Builder, ga: GatherA, stage_buf, elem, row0, rs, pc, mc, kc, K, shape, w: int):
    """Copy the block's ``mc`` rows (columns pc .. pc + kc) into ``stage_buf`` (row stride KC) and
    return a view of them for the packing copy."""
    MC, KC = shape
    chunk = 4 * w

    def row(br: Builder, r, _c):
        j = bounded_index(br, load_index(kf, br, ga.idx, br.add(row0, br.mul(r, rs))), ga.n)
        src = br.add(br.mul(j, K), pc)
        dst = br.mul(r, KC)

        def col(bc: Builder, c, _c2):
            left = bc.sub(kc, c)
            sv = bc.op(t.ViewOp.create(operands=[kf.buffer_args[ga.table], bc.c(bc.add(src, c)), bc.c(0), bc.c(1),
                                                 bc.c(1), bc.c(left)],
                                       result_types=[t.view_type(1, chunk, elem, "global")])).result
            ld = bc.op(t.LoadOp.create(operands=[sv], result_types=[t.tile_type(1, chunk, kf.reg)])).result
            dv = bc.op(t.ViewOp.create(operands=[stage_buf, bc.c(bc.add(dst, c)), bc.c(0), bc.c(1), bc.c(1),
                                                 bc.c(left)],
                                       result_types=[t.view_type(1, chunk, elem, "l2")])).result
            bc.op(t.StoreOp.create(operands=[ld, dv]))
            return []
        br.for_(0, kc, chunk, col)
        return []

    b.for_(0, mc, 1, row)
    op = t.ViewOp.create(operands=[stage_buf, b.c(0), b.c(KC), b.c(1), b.c(mc), b.c(kc)],
                         result_types=[t.view_type(MC, KC, elem, "l2")])
    b.op(op)
    return op.result


def refuse_on_gpu(name: str, plan, target: str) -> None:
    if getattr(plan, "gather", None) is not None:
        raise ScheduleIllegalError(f"kernel {name}: tessera.take feeding a matmul has no lowering on the {target} "
                                   'lane; target="cpu" compiles it')


__all__ = ["GatherA", "fusable", "analyse", "stage", "refuse_on_gpu", "ELEM_BYTES"]
