"""Apple GPU matrix instructions: ``simdgroup_matrix`` 8x8x8 (Metal Shading Language).

Source: Metal Shading Language Specification 3.1, section 6.7 (simdgroup matrix functions):
``simdgroup_multiply_accumulate`` on 8x8 ``simdgroup_half8x8`` / ``simdgroup_float8x8`` from
the Apple7 family (A14, M1), ``simdgroup_bfloat8x8`` from MSL 3.1 on Apple9 (A17, M3).
There is no LLVM backend for Apple GPUs here, so these records are emitted as MSL text (none
yet: the Apple lane has no lowering).
"""
from __future__ import annotations

from tessera.mma.records import MmaIsa, MmaRecord

ARCHS = ("apple7", "apple8", "apple9")
REGISTER_BUDGET = 128


def _sg(dtype: str, archs) -> MmaRecord:
    name = {"f16": "half", "f32": "float", "bf16": "bfloat"}[dtype]
    return MmaRecord(f"apple.simdgroup.8x8x8.{dtype}", "apple", "simdgroup", (8, 8, 8), dtype, dtype,
                     "f32" if dtype != "f16" else "f16", "simdgroup_multiply_accumulate",
                     f"msl: simdgroup_multiply_accumulate(simdgroup_{name}8x8 ...)", archs=frozenset(archs),
                     lanes=32, lowered_by=None)


RECORDS: tuple[MmaRecord, ...] = (
    _sg("f16", ARCHS), _sg("f32", ARCHS), _sg("bf16", ("apple9",)),
)


def isa(arch: str) -> MmaIsa:
    return MmaIsa("apple", arch, tuple(r for r in RECORDS if arch in r.archs), REGISTER_BUDGET, wave_sizes=(32,))
