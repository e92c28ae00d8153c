"""A fake of the ``cuda.bindings.driver`` subset ``tessera/runtime/cuda.py`` uses, for device-resident
tests without a GPU.

"Device memory" is host memory (ctypes buffers) tagged with the device that allocated it, so
copies really move bytes and every pointer handed to a launch is checked against the live
allocations.  Every call is recorded (``calls``) with its stream.  Kernels do not run on a
device: ``cuLaunchKernel`` decodes the packed parameters with the kernels' ABI records and
records them; where a test passes ``run=`` (e.g. the warp emulator), the kernel is executed on the
host-backed buffers, so a whole device-resident call can be checked against float64 — through the
emulator, which is not the hardware.  Stream capture records launches into a graph instead of
running them; ``cuGraphLaunch`` runs the graph's launches in order.
"""
from __future__ import annotations

import ctypes
import enum
import itertools
from types import SimpleNamespace

import ml_dtypes
import numpy as np


class R(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_STREAM_CAPTURE_ILLEGAL = 901
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910


DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64, "i32": np.int32,
          "i64": np.int64, "i8": np.int8, "i1": np.bool_, "ui8": np.uint8}


class FakeCudaDriver:
    CUresult = R
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75,
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
                                         CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=97)
    SMEM_OPTIN = 232448   # an H100 / H200's opt-in maximum per block
    CUpointer_attribute = SimpleNamespace(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL=9)
    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
    CUmemorytype = SimpleNamespace(CU_MEMORYTYPE_DEVICE=2)

    class CUDA_MEMCPY2D(SimpleNamespace):
        pass

    # the driver's tensor-map enums (values as in cuda.h)
    CUtensorMapDataType = SimpleNamespace(CU_TENSOR_MAP_DATA_TYPE_UINT8=0, CU_TENSOR_MAP_DATA_TYPE_FLOAT16=6,
                                          CU_TENSOR_MAP_DATA_TYPE_FLOAT32=7, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16=9)
    CUtensorMapInterleave = SimpleNamespace(CU_TENSOR_MAP_INTERLEAVE_NONE=0)
    CUtensorMapSwizzle = SimpleNamespace(CU_TENSOR_MAP_SWIZZLE_NONE=0, CU_TENSOR_MAP_SWIZZLE_32B=1,
                                         CU_TENSOR_MAP_SWIZZLE_64B=2, CU_TENSOR_MAP_SWIZZLE_128B=3)
    CUtensorMapL2promotion = SimpleNamespace(CU_TENSOR_MAP_L2_PROMOTION_NONE=0, CU_TENSOR_MAP_L2_PROMOTION_L2_128B=2)
    CUtensorMapFloatOOBfill = SimpleNamespace(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE=0,
                                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA=1)
    MAP_MAGIC = 0x7E55E4A

    class cuuint64_t(int):     # cuda-python's array element wrappers (the real bindings check the types)
        pass

    class cuuint32_t(int):
        pass

    def __init__(self, abis: list[dict] | None = None, archs=("sm_90",), run=None):
        self.archs = list(archs)                       # one per device ordinal
        self.sigs = {}
        for a in abis or []:
            self.add_abi(a)
        self.run = run                                  # run(kernel, grid, [(ptr, dtype)], scalars) or None
        self.live: dict[int, tuple[ctypes.Array, int]] = {}   # ptr -> (buffer, device)
        self.calls: list[tuple] = []
        self.launches: list[dict] = []                  # every kernel execution (direct or from a graph)
        self.current, self.ctx_set = 0, False           # the current context's device, and whether one is
        self.streams = itertools.count(0x5000)
        self.capturing: dict[int, list] = {}            # stream -> launches recorded
        self.handles = itertools.count(1)
        self.pool: dict[tuple[int, int], list] = {}

    def add_abi(self, abi: dict) -> None:
        self.sigs[abi["symbol"]] = [p for p in abi["params"]]

    def _r(self, fn, *values):
        self.calls.append((fn, *values))
        return (R.CUDA_SUCCESS, *values)

    def count(self, fn) -> int:
        return sum(1 for c in self.calls if c[0] == fn)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    # ------------------------------------------------------------------ device / context / module
    def cuInit(self, flags): return self._r("cuInit")
    def cuDeviceGetCount(self): return self._r("cuDeviceGetCount", len(self.archs))
    def cuDeviceGet(self, i): return self._r("cuDeviceGet", i)
    def cuDeviceGetName(self, n, dev): return self._r("cuDeviceGetName", b"Fake H200\0")

    def cuDeviceGetAttribute(self, attr, dev):
        if attr == 97:
            return self._r("cuDeviceGetAttribute", self.SMEM_OPTIN)
        cc = self.archs[dev][3:]
        return self._r("cuDeviceGetAttribute", int(cc[:-1]) if attr == 75 else int(cc[-1]))

    CTX = 0xC0   # device d's primary context is CTX + d; 0 is "none current"

    def cuDevicePrimaryCtxRetain(self, dev): return self._r("cuDevicePrimaryCtxRetain", self.CTX + dev)
    def cuDevicePrimaryCtxRelease(self, dev): return self._r("cuDevicePrimaryCtxRelease")

    def cuCtxSetCurrent(self, ctx):
        self.current, self.ctx_set = ctx - self.CTX, True
        return self._r("cuCtxSetCurrent", ctx - self.CTX)

    def cuCtxGetCurrent(self):
        return self._r("cuCtxGetCurrent", self.CTX + self.current if self.ctx_set else 0)

    def cuCtxSynchronize(self): return self._r("cuCtxSynchronize")
    def cuModuleLoadData(self, image): return self._r("cuModuleLoadData", ("module", self.current))
    def cuModuleUnload(self, m): return self._r("cuModuleUnload")

    def cuModuleGetFunction(self, module, name):
        if name.decode() not in self.sigs:
            return (R.CUDA_ERROR_NOT_FOUND,)
        return self._r("cuModuleGetFunction", name.decode())

    def cuFuncSetAttribute(self, fn, attr, value): return self._r("cuFuncSetAttribute", fn, attr, value)

    # ------------------------------------------------------------------ memory
    def alloc(self, n: int, device: int | None = None) -> int:
        """What a framework's allocator does (not recorded as a call of the runtime's).  Freed blocks are
        reused first in, first out per size and device, as a stream-ordered pool may reuse them."""
        dev = self.current if device is None else device
        free = self.pool.get((max(int(n), 1), dev))
        if free:
            ptr, entry = free.pop(0)
            self.live[ptr] = entry
            return ptr
        buf = ctypes.create_string_buffer(max(int(n), 1) + 64)
        ptr = (ctypes.addressof(buf) + 63) // 64 * 64   # 64-byte aligned, as device allocations are
        self.live[ptr] = (buf, self.current if device is None else device, max(int(n), 1))
        return ptr

    def owner(self, ptr: int, n: int = 1):
        """(base, device) of the live allocation holding [ptr, ptr + n), else None."""
        for base, (_, dev, size) in self.live.items():
            if base <= ptr and ptr + n <= base + size:
                return base, dev
        return None

    def _check(self, ptr, n):
        assert self.owner(ptr, n) is not None, f"{n} bytes at {ptr:#x} are outside every live device allocation"

    def cuMemAlloc(self, n): return self._r("cuMemAlloc", self.alloc(n))
    def cuMemAllocAsync(self, n, stream):
        p = self.alloc(n)
        self.calls.append(("cuMemAllocAsync", p, stream))
        return (R.CUDA_SUCCESS, p)

    def cuMemFree(self, ptr):
        del self.live[int(ptr)]
        return self._r("cuMemFree", ptr)

    def cuMemFreeAsync(self, ptr, stream):
        assert int(ptr) in self.live, f"freeing {int(ptr):#x}, which is not a live allocation"
        entry = self.live.pop(int(ptr))
        self.pool.setdefault((entry[2], entry[1]), []).append((int(ptr), entry))
        return self._r("cuMemFreeAsync", int(ptr), stream)

    def cuMemcpyHtoD(self, dst, src, n):
        self._check(dst, n)
        ctypes.memmove(dst, src, n)
        return self._r("cuMemcpyHtoD", dst, n)

    def cuMemcpyDtoH(self, dst, src, n):
        self._check(src, n)
        ctypes.memmove(dst, src, n)
        return self._r("cuMemcpyDtoH", src, n)

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self._check(dst, n)
        ctypes.memmove(dst, src, n)
        return self._r("cuMemcpyHtoDAsync", dst, n, stream)

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        self._check(src, n)
        ctypes.memmove(dst, src, n)
        return self._r("cuMemcpyDtoHAsync", src, n, stream)

    def cuMemcpyDtoDAsync(self, dst, src, n, stream):
        self._check(dst, n)
        self._check(src, n)
        ctypes.memmove(dst, src, n)
        return self._r("cuMemcpyDtoDAsync", dst, src, n, stream)

    def cuMemcpy2DAsync(self, p, stream):
        for r in range(p.Height):
            s, d = p.srcDevice + r * p.srcPitch, p.dstDevice + r * p.dstPitch
            self._check(s, p.WidthInBytes)
            self._check(d, p.WidthInBytes)
            ctypes.memmove(d, s, p.WidthInBytes)
        return self._r("cuMemcpy2DAsync", p.dstDevice, p.srcDevice, p.WidthInBytes, p.Height, p.srcPitch, stream)

    def cuPointerGetAttribute(self, attr, ptr):
        hit = self.owner(int(ptr))
        if hit is None:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        return self._r("cuPointerGetAttribute", hit[1])

    # ------------------------------------------------------------------ streams and events
    def cuStreamCreate(self, flags): return self._r("cuStreamCreate", next(self.streams))
    def cuStreamDestroy(self, s): return self._r("cuStreamDestroy", s)
    def cuStreamSynchronize(self, s): return self._r("cuStreamSynchronize", s)
    def cuEventCreate(self, flags): return self._r("cuEventCreate", SimpleNamespace(stream=None))
    def cuEventDestroy(self, e): return self._r("cuEventDestroy")

    def cuEventRecord(self, e, stream):
        e.stream = stream
        return self._r("cuEventRecord", stream)

    def cuStreamWaitEvent(self, stream, e, flags): return self._r("cuStreamWaitEvent", stream, e.stream)

    # ------------------------------------------------------------------ tensor maps
    def cuTensorMapEncodeTiled(self, dtype, rank, address, dims, strides, box, elem_strides, interleave, swizzle,
                               l2, oob):
        """Records the arguments; refuses what the real driver refuses (CUDA_ERROR_INVALID_VALUE); the
        128 bytes it returns carry a handle to the recorded arguments."""
        for name, arr, ty in (("globalDim", dims, self.cuuint64_t), ("globalStrides", strides, self.cuuint64_t),
                              ("boxDim", box, self.cuuint32_t), ("elementStrides", elem_strides, self.cuuint32_t)):
            if not all(isinstance(x, ty) for x in arr):
                raise TypeError(f"Argument '{name}' is not instance of type (expected List[{ty.__name__}])")
        dims, strides, box, elem_strides = ([int(x) for x in a] for a in (dims, strides, box, elem_strides))
        span = {0: 0, 1: 32, 2: 64, 3: 128}[int(swizzle)]
        esize = {0: 1, 6: 2, 7: 4, 9: 2}[int(dtype)]
        bad = (address % 16 or len(dims) != rank or len(strides) != rank - 1 or any(s % 16 for s in strides)
               or len(box) != rank or any(not 1 <= b <= 256 for b in box) or (box[0] * esize) % 16
               or (span and box[0] * esize > span) or any(not 1 <= e <= 8 for e in elem_strides))
        if bad:
            self.calls.append(("cuTensorMapEncodeTiled", "refused"))
            return (R.CUDA_ERROR_INVALID_VALUE, None)
        h = next(self.handles)
        args = {"dtype": int(dtype), "rank": rank, "address": int(address), "dims": list(dims),
                "strides": list(strides), "box": list(box), "elem_strides": list(elem_strides),
                "interleave": int(interleave), "swizzle": int(swizzle), "l2": int(l2), "oob": int(oob)}
        self.__dict__.setdefault("tensor_maps", {})[h] = args
        buf = ctypes.create_string_buffer(128)
        ctypes.c_uint64.from_address(ctypes.addressof(buf)).value = self.MAP_MAGIC
        ctypes.c_uint64.from_address(ctypes.addressof(buf) + 8).value = h
        return self._r("cuTensorMapEncodeTiled", SimpleNamespace(buf=buf, getPtr=lambda: ctypes.addressof(buf)))

    def _tensor_map(self, address: int) -> dict:
        assert address % 64 == 0, f"tensor map parameter at {address:#x} is not 64-byte aligned"
        magic = ctypes.c_uint64.from_address(address).value
        assert magic == self.MAP_MAGIC, "tensor map parameter holds no map cuTensorMapEncodeTiled wrote"
        return self.tensor_maps[ctypes.c_uint64.from_address(address + 8).value]

    # ------------------------------------------------------------------ launches and graphs
    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        sig = self.sigs[fn]
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        ptrs, scalars, maps = [], [], []
        for i, p in enumerate(sig):
            if p["kind"] == "buffer":
                ptrs.append((ctypes.c_uint64.from_address(slots[i]).value, np.dtype(DTYPES[p["dtype"]])))
            elif p["kind"] == "tensormap":
                maps.append(self._tensor_map(slots[i]))
            else:
                scalars.append(ctypes.c_int64.from_address(slots[i]).value)
        rec = {"kernel": fn, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem, "stream": stream,
               "device": self.current, "tensormaps": maps,
               "ptrs": [p for p, _ in ptrs], "dtypes": [d for _, d in ptrs], "scalars": scalars}
        self.calls.append(("cuLaunchKernel", fn, stream))
        if stream in self.capturing:
            self.capturing[stream].append(rec)   # captured, not run
        else:
            self._exec(rec)
        return (R.CUDA_SUCCESS,)

    def _exec(self, rec):
        for p in rec["ptrs"]:
            hit = self.owner(p)
            assert hit is not None, f"kernel {rec['kernel']} got {p:#x}, not live device memory"
            assert hit[1] == rec["device"], f"kernel {rec['kernel']} on device {rec['device']} got device {hit[1]}'s memory"
        self.launches.append(rec)
        if self.run is not None:
            self.run(rec, self)

    def cuStreamBeginCapture(self, stream, mode):
        if stream in (0, 1):
            return (R.CUDA_ERROR_STREAM_CAPTURE_ILLEGAL,)
        self.capturing[stream] = []
        return self._r("cuStreamBeginCapture", stream)

    def cuStreamEndCapture(self, stream):
        return self._r("cuStreamEndCapture", SimpleNamespace(nodes=self.capturing.pop(stream), id=next(self.handles)))

    def cuGraphInstantiateWithFlags(self, graph, flags):
        return self._r("cuGraphInstantiate", SimpleNamespace(nodes=list(graph.nodes), id=next(self.handles)))

    def cuGraphExecUpdate(self, ex, graph):
        same = [n["kernel"] for n in ex.nodes] == [n["kernel"] for n in graph.nodes]
        if same:
            ex.nodes = list(graph.nodes)
        self.calls.append(("cuGraphExecUpdate", same))
        return (R.CUDA_SUCCESS if same else R.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, None)

    def cuGraphLaunch(self, ex, stream):
        for n in ex.nodes:
            self._exec(dict(n, stream=stream, graph=ex.id))
        return self._r("cuGraphLaunch", ex.id, stream)

    def cuGraphDestroy(self, g): return self._r("cuGraphDestroy")
    def cuGraphExecDestroy(self, ex): return self._r("cuGraphExecDestroy")


