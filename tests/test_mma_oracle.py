"""The tables against an oracle nobody here wrote: LLVM's backends and ptxas."""
from __future__ import annotations

import pytest

from tessera.errors import MmaSelectorError
from tessera.mma import oracle
from tessera.mma.selector import get_isa, record_by_id, select_mma


@pytest.fixture(scope="module")
def legal_rows():
    return oracle.run_legal()


def test_every_legal_pair_compiles_and_shows_its_mnemonic(legal_rows):
    bad = [r for r in legal_rows if not (r["ok"] and r.get("mnemonic_found"))]
    assert not bad, bad[:5]
    targets = {r["record"].split(".")[0] for r in legal_rows}
    assert {"x86", "nvidia", "rocm"} <= targets


def test_ptx_records_assemble_with_ptxas(legal_rows):
    if oracle.ptxas_path() is None:
        pytest.skip("ptxas not installed")
    ptx_rows = [r for r in legal_rows if r["record"].startswith("nvidia.")]
    assert ptx_rows and all(r.get("ptxas") for r in ptx_rows), [r for r in ptx_rows if not r.get("ptxas")][:3]
    assert any(r["record"].startswith("nvidia.wgmma.") for r in ptx_rows)


ILLEGAL = [
    ("rocm.mfma.32x32x8.f16.gfx94x", "rocm", "gfx1151", "f16", "mfma"),         # MFMA on RDNA 3.5
    ("rocm.wmma.16x16x16.f16.gfx11.w32", "rocm", "gfx942", "f16", "wmma"),      # WMMA on CDNA 3
    ("rocm.wmma.16x16x16.f8e4m3fn.gfx12.w32", "rocm", "gfx1151", "f8e4m3fn", None),  # fp8 WMMA on gfx1151
    ("nvidia.mma_sync.m16n8k32.e4m3", "nvidia", "sm_80", "f8e4m3fn", None),     # fp8 mma.sync before sm_89
    ("x86.amx.bf16", "x86", "znver4", "bf16", "amx"),                             # AMX on a CPU without it
]


@pytest.mark.parametrize("rid, target, arch, dtype, family", ILLEGAL)
def test_illegal_pairs_are_refused_by_the_selector_and_by_llvm(rid, target, arch, dtype, family):
    rec = record_by_id(rid)
    isa = get_isa(target, arch)
    assert rec not in isa.records
    if family is None:
        with pytest.raises(MmaSelectorError):
            select_mma(isa, dtype)
    else:  # the dtype may be legal there, but never through this instruction
        try:
            sel = select_mma(isa, dtype, prefer_shape=rec.shape)
            assert sel.record.family != rec.family
        except MmaSelectorError:
            pass
    res = oracle.run_illegal([(rec, target, arch)])[f"{rid}@{arch}"]
    assert not res["ok"], "LLVM accepted an instruction the tables call illegal"
    assert res.get("aborted"), "LLVM refuses these by aborting the process: the guard caught it"
