"""``fuse-dual-gemm``: two matmuls of one A whose products meet in one elementwise epilogue run
as one GEMM kernel (SwiGLU ``silu(x @ w1) * (x @ w3)``, GeGLU ``gelu(x @ w1) * (x @ w3)``, a
gate ``(x @ w1) * sigmoid(x @ w3)``, with biases on either product).

Recognised: matmuls ``A @ B1`` and ``A @ B3`` with the same A (one value, or two single-use
reshape/transpose chains that are the same strided view of one value), B operands of one shape
and dtype, and results used only by elementwise ops of the products' shape that end in one
value (the epilogue graph of ``epilogue_dag.py``, grown from two roots).  The group holds both
matmuls, their operand views (as ``fuse-matmul-epilogue`` takes them) and that graph; it is a
``gemm`` kernel whose generator (``kernels/gemm_dual.py``) computes matching columns of both
products in one register tile and stores only the epilogue's result: neither product is
written to memory.  A product also used elsewhere (returned, read by another op), different K,
or a non-elementwise user leaves both matmuls to ``fuse-matmul-epilogue`` as before.

Runs before ``fuse-matmul-epilogue``, in the CPU pipeline only (the GPU lanes generate one
matmul per gemm kernel).
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph as g
from tessera.ir.strided import StridedView
from tessera.passes.base import TesseraPass, register
from tessera.passes.graph.epilogue_dag import _dependents, _generator
from tessera.passes.graph.fuse_matmul_epilogue import _operand_views
from tessera.passes.graph.outline import is_elementwise, outline, single_use
from tessera.passes.util import function_blocks, view_through


def a_source(v):
    """(root value, strided view of it) that matmul operand ``v`` reads: the same value, or a chain
    of single-use reshapes/transposes all expressible as strides; None otherwise."""
    chain = []
    while isinstance(v.owner, (g.ReshapeOp, g.TransposeOp)) and single_use(v):
        chain.append(v.owner)
        v = v.owner.input
    view = StridedView.contiguous(0, v.type.dims)
    for op in reversed(chain):
        view = view_through(view, op)
        if view is None:
            return None
    return v, (view.dims, view.strides, view.offset)


def same_a(m1: g.MatmulOp, m3: g.MatmulOp) -> bool:
    if isinstance(m1.lhs.owner, g.ConvPatchesOp) or isinstance(m3.lhs.owner, g.ConvPatchesOp):
        return False   # a convolution's implicit-GEMM A: the plain gemm reads it in place
    if m1.lhs == m3.lhs:
        return True
    s1, s3 = a_source(m1.lhs), a_source(m3.lhs)
    return s1 is not None and s3 is not None and s1[0] == s3[0] and s1[1] == s3[1]


def pairable(m1: g.MatmulOp, m3: g.MatmulOp) -> bool:
    """Same A, same K, B operands of one shape and dtype, results of one type."""
    return (m1.rhs.type == m3.rhs.type and m1.result.type == m3.result.type
            and m1.lhs.type.dims[-1] == m3.lhs.type.dims[-1] and m1.lhs != m1.rhs and m3.lhs != m3.rhs
            and same_a(m1, m3))


def grow_pair(m1: g.MatmulOp, m3: g.MatmulOp) -> list | None:
    """The elementwise graph reading both products and ending in one value (ops in block order),
    or None: a product used outside it, an op between the products that the graph cannot take,
    or a graph that does not combine the two."""
    block = m1.parent
    shape = m1.result.type.dims
    rank = len(shape)
    roots = {m1.result, m3.result}
    dependent = _dependents(m1.result) | _dependents(m3.result)
    ops = list(block.ops)
    members: list = []
    inside: set = set()
    vals = set(roots)
    for op in ops[ops.index(m1) + 1:]:
        if op is m3 or op not in dependent or not is_elementwise(op) or op.results[0].type.dims != shape:
            continue
        if not any(o in vals for o in op.operands):
            continue
        extra, ok = [], True
        for o in op.operands:
            if o in vals:
                continue
            if o.owner in dependent:          # reads a product through an op outside: not an epilogue
                ok = False
                break
            gen = _generator(o, rank)
            if gen is not None and any(isinstance(x, g.IotaOp) for x in gen):
                extra += [x for x in gen if x not in inside]
            elif isinstance(o.owner, g.ConstantOp) and single_use(o):
                extra.append(o.owner)
        if not ok:
            continue
        for x in extra + [op]:
            if x not in inside:
                inside.add(x)
                members.append(x)
        vals.add(op.results[0])
    outs = [v for v in vals if any(u.operation not in inside for u in v.uses) or not v.uses]
    if len(outs) != 1 or outs[0] in roots:
        return None
    # the one output must need both products, and every member must feed it
    need, seen, work = set(), set(), [outs[0]]
    while work:
        v = work.pop()
        if v in seen:
            continue
        seen.add(v)
        if v.owner in inside:
            need.add(v.owner)
            work.extend(v.owner.operands)
    if not roots <= seen or len(need) != len(members):
        return None
    return members


def _pair_for(m1: g.MatmulOp, block) -> tuple[g.MatmulOp, list] | None:
    ops = list(block.ops)
    for m3 in ops[ops.index(m1) + 1:]:
        if isinstance(m3, g.MatmulOp) and m3.parent is block and pairable(m1, m3):
            dag = grow_pair(m1, m3)
            if dag is not None:
                return m3, dag
    return None


def fuse_dual(block) -> bool:
    changed = False
    for m1 in list(block.ops):
        if not (isinstance(m1, g.MatmulOp) and m1.parent is block):
            continue
        found = _pair_for(m1, block)
        if found is None:
            continue
        m3, dag = found
        group = [m1, m3]
        for v in ([m1.lhs] if m1.lhs == m3.lhs else [m1.lhs, m3.lhs]) + [m1.rhs] + (
                [m3.rhs] if m3.rhs != m1.rhs else []):
            _operand_views(v, group)
        outline(group + dag, "gemm")
        changed = True
    return changed


@register
@dataclass(frozen=True)
class FuseDualGemm(TesseraPass):
    """Two matmuls of one A feeding one elementwise epilogue (SwiGLU) become one gemm group."""

    name = "fuse-dual-gemm"
    kind = "graph-transform"
    consumes = ()
    produces = ("tessera.fusion", "tessera.yield")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for block in function_blocks(op):
            fuse_dual(block)
