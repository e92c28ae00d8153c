"""``lower-tile-to-rocm{arch=...}``: Tile IR -> ``tessera_gpu`` + ``tessera_rocm`` Target IR.

``arch`` is mandatory (no default chip) and decides everything: the selector's ISA
for the arch says which fragments are legal (a WMMA fragment on gfx942 or an MFMA
one on gfx1151 is refused here, before LLVM could abort on it), and the wave size
comes from the instruction record (WMMA wave32 on RDNA, MFMA wave64 on CDNA).

The lane mappings (which element each lane's register item holds), per the AMD ISA
documents; ``l`` is the lane, items ``e`` in register order:

  WMMA gfx11 16x16x16 (wave32)  A: row l%16, k e (16 items; lanes 16-31 repeat 0-15)
                                B: k e, col l%16 (16 items, repeated likewise)
                                C: row 2v + l//16, col l%16 (8 f32 items v)
  WMMA gfx12 16x16x16 (wave32)  A: row l%16, k 8(l//16) + e (8 items)
                                B: k 8(l//16) + e, col l%16 (8 items)
                                C: row 8(l//16) + v, col l%16 (8 items)
  MFMA 16x16x16 (wave64)        A: row l%16, k 4(l//16) + e    B: k 4(l//16) + e, col l%16
                                C: row 4(l//16) + v, col l%16 (4 items)
  MFMA 32x32x8 (wave64)         A: row l%32, k 4(l//32) + e    B: k 4(l//32) + e, col l%32
                                C: row 8(v//4) + 4(l//32) + v%4, col l%32 (16 items)

Everything else (staging copies, masked edges, epilogue) is the shared SIMT lowering
(``passes/target/gpu/simt.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import SSAValue

from tessera.errors import MmaSelectorError, PassFailedError
from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import Builder
from tessera.ir.target import rocm as R
from tessera.mma.selector import get_isa
from tessera.passes.base import TesseraPass, option, register
from tessera.passes.target.gpu.simt_rows import RowsLowerer, is_row_kernel
from tessera.passes.target.gpu.simt import (
    GPU_CONSUMES,
    GPU_PRODUCES,
    Item,
    LaneMap,
    OperandMap,
    SimtLowerer,
    lane_split,
    lower_for_arch,

)

NAME = "lower-tile-to-rocm"


def _dtype_name(elem) -> str:
    return {"f16": "f16", "bf16": "bf16"}.get(str(elem), str(elem))


class _RocmMap(LaneMap):
    family = ""

    def __init__(self, arch: str, rec):
        self.arch = arch
        self.rec = rec
        self.lanes = rec.lanes

    def emit_mma(self, b: Builder, ft: t.FragmentType, a, bb, c):
        op_cls = R.WmmaOp if self.family == "wmma" else R.MfmaOp
        m, n, k = ft.mnk
        op = op_cls.create(operands=[a[0], bb[0], c[0]], result_types=[c[0].type],
                           attributes={"shape": StringAttr(f"{m}x{n}x{k}"), "arch": StringAttr(self.arch)})
        b.op(op)
        return [op.results[0]]


class Wmma11(_RocmMap):
    family = "wmma"

    def build(self, b: Builder, lane: SSAValue) -> None:
        l16, half = lane_split(b, lane, 16)
        self.a = OperandMap([Item(l16, 0, 0, e, 16) for e in range(16)], [16])
        self.b = OperandMap([Item(0, e, l16, 0, 1, 16) for e in range(16)], [16])
        self.c = OperandMap([Item(half, 2 * v, l16, 0) for v in range(8)], [8])


class Wmma12(_RocmMap):
    family = "wmma"

    def build(self, b: Builder, lane: SSAValue) -> None:
        l16, half = lane_split(b, lane, 16)
        k0 = b.mul(half, 8)
        self.a = OperandMap([Item(l16, 0, k0, e, 8) for e in range(8)], [8])
        self.b = OperandMap([Item(k0, e, l16, 0, 1, 8) for e in range(8)], [8])
        self.c = OperandMap([Item(k0, v, l16, 0) for v in range(8)], [8])


class Mfma16(_RocmMap):
    family = "mfma"

    def build(self, b: Builder, lane: SSAValue) -> None:
        l16, quad = lane_split(b, lane, 16)
        k0 = b.mul(quad, 4)
        self.a = OperandMap([Item(l16, 0, k0, e, 4) for e in range(4)], [4])
        self.b = OperandMap([Item(k0, e, l16, 0, 1, 4) for e in range(4)], [4])
        self.c = OperandMap([Item(k0, v, l16, 0) for v in range(4)], [4])


class Mfma32(_RocmMap):
    family = "mfma"

    def build(self, b: Builder, lane: SSAValue) -> None:
        l32, half = lane_split(b, lane, 32)
        k0 = b.mul(half, 4)
        self.a = OperandMap([Item(l32, 0, k0, e, 4) for e in range(4)], [4])
        self.b = OperandMap([Item(k0, e, l32, 0, 1, 4) for e in range(4)], [4])
        self.c = OperandMap([Item(k0, 8 * (v // 4) + v % 4, l32, 0) for v in range(16)], [16])


def lane_map_for(arch: str, ft: t.FragmentType) -> LaneMap:
    """The lane map of a fragment on ``arch``; the selector's ISA decides legality."""
    isa = get_isa("rocm", arch)
    fam = ft.family.data
    dtype = _dtype_name(ft.elem if ft.role.data != "acc" else ft.elem)
    shape = ft.mnk
    cands = [r for r in isa.records if r.family == fam and r.shape == shape]
    if not cands:
        legal = sorted({(r.family, "x".join(map(str, r.shape))) for r in isa.records})
        raise MmaSelectorError(f"rocm:{arch} has no {fam} {'x'.join(map(str, shape))} instruction; legal there: "
                               + ", ".join(f"{f} {s}" for f, s in legal))
    if ft.role.data != "acc":
        cands = [r for r in cands if r.a_dtype == dtype]
        if not cands:
            raise MmaSelectorError(f"rocm:{arch}: {fam} {'x'.join(map(str, shape))} does not take {dtype} inputs")
    lowered = [r for r in cands if r.lowered_by == NAME]
    if not lowered:
        raise MmaSelectorError(f"{cands[0].id} ({cands[0].mnemonic}) has no lowering in {NAME} yet")
    rec = lowered[0]
    gen = "gfx12" if arch.startswith("gfx12") else "gfx11" if arch.startswith("gfx11") else "gfx9"
    if fam == "wmma":
        return (Wmma12 if gen == "gfx12" else Wmma11)(arch, rec)
    return (Mfma32 if shape == (32, 32, 8) else Mfma16)(arch, rec)


