"""The sm_90a GEMM staged by the tensor copy engine (``copy_engine="tma"``): the schedule choice,
the PTX/SASS/resources (UTMALDG + HGMMA, by-value 64-byte-aligned tensor maps, no local memory),
the ABI, the host's cuTensorMapEncodeTiled arguments (against the fake driver), and the whole
kernel in the warp emulator against float64 — with teeth: a wrong expect_tx, a flipped phase, a
wrong swizzle mode, a missing mbarrier-init fence, a stage refilled too early."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from fake_cuda import FakeCudaArray, FakeCudaDriver, device_view, emulator_runner
from gpu_common import DTYPES, gemm_acc, inputs, oracle_acc, rel_err, rounding_model
from tessera.codegen import ptx_tools
from tessera.errors import (EmulatorError, EmulatorRaceError, ScheduleIllegalError, TensorMapError)
from tessera.ir import tensor_map as TM
from tessera.passes.tile.kernels import gpu_gemm_tma as G
from tessera.runtime import cuda
from tessera.toolchain import find_nvdisasm, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc)")
TMA = {"copy_engine": "tma"}
BULK = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"


def _compile(fn, args, arch="sm_90a", **pins):
    return ts.compile(fn, *args, target="nvidia", arch=arch, schedule={**TMA, **pins})


def _fresh(monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")


def _mm(x, y):
    return ts.ops.matmul(x, y, out_dtype=np.float32)


# --------------------------------------------------------------------------- the schedule choice
def test_tma_is_a_pinned_schedule_choice_and_the_default_is_unchanged(rng):
    a, b, c0 = inputs(rng, "bf16", 64, 64, 64)
    plain = ts.compile(gemm_acc, a, b, c0, target="nvidia", arch="sm_90a")
    assert "tma.maps" not in plain.ir("target") and "cp.async.bulk" not in plain.ptx()
    art = _compile(gemm_acc, (a, b, c0))
    assert "tile.bulk_copy" in art.ir("tile") and "copy_engine = \"tma\"" in art.ir("schedule")
    assert "tessera_nvidia.tma_load" in art.ir("target") and "tessera_nvidia.cp_async" not in art.ir("target")


def test_bad_copy_engine_pins_are_coded_errors(rng):
    a, b, c0 = inputs(rng, "f16", 64, 64, 64)
    with pytest.raises(ScheduleIllegalError, match="copy_engine"):
        _compile(gemm_acc, (a, b, c0), copy_engine="dma")
    with pytest.raises(ScheduleIllegalError, match="3 or 4 stages"):
        _compile(gemm_acc, (a, b, c0), staging=2)
    with pytest.raises(ScheduleIllegalError, match="wgmma"):       # sm_90 has no wgmma: mma.sync kernels
        _compile(gemm_acc, (a, b, c0), arch="sm_90")
    ab = rng.standard_normal((2, 64, 64)).astype(a.dtype)
    with pytest.raises(ScheduleIllegalError, match="batched"):
        _compile(lambda x, y: _mm(x, y), (ab, b))


@needs_ptxas
def test_a_row_stride_a_tensor_map_cannot_encode_is_refused_before_launch(monkeypatch, rng):
    """Rows of 200 bytes (K = 100 f16): the plan refuses them when it binds the sizes, before any
    allocation, encode or launch; the emulator (same spec) refuses them too."""
    _fresh(monkeypatch)
    a = rng.standard_normal((64, 100)).astype(DTYPES["f16"])
    b = rng.standard_normal((100, 64)).astype(DTYPES["f16"])
    f = ts.jit(_mm, target="nvidia", arch="sm_90a", schedule=TMA)
    art = f.compile(a, b)
    with pytest.raises(TensorMapError, match="multiple of 16") as e:
        art.emulate(a, b)
    assert e.value.code == "TENSOR_MAP"
    exe = art.compiled.executable
    exe._cuda.clear()
    exe._plans.clear()
    drv = FakeCudaDriver(art.abi(), archs=("sm_90",))
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    da, db = FakeCudaArray(drv, a), FakeCudaArray(drv, b)
    with pytest.raises(TensorMapError, match="multiple of 16"):
        f(da, db)
    assert not {"cuLaunchKernel", "cuTensorMapEncodeTiled", "cuMemAllocAsync"} & set(drv.names())


@pytest.mark.parametrize("change,why", [({"address": 8}, "16-byte aligned"), ({"strides": (200,)}, "multiple of 16"),
                                        ({"box": (64, 300)}, "1..256"), ({"swizzle": "64B"}, "swizzle span"),
                                        ({"oob": "nan"}, "zeros"), ({"element_strides": (2, 1)}, "dense")])
def test_the_tensor_map_rules_are_coded_errors(change, why):
    good = TM.TensorMapSpec("bf16", 256, (200, 70), (400,), (64, 128))
    TM.validate(good)
    bad = TM.TensorMapSpec(**{**good.__dict__, **change})
    with pytest.raises(TensorMapError, match=why) as e:
        TM.validate(bad)
    assert e.value.code == "TENSOR_MAP"


# --------------------------------------------------------------------------- PTX, SASS, resources, ABI
@needs_ptxas
def test_ptx_sass_and_resources(rng):
    a, b, c0 = inputs(rng, "bf16", 256, 256, 512)
    art = _compile(gemm_acc, (a, b, c0))
    ptx = art.ptx()
    abi = art.abi()[0]
    maps = [p for p in abi["params"] if p["kind"] == "tensormap"]
    assert [(p["map"], p["buffer"], p["size"], p["offset"] % 64) for p in maps] == [(0, 0, 128, 0), (1, 1, 128, 0)]
    for p in maps:     # declared by value, 64-byte aligned, 128 bytes, at the ABI's index
        assert re.search(rf"\.param \.align 64 \.b8 \w+_param_{p['index']}\[128\]", ptx), p
    assert maps[0]["record"]["box"] == [64, 128] and maps[1]["record"]["box"] == [64, 64]     # A; B's 64-column panels
    assert ptx.count(BULK) == 3 * 3            # A + 2 panels of B, in the prologue's 2 fills and the loop's one
    for must in ("mbarrier.init.shared.b64", "fence.mbarrier_init.release.cluster",
                 "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
                 "cvta.param.u64", "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"):
        assert must in ptx, must
    assert not re.search(r"\.extern\s+\.func", ptx) and "cp.async.cg" not in ptx and "ld.local" not in ptx
    # the stage's exact bytes: A's 128 x 64 box and B's two 64 x 64 panels, bf16
    assert re.search(rf"mov\.b32\s+%r\d+, {(128 + 128) * 64 * 2};", ptx)
    cub = ptx_tools.assemble(ptx, "sm_90a")
    assert not re.search(r"C75\d\d|serializ", cub.log)
    k = art.report().kernels[0]
    assert k["spill_stores"] == 0 and k["spill_loads"] == 0 and k["stack_bytes"] == 0 and k["registers"] <= 168
    if find_nvdisasm() is not None:
        sass = ptx_tools.sass(art.binary(), "sm_90a")
        assert "UTMALDG.2D" in sass and re.search(r"HGMMA\.64x128x16\.F32\.BF16", sass)
        assert "SYNCS.ARRIVE.TRANS64" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass
        assert not re.search(r"\b(LDL|STL)\b", sass) and "LDGSTS" not in sass


# --------------------------------------------------------------------------- emulator: the whole kernel
@pytest.mark.parametrize("dtype,shape,staging", [("bf16", (128, 128, 128), None),
                                                 ("f16", (70, 136, 520), None),      # edges, 9 k-blocks (laps)
                                                 ("bf16", (130, 72, 200), 3)])
def test_emulated_tma_gemm_matches_float64_and_the_rounding_model(dtype, shape, staging, rng):
    m, n, k = shape
    a, b, c0 = inputs(rng, dtype, m, n, k)
    art = _compile(gemm_acc, (a, b, c0), **({"staging": staging} if staging else {}))
    got = art.emulate(a, b, c0)
    assert rel_err(got, oracle_acc(a, b, c0)) < 1e-5
    assert np.array_equal(got, rounding_model(a, b, c0, 16))


def test_emulated_transposed_b_with_epilogue(rng):
    a, b, _ = inputs(rng, "bf16", 96, 80, 264)
    bias = rng.standard_normal(80).astype(np.float32)
    bt = np.ascontiguousarray(b.T)
    art = _compile(lambda x, w, c: ts.ops.relu(_mm(x, w.T) + c), (a, bt, bias))
    recs = [p["record"] for p in art.abi()[0]["params"] if p["kind"] == "tensormap"]
    assert sorted(r["arg"] for r in recs) == [0, 1] and all(r["box"] == [64, r["box"][1]] for r in recs)
    assert all(r["dims"][0] == r["stride"] for r in recs)     # both k-contiguous: dims [K, rows], stride K
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    assert rel_err(art.emulate(a, bt, bias), want) < 1e-5


def test_emulated_fp8_gemm_with_w_transposed(rng):
    """fp8 wgmma reads both operands K-major: W^T's rows of 128 k bytes are one swizzled row each."""
    import ml_dtypes
    a = (rng.standard_normal((70, 384)) * 2).astype(ml_dtypes.float8_e4m3fn)
    w = (rng.standard_normal((136, 384)) * 2).astype(ml_dtypes.float8_e4m3fn)
    art = _compile(lambda x, y: _mm(x, y.T), (a, w))
    assert {p["record"]["box"][0] for p in art.abi()[0]["params"] if p["kind"] == "tensormap"} == {128}
    assert rel_err(art.emulate(a, w), a.astype(np.float64) @ w.astype(np.float64).T) < 1e-6
    b = np.ascontiguousarray(w.T)          # a row-major fp8 B: fp8 wgmma cannot read it MN-major
    with pytest.raises(ScheduleIllegalError, match="contiguous"):
        _compile(_mm, (a, b))


