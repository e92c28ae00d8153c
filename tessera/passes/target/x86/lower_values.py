"""Values of the x86 Tile IR lowering: views as (base, offset, strides, extent) and register tiles."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    VectorType,
    BFloat16Type,
    Float8E4M3FNType,
    Float8E5M2Type,
    Float16Type,
    Float64Type,
    IntegerType,
)
from xdsl.ir import Attribute, SSAValue

from tessera.ir.attrs import ival
from tessera.ir.target import x86 as x


PTR = x.PTR


@dataclass
class ViewVal:
    base: SSAValue
    off: SSAValue
    rs: SSAValue
    cs: SSAValue
    rows: SSAValue
    cols: SSAValue
    shape: tuple[int, int]
    elem: Attribute


@dataclass
class Regs:
    """A tile or fragment in registers: rows x vectors (or broadcast registers)."""

    shape: tuple[int, int]
    rows: list[list[SSAValue]]
    kind: str = "tile"   # tile | a | b

    def flat(self) -> list[SSAValue]:
        return [v for r in self.rows for v in r]


def _const_int(v: SSAValue) -> int | None:
    op = v.owner
    if isinstance(op, arith.ConstantOp):
        return ival(op.value)
    return None


def _is_half(elem: Attribute) -> bool:
    return isinstance(elem, (BFloat16Type, Float16Type))


def _elem_bytes(elem: Attribute) -> int:
    if isinstance(elem, Float64Type):
        return 8
    if isinstance(elem, (Float8E4M3FNType, Float8E5M2Type)):
        return 1
    return 2 if _is_half(elem) else 1 if isinstance(elem, IntegerType) and elem.width.data == 8 else 4


@lru_cache(maxsize=512)
def _vector(elem: Attribute, n: int) -> VectorType:
    """One ``vector<n x elem>`` object per distinct type (attributes are immutable): building
    one per register cost 0.2 s on the Llama example, and the verifier's memo matches shared
    objects by identity."""
    return VectorType(elem, [n])
