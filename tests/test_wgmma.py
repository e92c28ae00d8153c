"""The sm_90a lane's wgmma GEMM: PTX/SASS/resources from ptxas and nvdisasm, the descriptors
(K-major and MN-major B) and 128-byte swizzle against an independent model of the PTX ISA rule,
the accumulator fragment layout, and the whole lowered kernel — its copies, its k-loop with one
wgmma group in flight — in the warp emulator against float64, each with teeth."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from gpu_common import DTYPES, gemm_acc, inputs, oracle_acc, rel_err, rounding_model
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
    # fp8: m64nNk32, lowered with both operands K-major (tests/test_gpu_fp8.py)
    sel = select_mma(get_isa("nvidia", "sm_90a"), "f8e4m3fn", out_dtype="f32", family="wgmma", lowering=lowering)
    assert sel.record.k == 32 and sel.record.lowered_by == lowering
    # a record with no lowering stays unselectable ("no capability without a producer"): s8 mma.sync
    with pytest.raises(MmaNoLoweringError):
        select_mma(get_isa("nvidia", "sm_90a"), "s8", out_dtype="i32", lowering=lowering)


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


def _mn_stored(rows_k: int, cols_n: int, lbo_elems: int) -> np.ndarray:
    """[k, n] byte offset where the swizzle128 copy puts element (kk, n) of a k x n block staged
    as n/64 panels of k rows x 64 (the lowering's own index function)."""
    return np.array([[2 * (n // 64) * lbo_elems + 2 * W.swizzled_index(kk, (n % 64) // 8) + 2 * (n % 8)
                      for n in range(cols_n)] for kk in range(rows_k)])


def test_mn_major_descriptor_reads_the_panels_the_copy_stores():
    """B staged as it lies (k rows of n, 64-column panels): the MN-major descriptor of each k16
    slice — start at row kk, LBO the panel stride, SBO 1024 — names, per the PTX ISA's canonical
    MN-major layout (model: emulate/smem_desc.py), exactly the bytes the copy wrote B[kk, n] to."""
    d = SD.decode(W.descriptor_high(8192) | (2048 >> 4))
    assert (d.start, d.lbo, d.sbo, d.swizzle, d.base_offset) == (2048, 8192, 1024, "128B", 0)
    for rows_k, cols_n in ((64, 128), (64, 256), (32, 64)):
        panel = rows_k * 64
        stored = _mn_stored(rows_k, cols_n, panel)
        assert len(np.unique(stored)) == rows_k * cols_n
        for kk in range(0, rows_k, 16):
            desc = W.descriptor_high(2 * panel) | ((2 * 64 * kk) >> 4)
            addr = SD.mnmajor_addresses(desc, cols_n, 16)                # [n, k]
            assert np.array_equal(addr, stored[kk:kk + 16].T)


@pytest.mark.parametrize("lbo,sbo", [(4096, 1024), (8192, 2048), (8192, 512)])
def test_a_planted_wrong_mn_major_offset_is_caught_by_the_model(lbo, sbo):
    stored = _mn_stored(64, 128, 64 * 64)
    addr = SD.mnmajor_addresses(W.descriptor(2048, lbo=lbo, sbo=sbo), 128, 16)
    assert not np.array_equal(addr, stored[16:32].T)
    # and the K-major reading of the same bytes (imm-trans-b 0) is wrong too
    assert not np.array_equal(SD.kmajor_addresses(W.descriptor_high(8192) | (2048 >> 4), 128, 16), stored[16:32].T)


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
    # a row-major B is read MN-major (imm-trans-b 1); one group stays in flight in the k-loop
    assert re.findall(r"wgmma\.mma_async[^;]*, 1, 1, 1, 0, (\d);", ptx) == ["1"] * 4
    assert re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx) == ["1", "0"]
    if find_nvdisasm() is not None:
        sass = ptx_tools.sass(art.binary(), "sm_90a")
        assert len(re.findall(r"HGMMA\.64x128x16\.F32\.BF16 [^;]*tnspB", sass)) == 4    # 64 / 16 per k-block
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass
        assert not re.search(r"\b(LDL|STL)\b", sass)


@needs_ptxas
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (./dev installs it)")
@pytest.mark.parametrize("b_transposed", [False, True])
def test_k_loop_copies_b_in_16_byte_vectors(b_transposed, rng):
    """SASS of the k-loop at 4096^3 (sass_stats): an interior k-block with aligned operands
    issues 4 HGMMA and 8 plain 16-byte cp.async (LDGSTS: 4 of A, 4 of B, whether B is row-major,
    read MN-major, or given transposed, read K-major) and no element loads; the row-major B used
    to be gathered element by element (32 LDG.U16 + 4 STS per k-block)."""
    from tessera.codegen.sass_stats import loop_counts
    a = np.zeros((4096, 4096), DTYPES["bf16"])
    fn = (lambda x, w: x @ w.T) if b_transposed else (lambda x, y: x @ y)
    art = _compile(fn, (a, a))
    c = loop_counts(ptx_tools.sass(art.binary(), "sm_90a"))["fast"]
    assert (c.get("HGMMA"), c.get("LDGSTS"), c.get("LDG", 0), c.get("STS", 0)) == (4, 8, 0, 0), c
    assert c["total"] < 200, c          # 366 with the gathers; interior blocks skip the extent arithmetic
    k = art.report().kernels[0]
    assert k["spill_stores"] == 0 and k["registers"] <= 232


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
@pytest.mark.parametrize("dtype,shape,staging", [("bf16", (128, 128, 128), None), ("f16", (67, 200, 150), None),
                                                 ("bf16", (70, 131, 90), None),     # n % 8: B by element loads
                                                 ("f16", (64, 256, 320), 3), ("bf16", (64, 128, 320), 2)])
def test_emulated_wgmma_gemm_matches_float64_and_the_rounding_model(dtype, shape, staging, rng):
    """Edges in every dimension; B MN-major by cp.async and (n not a multiple of 8) by element
    loads; 4 stages (copies 2 k-blocks ahead, one wgmma group in flight), 3 (1 ahead, one in
    flight) and 2 (1 ahead, wait_group 0), over several k-blocks."""
    m, n, k = shape
    a, b, c0 = inputs(rng, dtype, m, n, k)
    art = _compile(gemm_acc, (a, b, c0), **({"staging": staging} if staging else {}))
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
    monkeypatch.setattr(W, "swizzled_index", lambda r, j, b=None, esize=2: b.add(b.mul(r, 64), b.mul(j, 8)) if b else
                        r * 64 + j * 8)     # the planted copy stores rows unswizzled
    got, want = _plant_and_run(monkeypatch, rng)
    assert rel_err(got, want) > 1e-2


def test_teeth_wrong_descriptor_stride(monkeypatch, rng):
    """A stride of 2048 reads every other 8-row group: past the block, into a stage a cp.async is
    still filling (a race) or, where that stage has landed, the wrong rows."""
    from tessera.errors import EmulatorError
    monkeypatch.setattr(W, "descriptor_high", lambda panel_bytes=0: W.descriptor(0, sbo=2048))
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


def _plant_pipeline(monkeypatch, rng, staging=None):
    """A kernel of five k-blocks (the pipeline turns over), B row-major (MN-major)."""
    _fresh(monkeypatch)
    a, b, c0 = inputs(rng, "bf16", 64, 128, 320)
    art = _compile(gemm_acc, (a, b, c0), **({"staging": staging} if staging else {}))
    return art.emulate(a, b, c0), oracle_acc(a, b, c0)


@pytest.mark.parametrize("lbo,sbo", [(4096, 1024), (8192, 2048)])
def test_teeth_wrong_mn_major_lbo_or_sbo(monkeypatch, rng, lbo, sbo):
    from tessera.errors import EmulatorError
    real = W.descriptor_high
    monkeypatch.setattr(W, "descriptor_high", lambda panel_bytes=0: real(panel_bytes) if not panel_bytes else
                        W.descriptor(0, lbo=lbo, sbo=sbo))
    try:
        got, want = _plant_pipeline(monkeypatch, rng)
    except EmulatorError as e:
        assert e.code in ("EMULATE_RACE", "EMULATE_OUT_OF_BOUNDS")
    else:
        assert not rel_err(got, want) < 1e-2


def test_teeth_b_read_k_major_without_the_transpose_flag(monkeypatch, rng):
    real = W.WgmmaMap.emit_mma
    monkeypatch.setattr(W.WgmmaMap, "emit_mma", lambda self, b, ft, a, bb, c, trans_b=False, btype=None:
                        real(self, b, ft, a, bb, c, trans_b=False, btype=btype))
    try:      # read K-major, the 8-row groups run past the stage into one a copy is filling
        got, want = _plant_pipeline(monkeypatch, rng)
    except EmulatorRaceError as e:
        assert "cp.async in flight" in str(e)
    else:
        assert rel_err(got, want) > 1e-2


@pytest.mark.parametrize("staging", [None, 3])
def test_teeth_stage_refilled_while_its_wgmma_group_is_in_flight(monkeypatch, rng, staging):
    """wait_group 1 kept, but the copies run S - 1 blocks ahead (what wait_group 0 allowed): the
    copy refills the stage the group still in flight reads — the emulator reads a group's
    operands when it lands, a copy in flight taken as landed, so the answer is wrong."""
    from tessera.passes.tile.kernels import gpu_gemm_wgmma as G
    monkeypatch.setattr(G, "prefetch_distance", lambda stages, inflight: stages - 1)
    got, want = _plant_pipeline(monkeypatch, rng, staging)
    assert rel_err(got, want) > 1e-2


@needs_ptxas
def test_teeth_in_flight_group_without_the_final_wait(monkeypatch, rng):
    """The loop leaves a group in flight; without the wait_group 0 after it, ptxas injects its
    own wait (C7517: refused), and past that check the accumulators the emulated epilogue reads
    are the pending registers: NaN."""
    from tessera.codegen import nvptx
    from tessera.ir.target import nvidia as NV
    real = NV.WgmmaWaitOp.create

    def only_in_loop(cls, **kw):
        if kw["attributes"]["pending"].value.data == 0:
            return NV.WgmmaCommitOp.create()      # a harmless empty commit where the drain was
        return real(**kw)
    monkeypatch.setattr(NV.WgmmaWaitOp, "create", classmethod(only_in_loop))
    monkeypatch.setattr(nvptx, "check_wgmma_advisories", lambda log: None)
    _fresh(monkeypatch)
    a, b, c0 = inputs(rng, "bf16", 64, 128, 320)
    art = _compile(gemm_acc, (a, b, c0))
    monkeypatch.undo()
    with pytest.raises(CodegenError, match="C7517"):
        nvptx.check_wgmma_advisories(ptx_tools.assemble(art.ptx(), "sm_90a").log)
    assert np.isnan(art.emulate(a, b, c0)).all()


@needs_ptxas
def test_teeth_accumulators_read_past_the_final_wait(monkeypatch, rng):
    """Without wgmma_fence_operand after the loop's wait_group 0, LLVM schedules the epilogue's
    reads of the accumulators above the wait: ptxas reports C7514 (serialised wgmma) and the
    build refuses it."""
    from tessera.passes.target.nvidia.wgmma import WgmmaLowering
    from tessera.ir.target import nvidia as NV
    from tessera.ir.attrs import i64_attr
    monkeypatch.setattr(WgmmaLowering, "drain_after_loop", lambda self, b, loop: b.op(NV.WgmmaWaitOp.create(
        attributes={"pending": i64_attr(0)})))
    _fresh(monkeypatch)
    a = np.zeros((512, 512), DTYPES["bf16"])
    with pytest.raises(CodegenError, match="C7514|serialized"):
        _compile(lambda x, y: x @ y, (a, a)).binary()


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