# teeth: each planted bug below makes the emulated kernel fail
def _plant(monkeypatch, rng, shape=(64, 128, 320)):
    _fresh(monkeypatch)
    a, b, c0 = inputs(rng, "bf16", *shape)
    art = _compile(gemm_acc, (a, b, c0))
    return art, (a, b, c0)


def _bytes(delta):
    real = G.TmaStaging.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        self.bytes += delta
    return init


def test_teeth_expect_tx_too_large_never_completes(monkeypatch, rng):
    monkeypatch.setattr(G.TmaStaging, "__init__", _bytes(+16))
    art, args = _plant(monkeypatch, rng)
    with pytest.raises(EmulatorError, match="never return"):
        art.emulate(*args)


def test_teeth_expect_tx_too_small_completes_early(monkeypatch, rng):
    monkeypatch.setattr(G.TmaStaging, "__init__", _bytes(-16))
    art, args = _plant(monkeypatch, rng)
    with pytest.raises(EmulatorRaceError, match="more than expect_tx"):
        art.emulate(*args)


def test_teeth_flipped_phase(monkeypatch, rng):
    """Waiting for parity 1 on the first lap returns at once (the phase before init counts as
    complete): the wgmma reads a stage the copy engine is still filling."""
    from tessera.ir import tile as t

    def wait(self, bb, kb):
        parity = bb.rem(bb.add(bb.div(kb, self.S), 1), 2)
        bb.op(t.BulkWaitOp.create(operands=[self.bars, bb.c(bb.rem(kb, self.S)), bb.c(parity)]))
    monkeypatch.setattr(G.TmaStaging, "wait", wait)
    art, args = _plant(monkeypatch, rng)
    with pytest.raises(EmulatorRaceError, match="copy in flight"):
        art.emulate(*args)


