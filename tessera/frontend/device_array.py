"""Arrays in device memory on their way into and out of a GPU-lane call.

:class:`DeviceRef` is an argument as the runtime sees it: an address, a shape, byte strides, a
dtype, a device and (``__cuda_array_interface__``) the producer's stream.  It is read from
``__cuda_array_interface__`` (a dict: the cheap way, taken first) or from a DLPack capsule
(``__dlpack__(stream=...)``: the producer orders its work before the consumer's stream).

:class:`DeviceArray` is a result: device memory the runtime allocated, exposing
``__cuda_array_interface__`` (version 3, with its stream) and ``__dlpack__`` /
``__dlpack_device__`` (DLPack 1.0 and legacy), so torch (``torch.from_dlpack``), CuPy and any
other consumer take it without a copy.  The memory is freed, stream-ordered, when the last
holder (this object, or a consumer's tensor through the capsule) lets go.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tessera.errors import DeviceArrayError
from tessera.frontend import dlpack

DEVICE_LANES = {"nvidia": frozenset({dlpack.CUDA, dlpack.CUDA_MANAGED}), "rocm": frozenset({dlpack.ROCM})}


def norm_stream(s: int | None) -> int | None:
    """A stream handle for the driver: 1 (the protocols' name for the legacy default stream) is 0."""
    return None if s is None else 0 if int(s) in (0, 1) else int(s)


def protocol_stream(s: int) -> int:
    """A stream handle for DLPack / ``__cuda_array_interface__``, where 0 is not allowed (ambiguous)."""
    return 1 if s == 0 else s


@dataclass
class DeviceRef:
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]          # bytes
    dtype: np.dtype
    device_type: int
    device_id: int
    stream: int | None                # the producer's stream (__cuda_array_interface__), None: nothing to wait for
    read_only: bool
    how: str                          # "__cuda_array_interface__" or "DLPack 1.0" ...
    release: object = None            # a DLPack producer's deleter, called when the call's launches are queued

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def contiguous(self) -> bool:
        dense = dlpack._dense(self.shape, self.dtype.itemsize)
        return all(s == d for s, d, n in zip(self.strides, dense, self.shape) if n != 1)


def device_of(a) -> tuple[int, int] | None:
    """``(DLPack device type, id)`` of an array in device memory, None for host memory or a non-array.
    A ``__cuda_array_interface__`` object without ``__dlpack_device__`` reports id -1 (the pointer tells)."""
    try:
        kind, dev = a.__dlpack_device__()
    except AttributeError:
        pass
    else:
        return None if int(kind) in dlpack.HOST_DEVICES else (int(kind), int(dev))
    try:
        a.__cuda_array_interface__   # raises AttributeError on a host tensor (torch)
    except AttributeError:
        return None
    return dlpack.CUDA, -1


def cai_of(a) -> dict | None:
    """``a.__cuda_array_interface__``, or None where it has none or refuses to give it (torch raises for a
    bfloat16 tensor: DLPack reads those)."""
    try:
        return a.__cuda_array_interface__
    except (AttributeError, TypeError, RuntimeError, ValueError):
        return None


def _typestr(t: str) -> np.dtype:
    if t.endswith("V2") or t == "bfloat16":
        raise DeviceArrayError("a __cuda_array_interface__ typestr '<V2' is ambiguous (bfloat16 has no typestr): "
                               "pass the array through DLPack")
    return np.dtype(t)


def read(a, where: str, device: tuple[int, int], stream: int) -> DeviceRef:
    """Argument ``a`` as a :class:`DeviceRef`; ``stream`` is the stream the call will run on (a DLPack
    producer orders its pending work before it)."""
    cai = cai_of(a) if device[0] == dlpack.CUDA else None
    if cai is not None:
        if cai.get("mask") is not None:
            from tessera.errors import DeviceLayoutError
            raise DeviceLayoutError(f"{where} is a masked __cuda_array_interface__ array; masks are not read")
        shape = tuple(int(n) for n in cai["shape"])
        dtype = _typestr(cai["typestr"])
        ptr, ro = cai["data"]
        strides = cai.get("strides")
        strides = tuple(int(s) for s in strides) if strides is not None else dlpack._dense(shape, dtype.itemsize)
        s = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
        return DeviceRef(int(ptr or 0), shape, strides, dtype, device[0], device[1], norm_stream(s), bool(ro),
                         f"__cuda_array_interface__ v{cai.get('version', '?')}")
    try:
        try:
            cap = a.__dlpack__(stream=protocol_stream(stream), max_version=(1, 0))
        except TypeError:   # a producer of the legacy protocol only
            cap = a.__dlpack__(stream=protocol_stream(stream))
    except (BufferError, RuntimeError, ValueError, TypeError) as e:
        raise DeviceArrayError(f"{where} cannot be exported through DLPack: {e}") from None
    v = dlpack.device_view(cap)
    how = f"DLPack {v.version[0]}.{v.version[1]}" if v.version != (0, 0) else "legacy DLPack"
    return DeviceRef(v.ptr, v.shape, v.strides, v.dtype, v.device_type, v.device_id, None, v.read_only, how,
                     v.release)


class DeviceArray:
    """A result in device memory (see the module's docstring).  ``copy_to_host()`` gives a numpy copy."""
    __slots__ = ("_buf", "__weakref__")

    def __init__(self, buf):
        self._buf = buf   # runtime.launch_plan.DeviceBuffer: frees the memory when the last holder goes

    shape = property(lambda self: self._buf.shape)
    dtype = property(lambda self: self._buf.dtype)
    device = property(lambda self: self._buf.device)
    stream = property(lambda self: self._buf.stream)
    ptr = property(lambda self: self._buf.ptr)
    nbytes = property(lambda self: self._buf.nbytes)

    def __repr__(self) -> str:
        return f"tessera.DeviceArray(cuda:{self.device}, {self.dtype}, shape={list(self.shape)})"

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.dtype.kind == "V":
            raise AttributeError("bfloat16 has no __cuda_array_interface__ typestr; use DLPack (__dlpack__)")
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "strides": None,
                "version": 3, "stream": protocol_stream(self.stream)}

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack.CUDA, self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"a tessera.DeviceArray lives on cuda:{self.device}; it is not copied to {dl_device}")
        if copy is True:
            raise BufferError("tessera.DeviceArray exports its memory without a copy (copy=True is not supported)")
        if stream is not None and stream != -1:
            consumer = norm_stream(stream)
            if consumer != self.stream:   # the consumer's stream waits for the kernels that made this array
                with self._buf.module.entered() as mod:
                    mod.wait(consumer, self.stream)
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return dlpack.export(self, self.ptr, self.shape, self.dtype, dlpack.CUDA, self.device, versioned)

    def copy_to_host(self) -> np.ndarray:
        """A numpy copy (a counted device-to-host copy, then the stream is synchronised)."""
        out = np.empty(self.shape, self.dtype)
        mod = self._buf.module
        with mod.entered():
            mod.copy_out(out, self.ptr, self.stream)
            mod.synchronize(self.stream)
        return out


def to_framework(kind: str, arr: DeviceArray):
    """A result as the callers' framework holds device memory: torch and CuPy through DLPack, no copy."""
    if kind == "torch":
        import torch
        return torch.from_dlpack(arr)
    if kind == "cupy":
        import cupy
        return cupy.from_dlpack(arr)
    return arr