class FakeCaiArray:
    """A framework's device array with ``__cuda_array_interface__`` only (Numba-like): memory from the fake
    driver's allocator, optionally strided or offset, optionally a producer stream."""

    def __init__(self, drv: FakeCudaDriver, host: np.ndarray, device: int = 0, stream=None, readonly=False,
                 strides=None, offset: int = 0):
        self.drv, self.dtype, self.device, self.stream, self.readonly = drv, host.dtype, device, stream, readonly
        self.shape, self.strides = host.shape, strides
        if strides is None:
            extent = host.nbytes
        else:
            extent = sum((n - 1) * s for n, s in zip(host.shape, strides)) + host.itemsize
        self.base = drv.alloc(extent + offset, device)
        self.ptr = self.base + offset
        view = np.ndarray(host.shape, host.dtype, buffer=(ctypes.c_char * extent).from_address(self.ptr),
                          strides=strides)
        view[...] = host

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
                "strides": self.strides, "version": 3, "stream": self.stream}

    def host(self) -> np.ndarray:
        ext = sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + self.dtype.itemsize if self.strides \
            else int(np.prod(self.shape)) * self.dtype.itemsize
        return np.ndarray(self.shape, self.dtype, buffer=(ctypes.c_char * ext).from_address(self.ptr),
                          strides=self.strides).copy()


