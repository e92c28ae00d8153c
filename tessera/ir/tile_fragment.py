"""Tile IR's fragment ops (``tile`` dialect, collected in ``ir/tile.py``): a typed fragment made
zero, packed from a view, multiplied (``tile.mma``: typed fragments only) and unpacked.
"""
from __future__ import annotations


from xdsl.dialects.builtin import Float8E4M3FNType, Float8E5M2Type
from xdsl.ir import SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure

from tessera.errors import (
    TileFragmentPackShape,
    TileFragmentRoleDisagrees,
    TileFragmentUnpackRole,
    TileFragmentZeroRole,
    TileMmaAccumMismatch,
    TileMmaFamilyMismatch,
    TileMmaOperandRole,
    TileMmaResultType,
    TileMmaShapeMismatch,
    TileMmaUntypedOperand,
    TileShapeMismatch,
)

from tessera.ir.tile_types import ROLES, FragmentType, TileType, ViewType


# --------------------------------------------------------------------------- fragment ops
def _fragment_uses_role(op: IRDLOperation, result: SSAValue, role: str) -> None:
    for use in result.uses:
        user = use.operation
        if isinstance(user, MmaOp):
            slot = ROLES[use.index]
            if slot != role:
                raise TileFragmentRoleDisagrees(
                    f"{op.name} produces a role-{role} fragment used as tile.mma operand '{slot}'", op=op)


@irdl_op_definition
class FragmentZeroOp(IRDLOperation):
    name = "tile.fragment_zero"
    result = result_def(FragmentType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"

    def verify_(self) -> None:
        t = self.result.type
        if isinstance(t, FragmentType) and t.role.data != "acc":
            raise TileFragmentZeroRole(f"tile.fragment_zero must produce role acc, got {t.role.data}", op=self)


@irdl_op_definition
class FragmentPackOp(IRDLOperation):
    """Load a view into a fragment; the lowering decides which lane/register holds which element."""

    name = "tile.fragment_pack"
    source = operand_def(ViewType)
    result = result_def(FragmentType)
    assembly_format = "$source attr-dict `:` type($source) `->` type($result)"

    def verify_(self) -> None:
        v, f = self.source.type, self.result.type
        if isinstance(v, ViewType) and isinstance(f, FragmentType):
            if v.dims != f.data_shape:
                raise TileFragmentPackShape(
                    f"tile.fragment_pack: a role-{f.role.data} fragment of shape {f.mnk} holds "
                    f"{list(f.data_shape)}, but the view is {list(v.dims)}", op=self)
            want = f.acc if f.role.data == "acc" else f.elem
            if v.element_type != want:
                raise TileFragmentPackShape(
                    f"tile.fragment_pack: view element {v.element_type} differs from fragment's {want}", op=self)
            _fragment_uses_role(self, self.result, f.role.data)


@irdl_op_definition
class MmaOp(IRDLOperation):
    """``%d = tile.mma %a, %b, %c``: d = a x b + c on typed fragments; c is the real accumulator."""

    name = "tile.mma"
    a = operand_def()
    b = operand_def()
    c = operand_def()
    result = result_def()
    traits = traits_def(Pure())
    assembly_format = "$a `,` $b `,` $c attr-dict `:` type($a) `,` type($b) `,` type($c) `->` type($result)"

    def verify_(self) -> None:
        types = [self.a.type, self.b.type, self.c.type]
        for slot, t in zip(ROLES, types):
            if not isinstance(t, FragmentType):
                raise TileMmaUntypedOperand(f"tile.mma operand '{slot}' has type {t}; only !tile.fragment is "
                                            "accepted", op=self)
        fa, fb, fc = types  # type: ignore[misc]
        for slot, t in zip(ROLES, types):
            if t.role.data != slot:  # type: ignore[union-attr]
                raise TileMmaOperandRole(f"tile.mma operand '{slot}' has role {t.role.data}", op=self)  # type: ignore[union-attr]
        if not (fa.mnk == fb.mnk == fc.mnk):
            raise TileMmaShapeMismatch(f"tile.mma shapes differ: a {fa.mnk}, b {fb.mnk}, acc {fc.mnk}", op=self)
        if not (fa.family == fb.family == fc.family):
            raise TileMmaFamilyMismatch(
                f"tile.mma families differ: {fa.family.data}, {fb.family.data}, {fc.family.data}", op=self)
        fp8 = (Float8E4M3FNType, Float8E5M2Type)     # e4m3 x e5m2 mix (mma.sync .kind f8, wgmma)
        mixed_ok = isinstance(fa.elem, fp8) and isinstance(fb.elem, fp8)
        if fc.elem != fc.acc or not (fa.acc == fb.acc == fc.acc) or (fa.elem != fb.elem and not mixed_ok):
            raise TileMmaAccumMismatch(
                f"tile.mma accumulator types disagree: acc fragment holds {fc.elem}, declared acc types "
                f"{fa.acc}/{fb.acc}/{fc.acc}, inputs {fa.elem}/{fb.elem}", op=self)
        if self.result.type != fc:
            raise TileMmaResultType(f"tile.mma result type {self.result.type} differs from accumulator {fc}",
                                    op=self)


@irdl_op_definition
class FragmentUnpackOp(IRDLOperation):
    name = "tile.fragment_unpack"
    source = operand_def(FragmentType)
    result = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = "$source attr-dict `:` type($source) `->` type($result)"

    def verify_(self) -> None:
        f, t = self.source.type, self.result.type
        if isinstance(f, FragmentType):
            if f.role.data != "acc":
                raise TileFragmentUnpackRole(f"tile.fragment_unpack takes an acc fragment, got role {f.role.data}",
                                             op=self)
            if isinstance(t, TileType) and (t.dims != f.data_shape or t.element_type != f.acc):
                raise TileShapeMismatch(f"tile.fragment_unpack of {f} must give tile<{list(f.data_shape)}, {f.acc}>",
                                        op=self)
