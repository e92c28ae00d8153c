"""The MMA selector: one table of instructions, refusals that say what is legal, and consumers."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.errors import LaneUnavailableError, MmaSelectorError, TesseraError, UnknownArchError
from tessera.mma import nvidia, rocm
from tessera.mma import x86 as X
from tessera.mma.x86 import host_cpu
from tessera.mma.selector import (accumulator_regs_per_lane, all_records, cheapest_shape, get_isa, record_by_id,
                                  rank_shapes_by_footprint, register_tile, select_mma)

ISAS = [("x86", a) for a in ("avx2", "avx512", "avx512_bf16", "avx512_vnni", "amx", "znver4", "haswell",
                             "sapphirerapids", "host")] + \
       [("nvidia", a) for a in nvidia.ARCHS] + [("rocm", a) for a in rocm.ARCHS] + [("apple", a) for a in
                                                                                      ("apple7", "apple9")]


@pytest.mark.parametrize("target, arch", ISAS)
def test_every_advertised_dtype_has_a_legal_instruction(target, arch):
    """The seed's AMX-int8 defect (a dtype with no legal shape) cannot exist: records *are* shapes."""
    isa = get_isa(target, arch)
    for dtype in isa.dtypes():
        dt = dtype
        modes = {r.math_mode for r in isa.records if r.accepts(dt)}
        sel = select_mma(isa, dt, math_mode=None if None in modes else sorted(m for m in modes if m)[0],
                         **({"wave": None} if target == "rocm" else {}))
        assert sel.record in isa.records and sel.shape == sel.record.shape


def test_amx_int8_has_its_16x16x64_shape():
    isa = get_isa("x86", "sapphirerapids")
    sel = select_mma(isa, "s8")
    assert sel.record.id == "x86.amx.int8" and sel.shape == (16, 16, 64)
    assert sel.lowered_by is None


def test_prefer_shape_is_checked_for_the_dtype():
    isa = get_isa("nvidia", "sm_80")
    assert select_mma(isa, "bf16", prefer_shape=(16, 8, 8)).shape == (16, 8, 8)
    with pytest.raises(MmaSelectorError) as e:
        select_mma(isa, "bf16", prefer_shape=(16, 8, 32))  # legal for s8, not for bf16
    assert "16x8x8, 16x8x16" in str(e.value)


@pytest.mark.parametrize("target, arch, dtype, kw, words", [
    ("nvidia", "sm_75", "bf16", {}, ["sm_75", "bf16", "legal dtypes there: f16"]),
    ("nvidia", "sm_80", "f8e4m3fn", {}, ["sm_80", "f8e4m3fn"]),
    ("nvidia", "sm_80", "f32", {}, ["math_mode", "tf32"]),
    ("rocm", "gfx950", "f32", {"math_mode": "xf32"}, ["gfx950", "no matrix instruction for f32"]),
    ("rocm", "gfx942", "f32", {}, ["math_mode", "xf32"]),
    ("rocm", "gfx1151", "f8e4m3fn", {}, ["gfx1151", "legal dtypes there: f16, bf16"]),
    ("rocm", "gfx90a", "f16", {"wave": 32}, ["wave64 only"]),
    ("x86", "znver4", "bogus", {}, ["unknown dtype 'bogus'", "known dtypes"]),
    ("x86", "haswell", "s8", {}, ["haswell", "s8", "legal dtypes there: f32, f64, bf16"]),
    ("nvidia", "sm_80", "bf16", {"out_dtype": "f16"}, ["accumulate into f32"]),
])
def test_illegal_requests_say_what_is_legal(target, arch, dtype, kw, words):
    with pytest.raises(MmaSelectorError) as e:
        select_mma(get_isa(target, arch), dtype, **kw)
    for w in words:
        assert w in str(e.value)


def test_unknown_targets_and_archs_list_the_known_ones():
    with pytest.raises(UnknownArchError, match="known: x86, nvidia, rocm, apple"):
        get_isa("tpu", "v5")
    with pytest.raises(UnknownArchError, match="gfx1151"):
        get_isa("rocm", "gfx9999")
    with pytest.raises(UnknownArchError, match="no default chip"):
        get_isa("rocm", None)
    with pytest.raises(UnknownArchError, match="znver4"):
        get_isa("x86", "pentium5")


def test_isa_level_names_map_to_llvm_cpus_with_features():
    for name in X.ISA_LEVELS:
        isa = get_isa("x86", name)
        assert isa.llvm_cpu in ("x86-64-v3", "x86-64-v4") and isa.arch == name
    assert "+avx512bf16" in get_isa("x86", "avx512_bf16").llvm_features
    assert [r.id for r in get_isa("x86", "avx2").records] == ["x86.avx2.fma.f32", "x86.avx2.fma.f64", "x86.avx2.fma.bf16", "x86.avx2.fma.f16",
                                                              "x86.avx2.fma.e4m3", "x86.avx2.fma.e4m3.e5m2",
                                                              "x86.avx2.fma.e5m2.e4m3", "x86.avx2.fma.e5m2"]


