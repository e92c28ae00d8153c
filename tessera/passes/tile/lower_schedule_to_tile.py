"""``lower-schedule-to-tile``: each ``schedule.kernel`` becomes a Tile IR kernel function
and a ``tile.launch`` in the host program.

The generator is chosen by the kernel's ``kind`` (and, for gemm, the target of its
MMA record); it reads every schedule attribute.  The kernel function follows the
ABI in ``kernels/common.py``; the launch lists the symbolic sizes the runtime
passes and the per-thread workspace bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import FlatSymbolRefAttr, ModuleOp, StringAttr

from tessera.errors import ScheduleIllegalError
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ival, str_array
from tessera.mma.selector import record_by_id, MmaSelection, accumulator_regs_per_lane
from tessera.passes.base import TesseraPass, option, register
from tessera.passes.schedule import bounds
from tessera.passes.util import function_blocks, swap_op
from tessera.passes.tile.kernels import (attention, concat, elementwise, gemm, gemm_dual, gpu_attention, gpu_gemm, reduce, rowwise,
                                        transpose)
from tessera.passes.tile.kernels import scan
from tessera.passes.tile.kernels import gather
from tessera.passes.tile.kernels import pad
from tessera.passes.tile.kernels import rowreduce
from tessera.passes.tile.kernels import attention_decode
from tessera.passes.tile.kernels import gpu_rows
from tessera.passes.tile.kernels import scatter
from tessera.passes.tile.kernels import attention_backward
from tessera.passes.tile.kernels import gpu_attention_backward


def _selection(kop: s.KernelOp) -> MmaSelection:
    rec = record_by_id(kop.mma.data)
    return MmaSelection(rec, rec.shape, rec.a_layout, rec.b_layout, 1, rec.acc_dtype,
                        accumulator_regs_per_lane(rec))


GPU = ("rocm", "nvidia")
CPU_ONLY = ("tile.claim", "tile.prefetch", "tile.load_index",
            "tile.index")   # GPU lowerings refuse iota by name
GPU_ONLY = ("tile.program_id", "tile.wave_id")
NVIDIA_ONLY = ("tile.bulk_init", "tile.bulk_expect", "tile.bulk_copy", "tile.bulk_wait")   # copy_engine=tma (sm_90a)
ALL_PRODUCED = ("func.func", "tile.launch", "tile.alloc", "tile.view", "tile.async_copy", "tile.wait", "tile.barrier",
                "tile.claim", "tile.prefetch", "tile.fragment_zero", "tile.fragment_pack", "tile.mma", "tile.fragment_unpack", "tile.load",
                "tile.store", "tile.constant", "tile.splat_index", "tile.elementwise", "tile.mask", "tile.reduce",
                "tile.program_id", "tile.wave_id",
                "tile.load_index", "tile.index") + NVIDIA_ONLY


def check_bounds(kop: s.KernelOp, target: str) -> None:
    """A schedule.kernel read from a file carries any sizes: hold them to the ranges the schedule
    passes enforce on their options (bounds.py), before a generator expands them into code."""
    tiles = kop.tile_sizes
    kind = kop.kind.data
    vals = {"unroll": ival(kop.unroll), "register_tile": kop.reg_tile}
    if target in GPU:
        vals.update(staging=ival(kop.staging), tile_m=tiles.get("m") or tiles.get("q", 0),
                    tile_n=tiles.get("n") or tiles.get("kv", 0), tile_k=tiles.get("k", 0))
    else:
        vals.update(threads=ival(kop.threads))
        if kind == "gemm":
            vals.update(tile_m=tiles.get("m", 0), tile_n=tiles.get("n", 0), tile_k=tiles.get("k", 0))
        elif kind in ("attention", "attention_bwd"):
            vals.update(tile_m=tiles.get("q", 0), tile_n=tiles.get("kv", 0))
        else:
            vals.update(chunk=tiles.get("c", 0))
    bounds.check_static(vals, "cpu" if target == "x86" else target, f"kernel {kop.sym_name.data}: ")


def generate(kop: s.KernelOp, target: str = "x86"):
    check_bounds(kop, target)
    kind = kop.kind.data
    if target in GPU and any(isinstance(o, g.ConvPatchesOp) for o in kop.body.block.ops):
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: tessera.conv_patches (conv2d's implicit GEMM) "
                                   f"has no lowering on the {target} lane; target=\"cpu\" compiles conv2d")
    if target in GPU and kind in gpu_rows.KINDS:     # memory-bound kernels on the GPU lanes
        return gpu_rows.generate(kop)
    if target in GPU and kind not in ("gemm", "attention", "attention_bwd"):
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: no {target} generator for {kind} kernels")
    if kind == "gemm" or target in GPU:     # kernels whose instruction record names their target
        sel = _selection(kop)
        if sel.record.target != target:
            raise ScheduleIllegalError(f"kernel {kop.sym_name.data} was scheduled for {sel.record.target} "
                                       f"({sel.record.id}); this pass generates {target} Tile IR")
        if kind == "attention":
            return gpu_attention.generate(kop, sel)
        if kind == "attention_bwd":
            return gpu_attention_backward.generate(kop, sel)
        if gemm_dual.is_dual(kop):   # two matmuls of one A, one epilogue (fuse-dual-gemm: CPU lane only)
            if target in GPU:
                raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: a dual gemm (two matmuls of one A) has no "
                                           f"{target} generator; the {target} lane runs them as two gemm kernels")
            return gemm_dual.generate(kop, gemm_dual.analyse(kop), gemm.config(kop, sel))
        plan = gemm.analyse(kop)
        if target in GPU:
            return gpu_gemm.generate(kop, plan, sel)
        return gemm.generate(kop, plan, gemm.config(kop, sel))
    if kind == "attention" and kop.loop_order == ["bh", "kv", "g", "v"]:   # scheduled as split-K decode
        return attention_decode.generate(kop)
    mod = {"rowwise": rowwise, "elementwise": elementwise, "reduce": reduce, "transpose": transpose,
           "concat": concat, "attention": attention, "gather": gather,
           "scan": scan, "pad": pad, "rowreduce": rowreduce,
           "scatter": scatter, "attention_bwd": attention_backward}.get(kind)
    if mod is None:
        raise ScheduleIllegalError(f"no Tile IR generator for kernel kind {kind!r}")
    return mod.generate(kop)


@register
@dataclass(frozen=True)
class LowerScheduleToTile(TesseraPass):
    """schedule.kernel -> Tile IR kernel functions + tile.launch host steps."""

    name = "lower-schedule-to-tile"
    kind = "layer-boundary"
    consumes = ("schedule.kernel", "tessera.*")
    target: str = option("x86", doc="whose generators run: x86 (CPU), rocm or nvidia (GPU: gemm, attention)")

    @property
    def produces(self) -> tuple[str, ...]:   # type: ignore[override]
        """The Tile IR ops this target's generators emit (the lane map checks each has a consumer)."""
        skip = {"x86": GPU_ONLY, "rocm": CPU_ONLY}.get(self.target, CPU_ONLY) + \
            (NVIDIA_ONLY if self.target != "nvidia" else ())
        return tuple(o for o in ALL_PRODUCED if o not in skip)

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        if self.target not in ("x86",) + GPU:
            raise ScheduleIllegalError(f"lower-schedule-to-tile target {self.target!r}; legal: x86, rocm, nvidia")
        for block in function_blocks(module):
            for kop in list(block.ops):
                if not isinstance(kop, s.KernelOp):
                    continue
                kfn, dims, workspace, extra = generate(kop, self.target)
                # the vector width the kernel's tiles are laid out for (the target lowering maps them)
                kfn.attributes["vector"] = kop.vector
                limits = kfn.attributes.pop("limits", None)
                inplace = kfn.attributes.pop("inplace", None)   # "i:j": input i read only at output j's index
                gpu = {k.split(".", 1)[1]: kfn.attributes[k] for k in ("gpu.grid", "gpu.block")
                       if k in kfn.attributes}
                module.body.block.add_op(kfn)
                launch = t.LaunchOp.create(
                    operands=list(kop.inputs), result_types=[r.type for r in kop.outputs] + list(extra),
                    attributes={"callee": FlatSymbolRefAttr(kop.sym_name.data), "dims": str_array(
                        [str(d) for d in dims]), "workspace": i64_attr(workspace),
                        "parallel": StringAttr(kop.parallel.data), **({"limits": limits} if limits else {}),
                        **({"inplace": inplace} if inplace else {}), **gpu})
                swap_op(kop, launch)   # the launch's extra results (partial sums) have no users yet
