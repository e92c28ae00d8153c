"""The NVIDIA lane: @tessera.jit -> Graph -> Schedule -> Tile -> tessera_nvidia -> PTX -> cubin (ptxas),
numerics proven by the warp emulator, refusals, runtime honesty — each with teeth."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from gpu_common import (SHAPES, batched, check_relu_propagates_nan, drop_c0, gemm_acc, gemm_epilogue, gelu64, inputs,
                        oracle_acc, rel_err, rounding_model, swap_acc_rows)
from tessera.codegen import ptx_tools
from tessera.errors import EmulatorRaceError, LaneUnavailableError, MmaSelectorError, UnknownArchError
from tessera.mma.selector import get_isa, select_mma
from tessera.toolchain import find_nvdisasm, find_ptxas

ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120"]
PTX_MIN = {"sm_75": (6, 3), "sm_80": (7, 0), "sm_86": (7, 1), "sm_89": (7, 8), "sm_90": (7, 8), "sm_120": (8, 7)}
pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def _compile(fn, args, arch, **schedule):
    return ts.compile(fn, *args, target="nvidia", arch=arch, schedule=schedule or None)


def _k(arch: str) -> int:
    return 8 if arch == "sm_75" else 16       # sm_75 has m16n8k8 only


# --------------------------------------------------------------------------- PTX and cubins
@pytest.mark.parametrize("arch", [a if a == "sm_90" else pytest.param(a, marks=pytest.mark.slow) for a in ARCHS])
def test_ptx_assembles_for_every_arch_within_the_register_file(arch, rng):
    a, b, c0 = inputs(rng, "f16", 70, 72, 48)
    art = _compile(gemm_acc, (a, b, c0), arch)
    ptx = art.ptx()
    assert re.search(rf"\.target {arch}\b", ptx)
    major, minor = map(int, re.search(r"\.version (\d+)\.(\d+)", ptx).groups())
    assert (major, minor) >= PTX_MIN[arch]
    assert f"mma.sync.aligned.m16n8k{_k(arch)}.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned" in ptx
    assert ("cp.async" in ptx) == (arch != "sm_75")      # sm_75 has no cp.async: plain loads
    cubin = art.binary()
    assert cubin[:4] == b"\x7fELF"
    k = art.report().kernels[0]
    assert k["registers"] > 0 and k["smem_bytes"] == art.abi()[0]["shared_bytes"]
    assert k["static_smem_bytes"] == 0 and ".extern .shared .align 16 .b8" in ptx   # sized by the launch
    # the default 128x128x64 tiles keep 64 accumulators and a k-block of fragments per thread: with the
    # incoming C0 ptxas spills a few bytes (<= 32) on some archs; the plain GEMM does not spill at all
    assert k["spill_stores"] <= 32 and k["spill_loads"] <= 32
    plain = _compile(lambda x, y: x @ y, (a, b), arch).report().kernels[0]
    assert plain["spill_stores"] == 0 and plain["spill_loads"] == 0
    abi = art.abi()[0]
    assert abi["symbol"] == k["kernel"] and abi["block"] == [256, 1, 1] and abi["ptx_version"] == f"{major}.{minor}"


@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
def test_sass_has_hmma(rng):
    a, b, c0 = inputs(rng, "bf16", 64, 64, 32)
    art = _compile(gemm_acc, (a, b, c0), "sm_90")
    assert "HMMA" in ptx_tools.sass(art.binary(), "sm_90")


@pytest.mark.parametrize("arch", [pytest.param("sm_80", marks=pytest.mark.slow), "sm_90",
                                  pytest.param("sm_120", marks=pytest.mark.slow)])
def test_the_emitted_instruction_is_the_selected_records_for_each_dtype(arch, rng):
    """f16 and bf16 are different instructions of one shape: the PTX must hold the record's.
    (A real H200 caught bf16 kernels running the f16 mma.sync while the emulator, which reads
    the registers' types, agreed with float64.)"""
    for dtype in ("f16", "bf16"):
        a, b, c0 = inputs(rng, dtype, 70, 72, 48)
        art = _compile(gemm_acc, (a, b, c0), arch)
        mnemonic = art.report().kernels[0]["mma"]["mnemonic"]
        assert f".f32.{dtype}.{dtype}.f32" in mnemonic
        assert set(re.findall(r"mma\.sync\.aligned\.\S+", art.ptx())) == {mnemonic}
        assert f'atype = "{dtype}"' in art.ir("target")


def test_teeth_target_ir_whose_mma_type_disagrees_with_its_registers_is_refused(rng):
    from tessera.errors import TargetVerifyError
    from tessera.ir.text import parse_module, verify
    a, b, c0 = inputs(rng, "bf16", 33, 29, 37)
    text = _compile(gemm_acc, (a, b, c0), "sm_90").ir("target")
    verify(parse_module(text))
    with pytest.raises(TargetVerifyError, match="atype 'f16' does not match its A/B registers"):
        verify(parse_module(text.replace('atype = "bf16"', 'atype = "f16"')))


def test_lane_report(rng):
    a, b, c0 = inputs(rng, "bf16", 64, 64, 32)
    rep = _compile(gemm_acc, (a, b, c0), "sm_90").report()
    assert rep.lane == "nvidia-sm_90" and rep.layers == ["graph", "schedule", "tile", "target"]
    assert rep.kernels[0]["mma"]["record"] == "nvidia.mma_sync.m16n8k16.bf16"


# --------------------------------------------------------------------------- numerics (emulator)
@pytest.mark.parametrize("arch,dtype", [pytest.param("sm_75", "f16", marks=pytest.mark.slow), ("sm_80", "bf16"),
                                        pytest.param("sm_86", "f16", marks=pytest.mark.slow),
                                        pytest.param("sm_89", "bf16", marks=pytest.mark.slow),
                                        ("sm_90", "f16"), ("sm_90", "bf16"), ("sm_120", "f16")])
def test_emulated_gemm_with_c0_matches_float64_and_the_rounding_model(arch, dtype, rng):
    art = None
    for m, n, k in SHAPES:
        a, b, c0 = inputs(rng, dtype, m, n, k)
        art = art or _compile(gemm_acc, (a, b, c0), arch)
        got = art.emulate(a, b, c0)
        assert got.shape == (m, n) and rel_err(got, oracle_acc(a, b, c0)) < 1e-2
        model = rounding_model(a, b, c0, _k(arch))
        ulps = np.abs(got.view(np.int32).astype(np.int64) - model.view(np.int32).astype(np.int64))
        assert ulps.max() <= 1 and (ulps == 0).mean() > 0.999, (m, n, k, ulps.max())


@pytest.mark.slow   # GPU code generation and the emulator: ~10-45 s (CI runs -m slow)
def test_emulated_epilogue_and_batch(rng):
    a, b, _ = inputs(rng, "f16", 70, 50, 40)
    bias = rng.standard_normal(50).astype(np.float16)
    got = _compile(gemm_epilogue, (a, b, bias), "sm_80").emulate(a, b, bias)
    assert rel_err(got, gelu64(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64))) < 1e-2
    a, b, c0 = inputs(rng, "f16", 37, 29, 23, batch=(2,))
    got = _compile(batched, (a, b, c0), "sm_90").emulate(a, b, c0)
    x = oracle_acc(a, b, c0)
    assert rel_err(got, x / (1 + np.exp(-x))) < 1e-2


