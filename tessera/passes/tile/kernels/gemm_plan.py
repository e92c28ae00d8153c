"""What a GEMM kernel computes, read off its Graph IR body (``analyse``): the A and B operands
as strided views of the kernel inputs (A possibly through a row gather), the batch/M/N/K dims,
an incoming accumulator C0, and the elementwise epilogue (a chain, or a DAG for comparisons,
``where`` and values used twice).  ``gemm.py`` generates the loop nest from this plan; the GPU
GEMM and the dual (SwiGLU) GEMM read the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.builtin import Float32Type, Float64Type
from xdsl.ir import Attribute, BlockArgument, SSAValue

from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.passes.tile.kernels import gemm_dag, gemm_gather
from tessera.passes.tile.kernels.common import StridedView, illegal, scalar_constant, trace_view


@dataclass
class Operand:
    """An epilogue operand: a kernel input broadcast against the [batch..., M, N] output."""

    arg: int
    row_bcast: bool      # same value for every row (shape [..., 1, N] or [N])
    col_bcast: bool      # same value for every column
    view: StridedView    # with the output's rank (missing leading dims: stride 0)


@dataclass
class GemmPlan:
    a: StridedView
    b: StridedView
    batch: tuple[D.Dim, ...]
    m: D.Dim
    n: D.Dim
    k: D.Dim
    in_elem: Attribute
    out_elem: Attribute
    c0: Operand | None = None
    epilogue: list[tuple] = field(default_factory=list)   # ("un", fn) | ("bin", fn, Operand|float, chain_is_lhs)
    out_arg_types: list[Attribute] = field(default_factory=list)
    gather: object = None   # A is a take of table rows (gemm_gather.GatherA): a counts in rows
    b_elem: Attribute | None = None   # B's element type where it differs from A's (fp8 e4m3 x e5m2)

    def describe(self) -> dict:
        steps = []
        for st in self.epilogue:
            if st[0] == "dag":
                steps.append(gemm_dag.describe(st))
            elif st[0] == "un":
                steps.append(st[1])
            else:
                o = st[2]
                what = f"{o:g}" if isinstance(o, float) else ("row" if o.row_bcast and not o.col_bcast else
                                                               "col" if o.col_bcast and not o.row_bcast else
                                                               "scalar" if o.row_bcast else "full")
                steps.append(f"{st[1]}({what})")
        return {"accumulate_c0": self.c0 is not None, "epilogue": steps,
                "out_dtype": str(self.out_elem)}


def broadcast_view(view: StridedView, out_dims: tuple[D.Dim, ...]) -> StridedView:
    pad = len(out_dims) - len(view.dims)
    dims = (1,) * pad + view.dims
    strides = [0] * pad + list(view.strides)
    for i, (d, od) in enumerate(zip(dims, out_dims)):
        if d == 1 and od != 1:
            strides[i] = 0
    return StridedView(view.arg, tuple(out_dims), tuple(strides), view.offset, view.taps)


def analyse(kop: s.KernelOp) -> GemmPlan:
    block = kop.body.block
    name = kop.sym_name.data
    mms = [o for o in block.ops if isinstance(o, g.MatmulOp)]
    if len(mms) != 1:
        raise illegal(name, f"a gemm kernel holds exactly one tessera.matmul, found {len(mms)}")
    mm = mms[0]
    gather = None
    if isinstance(mm.lhs.owner, g.TakeOp):   # A rows through an index (gemm_gather.py)
        a, gather = gemm_gather.analyse(name, mm.lhs.owner)
    else:
        a = trace_view(mm.lhs, block)
    b = trace_view(mm.rhs, block)
    if a is None or b is None:
        raise illegal(name, "matmul operands must be kernel inputs seen through reshape/transpose")
    rt = mm.result.type
    out_dims = rt.dims
    batch, (m, n) = out_dims[:-2], out_dims[-2:]
    k = mm.lhs.type.dims[-1]
    a = broadcast_view(a, (*batch, m, k))
    b = broadcast_view(b, (*batch, k, n))
    plan = GemmPlan(a, b, batch, m, n, k, mm.lhs.type.element_type, rt.element_type, gather=gather,
                    b_elem=mm.rhs.type.element_type)
    if gemm_dag.needs_dag(block, mm):   # comparisons, where, a value used twice: the epilogue is a graph
        def operand_of(view):
            ov = broadcast_view(view, out_dims)
            return Operand(view.arg, ov.strides[-2] == 0, ov.strides[-1] == 0, ov)
        gemm_dag.analyse(kop, block, mm, plan, out_dims, operand_of)
        return plan
    chain: SSAValue = mm.result
    for op in block.ops:
        if op is mm or isinstance(op, (g.ReshapeOp, g.TransposeOp, g.SliceOp, g.ConstantOp, g.TakeOp,
                                       g.ConvPatchesOp)) and chain not in op.operands:
            continue
        if isinstance(op, g.YieldOp):
            if list(op.values) != [chain]:
                raise illegal(name, "a gemm kernel yields its epilogue chain only")
            break
        if chain not in op.operands:
            raise illegal(name, f"{op.name} is not on the matmul's epilogue chain")
        if isinstance(op, g.CastOp):
            plan.out_elem = op.result.type.element_type
        elif isinstance(op, g.ELEMENTWISE_UNARY):
            plan.epilogue.append(("un", g.elementwise_fn(op)))
        elif isinstance(op, g.ELEMENTWISE_BINARY):
            lhs_is_chain = op.lhs == chain
            other = op.rhs if lhs_is_chain else op.lhs
            if other == chain:
                plan.epilogue.append(("self", g.elementwise_fn(op)))
            else:
                const = None if isinstance(other, BlockArgument) else scalar_constant(other.owner)
                if const is not None:
                    plan.epilogue.append(("bin", g.elementwise_fn(op), const, lhs_is_chain))
                else:
                    view = trace_view(other, block)
                    if view is None or view.arg >= len(kop.inputs):
                        raise illegal(name, f"epilogue operand of {op.name} is not a kernel input")
                    ov = broadcast_view(view, out_dims)
                    operand = Operand(view.arg, ov.strides[-2] == 0, ov.strides[-1] == 0, ov)
                    if (not plan.epilogue and op.FN == "add" and not operand.row_bcast and not operand.col_bcast
                            and plan.c0 is None and isinstance(plan.out_elem, (Float32Type, Float64Type))
                            and kop.inputs[view.arg].type.element_type == plan.out_elem):
                        plan.c0 = operand  # the real incoming accumulator: C = A @ B + C0
                    else:
                        plan.epilogue.append(("bin", g.elementwise_fn(op), operand, lhs_is_chain))
        else:
            raise illegal(name, f"{op.name} cannot be fused into a gemm epilogue")
        chain = op.results[0]
    return plan
