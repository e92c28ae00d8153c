"""The GPU schedule of memory-bound kernels (``schedule-gpu`` calls :func:`rows_schedule`):
elementwise chains, copies through permuted strides (``transpose``), row kernels (softmax,
layer_norm, rms_norm, log_softmax) and reductions over the last axes.

- vector V: 16 bytes of the narrowest tensor the kernel reads or writes (8 for f16/bf16, 4 for
  f32): each thread moves V consecutive elements per access;
- threads: a power of two, at least one wave and at most 256, about enough for a whole row in
  one chunk where the row length is static (256 where it is symbolic, or for a flat elementwise
  kernel); chunk = threads x V columns per step (``tiles = [1, chunk]`` over loops ``r, c``);
- parallel ``r``: one workgroup per row (per output element of a reduction, per chunk of a
  flat elementwise kernel).

What these kernels cannot do is refused here, naming the op and the lane: row ops other than
softmax / layer_norm / rms_norm / log_softmax / cross_entropy / argmax / argmin / top_k (k <= 128),
reductions other than sum / mean / max over a
contiguous run of axes, gathers other than one_hot / take, reductions and row ops of int / bool tensors, int8
tensors and float64 ones.  Elementwise chains and copies of int32 / int64 / bool tensors are scheduled
(the typed lanes of ``passes/target/gpu``).
"""
from __future__ import annotations

from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float64Type, IntegerType, StringAttr

from tessera.dtypes import from_ir
from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir.graph_rows import LogSoftmaxOp
from tessera.ir.attrs import i64_attr, int_array, ints, ival, str_array

GPU_TOP_K = 128       # kernels/gpu_topk.MAX_K: k selection steps per row
ROW_KINDS = ("rowwise", "reduce", "elementwise", "transpose", "concat", "gather", "scan")
MAX_THREADS = 256


def _bytes(elem) -> int:
    if isinstance(elem, (Float16Type, BFloat16Type)):
        return 2
    if isinstance(elem, IntegerType):
        return max(1, elem.width.data // 8)
    return 4


def _refuse(name: str, op, target: str, why: str = "") -> ScheduleIllegalError:
    return ScheduleIllegalError(f"kernel {name} ({op.name}): the {target} lane has no kernel for {op.name}{why}; "
                                'target="cpu" compiles it')


def _check_ops(fop: g.FusionOp, name: str, target: str) -> g.Operation | None:
    """The row op or reduction of the group (None for a chain or a copy); refuses what the GPU
    generators do not cover."""
    main = None
    for op in fop.body.block.ops:
        if isinstance(op, g.YieldOp):
            continue
        if isinstance(op, g.GATHERS) and not isinstance(op, (g.OneHotOp, g.TakeOp, g.TakeAlongAxisOp)):
            raise _refuse(name, op, target)
        if isinstance(op, g.ROWWISE) and not isinstance(op, (g.SoftmaxOp, g.LayerNormOp, g.RmsNormOp, LogSoftmaxOp,
                                                              g.CrossEntropyOp, g.TopKOp) + g.ARGS):
            raise _refuse(name, op, target)
        if isinstance(op, g.TakeAlongAxisOp):
            x, i = op.input.type, op.indices.type
            if ival(op.axis) % x.rank != x.rank - 1 or tuple(x.dims[:-1]) != tuple(i.dims[:-1]):
                raise _refuse(name, op, target, " other than along the last axis with the indices' leading dims")
        if isinstance(op, g.TopKOp) and ival(op.k) > GPU_TOP_K:
            raise _refuse(name, op, target, f" with k = {ival(op.k)} (the GPU kernel takes k <= {GPU_TOP_K})")
        labels = isinstance(op, (g.CrossEntropyOp, g.OneHotOp, g.TakeOp, g.TakeAlongAxisOp, g.TopKOp) + g.ARGS)
        for v in list(op.operands) + list(op.results):
            et = getattr(v.type, "element_type", None)
            if isinstance(et, IntegerType) and (isinstance(op, g.REDUCTIONS + g.ROWWISE + g.SCANS) and not labels
                                                or et.width.data == 8):
                raise _refuse(name, op, target, f" on {from_ir(et)} tensors" if et.width.data == 8 else
                              " on int or bool tensors")
            if isinstance(et, Float64Type):
                raise _refuse(name, op, target, " on float64 tensors (the GPU kernels compute in f32)")
        if isinstance(op, g.ROWWISE + g.SCANS):
            main = op
        elif isinstance(op, g.REDUCTIONS):
            if not isinstance(op, (g.ReduceSumOp, g.ReduceMeanOp, g.ReduceMaxOp)):
                raise _refuse(name, op, target)
            rank = op.input.type.rank
            axes = sorted(a % rank for a in ints(op.axes))
            if axes != list(range(axes[0], axes[-1] + 1)):
                raise _refuse(name, op, target, f" over axes {axes} (canonicalize splits them)")
            main = op
    return main


def rows_schedule(fop: g.FusionOp, name: str, target: str, wave: int) -> dict:
    """The schedule.kernel attributes of a memory-bound GPU kernel."""
    kind = fop.kind.data
    main = _check_ops(fop, name, target)
    values = list(fop.inputs) + list(fop.outputs)
    V = 16 // min(_bytes(v.type.element_type) for v in values)
    V = min(V, 8)
    length = None
    if main is not None:
        d = main.input.type.dims
        length = d[-1]
        if isinstance(main, g.SCANS):        # the scanned last axis, or the inner columns after the axis
            ax = ival(main.axis) % len(d)
            length = d[-1] if ax == len(d) - 1 else None
        if isinstance(main, g.REDUCTIONS):   # the reduced run, or the inner axes after it
            rank = len(d)
            axes = sorted(a % rank for a in ints(main.axes))
            span = d[axes[0]:] if axes[-1] == rank - 1 else d[axes[-1] + 1:]
            length = 1
            for x in span:
                length = length * x if isinstance(x, int) and isinstance(length, int) else None
    elif kind == "concat":
        cat = next(o for o in fop.body.block.ops if isinstance(o, g.ConcatOp))
        if cat.axis.value.data % cat.result.type.rank != cat.result.type.rank - 1:
            raise _refuse(name, cat, target, f" along axis {cat.axis.value.data} (the GPU joins along the last "
                                             "axis only)")
        length = fop.outputs[0].type.dims[-1]
    elif kind in ("transpose", "gather"):
        length = fop.outputs[0].type.dims[-1] if fop.outputs[0].type.dims else 1
    threads = MAX_THREADS
    if isinstance(length, int):
        threads = wave
        while threads < MAX_THREADS and threads * V < length:
            threads *= 2
    return {"parallel": StringAttr("r"), "threads": i64_attr(threads), "staging": i64_attr(1),
            "mma": StringAttr(""), "register_tile": int_array([]), "vector": i64_attr(wave),
            "loops": str_array(["r", "c"]), "tiles": int_array([1, threads * V]), "order": str_array(["r", "c"])}


__all__ = ["ROW_KINDS", "rows_schedule"]
