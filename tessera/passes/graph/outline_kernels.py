"""``outline-kernels``: every Graph IR op not yet in a group becomes a group of its
own (reduce, transpose, a slice or a lone reshape as a copy; a transpose or slice with the
reshape of its result as one copy; an attention backward with the whole-slot slices of its
packed result, which it then writes as separate buffers); constants, already copied into
the groups that use them, are dropped, so the function body holds only groups."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from tessera.errors import PassFailedError
from tessera.ir import graph as g
from tessera.passes.base import TesseraPass, register
from tessera.ir.strided import StridedView
from tessera.passes.graph.outline import outline, single_use
from tessera.ir.attrs import ints
from tessera.passes.util import function_blocks, view_through_all

KIND_OF = {g.TransposeOp: "transpose", g.SliceOp: "transpose", g.ConcatOp: "concat", g.ReshapeOp: "elementwise", g.ConstantOp: "elementwise",
           g.MatmulOp: "gemm", g.AttentionOp: "attention",
           g.TakeOp: "gather", g.TakeAlongAxisOp: "gather", g.OneHotOp: "gather",
           g.ScatterAddOp: "scatter", g.AttentionGradOp: "attention_bwd",
           g.PadOp: "pad"}


def operand_reshapes(op, block) -> list:
    """A gather reads its operands in place through single-use reshapes of them (a reshape of a
    tensor outside any group is row-major: the same buffer); they join its group, so no copy
    kernel (which would carry integer indices through float registers) runs first."""
    if not isinstance(op, (*g.GATHERS, g.ScatterAddOp)):
        return []
    return [v.owner for v in op.operands if isinstance(v.owner, g.ReshapeOp) and v.owner.parent is block
            and single_use(v)]


def _kind(op) -> str:
    if isinstance(op, g.REDUCTIONS):
        return "reduce"
    if isinstance(op, g.ROWWISE):
        return "rowwise"
    if isinstance(op, g.SCANS):
        return "scan"
    for cls, k in KIND_OF.items():
        if isinstance(op, cls):
            return k
    if isinstance(op, g.ELEMENTWISE_UNARY + g.ELEMENTWISE_BINARY + g.ELEMENTWISE_OTHER + (g.CastOp,)):
        return "elementwise"
    raise PassFailedError(f"outline-kernels: no kernel kind for {op.name}")


def _with_input_views(op) -> list:
    """A pad with the single-use transposes/reshapes feeding it, as far as they stay strides of
    their source (its kernel reads through them: an NCHW convolution's input is transposed and
    padded in one pass)."""
    chain, v = [], op.input
    while isinstance(v.owner, (g.TransposeOp, g.ReshapeOp)) and single_use(v):
        chain.append(v.owner)
        v = v.owner.input
    # drop ops from the source end until the rest is expressible as strides
    while chain and view_through_all(StridedView.contiguous(0, chain[-1].input.type.dims), reversed(chain)) is None:
        chain.pop()
    return [*reversed(chain), op]


def slot_slices(op: g.AttentionGradOp, block) -> list | None:
    """The slices of an attention backward's packed ``[B, HKV, G + 2, S, D]`` result (with the
    single-use reshape of each) when they are its only users, each a run of whole slots (dQ's
    ``[:, :, :G]``, dK's ``[:, :, G]``, dV's ``[:, :, G + 1]``) and together covering every slot:
    they join the kernel's group, which then writes each gradient to its own buffer instead of a
    packed one copied out three times.  None where another use needs the packed tensor."""
    uses = [u.operation for u in op.result.uses]
    if not uses or any(not isinstance(u, g.SliceOp) or u.parent is not block for u in uses):
        return None
    dims, covered, ops = op.result.type.dims, [], []
    for sl in uses:
        starts, steps, out = ints(sl.starts), ints(sl.steps), sl.result.type.dims
        if any(ax != 2 and (starts[ax], steps[ax], out[ax]) != (0, 1, dims[ax]) for ax in range(5)) or steps[2] != 1:
            return None
        covered += range(starts[2], starts[2] + out[2])
        nxt = [u.operation for u in sl.result.uses]
        ops += [sl] + (nxt if len(nxt) == 1 and isinstance(nxt[0], g.ReshapeOp) and nxt[0].parent is block else [])
    return ops if sorted(covered) == list(range(dims[2])) else None


@register
@dataclass(frozen=True)
class OutlineKernels(TesseraPass):
    """Make every remaining Graph IR op a kernel group of its own."""

    name = "outline-kernels"
    kind = "graph-transform"
    consumes = ("tessera.constant",)  # constants already copied into the groups that use them
    produces = ("tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        for block in function_blocks(module):
            for op in list(block.ops):   # an attention backward writes its sliced gradients itself
                if isinstance(op, g.AttentionGradOp) and (ops := slot_slices(op, block)) is not None:
                    outline([op] + ops, "attention_bwd")
            for op in reversed(list(block.ops)):  # consumers first: they copy constants in
                if op.parent is not block:   # already moved into a group (a gather's operand reshape, a
                    # pad's input views, a transpose copied with the reshape of its result)
                    continue
                if op.dialect_name() == "tessera" and not isinstance(op, (g.FusionOp, g.YieldOp)):
                    if isinstance(op, g.ConstantOp) and not op.result.uses:
                        op.detach()
                        op.erase()
                        continue
                    src = op.input.owner if isinstance(op, g.ReshapeOp) else None
                    if isinstance(src, (g.TransposeOp, g.SliceOp)) and src.parent is block and single_use(op.input):
                        outline([src, op], "transpose")   # the copy is written in order: its reshape is free
                        continue
                    if isinstance(op, g.PadOp):
                        outline(_with_input_views(op), _kind(op))
                    else:
                        outline([op] + operand_reshapes(op, block), _kind(op))