@pytest.mark.parametrize("staging", [pytest.param(1, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_other_pipeline_depths(staging, rng):
    a, b, c0 = inputs(rng, "f16", 70, 72, 160)
    art = _compile(gemm_acc, (a, b, c0), "sm_80", staging=staging, tile_m=64, tile_n=64)
    # one commit group per copy (A and B): waiting for the oldest stage leaves 2 * (S - 2) groups in flight
    assert re.search(rf"cp\.async\.wait_group\s+{2 * max(staging - 2, 0)};", art.ptx())
    assert rel_err(art.emulate(a, b, c0), oracle_acc(a, b, c0)) < 1e-2


@pytest.mark.slow   # the warp/wave emulator: 6-15 s (CI runs -m slow)
def test_relu_epilogue_propagates_nan_like_numpy(rng):
    check_relu_propagates_nan(rng, lambda fn, args: _compile(fn, args, "sm_80"))


# --------------------------------------------------------------------------- teeth
@pytest.mark.slow   # the warp/wave emulator: 6-15 s (CI runs -m slow)
def test_teeth_a_lane_swap_in_the_lowering_fails(rng, monkeypatch):
    from tessera.passes.target.gpu.simt import OperandMap
    from tessera.passes.target.nvidia import lower_tile_to_nvidia as NVL
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = NVL.MmaSyncMap.build

    def swapped(self, b_, lane):
        orig(self, b_, lane)
        items = list(self.b.items)
        items[0], items[1] = items[1], items[0]        # b0 <-> b1: two k rows of B exchanged
        self.b = OperandMap(items, self.b.parts)
    monkeypatch.setattr(NVL.MmaSyncMap, "build", swapped)
    # a register layout mismatch is only visible when ldmatrix is not used: force element loads
    monkeypatch.setattr(NVL.NvidiaLowerer, "pack_operand", NVL.SimtLowerer.pack_operand)
    a, b, c0 = inputs(rng, "f16", 32, 32, 32)
    got = _compile(gemm_acc, (a, b, c0), "sm_90").emulate(a, b, c0)
    assert rel_err(got, oracle_acc(a, b, c0)) > 0.05


@pytest.mark.slow   # the warp/wave emulator: 7-15 s (CI runs -m slow)
def test_teeth_an_accumulator_lane_map_swap_fails(rng, monkeypatch):
    """The plant test_nvidia_device.py's device check must catch (swap_acc_rows: a compiler
    bug, not an edited result), caught here by the emulator on the same check."""
    a, b, c0 = inputs(rng, "f16", 70, 72, 48)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    assert rel_err(_compile(gemm_acc, (a, b, c0), "sm_90").emulate(a, b, c0), oracle_acc(a, b, c0)) < 1e-5
    swap_acc_rows(monkeypatch)
    got = _compile(gemm_acc, (a, b, c0), "sm_90").emulate(a, b, c0)
    assert rel_err(got, oracle_acc(a, b, c0)) > 1e-2


@pytest.mark.slow   # the warp/wave emulator: 7-15 s (CI runs -m slow)
def test_teeth_a_wrong_ldmatrix_address_fails(rng, monkeypatch):
    from tessera.passes.target.nvidia import lower_tile_to_nvidia as NVL
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = NVL.NvidiaLowerer.pack_operand

    def transposed_b(self, b_, vv, omap, ft):
        if ft.role.data == "b":
            regs = orig(self, b_, vv, omap, ft)
            regs[0].owner.attributes.pop("trans", None)   # forget .trans: B comes in the A layout
            return regs
        return orig(self, b_, vv, omap, ft)
    monkeypatch.setattr(NVL.NvidiaLowerer, "pack_operand", transposed_b)
    a, b, c0 = inputs(rng, "f16", 32, 32, 32)
    got = _compile(gemm_acc, (a, b, c0), "sm_80").emulate(a, b, c0)
    assert rel_err(got, oracle_acc(a, b, c0)) > 0.05


def test_teeth_dropping_c0_fails(rng, monkeypatch):
    drop_c0(monkeypatch)
    a, b, c0 = inputs(rng, "bf16", 33, 29, 37)
    got = _compile(gemm_acc, (a, b, c0), "sm_80").emulate(a, b, c0)
    assert rel_err(got, oracle_acc(a, b, c0)) > 0.05


@pytest.mark.slow   # the warp/wave emulator: 7-15 s (CI runs -m slow)
def test_teeth_waiting_for_too_few_copies_is_a_race(rng, monkeypatch):
    from tessera.ir.attrs import i64_attr
    from tessera.ir.target import nvidia as NV
    from tessera.passes.target.nvidia import lower_tile_to_nvidia as NVL
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")

    def lax_wait(self, op, b):
        pending = (op.outstanding.value.data if op.outstanding is not None else 0) + 2
        b.op(NV.CpAsyncWaitOp.create(attributes={"pending": i64_attr(pending)}))
    monkeypatch.setattr(NVL.NvidiaLowerer, "op_tile_wait", lax_wait)
    a, b, c0 = inputs(rng, "f16", 64, 64, 64)
    with pytest.raises(EmulatorRaceError, match="cp.async in flight"):
        _compile(gemm_acc, (a, b, c0), "sm_90").emulate(a, b, c0)


# --------------------------------------------------------------------------- refusals
def test_refusals_come_from_the_selector(rng):
    x = rng.standard_normal((32, 32)).astype(np.float32)
    bf = x.astype(inputs.__globals__["DTYPES"]["bf16"])
    with pytest.raises(MmaSelectorError, match="sm_75.*bf16"):
        ts.compile(lambda a, b: a @ b, bf, bf, target="nvidia", arch="sm_75")
    with pytest.raises(MmaSelectorError, match="sm_80 has no matrix instruction for f8e4m3fn"):
        select_mma(get_isa("nvidia", "sm_80"), "f8e4m3fn")
    assert select_mma(get_isa("nvidia", "sm_89"), "f8e4m3fn").record.min_ptx_for("sm_89") == (8, 4)
    # f32 runs on tf32 mma.sync from sm_80 (tests/test_gpu_tf32.py); sm_75 has no f32 instruction
    with pytest.raises(MmaSelectorError, match="sm_75.*f32"):
        ts.compile(lambda a, b: a @ b, x, x, target="nvidia", arch="sm_75")
    with pytest.raises(UnknownArchError, match="explicit arch"):
        ts.compile(lambda a, b: a @ b, x, x, target="nvidia")
    with pytest.raises(UnknownArchError, match="sm_70"):
        ts.compile(lambda a, b: a @ b, bf, bf, target="nvidia", arch="sm_70")


# --------------------------------------------------------------------------- runtime honesty
def test_calling_without_a_gpu_raises_lane_unavailable(rng):
    from tessera.runtime import cuda
    ok, why = cuda.device_available()
    if ok:
        pytest.skip("a CUDA device is present: the launch path is exercised by benchmarks/gpu/nvidia_check.py")
    a, b, c0 = inputs(rng, "f16", 32, 32, 16)
    with pytest.raises(LaneUnavailableError, match="nvidia-sm_90"):
        ts.jit(gemm_acc, target="nvidia", arch="sm_90")(a, b, c0)


def test_sm_90a_runs_wgmma_and_mma_sync_when_pinned(rng):
    """sm_90a GEMM is lowered to wgmma now (tests/test_wgmma.py); mma.sync stays reachable there by pin."""
    a, b, c0 = inputs(rng, "bf16", 33, 29, 37)
    art = _compile(gemm_acc, (a, b, c0), "sm_90a")
    assert ".target sm_90a" in art.ptx()
    assert art.report().kernels[0]["mma"]["record"] == "nvidia.wgmma.m64n128k16.bf16"
    assert rel_err(art.emulate(a, b, c0), oracle_acc(a, b, c0)) < 1e-5
    pinned = _compile(gemm_acc, (a, b, c0), "sm_90a", mma_family="mma_sync")
    assert pinned.report().kernels[0]["mma"]["record"] == "nvidia.mma_sync.m16n8k16.bf16"
    assert rel_err(pinned.emulate(a, b, c0), oracle_acc(a, b, c0)) < 1e-2
