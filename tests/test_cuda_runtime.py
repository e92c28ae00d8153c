"""CUDA driver-API launcher: behaviour without cuda-python or a GPU, parameter packing, and the
whole launch/time flow against a fake driver whose "device memory" is host memory (so fake
kernels can read the packed parameters and the buffers exactly as a GPU would).  A real-GPU
test runs only where ``device_available()`` says so."""
from __future__ import annotations

import ctypes
import enum
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from tessera import toolchain
from tessera.errors import ArgumentError, CodegenError, LaneUnavailableError
from tessera.runtime import cuda
from tessera.runtime.cuda import CudaModule, device_arch, device_available, pack_params


# --------------------------------------------------------------------------- fake driver
class R(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_LAUNCH_FAILED = 719


class FakeDriver:
    """The subset of ``cuda.bindings.driver`` the launcher uses.  ``kernels`` maps a name to
    ``(n_pointers, n_scalars, fn(pointers, scalars))``; ``fail`` maps a function to the
    CUresult it returns instead of success; ``raise_on_init`` mimics a missing libcuda."""
    CUresult = R
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
                                         CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=97)

    def __init__(self, kernels=None, devices=1, fail=None, raise_on_init=False):
        self.kernels, self.devices, self.fail, self.raise_on_init = kernels or {}, devices, fail or {}, raise_on_init
        self.live: dict[int, ctypes.Array] = {}
        self.calls: list[tuple] = []
        self.clock = itertools.count()

    def _r(self, fn, *values):
        self.calls.append((fn, *values))
        return (self.fail.get(fn, R.CUDA_SUCCESS), *values)

    def count(self, fn):
        return sum(1 for c in self.calls if c[0] == fn)

    def cuInit(self, flags):
        if self.raise_on_init:
            raise OSError("libcuda.so.1: cannot open shared object file")
        return self._r("cuInit") if self.devices else (R.CUDA_ERROR_NO_DEVICE,)

    def cuDeviceGetCount(self): return self._r("cuDeviceGetCount", self.devices)
    def cuDeviceGet(self, i): return self._r("cuDeviceGet", i)
    def cuDeviceGetName(self, n, dev): return self._r("cuDeviceGetName", b"Fake GPU\0\0\0")
    def cuDeviceGetAttribute(self, attr, dev): return self._r("cuDeviceGetAttribute", {75: 9, 76: 0, 97: 232448}[attr])
    def cuDevicePrimaryCtxRetain(self, dev): return self._r("cuDevicePrimaryCtxRetain", "ctx")
    def cuDevicePrimaryCtxRelease(self, dev): return self._r("cuDevicePrimaryCtxRelease")
    def cuCtxSetCurrent(self, ctx): return self._r("cuCtxSetCurrent")
    def cuCtxGetCurrent(self): return self._r("cuCtxGetCurrent", None)
    def cuCtxSynchronize(self): return self._r("cuCtxSynchronize")
    def cuModuleUnload(self, m): return self._r("cuModuleUnload")
    def cuFuncSetAttribute(self, fn, attr, value): return self._r("cuFuncSetAttribute", attr, value)

    def cuModuleLoadData(self, image):
        assert isinstance(image, bytes)
        return self._r("cuModuleLoadData", "module")

    def cuModuleGetFunction(self, module, name):
        assert module == "module" and isinstance(name, bytes)
        if name.decode() not in self.kernels:
            return (R.CUDA_ERROR_NOT_FOUND,)
        return self._r("cuModuleGetFunction", name.decode())

    def cuMemAlloc(self, n):
        buf = ctypes.create_string_buffer(n)
        self.live[ctypes.addressof(buf)] = buf
        return self._r("cuMemAlloc", ctypes.addressof(buf))

    def _check_dev(self, ptr, n):
        assert ptr in self.live and n <= len(self.live[ptr]), "copy outside a live allocation"

    def cuMemcpyHtoD(self, dst, src, n):
        self._check_dev(dst, n)
        ctypes.memmove(dst, src, n)
        return self._r("cuMemcpyHtoD", dst, n)

    def cuMemcpyDtoH(self, dst, src, n):
        self._check_dev(src, n)
        ctypes.memmove(dst, src, n)
        return self._r("cuMemcpyDtoH", src, n)

    def cuMemFree(self, ptr):
        del self.live[ptr]
        return self._r("cuMemFree")

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        n_ptr, n_sc, body = self.kernels[fn]
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        ptrs = [ctypes.c_uint64.from_address(slots[i]).value for i in range(n_ptr)]
        scalars = [ctypes.c_int64.from_address(slots[n_ptr + i]).value for i in range(n_sc)]
        for p in ptrs:
            assert p in self.live, "kernel got a pointer that is not live device memory"
        status = self._r("cuLaunchKernel", fn, (gx, gy, gz), (bx, by, bz), smem, stream, extra)
        if status[0] == R.CUDA_SUCCESS:
            body(ptrs, scalars)
        return status

    def cuEventCreate(self, flags): return self._r("cuEventCreate", SimpleNamespace(t=None))
    def cuEventDestroy(self, e): return self._r("cuEventDestroy")
    def cuEventSynchronize(self, e): return self._r("cuEventSynchronize")

    def cuEventRecord(self, e, stream):
        e.t = next(self.clock)
        return self._r("cuEventRecord")

    def cuEventElapsedTime(self, s, e):
        return self._r("cuEventElapsedTime", 0.25 * (e.t - s.t))


