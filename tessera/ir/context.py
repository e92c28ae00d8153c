"""One xDSL context with every dialect Tessera's IR may contain."""
from __future__ import annotations

from functools import lru_cache

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.dialects.llvm import LLVM
from xdsl.dialects.scf import Scf

from tessera.ir.graph import Graph
from tessera.ir.schedule import Schedule
from tessera.ir.target.apple import APPLE
from tessera.ir.target.gpu import GPU
from tessera.ir.target.nvidia import NVIDIA
from tessera.ir.target.rocm import ROCM
from tessera.ir.target.x86 import X86
from tessera.ir.tile import Tile

TESSERA_DIALECTS = (Graph, Schedule, Tile, X86, GPU, NVIDIA, ROCM, APPLE)
STRUCTURAL_DIALECTS = (Builtin, Func, Arith, Scf, LLVM)

# Which layer each dialect belongs to (the lane map and the lane report count ops by this).
LAYER_OF_DIALECT = {
    "tessera": "graph",
    "schedule": "schedule",
    "tile": "tile",
    "tessera_x86": "target",
    "tessera_gpu": "target",
    "tessera_nvidia": "target",
    "tessera_rocm": "target",
    "tessera_apple": "target",
}
LAYERS = ("graph", "schedule", "tile", "target")


def layer_of(op_name: str) -> str | None:
    return LAYER_OF_DIALECT.get(op_name.split(".", 1)[0])


@lru_cache(maxsize=1)
def _base_context() -> Context:
    ctx = Context()
    for d in STRUCTURAL_DIALECTS + TESSERA_DIALECTS:
        ctx.load_dialect(d)
    return ctx


def make_context() -> Context:
    """A fresh context (cloned: passes may register things)."""
    return _base_context().clone()
