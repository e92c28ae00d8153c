"""The sm_90a lane's wgmma GEMM: PTX/SASS/resources from ptxas and nvdisasm, the descriptor and
128-byte swizzle against an independent model of the PTX ISA rule, the accumulator fragment
layout and the whole lowered kernel in the warp emulator against float64 — each with teeth."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from gpu_common import gemm_acc, inputs, oracle_acc, rel_err, rounding_model
from tessera.codegen import ptx_tools
from tessera.emulate import layouts as L
from tessera.emulate import smem_desc as SD
from tessera.errors import (CodegenError, EmulatorRaceError, MmaNoLoweringError, MmaSelectorError,
                            ScheduleIllegalError)
from tessera.mma.selector import get_isa, select_mma
from tessera.passes.target.nvidia import wgmma as W
from tessera.toolchain import find_nvdisasm, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc)")


def _compile(fn, args, arch="sm_90a", **schedule):
    return ts.compile(fn, *args, target="nvidia", arch=arch, schedule=schedule or None)


def _fresh(monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")


# --------------------------------------------------------------------------- selection
def test_the_selector_picks_wgmma_on_sm_90a_only_where_it_is_lowered():
    lowering = "lower-tile-to-nvidia"
    for dt in ("f16", "bf16"):
        sel = select_mma(get_isa("nvidia", "sm_90a"), dt, out_dtype="f32", lowering=lowering)
        assert sel.record.family == "wgmma" and sel.record.lowered_by == lowering
        for arch in ("sm_80", "sm_89", "sm_90"):   # no 'a': mma.sync
            assert select_mma(get_isa("nvidia", arch), dt, out_dtype="f32", lowering=lowering).record.family \
                == "mma_sync"
    # fp8 wgmma has no lowering yet: the record stays unselectable ("no capability without a producer")
    with pytest.raises(MmaNoLoweringError):
        select_mma(get_isa("nvidia", "sm_90a"), "f8e4m3fn", out_dtype="f32", family="wgmma", lowering=lowering)


# --------------------------------------------------------------------------- descriptor and swizzle
def test_descriptor_fields_agree_with_the_isa_model():
    for start in (0, 1024, 1024 + 32, 96 * 1024 + 64, 227 * 1024 - 1024):
        d = SD.decode(W.descriptor(start))
        assert (d.start, d.sbo, d.base_offset, d.swizzle) == (start, 1024, 0, "128B")
    # the lowering's run-time form: the high fields as one constant, the address ORed in
    assert W.descriptor_high() | ((4096 >> 4) & 0x3FFF) == W.descriptor(4096)
    # teeth: a wrong stride field or swizzle mode decodes differently
    assert SD.decode(W.descriptor(0, sbo=512)).sbo != 1024
    assert SD.decode(W.descriptor(0, swizzle=2)).swizzle != "128B"


def test_swizzled_store_layout_is_what_the_descriptor_reads():
    """Element (r, c) of a staged block as the copy stores it == where wgmma (per the ISA model)
    looks for it, for the k16 slice of every k offset and every 8-row group."""
    rows = 128
    stored = np.array([[2 * W.swizzled_index(r, c // 8) + 2 * (c % 8) for c in range(64)] for r in range(rows)])
    model = np.array([[SD.store_address(0, r, c) for c in range(64)] for r in range(rows)])
    assert np.array_equal(stored, model)
    assert len(np.unique(stored)) == rows * 64           # a permutation of the block's bytes
    for kk in range(0, 64, 16):
        addr = SD.kmajor_addresses(W.descriptor(2 * kk), rows, 16)
        assert np.array_equal(addr, stored[:, kk:kk + 16])


def test_a_planted_wrong_swizzle_is_caught_by_the_model():
    def no_xor(r, j):
        return r * 64 + j * 8
    stored = np.array([[2 * no_xor(r, c // 8) + 2 * (c % 8) for c in range(64)] for r in range(16)])
    addr = SD.kmajor_addresses(W.descriptor(0), 16, 16)
    assert not np.array_equal(addr, stored[:, :16])


# --------------------------------------------------------------------------- accumulator layout
@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_accumulator_layout_multiplies_like_float64(n):
    """Scatter fresh f16 products through the table's fragment layout, gather them back: the
    layout is a bijection onto 64 x n, and a register-level model built from it reproduces A @ B."""
    rng = np.random.default_rng(n)
    lay = L.instr_layout("wgmma", (64, n, 16), arch="sm_90a", lanes=128, dtype="f16").c
    assert lay.items == n // 2 and not lay.replicated
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((16, n)).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    regs = want[lay.index[..., 0], lay.index[..., 1]]          # what thread t's register i holds
    # the documented rule, spelled out for a few registers
    for t, i in ((0, 0), (37, 3), (127, n // 2 - 1)):
        w, lane = t // 32, t % 32
        assert tuple(lay.index[t, i]) == (16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2)
    back = np.zeros((64, n))
    back[lay.index[..., 0], lay.index[..., 1]] = regs
    assert rel_err(back, want) == 0.0


# --------------------------------------------------------------------------- PTX, SASS, resources
@needs_ptxas
def test_sm_90a_gemm_ptx_assembles_with_hgmma_and_no_spills(rng):
    a, b, c0 = inputs(rng, "bf16", 128, 128, 128)
    art = _compile(gemm_acc, (a, b, c0))
    ptx = art.ptx()
    assert ".target sm_90a" in ptx
    assert not re.search(r"\.extern\s+\.func", ptx)           # every LLVM intrinsic was lowered
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx
    for must in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                 "fence.proxy.async.shared::cta", ".extern .shared .align 1024"):
        assert must in ptx, must
    k = art.report().kernels[0]
    assert k["mma"]["record"] == "nvidia.wgmma.m64n128k16.bf16" and k["vector"] == 128 and k["threads"] == 256
    assert k["spill_stores"] == 0 and k["spill_loads"] == 0 and k["stack_bytes"] == 0
    assert 64 < k["registers"] <= 255
    cub = ptx_tools.assemble(ptx, "sm_90a")                   # ptxas -v, here: no serialisation advisories
    assert not re.search(r"C75\d\d|serializ", cub.log)
    if find_nvdisasm() is not None:
        sass = ptx_tools.sass(art.binary(), "sm_90a")
        assert len(re.findall(r"HGMMA\.64x128x16\.F32\.BF16", sass)) == 4    # 64 / 16 per k-block
        assert not re.search(r"\b(LDL|STL)\b", sass)


def test_ptxas_serialisation_advisories_fail_the_build():
    from tessera.codegen.nvptx import check_wgmma_advisories
    check_wgmma_advisories("ptxas info    : Used 140 registers, used 1 barriers")
    with pytest.raises(CodegenError, match="serialized"):
        check_wgmma_advisories("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions "
                               "are serialized due to the presence of Extern calls")


def test_sm_90_without_a_stays_on_mma_sync_and_wgmma_is_refused_there(rng):
    a, b, c0 = inputs(rng, "f16", 64, 64, 64)
    with pytest.raises(MmaSelectorError, match="wgmma") as e:
        _compile(gemm_acc, (a, b, c0), "sm_90", mma_family="wgmma")
    assert e.value.code == "MMA_SELECTOR"
    assert _compile(gemm_acc, (a, b, c0), "sm_90").report().kernels[0]["mma"]["record"].startswith(
        "nvidia.mma_sync")


def test_bad_wgmma_schedules_are_coded_errors(rng):
    a, b, c0 = inputs(rng, "bf16", 64, 64, 64)
    with pytest.raises(ScheduleIllegalError, match="tile-k"):
        _compile(gemm_acc, (a, b, c0), tile_k=32)
    with pytest.raises(ScheduleIllegalError, match="attention"):
        q = rng.standard_normal((1, 2, 64, 64)).astype(a.dtype)
        _compile(lambda q, k, v: ts.ops.attention(q, k, v), (q, q, q), mma_family="wgmma")


# --------------------------------------------------------------------------- emulator: the whole kernel
@pytest.mark.parametrize("dtype,shape", [("bf16", (128, 128, 128)), ("f16", (67, 200, 150))])
def test_emulated_wgmma_gemm_matches_float64_and_the_rounding_model(dtype, shape, rng):
    m, n, k = shape
    a, b, c0 = inputs(rng, dtype, m, n, k)
    art = _compile(gemm_acc, (a, b, c0))
    got = art.emulate(a, b, c0)
    assert rel_err(got, oracle_acc(a, b, c0)) < 1e-5
    assert np.array_equal(got, rounding_model(a, b, c0, 16))     # one f32 rounding per k16 instruction


def test_emulated_transposed_b_and_epilogue(rng):
    a, b, _ = inputs(rng, "bf16", 96, 80, 72)
    bias = rng.standard_normal(80).astype(np.float32)
    bt = np.ascontiguousarray(b.T)
    art = _compile(lambda x, w, c: ts.ops.relu(ts.ops.matmul(x, w.T, out_dtype=np.float32) + c), (a, bt, bias))
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    assert rel_err(art.emulate(a, bt, bias), want) < 1e-5


# teeth: each planted bug below makes the emulated kernel fail
def _plant(monkeypatch, rng):
    _fresh(monkeypatch)
    a, b, c0 = inputs(rng, "f16", 64, 128, 64)
    return _compile(gemm_acc, (a, b, c0)), (a, b, c0)


def _plant_and_run(monkeypatch, rng):
    art, args = _plant(monkeypatch, rng)
    return art.emulate(*args), oracle_acc(*args)


def test_teeth_wrong_swizzle_in_the_copy(monkeypatch, rng):
    monkeypatch.setattr(W, "swizzled_index", lambda r, j, b=None: b.add(b.mul(r, 64), b.mul(j, 8)) if b else
                        r * 64 + j * 8)     # the planted copy stores rows unswizzled
    got, want = _plant_and_run(monkeypatch, rng)
    assert rel_err(got, want) > 1e-2


def test_teeth_wrong_descriptor_stride(monkeypatch, rng):
    """A stride of 2048 reads every other 8-row group: past the block, into a stage a cp.async is
    still filling (a race) or, where that stage has landed, the wrong rows."""
    from tessera.errors import EmulatorError
    monkeypatch.setattr(W, "descriptor_high", lambda: W.descriptor(0, sbo=2048))
    try:
        got, want = _plant_and_run(monkeypatch, rng)
    except EmulatorError as e:
        assert e.code in ("EMULATE_RACE", "EMULATE_OUT_OF_BOUNDS")
    else:
        assert not rel_err(got, want) < 1e-2


@needs_ptxas
def test_teeth_missing_wgmma_fence(monkeypatch, rng):
    """Caught twice: ptxas injects its own warpgroup.arrive (info C7519), which the build refuses;
    past that check, the emulator refuses a wgmma issued with no fence."""
    from tessera.codegen import nvptx
    from tessera.ir.target import gpu as G
    from tessera.ir.target import nvidia as NV
    monkeypatch.setattr(NV.WgmmaFenceOp, "create", classmethod(lambda cls, **k: G.BarrierOp.create()))
    monkeypatch.setattr(nvptx, "check_wgmma_advisories", lambda log: None)
    art, args = _plant(monkeypatch, rng)
    monkeypatch.undo()
    with pytest.raises(CodegenError, match="C7519"):
        nvptx.check_wgmma_advisories(ptx_tools.assemble(art.ptx(), "sm_90a").log)
    with pytest.raises(EmulatorRaceError, match="wgmma.fence"):
        art.emulate(*args)


def test_teeth_missing_async_proxy_fence(monkeypatch, rng):
    from tessera.ir.target import nvidia as NV
    from tessera.ir.target import gpu as G
    monkeypatch.setattr(NV.FenceProxyAsyncOp, "create", classmethod(lambda cls, **k: G.BarrierOp.create()))
    with pytest.raises(EmulatorRaceError, match="fence.proxy.async"):
        _plant_and_run(monkeypatch, rng)


@needs_ptxas
def test_teeth_missing_wait_group(monkeypatch, rng):
    """ptxas injects warpgroup.wait (info C7517): refused; past that, the emulator's accumulators
    are not readable before a wait_group lands them."""
    from tessera.codegen import nvptx
    from tessera.ir.target import gpu as G
    from tessera.ir.target import nvidia as NV
    monkeypatch.setattr(NV.WgmmaWaitOp, "create", classmethod(lambda cls, **k: G.BarrierOp.create()))
    monkeypatch.setattr(nvptx, "check_wgmma_advisories", lambda log: None)
    art, args = _plant(monkeypatch, rng)
    monkeypatch.undo()
    with pytest.raises(CodegenError, match="C7517"):
        nvptx.check_wgmma_advisories(ptx_tools.assemble(art.ptx(), "sm_90a").log)
    got, want = art.emulate(*args), oracle_acc(*args)
    assert np.isnan(got).any() or rel_err(got, want) > 1e-2


@pytest.mark.parametrize("n", [8, 24, pytest.param(256, marks=pytest.mark.slow)])
def test_every_lowered_record_width_compiles_and_emulates(n, rng):
    """The records marked lowered (m64nNk16, N = 8..256) are really produced: a tile-n pin selects
    m64nNk16, ptxas assembles it without spills, and the emulated kernel matches float64."""
    a = rng.standard_normal((70, 130)).astype(np.float16)
    b = rng.standard_normal((130, n + 5)).astype(np.float16)
    art = _compile(lambda x, y: ts.ops.matmul(x, y, out_dtype=np.float32), (a, b), tile_n=n)
    k = art.report().kernels[0]
    assert k["mma"]["record"] == f"nvidia.wgmma.m64n{n}k16.f16" and k["spill_stores"] == 0
    assert rel_err(art.emulate(a, b), a.astype(np.float64) @ b.astype(np.float64)) < 1e-5
