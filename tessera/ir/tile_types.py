"""Tile IR types: buffers, views, register tiles, typed fragments and tokens.

The ``tile`` dialect's operations live in :mod:`tessera.ir.tile`, which re-exports every
name here; see its docstring for the type syntax.
"""
from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import ArrayAttr, IntAttr, StringAttr
from xdsl.ir import Attribute, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer

from tessera.errors import TileMemorySpaceError, TileShapeMismatch, TileVerifyError

FAMILIES = ("fma", "avx512_bf16", "avx512_vnni", "amx", "mma_sync", "wgmma", "wmma", "mfma", "simdgroup")
ROLES = ("a", "b", "acc")
LAYOUTS = ("row_major", "col_major", "panel", "lane", "vnni", "smem_desc")  # smem_desc: wgmma operand in shared memory
# Memory spaces: global (device/host memory), workspace (runtime-owned per-thread scratch),
# l1/l2/l3 (per-thread CPU staging panels sized for that cache level), team (CPU staging
# shared by the threads of one launch, like a GPU workgroup's), lds (AMD), smem (NVIDIA),
# tgmem (Apple threadgroup memory).
SPACES = ("global", "workspace", "l1", "l2", "l3", "team", "lds", "smem", "tgmem")
STAGING_SPACES = ("l1", "l2", "l3", "team", "lds", "smem", "tgmem", "workspace")
SHARED_SPACES = ("team", "lds", "smem", "tgmem")


def _print_shape(printer: Printer, shape: Sequence[int]) -> None:
    printer.print_string("[" + ", ".join(str(s) for s in shape) + "]")


def _parse_shape(parser: AttrParser) -> list[int]:
    parser.parse_punctuation("[")
    out: list[int] = []
    if parser.parse_optional_punctuation("]") is None:
        while True:
            out.append(parser.parse_integer(allow_boolean=False, allow_negative=False))
            if parser.parse_optional_punctuation(",") is None:
                break
        parser.parse_punctuation("]")
    return out


def _ints(a: ArrayAttr) -> tuple[int, ...]:
    return tuple(x.data for x in a.data)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- types
