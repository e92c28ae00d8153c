"""Device-resident calls on the NVIDIA lane, against a fake CUDA driver (tests/fake_cuda.py).

The fake's "device memory" is host memory, so these tests prove the plumbing — zero copies for
device inputs and outputs (counted), the caller's pointers and stream reaching cuLaunchKernel, one
launch plan per signature, graph capture in order, coded refusals — and, where the fake runs each
launch through the warp emulator, the numerics of a whole device-resident call against float64.
Kernel execution on real device arrays is proven only by benchmarks/gpu/device_resident.py on a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from fake_cuda import FakeCaiArray, FakeCudaArray, FakeCudaDriver, FakeDLPackArray, device_view, emulator_runner
from tessera.errors import DeviceArrayError, DeviceHostMixError, DeviceLayoutError, DeviceMismatchError
from tessera.frontend.device_array import DeviceArray
from tessera.runtime import cuda
from tessera.runtime.gpu import GpuExecutable
from tessera.toolchain import find_ptxas

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
PINS = {"tile_m": 32, "tile_n": 32, "tile_k": 32, "register_tile": (1, 2), "staging": 1}
TOL = 5e-3    # absolute, on softmax values <= 1 stored in f16 (a few units in the last place)
COPY_CALLS = ("cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync")


def prog(a, b):
    return ts.ops.softmax(a @ b)      # two kernels: a GEMM, then a row kernel reading its result


def _oracle(a, b):
    x = a.astype(np.float64) @ b.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _inputs(rng, m=40, k=32, n=48):
    return (rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16))


def _setup(monkeypatch, rng, emulate=False, archs=("sm_90",), **shape):
    a, b = _inputs(rng, **shape)
    f = ts.jit(prog, target="nvidia", arch="sm_90", schedule=PINS)
    art = f.compile(a, b)
    exe = art.compiled.executable      # shared in-process with earlier tests: its modules were another fake's
    exe._cuda.clear()
    exe._plans.clear()
    exe.plans_built = 0
    drv = FakeCudaDriver(art.abi(), archs=archs, run=emulator_runner(art.compiled.executable) if emulate else None)
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    return f, drv, a, b


def _launch_recs(drv, before=0):
    return drv.launches[before:]


def check_zero_copy(drv, f, args, stream):
    """The device-resident contract of one call, as the driver saw it."""
    cuda_before = {k: cuda.copies(k) for k in ("HtoD", "DtoH")}
    calls, runs = len(drv.calls), len(drv.launches)
    out = f(*args)
    new = drv.calls[calls:]
    assert not [c for c in new if c[0] in COPY_CALLS], "a host<->device copy inside a device-resident call"
    assert {k: cuda.copies(k) for k in ("HtoD", "DtoH")} == cuda_before
    recs = drv.launches[runs:]
    assert [r["kernel"].rsplit("_", 1)[-1] for r in recs] == ["gemm", "rowwise"]
    gemm, rows = recs
    assert gemm["ptrs"][:2] == [args[0].ptr, args[1].ptr]                 # the caller's memory, in place
    assert rows["ptrs"][0] == gemm["ptrs"][2]                              # the GEMM's result feeds the rows
    assert all(r["stream"] == stream for r in recs)                        # on the caller's stream
    allocated = [c[1] for c in new if c[0] == "cuMemAllocAsync"]
    assert gemm["ptrs"][2] in allocated and rows["ptrs"][1] in allocated
    assert isinstance(out, DeviceArray) and out.ptr == rows["ptrs"][1] and out.stream == stream
    assert out.__cuda_array_interface__["data"] == (rows["ptrs"][1], False)
    freed = [c[1] for c in new if c[0] == "cuMemFreeAsync"]
    assert freed == [gemm["ptrs"][2]]                                      # the intermediate, stream-ordered
    return out


# --------------------------------------------------------------------------- zero copy, pointers, stream
def test_device_inputs_and_outputs_take_no_host_copy(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    da, db = FakeCudaArray(drv, a, stream=0x777), FakeCudaArray(drv, b, stream=0x777)
    out = check_zero_copy(drv, f, (da, db), 0x777)
    assert out.shape == (40, 48) and out.dtype == np.float16
    entry = ts.lane_log.entries[-1]
    assert entry.lane == "nvidia-sm_90" and "device-resident" in entry.inputs[0] and "no host copy" in entry.inputs[0]


def test_teeth_a_host_round_trip_for_device_inputs_is_caught(monkeypatch, rng):
    """Planted: run_device copies its inputs through the host (what the lane did before); the check fails."""
    f, drv, a, b = _setup(monkeypatch, rng)
    real = GpuExecutable.run_device

    def via_host(self, inputs, **kw):
        mod = self.cuda_module(0)
        staged = []
        for x in inputs:
            h = np.empty(x.shape, x.dtype)
            mod.copy_out(h, x.ptr, 0)
            p = mod.alloc(h.nbytes, 0)
            mod.copy_in(p, h, 0)
            staged.append(type("S", (), {"ptr": p, "shape": x.shape, "dtype": x.dtype, "ndim": len(x.shape)})())
        return real(self, staged, **kw)
    monkeypatch.setattr(GpuExecutable, "run_device", via_host)
    with pytest.raises(AssertionError):
        check_zero_copy(drv, f, (FakeCudaArray(drv, a, stream=5), FakeCudaArray(drv, b, stream=5)), 5)


def test_emulated_device_call_matches_float64(monkeypatch, rng):
    """The fake runs each launch in the warp emulator over the host-backed 'device' memory: the whole
    device-resident call (pointers, plan, intermediate, result export) against float64."""
    f, drv, a, b = _setup(monkeypatch, rng, emulate=True)
    out = f(FakeCudaArray(drv, a), FakeCudaArray(drv, b))
    got = out.copy_to_host()
    assert np.abs(got.astype(np.float64) - _oracle(a, b)).max() < TOL
    assert cuda.copies("DtoH") >= 1    # copy_to_host is the one counted copy, outside the call
    # the same function on host arrays: copied in and out, and the lane log says so
    h0, d0 = cuda.copies("HtoD"), cuda.copies("DtoH")
    host = f(a, b)
    assert np.abs(host.astype(np.float64) - _oracle(a, b)).max() < TOL
    assert (cuda.copies("HtoD") - h0, cuda.copies("DtoH") - d0) == (2, 1)
    assert ts.lane_log.entries[-1].reason == "compiled; host copy in/out"


def test_a_dlpack_producer_is_handed_the_callers_stream_and_its_capsule_given_back(monkeypatch, rng):
    from tessera.frontend import dlpack
    f, drv, a, b = _setup(monkeypatch, rng)
    da, db = FakeDLPackArray(drv, a), FakeDLPackArray(drv, b)
    with ts.device_options(stream=0x999):
        out = f(da, db)
    assert da.streams == [0x999] and db.streams == [0x999]      # DLPack: the producer orders its work
    gemm = drv.launches[0]
    assert gemm["ptrs"][:2] == [da.inner.ptr, db.inner.ptr] and gemm["stream"] == 0x999
    assert not any(c[0] in COPY_CALLS for c in drv.calls)
    assert not any(o[3] is da or o[3] is db for o in dlpack._EXPORTED.values())   # deleters called
    assert "DLPack 1.0" in ts.lane_log.entries[-1].inputs[0] and out.stream == 0x999


def test_a_producer_on_another_stream_is_waited_for(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    da, db = FakeCudaArray(drv, a, stream=0x111), FakeCudaArray(drv, b, stream=None)
    with ts.device_options(stream=0x222):
        f(da, db)
    waits = [c for c in drv.calls if c[0] == "cuStreamWaitEvent"]
    assert waits == [("cuStreamWaitEvent", 0x222, 0x111)]       # stream=None: nothing to wait for
    first_launch = drv.names().index("cuLaunchKernel")
    assert drv.names().index("cuStreamWaitEvent") < first_launch
    assert {r["stream"] for r in drv.launches} == {0x222}


def test_the_legacy_default_stream_when_nothing_names_one(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    out = f(FakeCaiArray(drv, a), FakeCaiArray(drv, b))
    assert {r["stream"] for r in drv.launches} == {0}
    assert out.__cuda_array_interface__["stream"] == 1          # 0 is not a legal CAI stream: legacy = 1


# --------------------------------------------------------------------------- plans
def test_one_launch_plan_per_signature(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    exe = f.compile(a, b).compiled.executable
    args = (FakeCudaArray(drv, a), FakeCudaArray(drv, b))
    for _ in range(5):
        f(*args)
    assert exe.plans_built == 1
    assert drv.count("cuModuleLoadData") == 1 and drv.count("cuModuleGetFunction") == 2
    assert drv.count("cuLaunchKernel") == 10
    a2, b2 = _inputs(rng, m=72, k=32, n=40)
    f(FakeCudaArray(drv, a2), FakeCudaArray(drv, b2))
    assert exe.plans_built == 2
    _check_sizes(drv.launches[-2:], 72, 32, 40)
    f(*args)
    assert exe.plans_built == 2
    _check_sizes(drv.launches[-2:], 40, 32, 48)


def _check_sizes(recs, m, k, n):
    gemm, rows = recs
    assert sorted(set(gemm["scalars"])) == sorted({m, k, n}), gemm["scalars"]
    assert set(rows["scalars"]) <= {m, n} and m in rows["scalars"]
    assert gemm["grid"][0] * gemm["grid"][1] * gemm["grid"][2] == -(-m // 32) * -(-n // 32)


def test_teeth_a_plan_cache_keyed_without_shapes_is_caught(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    real = GpuExecutable.plan

    def shapeless(self, mod, inputs, env=None):
        p = self._plans.get("one")
        if p is None:
            p = self._plans["one"] = real(self, mod, inputs, env)
        return p
    monkeypatch.setattr(GpuExecutable, "plan", shapeless)
    f(FakeCudaArray(drv, a), FakeCudaArray(drv, b))
    a2, b2 = _inputs(rng, m=72, k=32, n=40)
    f(FakeCudaArray(drv, a2), FakeCudaArray(drv, b2))
    with pytest.raises(AssertionError):
        _check_sizes(drv.launches[-2:], 72, 32, 40)


def test_large_shared_memory_opt_in_happens_once(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    exe = f.compile(a, b).compiled.executable
    big = exe.abis[0]["symbol"]
    monkeypatch.setattr(exe, "abis", [dict(x, shared_bytes=100_000) if x["symbol"] == big else x for x in exe.abis])
    args = (FakeCudaArray(drv, a), FakeCudaArray(drv, b))
    for _ in range(3):
        f(*args)
    assert [c for c in drv.calls if c[0] == "cuFuncSetAttribute"] == [("cuFuncSetAttribute", big, 8, 100_000)]
    assert all(r["smem"] == 100_000 for r in drv.launches if r["kernel"] == big)


def test_shared_memory_over_the_device_limit_is_refused_before_launch(monkeypatch, rng):
    from tessera.errors import SharedMemoryLimitError
    f, drv, a, b = _setup(monkeypatch, rng)
    exe = f.compile(a, b).compiled.executable
    big = exe.abis[0]["symbol"]
    monkeypatch.setattr(exe, "abis", [dict(x, shared_bytes=drv.SMEM_OPTIN + 16) if x["symbol"] == big else x
                                      for x in exe.abis])
    with pytest.raises(SharedMemoryLimitError, match=f"{drv.SMEM_OPTIN} \\(opt-in\\)") as e:
        f(FakeCudaArray(drv, a), FakeCudaArray(drv, b))
    assert e.value.code == "SHARED_MEMORY_LIMIT" and drv.count("cuLaunchKernel") == 0
    assert drv.count("cuMemAllocAsync") == 0 and drv.count("cuFuncSetAttribute") == 0


# --------------------------------------------------------------------------- graphs
def test_graph_capture_replays_on_the_callers_stream(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng, emulate=True)
    exe = f.compile(a, b).compiled.executable
    args = (FakeCudaArray(drv, a), FakeCudaArray(drv, b))
    with ts.device_options(capture=True, stream=0x42):
        out1 = f(*args)
        n1 = drv.names()
        out2 = f(*args)
    graph_calls = [c for c in n1 if c.startswith(("cuStreamBeginCapture", "cuStreamEndCapture", "cuGraph",
                                                  "cuLaunchKernel"))]
    assert graph_calls == ["cuStreamBeginCapture", "cuLaunchKernel", "cuLaunchKernel", "cuStreamEndCapture",
                           "cuGraphInstantiate", "cuGraphDestroy", "cuGraphLaunch"]
    begin = next(c for c in drv.calls if c[0] == "cuStreamBeginCapture")
    assert begin[1] not in (0, 1, 0x42)                    # captured on a private stream (runs nothing)
    assert [c[2] for c in drv.calls if c[0] == "cuGraphLaunch"] == [0x42, 0x42]   # replayed on the caller's
    assert all(r["stream"] == 0x42 and "graph" in r for r in drv.launches)
    plan = next(iter(exe._plans.values()))
    # the second call's results are fresh memory: captured again, the executable graph updated in place
    assert plan.captures == 2 and plan.replays == 2 and ("cuGraphExecUpdate", True) in drv.calls
    assert drv.count("cuGraphInstantiate") == 1
    for out in (out1, out2):
        assert np.abs(out.copy_to_host().astype(np.float64) - _oracle(a, b)).max() < TOL


def test_graph_with_unchanged_pointers_is_replayed_without_capture(monkeypatch, rng):
    """Results dropped between calls: the pool hands the same addresses back, so the instantiated graph
    is launched as it is (no capture, no update)."""
    f, drv, a, b = _setup(monkeypatch, rng)
    exe = f.compile(a, b).compiled.executable
    args = (FakeCudaArray(drv, a), FakeCudaArray(drv, b))
    with ts.device_options(capture=True, stream=7):
        f(*args)
        mark = len(drv.calls)
        f(*args)
    plan = next(iter(exe._plans.values()))
    assert (plan.captures, plan.replays) == (1, 2)
    second = [c[0] for c in drv.calls[mark:] if c[0].startswith(("cuStream", "cuGraph", "cuLaunch"))]
    assert second == ["cuGraphLaunch"]
    assert len(drv.launches) == 4 and all("graph" in r for r in drv.launches)


# --------------------------------------------------------------------------- layouts
def test_pitched_rows_take_one_device_copy_and_say_so(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng, emulate=True)
    wide = np.zeros((40, 64), np.float16)
    wide[:, :32] = a
    da = FakeCaiArray(drv, a, strides=(128, 2))          # a[:, :32] of a 40x64 array: rows 128 bytes apart
    out = f(da, FakeCaiArray(drv, b))
    copies = [c for c in drv.calls if c[0] == "cuMemcpy2DAsync"]
    assert len(copies) == 1 and copies[0][3:6] == (64, 40, 128)
    assert drv.launches[0]["ptrs"][0] != da.ptr and not any(c[0] in COPY_CALLS for c in drv.calls)
    assert any("one device copy" in n for n in ts.lane_log.entries[-1].inputs)
    assert np.abs(out.copy_to_host().astype(np.float64) - _oracle(a, b)).max() < TOL


def test_transposed_and_misaligned_device_arrays(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    t = FakeCaiArray(drv, a, strides=(2, 80))             # a column-major 40x32: a transpose
    with pytest.raises(DeviceLayoutError, match="transpose"):
        f(t, FakeCaiArray(drv, b))
    odd = FakeCaiArray(drv, a, offset=1)
    with pytest.raises(DeviceLayoutError, match="not aligned"):
        f(odd, FakeCaiArray(drv, b))
    shifted = FakeCaiArray(drv, a, offset=2)              # element-aligned, not 16-byte aligned: one copy
    f(shifted, FakeCaiArray(drv, b))
    assert drv.count("cuMemcpyDtoDAsync") == 1 and drv.launches[-2]["ptrs"][0] != shifted.ptr
    assert drv.count("cuLaunchKernel") == 2


def test_read_only_inputs_are_read_in_place_and_never_written(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng, emulate=True)
    da, db = FakeCaiArray(drv, a, readonly=True), FakeCaiArray(drv, b, readonly=True)
    out = f(da, db)
    assert drv.launches[0]["ptrs"][:2] == [da.ptr, db.ptr]
    written = {drv.launches[0]["ptrs"][2], drv.launches[1]["ptrs"][1]}     # the kernels' output parameters
    assert not written & {da.ptr, db.ptr}
    np.testing.assert_array_equal(da.host(), a)
    np.testing.assert_array_equal(db.host(), b)
    assert device_view(drv, out.ptr, out.shape, out.dtype).shape == (40, 48)


# --------------------------------------------------------------------------- coded refusals
def test_device_arrays_on_the_cpu_lane_keep_their_coded_error(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    g = ts.jit(prog)
    for arr in (FakeCudaArray(drv, a), FakeCaiArray(drv, a)):
        with pytest.raises(DeviceArrayError) as e:
            g(arr, b)
        assert e.value.code == "DEVICE_ARRAY" and "cpu" in e.value.message.lower()


def test_a_host_device_mix_is_refused_naming_the_host_arguments(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng)
    with pytest.raises(DeviceHostMixError, match=r"host arrays \(arguments \[1\]\)") as e:
        f(FakeCudaArray(drv, a), b)
    assert e.value.code == "DEVICE_HOST_MIX" and drv.count("cuLaunchKernel") == 0


def test_wrong_device_is_refused_before_any_launch(monkeypatch, rng):
    f, drv, a, b = _setup(monkeypatch, rng, archs=("sm_90", "sm_90", "sm_80"))
    with pytest.raises(DeviceMismatchError, match="different devices"):
        f(FakeCudaArray(drv, a, device=0), FakeCudaArray(drv, b, device=1))
    with ts.device_options(device=1), pytest.raises(DeviceMismatchError, match="device 1") as e:
        f(FakeCudaArray(drv, a, device=0), FakeCudaArray(drv, b, device=0))
    assert e.value.code == "DEVICE_MISMATCH"
    with pytest.raises(DeviceMismatchError, match="sm_90.*device 2 is sm_80"):
        f(FakeCudaArray(drv, a, device=2), FakeCudaArray(drv, b, device=2))
    liar = FakeCudaArray(drv, a, device=1)
    liar.device = 0                                       # says cuda:0; the driver says its memory is device 1's
    with pytest.raises(DeviceMismatchError, match="memory of CUDA device 1"):
        f(liar, FakeCudaArray(drv, b, device=0))
    assert drv.count("cuLaunchKernel") == 0
    f(FakeCudaArray(drv, a, device=1), FakeCudaArray(drv, b, device=1))    # device 1 is an sm_90: it runs there
    assert drv.count("cuLaunchKernel") == 2


def test_the_callers_current_context_is_restored(monkeypatch, rng):
    """torch's runtime API reads the current context as its current device: a call on device 0 made while
    device 1's context is current runs on device 0 and leaves device 1's current."""
    f, drv, a, b = _setup(monkeypatch, rng, archs=("sm_90", "sm_90"))
    drv.cuCtxSetCurrent(drv.CTX + 1)
    out = f(FakeCudaArray(drv, a, device=0), FakeCudaArray(drv, b, device=0))
    assert drv.current == 1 and {r["device"] for r in drv.launches} == {0}
    ptr = out.ptr
    del out
    import gc
    gc.collect()
    assert ptr not in drv.live and drv.current == 1          # freed on its device, context restored again


def test_requires_grad_and_a_refusing_cuda_array_interface(monkeypatch, rng):
    """torch raises from __cuda_array_interface__ for a tensor that requires grad or is bfloat16: the first is
    REQUIRES_GRAD, the second is read through DLPack instead."""
    from tessera.errors import RequiresGradError
    f, drv, a, b = _setup(monkeypatch, rng)

    class GradTensor(FakeDLPackArray):
        requires_grad = True

        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")
    with pytest.raises(RequiresGradError):
        f(GradTensor(drv, a), FakeCudaArray(drv, b))

    class NoCai(FakeDLPackArray):
        @property
        def __cuda_array_interface__(self):
            raise TypeError("dtype torch.bfloat16 is not supported by __cuda_array_interface__")
    x = NoCai(drv, a)
    f(x, FakeCudaArray(drv, b))
    assert x.streams == [1] and drv.launches[0]["ptrs"][0] == x.inner.ptr    # DLPack, legacy default stream


def test_a_cuda_array_on_the_rocm_lane_is_refused():
    class CudaThing:
        shape, dtype = (4, 4), np.dtype(np.float16)

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):
            raise AssertionError("never read")
    g = ts.jit(prog, target="rocm", arch="gfx942")
    with pytest.raises(DeviceArrayError, match="only the nvidia lane takes device arrays"):
        g(CudaThing(), CudaThing())


# --------------------------------------------------------------------------- results
def test_a_result_exports_through_dlpack_and_frees_once(monkeypatch, rng):
    import gc
    from tessera.frontend import dlpack
    f, drv, a, b = _setup(monkeypatch, rng)
    out = f(FakeCudaArray(drv, a, stream=3), FakeCudaArray(drv, b, stream=3))
    ptr = out.ptr
    assert out.__dlpack_device__() == (dlpack.CUDA, 0)
    view = dlpack.device_view(out.__dlpack__(stream=9, max_version=(1, 0)))
    assert (view.ptr, view.shape, view.dtype, view.device_type) == (ptr, (40, 48), np.float16, dlpack.CUDA)
    assert ("cuStreamWaitEvent", 9, 3) in drv.calls       # the consumer's stream waits for the producing one
    del out
    gc.collect()
    assert ptr in drv.live                                 # the consumer still holds it
    view.release()
    gc.collect()
    assert ptr not in drv.live and [c for c in drv.calls if c[0] == "cuMemFreeAsync" and c[1] == ptr] == \
        [("cuMemFreeAsync", ptr, 3)]


def test_the_dlpack_exporter_is_read_by_a_real_consumer(rng):
    """The capsules DeviceArray hands out, made over host memory so that numpy (a real DLPack consumer)
    can take them: both protocol versions, values intact, the owner released once the consumer lets go
    (or when a capsule dies unconsumed)."""
    import gc
    import weakref
    from tessera.frontend import dlpack
    a = rng.standard_normal((5, 7)).astype(np.float32)

    class Owner:
        pass

    class Producer:
        def __init__(self, owner, versioned):
            self.owner, self.versioned = owner, versioned

        def __dlpack_device__(self):
            return (dlpack.CPU, 0)

        def __dlpack__(self, max_version=None, **kw):
            return dlpack.export(self.owner, a.ctypes.data, a.shape, a.dtype, dlpack.CPU, 0,
                                 versioned=self.versioned and max_version is not None)
    for versioned in (False, True):
        o = Owner()
        alive = weakref.ref(o)
        got = np.from_dlpack(Producer(o, versioned))
        del o
        gc.collect()
        np.testing.assert_array_equal(got, a)
        assert alive() is not None
        del got
        gc.collect()
        assert alive() is None
    o = Owner()
    alive = weakref.ref(o)
    cap = dlpack.export(o, a.ctypes.data, a.shape, a.dtype, dlpack.CPU, 0)
    del o, cap
    gc.collect()
    assert alive() is None


@pytest.mark.slow   # compiles the demo block and emulates its 12 kernels: ~40 s here
def test_the_device_script_dry_run(tmp_path, monkeypatch):
    import importlib.util
    import json
    from pathlib import Path
    from tessera.runtime.cuda import CudaModule
    monkeypatch.setattr(CudaModule, "launch_on", CudaModule.launch_on)   # the script spies on launches: undone after
    monkeypatch.setattr(cuda, "_driver", cuda._driver)
    path = Path(__file__).resolve().parent.parent / "benchmarks/gpu/device_resident.py"
    spec = importlib.util.spec_from_file_location("device_resident_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run", "--out", str(tmp_path), "--seed", "7"]) == 0
    rec = json.loads((tmp_path / "device_resident.json").read_text())
    assert rec["ok"] and rec["gemm"]["inputs_in_place"] and rec["gemm"]["result_is_kernel_output"]
    assert len(rec["block"]["kernels"]) > 3 and rec["block"]["rel_err"] < 2e-2 and rec["commit"]


def test_scalars_tuples_and_returned_arguments(monkeypatch, rng):
    """A Python number is a runtime scalar: its bytes are uploaded, counted apart from array copies.  A
    result that is an argument, or one returned twice, is a fresh device copy: results never alias."""
    a, b = _inputs(rng)

    def several(x, y, s):
        c = (x @ y) * s
        return c, x, c

    f = ts.jit(several, target="nvidia", arch="sm_90", schedule=PINS)
    art = f.compile(a, b, 0.5)
    exe = art.compiled.executable
    exe._cuda.clear()
    exe._plans.clear()
    drv = FakeCudaDriver(art.abi(), run=emulator_runner(exe))
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    da, db = FakeCudaArray(drv, a), FakeCudaArray(drv, b)
    h0, s0 = cuda.copies("HtoD"), cuda.copies("HtoD scalar")
    c1, x, c2 = f(da, db, 0.5)
    assert cuda.copies("HtoD") == h0 and cuda.copies("HtoD scalar") == s0 + 1
    assert len({c1.ptr, x.ptr, c2.ptr, da.ptr}) == 4                  # no result aliases another or an argument
    assert drv.count("cuMemcpyDtoDAsync") == 2
    want = (a.astype(np.float64) @ b.astype(np.float64)) * 0.5
    for got in (c1, c2):
        assert np.abs(got.copy_to_host().astype(np.float64) - want).max() < 2e-2 * np.abs(want).max()
    np.testing.assert_array_equal(x.copy_to_host(), a)
    assert not [c for c in drv.calls if c[0] in ("cuMemcpyHtoD", "cuMemcpyDtoH")]


def test_an_array_over_the_32_bit_index_limit_is_refused_before_any_allocation(monkeypatch, rng):
    from types import SimpleNamespace
    from tessera.errors import ShapeMismatchError
    f, drv, a, b = _setup(monkeypatch, rng)
    exe = f.compile(a, b).compiled.executable
    big = SimpleNamespace(ptr=FakeCudaArray(drv, a).ptr, shape=(1 << 16, 1 << 15), dtype=np.dtype(np.float16), ndim=2)
    small = SimpleNamespace(ptr=FakeCudaArray(drv, b).ptr, shape=(1 << 15, 48), dtype=np.dtype(np.float16), ndim=2)
    with pytest.raises(ShapeMismatchError, match="32 bits"):
        exe.run_device([big, small], stream=0, device=0)
    assert drv.count("cuMemAllocAsync") == 0 and drv.count("cuLaunchKernel") == 0
    exe.run_device([SimpleNamespace(**dict(vars(big), shape=(40, 32))), SimpleNamespace(**dict(vars(small), shape=(32, 48)))])
    assert drv.count("cuLaunchKernel") == 2                      # the same refs at a legal size run


def test_teeth_a_plan_that_patches_the_wrong_slots_is_caught(monkeypatch, rng):
    """Planted: the plan writes each kernel's first two pointers the wrong way round (a and b swapped,
    say).  The emulated device call no longer matches float64, or reads outside a buffer."""
    from tessera.errors import TesseraError
    from tessera.runtime import launch_plan
    f, drv, a, b = _setup(monkeypatch, rng, emulate=True, m=32, k=32, n=32)
    real = launch_plan.StepPlan.patch

    def swapped(self, ptr):
        real(self, ptr)
        v = self.params.values
        v[0].value, v[1].value = v[1].value, v[0].value
    monkeypatch.setattr(launch_plan.StepPlan, "patch", swapped)
    try:
        out = f(FakeCudaArray(drv, a), FakeCudaArray(drv, b)).copy_to_host()
    except (TesseraError, AssertionError):
        return
    assert np.abs(out.astype(np.float64) - _oracle(a, b)).max() > TOL