def f32(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))


def saxpy(ptrs, scalars):
    """y = a*x + y over n floats; also scribbles on x's device copy (which is no output)."""
    x, y = f32(ptrs[0], scalars[0]), f32(ptrs[1], scalars[0])
    y[:] = scalars[1] * x + y
    x[:] = -1


KERNELS = {"saxpy": (2, 2, saxpy), "noop": (0, 0, lambda p, s: None)}


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver(KERNELS)
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    return drv


# --------------------------------------------------------------------------- no cuda-python / no GPU
def test_without_cuda_python(monkeypatch):
    monkeypatch.setattr(cuda, "_driver", lambda: None)
    assert device_available() == (False, "cuda-python not installed")
    assert device_arch() is None
    with pytest.raises(LaneUnavailableError, match="cuda-python"):
        CudaModule(b"\x7fELF")


def test_this_machine_reports_a_reason_or_a_device():
    ok, why = device_available()
    assert isinstance(ok, bool) and isinstance(why, str) and why
    if not ok:
        with pytest.raises(LaneUnavailableError):
            CudaModule(b"\x7fELF")


def test_no_device(monkeypatch):
    monkeypatch.setattr(cuda, "_driver", lambda: FakeDriver(devices=0))
    assert device_available() == (False, "no CUDA device")
    with pytest.raises(LaneUnavailableError, match="cuInit failed: CUDA_ERROR_NO_DEVICE"):
        CudaModule(b"\x7fELF")


def test_driver_library_missing(monkeypatch):
    monkeypatch.setattr(cuda, "_driver", lambda: FakeDriver(raise_on_init=True))
    ok, why = device_available()
    assert not ok and "libcuda.so.1" in why
    with pytest.raises(LaneUnavailableError, match="CUDA driver unavailable.*libcuda"):
        CudaModule(b"\x7fELF")


def test_device_present(fake):
    assert device_available() == (True, "Fake GPU")
    assert device_arch() == "sm_90"


def test_module_without_binary_for_this_gpu(monkeypatch):
    drv = FakeDriver(KERNELS, fail={"cuModuleLoadData": R.CUDA_ERROR_NO_BINARY_FOR_GPU})
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    with pytest.raises(LaneUnavailableError, match="CUDA_ERROR_NO_BINARY_FOR_GPU"):
        CudaModule(b"\x7fELF")
    assert drv.count("cuDevicePrimaryCtxRelease") == 1      # the context retained is released


