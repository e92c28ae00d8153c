"""The data the GPU SIMT lowering works on: lane maps (which matrix element each register
item of a lane holds), per-lane views, distributed tiles and fragments, and small helpers.
Re-exported by :mod:`tessera.passes.target.gpu.simt`."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import (BFloat16Type, Float8E4M3FNType, Float8E5M2Type, FloatAttr, Float16Type,
                                   IntegerType, VectorType, f32)
from xdsl.ir import Attribute, SSAValue

from tessera.ir import tile as t
from tessera.ir.attrs import ival
from tessera.ir.builder import Builder

Idx = SSAValue | int

# --------------------------------------------------------------------------- lane maps
@dataclass(frozen=True)
class Item:
    """One register item of a lane: element (rbase + rdelta, cbase + cdelta); ``calign``
    (``ralign``) says cbase (rbase) is a multiple of it, so a run of columns (of rows, in a
    transposed view) starting there may be loaded as a vector."""

    rbase: Idx
    rdelta: int
    cbase: Idx
    cdelta: int
    calign: int = 1
    ralign: int = 1


@dataclass
class OperandMap:
    items: list[Item]
    parts: list[int]            # items per register value, in order (sum = len(items))

    def part_slices(self) -> list[tuple[int, int]]:
        out, i = [], 0
        for n in self.parts:
            out.append((i, i + n))
            i += n
        return out


class LaneMap:
    """One instruction's lane mapping.  Subclasses set ``lanes`` and build the maps from
    the lane index (an ``index`` value) at kernel entry; ``emit_mma`` issues the op."""

    lanes: int = 32
    a: OperandMap
    b: OperandMap
    c: OperandMap

    def build(self, b: Builder, lane: SSAValue) -> None:
        raise NotImplementedError

    def emit_mma(self, b: Builder, ft: t.FragmentType, a: list[SSAValue], bb: list[SSAValue],
                 c: list[SSAValue]) -> list[SSAValue]:
        raise NotImplementedError


def lane_split(b: Builder, lane: SSAValue, width: int) -> tuple[SSAValue | int, SSAValue | int]:
    """(lane % width, lane // width)."""
    return b.rem(lane, width), b.div(lane, width)


# --------------------------------------------------------------------------- values
@dataclass
class View:
    base: SSAValue
    off: SSAValue
    rs: SSAValue
    cs: SSAValue
    rows: SSAValue
    cols: SSAValue
    shape: tuple[int, int]
    elem: Attribute
    align: int          # elements: off and the outer stride (rs, or cs when rs == 1) are multiples of it
    full: bool          # the valid extent is statically the whole view


@dataclass
class Dist:
    """A tile (or acc fragment) spread over a wave: each lane holds ``omap``'s items."""

    parts: list[SSAValue]
    omap: OperandMap
    shape: tuple[int, int]


@dataclass
class Frag:
    parts: list[SSAValue]
    omap: OperandMap


@dataclass
class Deferred:
    """A ``tile.load``: loaded at the coordinates of the tile it meets."""

    view: View
    pad: float
    elem: Attribute = f32       # the registers' element type (f32; int / bool tiles their own)


@dataclass
class Splat:
    value: float
    elem: Attribute = f32


def const_int(v: SSAValue) -> int | None:
    op = v.owner
    if isinstance(op, arith.ConstantOp) and not isinstance(op.value, FloatAttr):
        return ival(op.value)
    return None


def elem_bytes(elem: Attribute) -> int:
    if isinstance(elem, IntegerType):
        return max(1, elem.width.data // 8)        # bools: one byte per element; int8/32/64
    if isinstance(elem, (Float8E4M3FNType, Float8E5M2Type)):
        return 1
    return 2 if isinstance(elem, (Float16Type, BFloat16Type)) else 4


def vec(elem: Attribute, n: int) -> Attribute:
    return VectorType(elem, [n])


def part_type(elem: Attribute, n: int) -> Attribute:
    return elem if n == 1 else vec(elem, n)


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p
