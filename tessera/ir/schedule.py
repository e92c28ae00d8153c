"""Schedule IR: the ``schedule`` dialect — how each kernel's work is split.

``schedule.kernel`` wraps the Graph IR ops of one fusion group (its region, the
"body to be tiled") and carries every scheduling decision as an attribute.  The
schedule -> tile lowering reads every attribute; none is decoration:

  kind           kernel pattern (gemm, rowwise, elementwise, reduce, transpose, attention)
  loops          the loop names of the iteration space, e.g. ["m", "n", "k"]
  tiles          the cache-block size per loop (same order as loops)
  order          loop nest order, outermost first (a permutation of loops)
  parallel       the loop whose blocks are split across threads ("b*m": the product of two), or "none"
  threads        how many threads the parallel loop is split across at most
  staging        staging depth (1 = copy then compute; 2+ = multi-buffered on GPUs)
  mma            the MMA selector record id the kernel's fragments come from ("" if none)
  register_tile  [MR, NR]: instructions per register tile (rows x columns)
  unroll         unroll factor of the innermost reduction loop
  vector         vector width (elements) for non-MMA kernels
  copy_engine    (optional) who stages a GPU GEMM's blocks: "threads" (the default: every thread
                 copies its share, cp.async) or "tma" (NVIDIA sm_90a: the tensor copy engine,
                 one elected thread, completion on mbarriers; kernels/gpu_gemm_wgmma.py)
  split          (optional) how the parallel work is cut: gemm (parallel m / n): row chunks per
                 thread at least (1..16; absent: 4); decode attention (parallel bh*kv / none): key
                 chunks per (batch, kv head) at most (1..256; absent: chosen at run time)
"""
from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, StringAttr
from xdsl.ir import Dialect
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    region_def,
    opt_attr_def,
    var_operand_def,
    var_result_def,
)

from tessera.errors import ScheduleVerifyError
from tessera.ir.attrs import ints, ival, strs
from tessera.ir.graph import TensorType, YieldOp

KINDS = ("gemm", "rowwise", "elementwise", "reduce", "transpose", "concat", "attention",
         "gather", "pad")
KINDS += ("scan",)   # cumsum / cumprod (passes/tile/kernels/scan.py)
KINDS += ("scatter",)   # scatter_add (passes/tile/kernels/scatter.py)
KINDS += ("rowreduce",)   # a row result from its row's reductions (passes/tile/kernels/rowreduce.py)
KINDS += ("attention_bwd",)   # attention_grad (passes/tile/kernels/attention_backward.py)


_strs, _ints = strs, ints
# the legal range of ``split`` per kernel kind (and the parallel loops it applies to)
SPLIT_MAX = {"gemm": 16, "attention": 256}
SPLIT_PARALLEL = {"gemm": ("m", "n"), "attention": ("bh*kv", "none")}


COPY_ENGINES = ("threads", "tma")


@irdl_op_definition
class KernelOp(IRDLOperation):
    name = "schedule.kernel"
    sym_name = attr_def(StringAttr)
    kind = attr_def(StringAttr)
    loops = attr_def(ArrayAttr)
    tiles = attr_def(ArrayAttr)
    order = attr_def(ArrayAttr)
    parallel = attr_def(StringAttr)
    threads = attr_def(IntegerAttr)
    staging = attr_def(IntegerAttr)
    mma = attr_def(StringAttr)
    register_tile = attr_def(ArrayAttr)
    unroll = attr_def(IntegerAttr)
    vector = attr_def(IntegerAttr)
    split = opt_attr_def(IntegerAttr)
    copy_engine = opt_attr_def(StringAttr)
    inputs = var_operand_def(TensorType)
    outputs = var_result_def(TensorType)
    body = region_def("single_block")
    assembly_format = "$sym_name `(` $inputs `)` attr-dict-with-keyword `:` functional-type($inputs, results) $body"

    @property
    def loop_names(self) -> list[str]:
        return _strs(self.loops)

    @property
    def tile_sizes(self) -> dict[str, int]:
        return dict(zip(self.loop_names, _ints(self.tiles)))

    @property
    def loop_order(self) -> list[str]:
        return _strs(self.order)

    @property
    def reg_tile(self) -> tuple[int, ...]:
        return tuple(_ints(self.register_tile))

    def verify_(self) -> None:
        def bad(msg: str) -> ScheduleVerifyError:
            return ScheduleVerifyError(f"schedule.kernel @{self.sym_name.data}: {msg}", op=self)

        for label, arr, kind in (("loops", self.loops, StringAttr), ("order", self.order, StringAttr),
                                 ("tiles", self.tiles, IntegerAttr), ("register_tile", self.register_tile, IntegerAttr)):
            if not all(isinstance(a, kind) for a in arr.data):
                raise bad(f"{label} must be a list of {'strings' if kind is StringAttr else 'integers'}")
        if self.kind.data not in KINDS:
            raise bad(f"kind {self.kind.data!r}; legal: {', '.join(KINDS)}")
        loops = self.loop_names
        if len(set(loops)) != len(loops):
            raise bad(f"repeated loop name in {loops}")
        if len(_ints(self.tiles)) != len(loops):
            raise bad(f"{len(_ints(self.tiles))} tile sizes for {len(loops)} loops")
        if any(t <= 0 for t in _ints(self.tiles)):
            raise bad("tile sizes must be positive")
        if sorted(self.loop_order) != sorted(loops):
            raise bad(f"order {self.loop_order} is not a permutation of loops {loops}")
        if self.parallel.data != "none" and not set(self.parallel.data.split("*")) <= set(loops):
            raise bad(f"parallel loop {self.parallel.data!r} is not one of {loops}, a product of them "
                      "('b*m'), or 'none'")
        if min(ival(self.threads), ival(self.staging), ival(self.unroll), ival(self.vector)) < 1:
            raise bad("threads, staging, unroll and vector must be >= 1")
        if self.copy_engine is not None and self.copy_engine.data not in COPY_ENGINES:
            raise bad(f"copy_engine {self.copy_engine.data!r}; legal: {', '.join(COPY_ENGINES)}")
        if len(self.reg_tile) not in (0, 2) or any(r <= 0 for r in self.reg_tile):
            raise bad("register_tile must be [] or [MR, NR] with positive entries")
        if self.split is not None:
            kind, n = self.kind.data, ival(self.split)
            if kind not in SPLIT_MAX or self.parallel.data not in SPLIT_PARALLEL[kind]:
                raise bad(f"split applies to gemm kernels with parallel m or n and to decode attention (parallel "
                          f"bh*kv or none), not a {kind} kernel with parallel {self.parallel.data!r}")
            if kind == "attention" and loops != ["bh", "kv", "g", "v"]:
                raise bad("split on an attention kernel needs the decode kernel's loops [bh, kv, g, v]")
            if not 1 <= n <= SPLIT_MAX[kind]:
                raise bad(f"split={n} is out of range for a {kind} kernel; legal: 1..{SPLIT_MAX[kind]}")
        block = self.body.block
        if [a.type for a in block.args] != [v.type for v in self.inputs]:
            raise bad("block arguments must match the kernel's inputs")
        last = block.last_op
        if not isinstance(last, YieldOp) or [v.type for v in last.values] != [r.type for r in self.outputs]:
            raise bad("body must end in tessera.yield of the kernel's result types")


Schedule = Dialect("schedule", [KernelOp], [])
