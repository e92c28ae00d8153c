"""A thin CUDA driver-API launcher for cubins, over ``cuda-python``.

``cuda-python`` is imported lazily (``cuda.bindings.driver``, or ``cuda.cuda`` from releases
before 12.6): Tessera installs and its tests pass without it.  Every call's ``CUresult`` is
checked; failures raise :class:`LaneUnavailableError` when this machine cannot run the lane
(no driver, no device, no binary for this GPU) and :class:`CodegenError` otherwise, with the
CUDA error name in the message.

Kernel parameters are passed through ``kernelParams``: an array of pointers, one per
parameter, each to a 64-bit value (a device pointer per buffer, then an int64 per scalar).
The driver copies as many bytes as the kernel's parameter declares, so a ``.u32`` parameter
receives the low half of its int64 (little-endian), which is its value when it fits.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tessera.errors import ArgumentError, CodegenError, LaneUnavailableError, SharedMemoryLimitError
from tessera.ir.tensor_map import MAP_ALIGN, MAP_BYTES   # plain data (no xDSL): nvidia_check.py loads it by path

# Errors that mean "this machine cannot run the lane", not "the kernel or launch is wrong".
_UNAVAILABLE = {
    "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_NOT_INITIALIZED",
    "CUDA_ERROR_DEINITIALIZED", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "CUDA_ERROR_DEVICES_UNAVAILABLE",
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "CUDA_ERROR_NO_BINARY_FOR_GPU",
    "CUDA_ERROR_SYSTEM_NOT_READY", "CUDA_ERROR_STUB_LIBRARY", "CUDA_ERROR_OPERATING_SYSTEM",
}
_DEFAULT_DYNAMIC_SMEM = 48 * 1024   # above this a kernel must opt in to dynamic shared memory
_I64 = (-(1 << 63), (1 << 63) - 1)

# Every host<->device and device<->device copy the runtime makes, by kind ("HtoD", "DtoH", "DtoD",
# "HtoD scalar" for a runtime scalar's few bytes) -> [calls, bytes].  A device-resident call adds
# nothing under "HtoD" or "DtoH"; tests and the device script read these counts.
COPIES: dict[str, list[int]] = {}


def copies(kind: str) -> int:
    """How many copies of ``kind`` the runtime has made in this process."""
    return COPIES.get(kind, [0, 0])[0]


def _count(kind: str, nbytes: int) -> None:
    c = COPIES.setdefault(kind, [0, 0])
    c[0] += 1
    c[1] += int(nbytes)


def _driver() -> Any | None:
    """The cuda-python driver module, or None when cuda-python is not installed."""
    try:
        from cuda.bindings import driver
        return driver
    except ImportError:
        pass
    try:
        from cuda import cuda as driver  # cuda-python < 12.6
        return driver
    except ImportError:
        return None


def _name(err: Any) -> str:
    return getattr(err, "name", None) or f"CUresult {int(err)}"


def _check(result: Any, what: str) -> Any:
    """Unpack cuda-python's ``(CUresult, *values)`` and raise on failure; returns the value(s)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = _name(err)
        cls = LaneUnavailableError if name in _UNAVAILABLE else CodegenError
        raise cls(f"CUDA {what} failed: {name}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


def _current(cu) -> Any | None:
    """The thread's current context, None where there is none."""
    got = cu.cuCtxGetCurrent()
    return got[1] if int(got[0]) == 0 and got[1] is not None and int(got[1]) != 0 else None


def device_available() -> tuple[bool, str]:
    """``(True, device name)`` for CUDA device 0, else ``(False, reason)``; never raises."""
    drv = _driver()
    if drv is None:
        return False, "cuda-python not installed"
    try:
        _check(drv.cuInit(0), "cuInit")
        if _check(drv.cuDeviceGetCount(), "cuDeviceGetCount") < 1:
            return False, "no CUDA device"
        name = _check(drv.cuDeviceGetName(256, _check(drv.cuDeviceGet(0), "cuDeviceGet")), "cuDeviceGetName")
        name = name if isinstance(name, str) else bytes(name).decode(errors="replace")
        return True, name.split("\0", 1)[0].strip()
    except LaneUnavailableError as e:
        return False, "no CUDA device" if "CUDA_ERROR_NO_DEVICE" in e.message else e.message
    except Exception as e:  # a missing libcuda raises from inside cuda-python
        return False, f"CUDA driver unavailable: {type(e).__name__}: {e}"


def device_arch(device: int = 0) -> str | None:
    """``sm_XY`` of a CUDA device, or None when there is none (never raises)."""
    drv = _driver()
    if drv is None or not device_available()[0]:
        return None
    try:
        dev = _check(drv.cuDeviceGet(device), "cuDeviceGet")
        attr = drv.CUdevice_attribute
        major = _check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attr")
        minor = _check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attr")
        return f"sm_{major}{minor}"
    except Exception:
        return None


@dataclass
class KernelParams:
    """A ``void*[]`` for ``cuLaunchKernel``; ``values`` keeps the pointed-to ctypes alive; ``maps``
    are the 64-byte aligned 128-byte slots of by-value tensor maps (after the scalars)."""
    array: ctypes.Array
    values: list[ctypes.c_uint64 | ctypes.c_int64]
    maps: list[tuple[ctypes.Array, int]] = None     # (holder, aligned address)

    def set_map(self, j: int, data: bytes) -> None:
        if len(data) != MAP_BYTES:
            raise ArgumentError(f"a tensor map is {MAP_BYTES} bytes, got {len(data)}")
        ctypes.memmove(self.maps[j][1], data, MAP_BYTES)

    @property
    def address(self) -> int:
        """What to pass as ``kernelParams`` (0 when the kernel takes no parameters)."""
        return ctypes.addressof(self.array) if self.values or self.maps else 0

    @property
    def sizes(self) -> list[int]:
        return [ctypes.sizeof(v) for v in self.values]


def pack_params(pointers: Sequence[int], scalars: Sequence[int], n_maps: int = 0) -> KernelParams:
    """One uint64 per device pointer, then one int64 per scalar, then ``n_maps`` tensor-map slots
    (128 bytes each, 64-byte aligned as ``__grid_constant__ CUtensorMap`` is; zeroed until
    :meth:`KernelParams.set_map`), and the array of their addresses."""
    for p in pointers:
        if not 0 <= int(p) < (1 << 64):
            raise ArgumentError(f"device pointer {p!r} is not a 64-bit address")
    for s in scalars:
        if not isinstance(s, (int, np.integer)) or not _I64[0] <= int(s) <= _I64[1]:
            raise ArgumentError(f"kernel scalar {s!r} is not an int64")
    values = [ctypes.c_uint64(int(p)) for p in pointers] + [ctypes.c_int64(int(s)) for s in scalars]
    maps = []
    for _ in range(n_maps):
        holder = ctypes.create_string_buffer(MAP_BYTES + MAP_ALIGN)
        maps.append((holder, -(-ctypes.addressof(holder) // MAP_ALIGN) * MAP_ALIGN))
    slots = [ctypes.addressof(v) for v in values] + [a for _, a in maps]
    array = (ctypes.c_void_p * max(len(slots), 1))(*slots)
    return KernelParams(array, values, maps)


def _dims(name: str, d: Sequence[int]) -> tuple[int, int, int]:
    if len(d) != 3 or any(int(x) < 1 for x in d):
        raise ArgumentError(f"{name} must be three positive ints, got {tuple(d)}")
    return int(d[0]), int(d[1]), int(d[2])


class CudaModule:
    """A cubin loaded into device 0's primary context.  Use as a context manager or call
    :meth:`close`; device memory is allocated and freed per call."""

    def __init__(self, cubin: bytes, device: int = 0):
        self._cu = _driver()
        if self._cu is None:
            raise LaneUnavailableError("the CUDA lane needs cuda-python (pip install cuda-python), "
                                       "which is not installed")
        cu = self._cu
        self._module = self._ctx = self._dev = self._capture = None
        self.ordinal = int(device)
        self._opted: dict[str, int] = {}
        try:
            _check(cu.cuInit(0), "cuInit")
            self._dev = _check(cu.cuDeviceGet(device), "cuDeviceGet")
            self._ctx = _check(cu.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
            prev = _current(cu)
            _check(cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
            self._module = _check(cu.cuModuleLoadData(bytes(cubin)), "cuModuleLoadData")
            if prev is not None and int(prev) != int(self._ctx):   # the caller's context stays current
                cu.cuCtxSetCurrent(prev)
        except (LaneUnavailableError, CodegenError):
            self.close()
            raise
        except Exception as e:  # a missing libcuda raises from inside cuda-python
            self.close()
            raise LaneUnavailableError(f"CUDA driver unavailable: {type(e).__name__}: {e}") from e
        self._functions: dict[str, Any] = {}

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        cu, module, ctx, self._module, self._ctx = self._cu, self._module, self._ctx, None, None
        capture, self._capture = getattr(self, "_capture", None), None
        try:
            if capture is not None:
                cu.cuStreamDestroy(capture)
            if module is not None:
                cu.cuModuleUnload(module)
            if ctx is not None:
                cu.cuDevicePrimaryCtxRelease(self._dev)
        except Exception:
            pass

    def __enter__(self) -> "CudaModule":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_module", None) is not None:
            self.close()

    # ------------------------------------------------------------------ helpers
    def _function(self, kernel: str, shared_bytes: int) -> Any:
        cu = self._cu
        if self._module is None:
            raise CodegenError("CUDA module is closed")
        _check(cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        fn = self._functions.get(kernel)
        if fn is None:
            fn = self._functions[kernel] = _check(cu.cuModuleGetFunction(self._module, kernel.encode()),
                                                  f"cuModuleGetFunction({kernel})")
        if shared_bytes > max(_DEFAULT_DYNAMIC_SMEM, self._opted.get(kernel, 0)):   # opted in once per kernel
            limit = _check(cu.cuDeviceGetAttribute(
                cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self._dev),
                "cuDeviceGetAttribute(max shared memory per block, opt-in)")
            if shared_bytes > int(limit):
                raise SharedMemoryLimitError(f"kernel {kernel} needs {shared_bytes} bytes of shared memory per block; "
                                             f"CUDA device {self.ordinal} allows at most {int(limit)} (opt-in)")
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(cu.cuFuncSetAttribute(fn, attr, int(shared_bytes)), "cuFuncSetAttribute(max dynamic smem)")
            self._opted[kernel] = int(shared_bytes)
        return fn

    @staticmethod
    def _arrays(buffers: Sequence[np.ndarray], outputs: Sequence[int]) -> None:
        for i, b in enumerate(buffers):
            if not isinstance(b, np.ndarray) or not b.flags.c_contiguous:
                raise ArgumentError(f"buffer {i} must be a C-contiguous numpy array")
        for i in outputs:
            if not 0 <= i < len(buffers):
                raise ArgumentError(f"output index {i} is out of range for {len(buffers)} buffers")
            if not buffers[i].flags.writeable:
                raise ArgumentError(f"output buffer {i} is read-only")

    def _upload(self, buffers: Sequence[np.ndarray], ptrs: list[Any]) -> None:
        """Allocate and fill one device buffer per array, appending to ``ptrs`` as it goes
        (so that the caller frees what was allocated if a later step fails)."""
        cu = self._cu
        for b in buffers:
            ptrs.append(_check(cu.cuMemAlloc(max(b.nbytes, 1)), "cuMemAlloc"))
            if b.nbytes:
                _check(cu.cuMemcpyHtoD(ptrs[-1], b.ctypes.data, b.nbytes), "cuMemcpyHtoD")
                _count("HtoD", b.nbytes)

    def _free(self, ptrs: list[Any]) -> None:
        for p in ptrs:
            try:
                self._cu.cuMemFree(p)
            except Exception:
                pass

    def _launch(self, fn: Any, kernel: str, grid, block, shared_bytes: int, params: KernelParams) -> None:
        _check(self._cu.cuLaunchKernel(fn, *grid, *block, int(shared_bytes), 0, params.address, 0),
               f"cuLaunchKernel({kernel})")

    # ------------------------------------------------------------------ API
    def _params(self, ptrs: list, scalars: Sequence[int], tensor_maps: Sequence[dict]) -> KernelParams:
        """Pointers, scalars, then each ABI ``tensormap`` parameter encoded by the driver for its
        buffer's device address and these sizes (``runtime/cuda_tensor_map.py``)."""
        params = pack_params([int(p) for p in ptrs], scalars, len(tensor_maps))
        if tensor_maps:
            from tessera.ir.tensor_map import spec_for
            for j, p in enumerate(tensor_maps):
                params.set_map(j, self.encode_tensor_map(spec_for(p["record"], int(ptrs[p["buffer"]]), scalars)))
        return params

    def launch(self, kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int,
               buffers: list[np.ndarray], scalars: list[int], outputs: list[int],
               tensor_maps: Sequence[dict] = ()) -> None:
        """Copy every buffer to the device, run ``kernel`` once, synchronise, and copy the
        buffers at indices ``outputs`` back into their arrays in place.  ``tensor_maps``: the
        kernel's ABI ``tensormap`` parameters (copy-engine kernels), encoded after the upload."""
        grid, block = _dims("grid", grid), _dims("block", block)
        self._arrays(buffers, outputs)
        fn = self._function(kernel, shared_bytes)
        cu, ptrs = self._cu, []
        try:
            self._upload(buffers, ptrs)
            params = self._params(ptrs, scalars, tensor_maps)
            self._launch(fn, kernel, grid, block, shared_bytes, params)
            _check(cu.cuCtxSynchronize(), f"kernel {kernel}")
            for i in outputs:
                if buffers[i].nbytes:
                    _check(cu.cuMemcpyDtoH(buffers[i].ctypes.data, ptrs[i], buffers[i].nbytes), "cuMemcpyDtoH")
                    _count("DtoH", buffers[i].nbytes)
        finally:
            self._free(ptrs)

    def time(self, kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int,
             buffers: list[np.ndarray], scalars: list[int], repeats: int = 20, warmup: int = 3,
             tensor_maps: Sequence[dict] = ()) -> list[float]:
        """Milliseconds per launch, measured with CUDA events around each of ``repeats``
        launches after ``warmup`` untimed ones; the buffers stay on the device throughout
        and nothing is copied back."""
        grid, block = _dims("grid", grid), _dims("block", block)
        if repeats < 1 or warmup < 0:
            raise ArgumentError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
        self._arrays(buffers, [])
        fn = self._function(kernel, shared_bytes)
        cu, ptrs, events = self._cu, [], []
        try:
            self._upload(buffers, ptrs)
            params = self._params(ptrs, scalars, tensor_maps)
            for _ in range(2):
                events.append(_check(cu.cuEventCreate(0), "cuEventCreate"))
            start, end = events
            for _ in range(warmup):
                self._launch(fn, kernel, grid, block, shared_bytes, params)
            _check(cu.cuCtxSynchronize(), f"kernel {kernel} (warmup)")
            times = []
            for _ in range(repeats):
                _check(cu.cuEventRecord(start, 0), "cuEventRecord")
                self._launch(fn, kernel, grid, block, shared_bytes, params)
                _check(cu.cuEventRecord(end, 0), "cuEventRecord")
                _check(cu.cuEventSynchronize(end), f"kernel {kernel}")
                times.append(float(_check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")))
            return times
        finally:
            for e in events:
                try:
                    cu.cuEventDestroy(e)
                except Exception:
                    pass
            self._free(ptrs)

    # ------------------------------------------------------------------ device-resident calls
    # The pieces a launch plan (runtime/cuda_plan.py) is made of: stream-ordered memory, copies that
    # are counted (COPIES), launches on a given stream, cross-stream ordering, and graph capture.
    # Pointers and stream handles are plain ints here (cuda-python accepts ints for CUdeviceptr and
    # CUstream); 0 is the legacy default stream.
    @contextmanager
    def entered(self):
        """This module's context current in the block, the thread's previous one restored after it (torch's
        runtime API takes the current context for its current device: a call must not change it)."""
        if self._module is None:
            raise CodegenError("CUDA module is closed")
        cu = self._cu
        prev = _current(cu)
        switch = prev is None or int(prev) != int(self._ctx)
        if switch:
            _check(cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        try:
            yield self
        finally:
            if switch and prev is not None:
                cu.cuCtxSetCurrent(prev)

    def encode_tensor_map(self, spec) -> bytes:
        """The driver's encoding of a tensor map (``runtime/cuda_tensor_map.py``)."""
        from tessera.runtime import cuda_tensor_map
        return cuda_tensor_map.encode(self._cu, spec)

    def function(self, kernel: str, shared_bytes: int) -> Any:
        """The kernel's handle, opted in to ``shared_bytes`` of dynamic shared memory (once)."""
        return self._function(kernel, shared_bytes)

    def alloc(self, nbytes: int, stream: int) -> int:
        """``nbytes`` of device memory, stream-ordered on ``stream`` (no device-wide synchronisation)."""
        return int(_check(self._cu.cuMemAllocAsync(max(int(nbytes), 1), stream), "cuMemAllocAsync"))

    def free(self, ptr: int, stream: int) -> None:
        """Give back what :meth:`alloc` gave, stream-ordered after the work queued on ``stream``."""
        _check(self._cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")

    def copy_in(self, dst: int, src: np.ndarray, stream: int, kind: str = "HtoD") -> None:
        if src.nbytes:
            _check(self._cu.cuMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, stream), "cuMemcpyHtoDAsync")
            _count(kind, src.nbytes)

    def copy_out(self, dst: np.ndarray, src: int, stream: int) -> None:
        if dst.nbytes:
            _check(self._cu.cuMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, stream), "cuMemcpyDtoHAsync")
            _count("DtoH", dst.nbytes)

    def copy_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        if nbytes:
            _check(self._cu.cuMemcpyDtoDAsync(dst, src, int(nbytes), stream), "cuMemcpyDtoDAsync")
            _count("DtoD", nbytes)

    def copy_rows(self, dst: int, src: int, row_bytes: int, rows: int, src_pitch: int, stream: int) -> None:
        """``rows`` rows of ``row_bytes``, ``src_pitch`` bytes apart, packed densely at ``dst`` (one 2-D copy)."""
        cu = self._cu
        p = cu.CUDA_MEMCPY2D()
        p.srcMemoryType = p.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcDevice, p.srcPitch, p.dstDevice, p.dstPitch = src, int(src_pitch), dst, int(row_bytes)
        p.WidthInBytes, p.Height = int(row_bytes), int(rows)
        _check(cu.cuMemcpy2DAsync(p, stream), "cuMemcpy2DAsync")
        _count("DtoD", row_bytes * rows)

    def synchronize(self, stream: int) -> None:
        _check(self._cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def wait(self, consumer: int, producer: int) -> None:
        """Order ``consumer`` after the work queued so far on ``producer`` (an event, no host wait)."""
        cu = self._cu
        ev = _check(cu.cuEventCreate(int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)), "cuEventCreate")   # a uint flag
        try:
            _check(cu.cuEventRecord(ev, producer), "cuEventRecord")
            _check(cu.cuStreamWaitEvent(consumer, ev, 0), "cuStreamWaitEvent")
        finally:
            cu.cuEventDestroy(ev)

    def pointer_device(self, ptr: int) -> int | None:
        """The ordinal of the device whose memory ``ptr`` is; None where CUDA does not know the address."""
        attr = self._cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        result = self._cu.cuPointerGetAttribute(attr, ptr)
        return int(result[1]) if int(result[0]) == 0 else None

    def launch_on(self, fn: Any, kernel: str, grid, block, shared_bytes: int, params: KernelParams,
                  stream: int) -> None:
        _check(self._cu.cuLaunchKernel(fn, *grid, *block, int(shared_bytes), stream, params.address, 0),
               f"cuLaunchKernel({kernel})")

    # graph capture: the launches of one call recorded on a private stream (capturing runs nothing, and
    # the legacy default stream cannot be captured), instantiated once, replayed on the caller's stream
    def capture_stream(self) -> int:
        if self._capture is None:
            flag = int(self._cu.CUstream_flags.CU_STREAM_NON_BLOCKING)   # a uint flag; enum-typed arguments take the enum
            self._capture = _check(self._cu.cuStreamCreate(flag), "cuStreamCreate")
        return int(self._capture)

    def begin_capture(self, stream: int) -> None:
        mode = self._cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(self._cu.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")

    def end_capture(self, stream: int) -> Any:
        return _check(self._cu.cuStreamEndCapture(stream), "cuStreamEndCapture")

    def instantiate(self, graph: Any) -> Any:
        cu = self._cu
        if hasattr(cu, "cuGraphInstantiateWithFlags"):
            return _check(cu.cuGraphInstantiateWithFlags(graph, 0), "cuGraphInstantiate")
        return _check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def update(self, graph_exec: Any, graph: Any) -> bool:
        """Patch an instantiated graph with a newly captured one of the same shape (new pointers);
        False where CUDA says the update is not possible (then instantiate afresh)."""
        result = self._cu.cuGraphExecUpdate(graph_exec, graph)
        err = result[0] if isinstance(result, tuple) else result
        return int(err) == 0

    def graph_launch(self, graph_exec: Any, stream: int) -> None:
        _check(self._cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")

    def destroy_graph(self, graph: Any) -> None:
        self._cu.cuGraphDestroy(graph)

    def destroy_exec(self, graph_exec: Any) -> None:
        self._cu.cuGraphExecDestroy(graph_exec)