@register
@dataclass(frozen=True)
class LowerTileToRocm(TesseraPass):
    """Tile IR -> tessera_gpu/tessera_rocm Target IR (compiler-owned WMMA/MFMA lane mapping)."""

    name = NAME
    kind = "target-lowering"
    consumes = GPU_CONSUMES
    produces = GPU_PRODUCES + ("tessera_rocm.wmma", "tessera_rocm.mfma")
    arch: str = option(doc="AMD GPU arch (gfx90a, gfx942, gfx950, gfx1100, gfx1151, gfx1201, ...); required")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        def make_lowerer(fn):
            wave = ival(fn.attributes["vector"]) if "vector" in fn.attributes else None
            waves = get_isa("rocm", self.arch).wave_sizes
            if wave not in waves:
                raise PassFailedError(f"{NAME}: kernel @{fn.sym_name.data} is laid out for wave{wave}; {self.arch} "
                                      f"runs wave{'/'.join(map(str, waves))}")
            if is_row_kernel(fn):     # memory-bound kernels (passes/target/gpu/simt_rows.py)
                return RowsLowerer({}, wave, ival(fn.attributes["gpu.block"]), "lds")
            return SimtLowerer({}, wave, ival(fn.attributes["gpu.block"]), "lds")

        lower_for_arch(module, NAME, "rocm", self.arch, make_lowerer, lambda ft: lane_map_for(self.arch, ft))


__all__ = ["LowerTileToRocm", "lane_map_for"]