def test_teeth_missing_mbarrier_init_fence(monkeypatch, rng):
    from tessera.ir.target import nvidia as NV
    # the fence replaced by an instruction that orders nothing for the async proxy (an empty commit)
    monkeypatch.setattr(NV.FenceMbarrierInitOp, "create", classmethod(lambda cls, **k: NV.CpAsyncCommitOp.create()))
    art, args = _plant(monkeypatch, rng)
    with pytest.raises(EmulatorRaceError, match="not fenced"):
        art.emulate(*args)


def test_teeth_stage_refilled_while_its_wgmma_group_is_in_flight(monkeypatch, rng):
    from tessera.passes.tile.kernels import gpu_gemm_wgmma as W
    monkeypatch.setattr(W, "prefetch_distance", lambda stages, inflight: stages - 1)
    art, args = _plant(monkeypatch, rng)
    try:
        got = art.emulate(*args)
    except EmulatorRaceError:
        return
    assert rel_err(got, oracle_acc(*args)) > 1e-2


def test_teeth_wrong_swizzle_in_the_tensor_map(monkeypatch, rng):
    """The host's map says no swizzle: the engine lands the rows unpermuted, the 128-byte
    descriptors read them permuted — wrong answer; a 64-byte swizzle cannot hold the 128-byte rows."""
    from tessera.emulate.tma import TmaOps
    real = TmaOps.map_spec
    art, args = _plant(monkeypatch, rng, (64, 64, 128))
    monkeypatch.setattr(TmaOps, "map_spec", lambda self, rec, sizes: TM.TensorMapSpec(
        **{**real(self, rec, sizes).__dict__, "swizzle": "none"}))
    assert rel_err(art.emulate(*args), oracle_acc(*args)) > 1e-2
    monkeypatch.setattr(TmaOps, "map_spec", lambda self, rec, sizes: real(self, {**rec, "swizzle": "64B"}, sizes))
    with pytest.raises(TensorMapError, match="swizzle span"):
        art.emulate(*args)


