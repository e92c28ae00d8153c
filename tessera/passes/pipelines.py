"""Named pipelines and the import of every pass (so the registry is complete).

A named pipeline is spelled like a pass (``tessera-cpu{arch=znver4}``), checks its
own options the same way, and expands to a string of real passes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tessera.passes.base import OptionInfo
from tessera.passes.graph import (  # noqa: F401  (importing registers the passes)
    canonicalize,
    fuse_attention,
    fuse_dual_gemm,
    fuse_elementwise,
    fuse_matmul_epilogue,
    fuse_multi_tensor,
    fuse_row_reductions,
    fuse_rowwise,
    outline_kernels,
)
from tessera.passes.schedule import schedule_cpu, schedule_gpu  # noqa: F401
from tessera.passes.target.nvidia import lower_tile_to_nvidia  # noqa: F401
from tessera.passes.target.rocm import lower_tile_to_rocm  # noqa: F401
from tessera.passes.target.x86 import lower_tile_to_x86  # noqa: F401
from tessera.passes.tile import lower_schedule_to_tile  # noqa: F401


@dataclass(frozen=True)
class NamedPipeline:
    name: str
    summary: str
    options: list[OptionInfo]
    expand: Callable[[dict], str]
    production: bool = True
    target: str | None = None
    example_arch: str | None = None          # the arch the lane map compiles with (machine independent)
    translation: tuple[str, ...] = ()        # dialects the translation after the last pass accepts


NAMED: dict[str, NamedPipeline] = {}


def _named(p: NamedPipeline) -> NamedPipeline:
    NAMED[p.name] = p
    return p


def _opt(spelling: str, typ, required: bool, default, doc: str) -> OptionInfo:
    return OptionInfo(spelling, spelling.replace("-", "_"), typ, required, default, doc)


GRAPH_PASSES = "canonicalize,fuse-attention,fuse-matmul-epilogue,fuse-rowwise,fuse-elementwise,outline-kernels"
# the CPU lane also pairs two GEMMs of one A whose products meet in one epilogue (SwiGLU)
CPU_GRAPH_PASSES = GRAPH_PASSES.replace("fuse-matmul-epilogue", "fuse-dual-gemm,fuse-matmul-epilogue")
# ... and a row-shaped result with the last-axis reductions of its own row (kernels/rowreduce.py)
CPU_GRAPH_PASSES = CPU_GRAPH_PASSES.replace("fuse-rowwise", "fuse-row-reductions,fuse-rowwise")
# ... and runs independent elementwise groups (an optimizer's per-parameter updates) as one launch
CPU_GRAPH_PASSES += ",fuse-multi-tensor"
SCHEDULE_PINS = ("threads", "tile-m", "tile-n", "tile-k", "register-tile", "mma-shape", "parallel", "unroll",
                 "chunk", "pin-kinds", "split")


from tessera.passes.base import fmt_option as _fmt  # noqa: E402


ENTRY_LAYERS = ("graph", "schedule", "tile", "target")


def _stages(o: dict, pipeline: str, schedule: str, pins: tuple[str, ...], tile: str, target: str,
            graph: str = GRAPH_PASSES) -> str:
    """Graph passes + ``schedule{pins}``, then ``tile`` and ``target``, from the layer ``input`` names."""
    entry = o.get("input") or "graph"
    if entry not in ENTRY_LAYERS:
        from tessera.errors import PipelineOptionType
        raise PipelineOptionType(f"pass '{pipeline}': option 'input' is one of {', '.join(ENTRY_LAYERS)}, "
                                 f"not {entry!r}")
    given = " ".join(f"{k}={_fmt(o[k.replace('-', '_')])}" for k in pins
                     if o.get(k.replace("-", "_")) not in (None, 0, "", ()))
    sched = schedule[:-1] + (" " + given if given else "") + "}"
    stages = [graph + "," + sched, tile, target]
    return ",".join(stages[ENTRY_LAYERS.index(entry):])


def _cpu(o: dict) -> str:
    return _stages(o, "tessera-cpu", f"schedule-cpu{{arch={o['arch']}}}", SCHEDULE_PINS, "lower-schedule-to-tile",
                   f"lower-tile-to-x86{{arch={o['arch']} threads={o.get('threads') or 0}"
                   + (" deterministic=true" if o.get("deterministic") else "") + "}", CPU_GRAPH_PASSES)


_named(NamedPipeline(
    "tessera-cpu", "the CPU lane: Graph -> Schedule -> Tile -> tessera_x86 Target IR",
    [_opt("arch", str, True, None, "x86 CPU name or ISA level; the API resolves None to the host first"),
     _opt("threads", int, False, 0, "threads per kernel (0: the CPUs this process may use)"),
     _opt("tile-m", int, False, 0, "gemm MC"), _opt("tile-n", int, False, 0, "gemm NC"),
     _opt("tile-k", int, False, 0, "gemm KC"),
     _opt("register-tile", tuple[int, ...], False, (), "gemm MR,NR"),
     _opt("mma-shape", tuple[int, ...], False, (), "instruction shape M,N,K to prefer"),
     _opt("parallel", str, False, "", "parallel loop: m (gemm) / r (others) / none"),
     _opt("unroll", int, False, 0, "gemm k-loop unroll"),
     _opt("chunk", int, False, 0, "columns per step of row kernels"),
     _opt("pin-kinds", str, False, "", "kernel kinds ('+'-joined) the tile/register/chunk pins apply to; '': all"),
     _opt("split", int, False, 0, "gemm: row chunks per thread at least; decode attention: key chunks at most"),
     _opt("deterministic", bool, False, False, "kernels ignore the caller's FTZ/DAZ (bit-reproducible results "
                                               "whatever the calling thread's floating-point mode; docs/numerics.md)"),
     _opt("input", str, False, "graph", "the layer the input is at: graph, schedule, tile or target")],
    _cpu, target="x86", example_arch="avx512_bf16",
    translation=("tessera_x86", "arith", "scf", "func", "builtin")))


GPU_PINS = ("tile-m", "tile-n", "tile-k", "register-tile", "staging", "mma-shape", "mma-family", "math-mode",
            "copy-engine")


def _gpu(target: str):
    def expand(o: dict) -> str:
        return _stages(o, f"tessera-{target}", f"schedule-gpu{{target={target} arch={o['arch']}}}", GPU_PINS,
                       f"lower-schedule-to-tile{{target={target}}}", f"lower-tile-to-{target}{{arch={o['arch']}}}")
    return expand


def _gpu_options(target: str, example: str) -> list[OptionInfo]:
    return [_opt("arch", str, True, None, f"the {target} arch, e.g. {example}; required (no default chip)"),
            _opt("tile-m", int, False, 0, "rows of C per workgroup"), _opt("tile-n", int, False, 0,
                                                                             "columns of C per workgroup"),
            _opt("tile-k", int, False, 0, "k per staged block"),
            _opt("register-tile", tuple[int, ...], False, (), "FM,FN instructions per wave"),
            _opt("staging", int, False, 0, "k-blocks in flight in shared memory"),
            _opt("mma-shape", tuple[int, ...], False, (), "instruction shape M,N,K to prefer"),
            _opt("mma-family", str, False, "", "instruction family to require"),
            _opt("math-mode", str, False, "", "tf32 (nvidia): let f32 inputs run on tf32 instructions (inputs "
                 "rounded to a 10-bit mantissa); without it f32 GEMMs and attention are refused"),
            _opt("copy-engine", str, False, "", "who stages GEMM blocks: threads (default) or tma (sm_90a: the tensor "
                 "copy engine, mbarrier completion)"),
            _opt("input", str, False, "graph", "the layer the input is at: graph, schedule, tile or target")]


GPU_TRANSLATION = ("tessera_gpu", "arith", "scf", "func", "builtin")

_named(NamedPipeline(
    "tessera-rocm", "the ROCm lane: Graph -> Schedule -> Tile -> tessera_gpu/tessera_rocm Target IR (WMMA / MFMA)",
    _gpu_options("rocm", "gfx1151"), _gpu("rocm"), target="rocm", example_arch="gfx1151",
    translation=GPU_TRANSLATION + ("tessera_rocm",)))

_named(NamedPipeline(
    "tessera-nvidia", "the NVIDIA lane: Graph -> Schedule -> Tile -> tessera_gpu/tessera_nvidia Target IR (mma.sync)",
    _gpu_options("nvidia", "sm_90"), _gpu("nvidia"), target="nvidia", example_arch="sm_90",
    translation=GPU_TRANSLATION + ("tessera_nvidia",)))