@irdl_attr_definition
class BufferType(ParametrizedAttribute, TypeAttribute):
    name = "tile.buffer"
    element_type: Attribute
    space: StringAttr

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_attribute(self.element_type)
        printer.print_string(f", {self.space.data}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        with parser.in_angle_brackets():
            elem = parser.parse_type()
            parser.parse_punctuation(",")
            space = parser.parse_identifier()
        return elem, StringAttr(space)

    def verify(self) -> None:
        if self.space.data not in SPACES:
            raise TileMemorySpaceError(f"unknown memory space {self.space.data!r}; known: {', '.join(SPACES)}")


def buffer(elem: Attribute, space: str = "global") -> BufferType:
    return BufferType(elem, StringAttr(space))


@irdl_attr_definition
class ViewType(ParametrizedAttribute, TypeAttribute):
    name = "tile.view"
    shape: ArrayAttr
    element_type: Attribute
    space: StringAttr

    @property
    def dims(self) -> tuple[int, ...]:
        return _ints(self.shape)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        _print_shape(printer, self.dims)
        printer.print_string(", ")
        printer.print_attribute(self.element_type)
        printer.print_string(f", {self.space.data}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        with parser.in_angle_brackets():
            shape = _parse_shape(parser)
            parser.parse_punctuation(",")
            elem = parser.parse_type()
            parser.parse_punctuation(",")
            space = parser.parse_identifier()
        return ArrayAttr([IntAttr(s) for s in shape]), elem, StringAttr(space)

    def verify(self) -> None:
        if len(self.dims) != 2:
            raise TileShapeMismatch(f"!tile.view must be 2-D, got {list(self.dims)}")
        if self.space.data not in SPACES:
            raise TileMemorySpaceError(f"unknown memory space {self.space.data!r}")


def view_type(rows: int, cols: int, elem: Attribute, space: str) -> ViewType:
    return ViewType(ArrayAttr([IntAttr(rows), IntAttr(cols)]), elem, StringAttr(space))


@irdl_attr_definition
class TileType(ParametrizedAttribute, TypeAttribute):
    name = "tile.tile"
    shape: ArrayAttr
    element_type: Attribute

    @property
    def dims(self) -> tuple[int, ...]:
        return _ints(self.shape)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        _print_shape(printer, self.dims)
        printer.print_string(", ")
        printer.print_attribute(self.element_type)
        printer.print_string(">")

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        with parser.in_angle_brackets():
            shape = _parse_shape(parser)
            parser.parse_punctuation(",")
            elem = parser.parse_type()
        return ArrayAttr([IntAttr(s) for s in shape]), elem

    def verify(self) -> None:
        if len(self.dims) != 2:
            raise TileShapeMismatch(f"!tile.tile must be 2-D, got {list(self.dims)}")


def tile_type(rows: int, cols: int, elem: Attribute) -> TileType:
    return TileType(ArrayAttr([IntAttr(rows), IntAttr(cols)]), elem)


@irdl_attr_definition
class FragmentType(ParametrizedAttribute, TypeAttribute):
    """``!tile.fragment<m, n, k, elem, acc, role, layout, family>``."""

    name = "tile.fragment"
    m: IntAttr
    n: IntAttr
    k: IntAttr
    elem: Attribute
    acc: Attribute
    role: StringAttr
    layout: StringAttr
    family: StringAttr

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.m.data, self.n.data, self.k.data

    @property
    def data_shape(self) -> tuple[int, int]:
        """Rows x cols of the matrix this fragment holds: a is m x k, b is k x n, acc is m x n."""
        m, n, k = self.mnk
        return {"a": (m, k), "b": (k, n), "acc": (m, n)}[self.role.data]

    def with_role(self, role: str, layout: str | None = None) -> "FragmentType":
        return fragment(self.mnk, self.elem, self.acc, role, layout or self.layout.data, self.family.data)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.m.data}, {self.n.data}, {self.k.data}, ")
        printer.print_attribute(self.elem)
        printer.print_string(", ")
        printer.print_attribute(self.acc)
        printer.print_string(f", {self.role.data}, {self.layout.data}, {self.family.data}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        with parser.in_angle_brackets():
            m = parser.parse_integer(allow_boolean=False)
            parser.parse_punctuation(",")
            n = parser.parse_integer(allow_boolean=False)
            parser.parse_punctuation(",")
            k = parser.parse_integer(allow_boolean=False)
            parser.parse_punctuation(",")
            elem = parser.parse_type()
            parser.parse_punctuation(",")
            acc = parser.parse_type()
            parser.parse_punctuation(",")
            role = parser.parse_identifier()
            parser.parse_punctuation(",")
            layout = parser.parse_identifier()
            parser.parse_punctuation(",")
            family = parser.parse_identifier()
        return (IntAttr(m), IntAttr(n), IntAttr(k), elem, acc, StringAttr(role), StringAttr(layout),
                StringAttr(family))

    def verify(self) -> None:
        if min(self.mnk) <= 0:
            raise TileVerifyError(f"fragment shape {self.mnk} must be positive")
        if self.role.data not in ROLES:
            raise TileVerifyError(f"fragment role {self.role.data!r}; legal: {', '.join(ROLES)}")
        if self.layout.data not in LAYOUTS:
            raise TileVerifyError(f"fragment layout {self.layout.data!r}; legal: {', '.join(LAYOUTS)}")
        if self.family.data not in FAMILIES:
            raise TileVerifyError(f"fragment family {self.family.data!r}; legal: {', '.join(FAMILIES)}")


def fragment(mnk: Sequence[int], elem: Attribute, acc: Attribute, role: str, layout: str,
             family: str) -> FragmentType:
    m, n, k = mnk
    return FragmentType(IntAttr(m), IntAttr(n), IntAttr(k), elem, acc, StringAttr(role), StringAttr(layout),
                        StringAttr(family))


@irdl_attr_definition
class TokenType(ParametrizedAttribute, TypeAttribute):
    name = "tile.token"
