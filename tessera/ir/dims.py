"""Symbolic tensor dimensions.

A dimension is an ``int`` (a fact the kernel is specialised on) or a canonical
product expression of symbols and an integer coefficient, spelled ``"B*S"`` or
``"4*N"`` (a stride may have a negative coefficient, ``"-1*N"``: a view walking an axis
backwards).  Two dimensions are equal when their canonical forms are equal; the
runtime binds symbols to sizes when a kernel is called.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

Dim = int | str

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _factors(dim: Dim) -> tuple[int, list[str]]:
    if isinstance(dim, int):
        return dim, []
    coef = 1
    syms: list[str] = []
    for part in dim.split("*"):
        part = part.strip()
        if part.lstrip("-").isdigit():
            coef *= int(part)
        elif _SYMBOL.match(part):
            syms.append(part)
        else:
            raise ValueError(f"bad dimension expression {dim!r}")
    return coef, syms


def _build(coef: int, syms: list[str]) -> Dim:
    if not syms or coef == 0:
        return coef
    syms = sorted(syms)
    return "*".join(([str(coef)] if coef != 1 else []) + syms)


def canon(dim: Dim) -> Dim:
    """The canonical spelling of a dimension (``"S*B*2"`` -> ``"2*B*S"``)."""
    return _build(*_factors(dim))


def mul(*dims: Dim) -> Dim:
    coef = 1
    syms: list[str] = []
    for d in dims:
        c, s = _factors(d)
        coef *= c
        syms += s
    return _build(coef, syms)


def product(dims: Iterable[Dim]) -> Dim:
    return mul(1, *dims)


def symbols(dim: Dim) -> list[str]:
    return _factors(dim)[1]


def is_static(dim: Dim) -> bool:
    return isinstance(dim, int)


def evaluate(dim: Dim, bindings: Mapping[str, int]) -> int:
    coef, syms = _factors(dim)
    return coef * math.prod(bindings[s] for s in syms)


def parse_dim(text: str) -> Dim:
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return canon(text)


def ceil_extent(dim: Dim, block: int) -> str:
    """A GPU grid extent: ``"D/b"`` means ceil(D / b) workgroups (at least 1 when D is 0)."""
    return f"{canon(dim)}/{int(block)}"


def evaluate_extent(text: str, bindings: Mapping[str, int]) -> int:
    dim, _, block = text.partition("/")
    n = evaluate(parse_dim(dim), bindings)
    return max(1, -(-n // int(block))) if block else max(1, n)
