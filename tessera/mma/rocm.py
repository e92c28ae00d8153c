"""rocm matrix-instruction records (filled in by the rocm selector work)."""
from __future__ import annotations

from tessera.mma.records import MmaIsa, MmaRecord

RECORDS: tuple[MmaRecord, ...] = ()
ARCHS: tuple[str, ...] = ()


def isa(arch: str) -> MmaIsa:
    raise NotImplementedError