# --------------------------------------------------------------------------- parameter packing
def test_pack_params_values_and_sizes():
    kp = pack_params([0x7F00_0000_1000, 2**64 - 1], [-5, 2**63 - 1, np.int32(7)])
    assert kp.sizes == [8] * 5
    slots = ctypes.cast(kp.address, ctypes.POINTER(ctypes.c_void_p))
    assert [ctypes.c_uint64.from_address(slots[i]).value for i in range(2)] == [0x7F00_0000_1000, 2**64 - 1]
    assert [ctypes.c_int64.from_address(slots[i]).value for i in range(2, 5)] == [-5, 2**63 - 1, 7]
    assert [type(v) for v in kp.values] == [ctypes.c_uint64] * 2 + [ctypes.c_int64] * 3
    assert ctypes.sizeof(kp.array) == 5 * ctypes.sizeof(ctypes.c_void_p)


def test_pack_params_empty_and_invalid():
    assert pack_params([], []).address == 0 and pack_params([], []).sizes == []
    for bad in ([2**63], [1.5], ["3"]):
        with pytest.raises(ArgumentError, match="int64"):
            pack_params([], bad)
    with pytest.raises(ArgumentError, match="64-bit address"):
        pack_params([-1], [])


# --------------------------------------------------------------------------- launch / time (fake device)
def test_launch_copies_outputs_back_only(fake, rng):
    x = rng.standard_normal(100).astype(np.float32)
    y = rng.standard_normal(100).astype(np.float32)
    x0, want = x.copy(), 3 * x + y
    with CudaModule(b"\x7fELF") as mod:
        mod.launch("saxpy", (4, 1, 1), (32, 1, 1), 1024, [x, y], [100, 3], outputs=[1])
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(x, x0)                     # x's device copy was scribbled on
    assert fake.live == {}                                   # all device memory freed
    launch = next(c for c in fake.calls if c[0] == "cuLaunchKernel")
    assert launch[1:] == ("saxpy", (4, 1, 1), (32, 1, 1), 1024, 0, 0)
    assert fake.count("cuMemcpyHtoD") == 2 and fake.count("cuMemcpyDtoH") == 1
    assert fake.count("cuFuncSetAttribute") == 0
    assert fake.count("cuModuleUnload") == 1 and fake.count("cuDevicePrimaryCtxRelease") == 1


def test_launch_with_no_parameters_and_empty_buffers(fake):
    mod = CudaModule(b"\x7fELF")
    mod.launch("noop", (1, 1, 1), (1, 1, 1), 0, [], [], [])
    empty = np.zeros(0, np.float32)
    mod.launch("saxpy", (1, 1, 1), (1, 1, 1), 0, [empty, empty.copy()], [0, 1], [1])
    assert fake.live == {} and fake.count("cuMemcpyHtoD") == 0


def test_large_dynamic_shared_memory_opts_in(fake):
    x = np.ones(4, np.float32)
    CudaModule(b"\x7fELF").launch("saxpy", (1, 1, 1), (4, 1, 1), 100_000, [x, x.copy()], [4, 1], [1])
    assert ("cuFuncSetAttribute", 8, 100_000) in fake.calls


def test_launch_failure_raises_codegen_error_and_frees(monkeypatch):
    drv = FakeDriver(KERNELS, fail={"cuLaunchKernel": R.CUDA_ERROR_LAUNCH_FAILED})
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    x = np.ones(8, np.float32)
    with pytest.raises(CodegenError, match=r"cuLaunchKernel\(saxpy\) failed: CUDA_ERROR_LAUNCH_FAILED"):
        CudaModule(b"\x7fELF").launch("saxpy", (1, 1, 1), (8, 1, 1), 0, [x, x.copy()], [8, 2], [1])
    assert drv.live == {}


def test_unknown_kernel(fake):
    with pytest.raises(CodegenError, match=r"cuModuleGetFunction\(nope\) failed: CUDA_ERROR_NOT_FOUND"):
        CudaModule(b"\x7fELF").launch("nope", (1, 1, 1), (1, 1, 1), 0, [], [], [])


