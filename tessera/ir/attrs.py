"""Small helpers to build and read builtin attributes."""
from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, StringAttr, i64
from xdsl.ir import Attribute


def i64_attr(value: int) -> IntegerAttr:
    return IntegerAttr(int(value), i64)


def ival(attr: Attribute) -> int:
    """The value of an integer attribute; anything else (``2147483647 : f16`` parses as a float
    attribute, inf) is a TypeError, which the verifier reports as malformed attributes."""
    if not isinstance(attr, IntegerAttr):
        raise TypeError(f"expected an integer attribute, got {attr}")
    return int(attr.value.data)


def int_array(values: Iterable[int]) -> ArrayAttr:
    return ArrayAttr([i64_attr(v) for v in values])


def str_array(values: Iterable[str]) -> ArrayAttr:
    return ArrayAttr([StringAttr(v) for v in values])


def ints(attr: ArrayAttr) -> list[int]:
    return [ival(a) for a in attr.data]


def strs(attr: ArrayAttr) -> list[str]:
    return [a.data for a in attr.data]  # type: ignore[attr-defined]