# --------------------------------------------------------------------------- host: the driver's encoder
@needs_ptxas
def test_host_encodes_the_maps_through_the_driver_and_the_result_matches_float64(monkeypatch, rng):
    """The launch plan calls cuTensorMapEncodeTiled (the fake driver records its arguments and
    returns an opaque map), writes the 128 bytes into the kernel's 64-byte aligned parameter slots,
    and the emulator runs the launch with the maps *as encoded* — so every field the host passes
    (dtype, dims, stride, box, swizzle, OOB fill) is checked by the numbers."""
    _fresh(monkeypatch)
    m, n, k = 70, 136, 200
    a, b, _ = inputs(rng, "f16", m, n, k)      # f16: a __cuda_array_interface__ typestr exists (bf16 has none)
    f = ts.jit(_mm, target="nvidia", arch="sm_90a", schedule=TMA)
    art = f.compile(a, b)
    exe = art.compiled.executable
    exe._cuda.clear()
    exe._plans.clear()
    drv = FakeCudaDriver(art.abi(), archs=("sm_90",), run=emulator_runner(exe))
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    da, db = FakeCudaArray(drv, a), FakeCudaArray(drv, b)
    out = f(da, db)
    got = device_view(drv, out.ptr, (m, n), np.float32)
    assert rel_err(got, a.astype(np.float64) @ b.astype(np.float64)) < 1e-5
    enc = [c for c in drv.calls if c[0] == "cuTensorMapEncodeTiled"]
    assert len(enc) == 2
    ma, mb = drv.launches[-1]["tensormaps"]
    assert ma == {"dtype": 6, "rank": 2, "address": da.ptr, "dims": [k, m], "strides": [k * 2], "box": [64, 128],
                  "elem_strides": [1, 1], "interleave": 0, "swizzle": 3, "l2": 2, "oob": 0}
    assert mb == {**ma, "address": db.ptr, "dims": [n, k], "strides": [n * 2], "box": [64, 64]}
    # a second call on the same arrays reuses the encoded maps; new arrays are encoded again
    f(da, db)
    assert len([c for c in drv.calls if c[0] == "cuTensorMapEncodeTiled"]) == 2
    f(FakeCudaArray(drv, a), db)
    assert len([c for c in drv.calls if c[0] == "cuTensorMapEncodeTiled"]) == 3


@needs_ptxas
def test_teeth_host_swizzle_argument(monkeypatch, rng):
    """Planted in the host encoder: SWIZZLE_NONE gives a wrong answer, SWIZZLE_64B a driver refusal."""
    from tessera.runtime import cuda_tensor_map as CT
    _fresh(monkeypatch)
    a, b, _ = inputs(rng, "f16", 64, 64, 128)
    f = ts.jit(_mm, target="nvidia", arch="sm_90a", schedule=TMA)
    art = f.compile(a, b)
    exe = art.compiled.executable
    for planted, expect in (("CU_TENSOR_MAP_SWIZZLE_NONE", "wrong"), ("CU_TENSOR_MAP_SWIZZLE_64B", "refused")):
        exe._cuda.clear()
        exe._plans.clear()
        drv = FakeCudaDriver(art.abi(), archs=("sm_90",), run=emulator_runner(exe))
        monkeypatch.setattr(cuda, "_driver", lambda: drv)
        monkeypatch.setitem(CT.SWIZZLES, "128B", planted)
        da, db = FakeCudaArray(drv, a), FakeCudaArray(drv, b)
        if expect == "refused":
            with pytest.raises(TensorMapError, match="CUDA_ERROR_INVALID_VALUE"):
                f(da, db)
        else:
            out = f(da, db)
            got = device_view(drv, out.ptr, (64, 64), np.float32)
            assert rel_err(got, a.astype(np.float64) @ b.astype(np.float64)) > 1e-2


def test_kernel_params_hold_tensor_maps_64_byte_aligned():
    p = cuda.pack_params([0x1000, 0x2000], [5], n_maps=2)
    p.set_map(1, bytes(range(128)))
    import ctypes
    slots = ctypes.cast(p.address, ctypes.POINTER(ctypes.c_void_p))
    assert [slots[i] % 64 for i in (3, 4)] == [0, 0]
    assert ctypes.string_at(slots[4], 128) == bytes(range(128)) and ctypes.string_at(slots[3], 128) == bytes(128)
    with pytest.raises(Exception, match="128 bytes"):
        p.set_map(0, b"short")
