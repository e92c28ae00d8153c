"""Named pipelines and the import of every pass (so the registry is complete).

A named pipeline is spelled like a pass (``tessera-cpu{arch=znver4}``), checks its
own options the same way, and expands to a string of real passes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tessera.passes.base import OptionInfo
from tessera.passes.graph import canonicalize  # noqa: F401  (registers)


@dataclass(frozen=True)
class NamedPipeline:
    name: str
    summary: str
    options: list[OptionInfo]
    expand: Callable[[dict], str]
    production: bool = True


NAMED: dict[str, NamedPipeline] = {}


def _named(p: NamedPipeline) -> NamedPipeline:
    NAMED[p.name] = p
    return p


_named(NamedPipeline(
    "graph-canonical", "Graph IR clean-up only (no lowering)", [],
    lambda o: "canonicalize", production=False))
