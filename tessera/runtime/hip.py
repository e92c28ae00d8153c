"""A thin HIP module launcher for ROCm code objects, over ``hip-python`` (imported lazily).

Where ``hip-python`` and a ROCm device exist, the ROCm lane launches its ``.hsaco`` here:
load the module, copy the buffers to the device, launch with the kernel arguments packed
as the ABI says (one 8-byte pointer per buffer, then one int64 per size: ``docs/abi.md``),
synchronise, copy the outputs back.  Every ``hipError_t`` is checked; a machine without
the runtime or a device raises ``LaneUnavailableError``.  (No ROCm device has been
available to test this path: the tests cover the unavailable case and the argument packing.)
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any, Sequence

import numpy as np

from tessera.errors import CodegenError, LaneUnavailableError

_UNAVAILABLE = {"hipErrorNoDevice", "hipErrorInsufficientDriver", "hipErrorNotInitialized",
                "hipErrorNoBinaryForGpu", "hipErrorInvalidDevice"}


def _hip() -> Any | None:
    try:
        from hip import hip   # hip-python
        return hip
    except ImportError:
        return None


def _check(result: Any, what: str) -> Any:
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", None) or f"hipError {int(err)}"
        cls = LaneUnavailableError if name in _UNAVAILABLE else CodegenError
        raise cls(f"HIP {what} failed: {name}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


def device_available() -> tuple[bool, str]:
    hip = _hip()
    if hip is None:
        return False, "hip-python not installed"
    try:
        n = _check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
    except Exception as e:  # noqa: BLE001 - no runtime library, no driver: the lane is unavailable
        return False, f"HIP runtime unavailable: {e}"
    if not n:
        return False, "no ROCm device"
    props = hip.hipDeviceProp_t()
    _check(hip.hipGetDeviceProperties(props, 0), "hipGetDeviceProperties")
    return True, str(getattr(props, "gcnArchName", b"") or "").split(":")[0]


def pack_args(pointers: Sequence[int], sizes: Sequence[int]) -> bytes:
    """The kernel argument block: 8-byte pointers, then 8-byte signed sizes (docs/abi.md)."""
    return struct.pack(f"<{len(pointers)}Q{len(sizes)}q", *[int(p) for p in pointers], *[int(s) for s in sizes])


class HipModule:
    def __init__(self, hsaco: bytes):
        self._hip = _hip()
        if self._hip is None:
            raise LaneUnavailableError("the ROCm lane needs hip-python (pip install hip-python), which is not installed")
        try:
            self._module = _check(self._hip.hipModuleLoadData(bytes(hsaco)), "hipModuleLoadData")
        except (LaneUnavailableError, CodegenError):
            raise
        except Exception as e:  # noqa: BLE001
            raise LaneUnavailableError(f"HIP runtime unavailable: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        if getattr(self, "_module", None) is not None:
            try:
                self._hip.hipModuleUnload(self._module)
            finally:
                self._module = None

    def launch(self, kernel: str, grid, block, shared: int, buffers: list[np.ndarray], sizes: list[int],
               outputs: list[int]) -> None:
        hip = self._hip
        fn = _check(hip.hipModuleGetFunction(self._module, kernel.encode()), f"hipModuleGetFunction({kernel})")
        ptrs = []
        try:
            for b in buffers:
                ptrs.append(_check(hip.hipMalloc(max(b.nbytes, 1)), "hipMalloc"))
                if b.nbytes:
                    _check(hip.hipMemcpy(ptrs[-1], b.ctypes.data, b.nbytes, hip.hipMemcpyKind.hipMemcpyHostToDevice),
                           "hipMemcpy H2D")
            blob = ctypes.create_string_buffer(pack_args([int(p) for p in ptrs], sizes))
            size = ctypes.c_size_t(len(blob.raw))
            # HIP_LAUNCH_PARAM_BUFFER_POINTER = 1, _BUFFER_SIZE = 2, _END = 3
            extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(blob), 2, ctypes.addressof(size), 3)
            _check(hip.hipModuleLaunchKernel(fn, *grid, *block, shared, None, None, extra), f"launch {kernel}")
            _check(hip.hipDeviceSynchronize(), f"kernel {kernel}")
            for i in outputs:
                if buffers[i].nbytes:
                    _check(hip.hipMemcpy(buffers[i].ctypes.data, ptrs[i], buffers[i].nbytes,
                                         hip.hipMemcpyKind.hipMemcpyDeviceToHost), "hipMemcpy D2H")
        finally:
            for p in ptrs:
                hip.hipFree(p)
