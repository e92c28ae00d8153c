"""``fuse-matmul-epilogue``: one ``gemm`` group per matmul.

The group takes the matmul, the reshape/transpose ops that only feed its operands
(they become strides of the packing copies) and a slice at the root of that chain (an
offset), and the chain of elementwise ops that
follows it while each link has a single use and keeps the matmul's shape: bias and
residual adds, scaling, activations, and a final cast.  Scalar constants used only
by the chain come along.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph as g
from tessera.ir.attrs import ints, ival
from tessera.ir.strided import StridedView
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph import epilogue_dag
from tessera.passes.graph.outline import outline, single_use
from tessera.passes.graph.outline_kernels import operand_reshapes
from tessera.passes.util import function_blocks, view_through


def _operand_views(v, group: list) -> None:
    """Absorb the single-use reshape/transpose chain feeding a matmul operand, as far as it
    stays expressible as strides of the chain's source (otherwise the rest stays a copy).  A
    convolution's ``conv_patches`` operand comes along: the GEMM packs A through it."""
    if isinstance(v.owner, g.ConvPatchesOp) and single_use(v):
        group.append(v.owner)
        return
    chain = []
    while isinstance(v.owner, (g.ReshapeOp, g.TransposeOp)) and single_use(v):
        chain.append(v.owner)
        v = v.owner.input
    if isinstance(v.owner, g.SliceOp) and single_use(v):
        chain.append(v.owner)   # a slice at the root is an offset and strides (q, k, v split from one qkv)
        v = v.owner.input
    # walk from the source towards the matmul; keep the longest expressible suffix
    view = StridedView.contiguous(0, v.type.dims)
    keep = 0
    for i, op in enumerate(reversed(chain)):
        nxt = view_through(view, op)
        if nxt is None:
            # everything towards the source stays outside (one copy); this op reads that copy when it
            # can (a reshape of a transposed weight), else it stays outside too
            keep = i
            nxt = view_through(StridedView.contiguous(0, op.input.type.dims), op)
            if nxt is None:
                keep, nxt = i + 1, StridedView.contiguous(0, op.result.type.dims)
        view = nxt
    group.extend(chain[:len(chain) - keep])


def _take_as_a(op) -> bool:
    """A take of rows of a 2-D table (axis 0): the GEMM packs A's rows through the index
    (kernels/gemm_gather.py) instead of reading a gathered copy."""
    return isinstance(op, g.TakeOp) and ival(op.axis) == 0 and op.input.type.rank == 2


def _epilogue(mm: g.MatmulOp, group: list) -> None:
    chain = mm.result
    while single_use(chain):
        user = next(iter(chain.uses)).operation
        if isinstance(user, g.CastOp):
            group.append(user)
            return
        if isinstance(user, g.ELEMENTWISE_UNARY):
            pass
        elif isinstance(user, g.ELEMENTWISE_BINARY):
            if user.result.type.dims != chain.type.dims:
                return  # the other operand would broadcast the result: not an epilogue
            other = user.rhs if user.lhs == chain else user.lhs
            if isinstance(other.owner, g.ConstantOp) and single_use(other):
                group.append(other.owner)
            elif (isinstance(other.owner, g.ReshapeOp) and single_use(other)
                  and StridedView.contiguous(0, other.owner.input.type.dims).reshape(other.type.dims) is not None):
                group.append(other.owner)   # a reshaped bias is read through strides
            elif (isinstance(other.owner, g.SliceOp) and single_use(other)
                  and ints(other.owner.steps)[-1] == 1 and other.owner.input != chain):
                group.append(other.owner)   # a window of another kernel's result (a padded copy's interior)
        else:
            return
        group.append(user)
        chain = user.results[0]


def fuse_matmuls(block) -> bool:
    changed = False
    for op in list(block.ops):
        if isinstance(op, g.MatmulOp) and op.parent is block:
            group = [op]
            take = op.lhs.owner
            if _take_as_a(take) and single_use(op.lhs) and op.rhs != op.lhs:
                group += [take] + operand_reshapes(take, block)   # A rows read through the index
            else:
                _operand_views(op.lhs, group)
            if op.rhs != op.lhs:
                _operand_views(op.rhs, group)
            dag = epilogue_dag.grow(op)   # comparisons, where, a value used twice (epilogue_dag.py)
            if dag is not None:
                group.extend(dag)
            else:
                _epilogue(op, group)
            outline(group, "gemm")
            changed = True
    return changed


@register
@dataclass(frozen=True)
class FuseMatmulEpilogue(TesseraPass):
    """Group each matmul with its operand reshapes/transposes and its elementwise epilogue."""

    name = "fuse-matmul-epilogue"
    kind = "graph-transform"
    consumes = ()
    produces = ("tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for block in function_blocks(op):
            fuse_matmuls(block)