def test_launch_argument_checks(fake):
    mod = CudaModule(b"\x7fELF")
    a = np.ones((4, 4), np.float32)
    with pytest.raises(ArgumentError, match="C-contiguous"):
        mod.launch("saxpy", (1, 1, 1), (1, 1, 1), 0, [a.T, a], [4, 1], [1])
    with pytest.raises(ArgumentError, match="out of range"):
        mod.launch("saxpy", (1, 1, 1), (1, 1, 1), 0, [a, a], [4, 1], [2])
    with pytest.raises(ArgumentError, match="grid"):
        mod.launch("saxpy", (0, 1, 1), (1, 1, 1), 0, [a, a], [4, 1], [1])
    with pytest.raises(ArgumentError, match="int64"):
        mod.launch("saxpy", (1, 1, 1), (1, 1, 1), 0, [a, a], [4.0, 1], [1])
    assert fake.live == {} and fake.count("cuLaunchKernel") == 0


def test_time_keeps_buffers_on_device(fake):
    x, y = np.ones(16, np.float32), np.zeros(16, np.float32)
    times = CudaModule(b"\x7fELF").time("saxpy", (1, 1, 1), (16, 1, 1), 0, [x, y], [16, 2], repeats=5, warmup=2)
    assert times == [0.25] * 5                               # one tick between each start/end pair
    assert fake.count("cuLaunchKernel") == 7 and fake.count("cuMemcpyHtoD") == 2
    assert fake.count("cuMemcpyDtoH") == 0 and (y == 0).all()
    assert fake.live == {} and fake.count("cuEventDestroy") == 2


# --------------------------------------------------------------------------- a real GPU
ADD_PTX = """\
.version {version}
.target {arch}
.address_size 64

.visible .entry add_scalar(.param .u64 p_in, .param .u64 p_out, .param .s64 p_n, .param .s64 p_s)
{{
    .reg .pred %p;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd0, [p_in];
    ld.param.u64 %rd1, [p_out];
    ld.param.s64 %rd2, [p_n];
    ld.param.s64 %rd3, [p_s];
    mov.u32 %r0, %ctaid.x;
    mov.u32 %r1, %ntid.x;
    mov.u32 %r2, %tid.x;
    mad.lo.u32 %r3, %r0, %r1, %r2;
    cvt.u64.u32 %rd4, %r3;
    setp.ge.s64 %p, %rd4, %rd2;
    @%p bra DONE;
    shl.b64 %rd5, %rd4, 2;
    cvta.to.global.u64 %rd0, %rd0;
    cvta.to.global.u64 %rd1, %rd1;
    add.u64 %rd6, %rd0, %rd5;
    add.u64 %rd7, %rd1, %rd5;
    ld.global.f32 %f0, [%rd6];
    cvt.rn.f32.s64 %f1, %rd3;
    add.f32 %f2, %f0, %f1;
    st.global.f32 [%rd7], %f2;
DONE:
    ret;
}}
"""


@pytest.mark.skipif(not device_available()[0], reason="no CUDA device")
@pytest.mark.skipif(toolchain.find_ptxas() is None, reason="ptxas not installed")
def test_real_gpu_launch_and_time(rng):
    from tessera.codegen.ptx_tools import assemble
    arch = device_arch()
    for version in ("9.0", "8.8", "8.7", "8.0", "7.8"):
        try:
            cub = assemble(ADD_PTX.format(version=version, arch=arch), arch)
            break
        except CodegenError:
            continue
    else:
        pytest.fail(f"no PTX version assembles for {arch}")
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    out = np.zeros(n + 8, np.float32)                        # the tail must stay untouched
    with CudaModule(cub.data) as mod:
        mod.launch("add_scalar", ((n + 127) // 128, 1, 1), (128, 1, 1), 0, [x, out], [n, -3], [1])
        np.testing.assert_array_equal(out[:n], x - 3)
        assert (out[n:] == 0).all()
        times = mod.time("add_scalar", ((n + 127) // 128, 1, 1), (128, 1, 1), 0, [x, out], [n, 1], repeats=5)
        assert len(times) == 5 and all(t > 0 for t in times)
        with pytest.raises(CodegenError, match="CUDA_ERROR_NOT_FOUND"):
            mod.launch("missing", (1, 1, 1), (1, 1, 1), 0, [], [], [])
