"""Small helpers to build and read builtin attributes."""
from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, StringAttr, i64
from xdsl.ir import Attribute


def i64_attr(value: int) -> IntegerAttr:
    return IntegerAttr(int(value), i64)


def ival(attr: Attribute) -> int:
    return int(attr.value.data)  # type: ignore[attr-defined]


def int_array(values: Iterable[int]) -> ArrayAttr:
    return ArrayAttr([i64_attr(v) for v in values])


def str_array(values: Iterable[str]) -> ArrayAttr:
    return ArrayAttr([StringAttr(v) for v in values])


def ints(attr: ArrayAttr) -> list[int]:
    return [ival(a) for a in attr.data]


def strs(attr: ArrayAttr) -> list[str]:
    return [a.data for a in attr.data]  # type: ignore[attr-defined]