class FakeCudaArray(FakeCaiArray):
    """... and ``__dlpack_device__`` (CuPy-like, without being CuPy)."""

    def __dlpack_device__(self):
        return (2, self.device)


class FakeDLPackArray:
    """A DLPack-only device array (``__dlpack__`` / ``__dlpack_device__``); records the stream each export
    was asked for and whether its capsule was given back."""

    def __init__(self, drv: FakeCudaDriver, host: np.ndarray, device: int = 0):
        self.inner = FakeCaiArray(drv, host, device)
        self.shape, self.dtype, self.device = host.shape, host.dtype, device
        self.streams: list = []

    def __dlpack_device__(self):
        return (2, self.device)

    def __dlpack__(self, stream=None, max_version=None, **kw):
        from tessera.frontend import dlpack
        self.streams.append(stream)
        return dlpack.export(self, self.inner.ptr, self.shape, self.dtype, dlpack.CUDA, self.device,
                             versioned=max_version is not None)


def device_view(drv: FakeCudaDriver, ptr: int, shape, dtype) -> np.ndarray:
    """A numpy view of fake device memory (what a test reads a result's bytes through)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    assert drv.owner(ptr, max(n, 1)) is not None
    return np.frombuffer((ctypes.c_char * n).from_address(ptr), dtype).reshape(shape)


def emulator_runner(exe):
    """A ``run=`` for FakeCudaDriver executing each launch with the warp emulator over host-backed memory."""
    from tessera.emulate.simt import Emulator
    from tessera.ir.text import parse_module
    emu = Emulator(parse_module(exe.target_ir), exe.target, exe.arch)

    def run(rec, drv):
        bufs = []
        for p, dt in zip(rec["ptrs"], rec["dtypes"]):
            base, _ = drv.owner(p)
            size = drv.live[base][2] - (p - base)
            bufs.append(np.frombuffer((ctypes.c_char * (size // dt.itemsize * dt.itemsize)).from_address(p), dt))
        emu.launch(rec["kernel"], rec["grid"], bufs, rec["scalars"], maps=[
            map_spec(m, rec["ptrs"]) for m in rec.get("tensormaps", [])] or None)
    return run


def map_spec(args: dict, ptrs: list[int]):
    """(TensorMapSpec, buffer index) of a map as the host encoded it: what the emulated copy engine reads."""
    from tessera.ir.tensor_map import TensorMapSpec
    elem = {6: "f16", 7: "f32", 9: "bf16", 0: "f8E4M3FN"}[args["dtype"]]
    swizzle = {0: "none", 1: "32B", 2: "64B", 3: "128B"}[args["swizzle"]]
    assert args["address"] in ptrs, "a tensor map names an address that is no buffer of the launch"
    assert args["oob"] == 0 and args["interleave"] == 0 and args["rank"] == 2
    spec = TensorMapSpec(elem, args["address"], tuple(args["dims"]), tuple(args["strides"]), tuple(args["box"]),
                         tuple(args["elem_strides"]), swizzle, "zero")
    return spec, ptrs.index(args["address"])