def test_accumulator_footprint_counts_bytes_and_blocks():
    assert accumulator_regs_per_lane(record_by_id("nvidia.mma_sync.m16n8k16.f16")) == 4  # 16*8*4 B / (4 B * 32)
    assert accumulator_regs_per_lane(record_by_id("rocm.mfma.32x32x8.f16.gfx94x")) == 16
    assert accumulator_regs_per_lane(record_by_id("rocm.wmma.16x16x16.f16.gfx11.w32")) == 8
    assert accumulator_regs_per_lane(record_by_id("rocm.wmma.16x16x16.f16.gfx11.w64")) == 4
    assert accumulator_regs_per_lane(record_by_id("apple.simdgroup.8x8x8.f16")) == 1  # f16 accumulator: half of f32
    assert accumulator_regs_per_lane(record_by_id("x86.amx.bf16")) is None
    ranked = rank_shapes_by_footprint(get_isa("rocm", "gfx942"), "f16")
    assert ranked[0].shape == (16, 16, 16) and cheapest_shape(get_isa("rocm", "gfx942"), "f16") == (16, 16, 16)


def test_wave_size_comes_from_the_arch():
    assert select_mma(get_isa("rocm", "gfx1151"), "f16").record.lanes == 32
    assert select_mma(get_isa("rocm", "gfx1151"), "f16", wave=64).record.lanes == 64
    assert select_mma(get_isa("rocm", "gfx942"), "f16").record.lanes == 64


def test_register_tile_respects_the_budget_and_pins():
    isa = get_isa("x86", "avx2")
    sel = select_mma(isa, "f32")
    t = register_tile(isa, sel)
    assert t.registers <= 16
    assert register_tile(isa, sel, prefer_tile=(6, 2)).mr == 6
    with pytest.raises(MmaSelectorError, match="needs 31 vector registers"):
        register_tile(isa, sel, prefer_tile=(10, 2) if False else (14, 2))


def test_records_are_unique_and_complete():
    ids = [r.id for r in all_records()]
    assert len(ids) == len(set(ids))
    for r in all_records():
        assert r.mnemonic and r.intrinsic and r.family
        assert r.target == "x86" or r.archs


# ---------------------------------------------------------------------------- consumers
def test_changing_the_preferred_shape_changes_the_tile_ir(rng):
    # compiled for AVX-512 whatever the host: the IR is checked everywhere; the code runs where the
    # CPU has the features, and elsewhere is refused before it could die of SIGILL
    a, b = rng.standard_normal((40, 50)).astype(np.float32), rng.standard_normal((50, 60)).astype(np.float32)
    f = lambda x, w: x @ w  # noqa: E731
    wide = ts.compile(f, a, b, arch="avx512", schedule={"register_tile": (4, 2)})
    narrow = ts.compile(f, a, b, arch="avx512", schedule={"register_tile": (4, 2), "mma_shape": (1, 8, 1)})
    assert "!tile.fragment<4, 32, 1, f32, f32, acc, row_major, fma>" in wide.ir("tile")
    assert "!tile.fragment<4, 16, 1, f32, f32, acc, row_major, fma>" in narrow.ir("tile")
    assert wide.report().kernels[0]["mma"]["record"] == "x86.avx512.fma.f32"
    assert narrow.report().kernels[0]["mma"]["record"] == "x86.avx2.fma.f32"
    ref = a.astype(np.float64) @ b
    for art in (wide, narrow):
        if "avx512f" in host_cpu()[1]:
            np.testing.assert_allclose(art(a, b), ref, rtol=1e-4, atol=1e-4)
        else:
            with pytest.raises(LaneUnavailableError, match="avx512f"):
                art(a, b)


def test_register_tile_pin_changes_the_tile_ir(rng):
    a = rng.standard_normal((30, 30)).astype(np.float32)
    w = 16 if "avx512f" in host_cpu()[1] else 8
    t1 = ts.compile(lambda x, w: x @ w, a, a, schedule={"register_tile": (6, 1)}).ir("tile")
    t2 = ts.compile(lambda x, w: x @ w, a, a, schedule={"register_tile": (3, 2)}).ir("tile")
    assert f"fragment<6, {w}, 1" in t1 and f"fragment<3, {2 * w}, 1" in t2


def test_a_record_without_lowering_is_refused(rng):
    # AMX int8 (tdpbssd) is a record the x86 lowering does not implement yet
    with pytest.raises(TesseraError) as e:
        select_mma(get_isa("x86", "amx"), "s8", out_dtype="i32", lowering="lower-tile-to-x86")
    assert e.value.code == "MMA_NO_LOWERING" and "x86.amx.int8" in str(e.value)
    # an instruction the chip lacks is refused with the shapes it has
    a = rng.standard_normal((32, 64)).astype(ts.bfloat16)
    with pytest.raises(TesseraError) as e:
        ts.compile(lambda x, w: x @ w, a, a.T.copy(), schedule={"mma_shape": (16, 16, 32)}, arch="znver4")
    assert e.value.code == "MMA_SELECTOR" and "1x16x2" in str(e.value)


def test_lane_report_prints_the_selection(rng):
    a = rng.standard_normal((20, 20)).astype(np.float32)
    text = str(ts.explain(ts.jit(lambda x, w: x @ w), a, a))
    assert "x86.avx512.fma.f32" in text or "x86.avx2.fma.f32" in text
    assert "register tile" in text
