"""Read a DLPack capsule as a numpy view, with no copy.

``numpy.from_dlpack`` refuses bfloat16 (DLPack's ``kDLBfloat`` code) and hides the producer's
read-only flag, so the capsule is read here: the ``DLManagedTensorVersioned`` of DLPack 1.0
(``"dltensor_versioned"``) or the legacy ``DLManagedTensor`` (``"dltensor"``).  The capsule is
renamed ``used_...`` as the protocol asks, and the producer's deleter runs when the last numpy
view of its memory is collected.  Every view handed out is read-only: Tessera reads its
arguments and never writes them.
"""
from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import numpy as np

from tessera.errors import DtypeError

# DLDeviceType codes (dlpack.h)
CPU, CUDA, CUDA_HOST, OPENCL, VULKAN, METAL, VPI, ROCM, ROCM_HOST, EXT_DEV, CUDA_MANAGED, ONEAPI, WEBGPU, HEXAGON = (
    1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cuda_host", OPENCL: "opencl", VULKAN: "vulkan",
                METAL: "metal", VPI: "vpi", ROCM: "rocm", ROCM_HOST: "rocm_host", EXT_DEV: "ext_dev",
                CUDA_MANAGED: "cuda_managed", ONEAPI: "oneapi", WEBGPU: "webgpu", HEXAGON: "hexagon"}
HOST_DEVICES = frozenset({CPU, CUDA_HOST, ROCM_HOST})   # memory the host CPU reads directly

READ_ONLY = 1 << 0   # DLPACK_FLAG_BITMASK_READ_ONLY
IS_COPIED = 1 << 1   # DLPACK_FLAG_BITMASK_IS_COPIED

# DLDataTypeCode
INT, UINT, FLOAT, BFLOAT, COMPLEX, BOOL = 0, 1, 2, 4, 5, 6


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


# the deleter is called with the GIL held: a producer's deleter may drop Python references
_Deleter = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_void_p]
# the capsule keeps a pointer to its name: these buffers live as long as the module
_USED = {b"dltensor": ctypes.create_string_buffer(b"used_dltensor"),
         b"dltensor_versioned": ctypes.create_string_buffer(b"used_dltensor_versioned")}


@dataclass(frozen=True)
class Imported:
    """A capsule's tensor as a (read-only) numpy view, and what the producer said about it."""
    array: np.ndarray
    version: tuple[int, int]          # (0, 0) for the legacy protocol
    read_only: bool                   # the producer's READ_ONLY flag (legacy: unknown, False)
    copied: bool                      # the producer's IS_COPIED flag
    contiguous: bool                  # C-contiguous as the producer laid it out


def dtype_of(code: int, bits: int, lanes: int) -> np.dtype:
    """The numpy dtype of a DLDataType; bfloat16 (code 4) as ml_dtypes.bfloat16."""
    if lanes != 1:
        raise DtypeError(f"a DLPack tensor of {lanes}-lane vectors is not supported")
    if code == BFLOAT and bits == 16:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    kinds = {INT: "i", UINT: "u", FLOAT: "f", BOOL: "b", COMPLEX: "c"}
    if code in kinds and bits % 8 == 0:
        try:
            return np.dtype(f"{kinds[code]}{bits // 8}")
        except TypeError:
            pass
    raise DtypeError(f"DLPack dtype (code {code}, {bits} bits) has no numpy equivalent here")


def _release(address: int, deleter) -> None:
    deleter(address)


def _open(capsule):
    """(name, address, managed struct, (major, minor), flags) of an unconsumed capsule."""
    name = _api.PyCapsule_GetName(capsule)
    if name not in _USED:
        raise DtypeError(f"not an unconsumed DLPack capsule (its name is {name!r})")
    address = _api.PyCapsule_GetPointer(capsule, name)
    if name == b"dltensor_versioned":
        m = _ManagedVersioned.from_address(address)
        return name, address, m, (m.version.major, m.version.minor), m.flags
    return name, address, _Managed.from_address(address), (0, 0), 0


def from_capsule(capsule) -> Imported:
    """The capsule's tensor as a numpy view of the producer's memory (consumes the capsule)."""
    name, address, m, version, flags = _open(capsule)
    t = m.dl_tensor
    if t.device.device_type not in HOST_DEVICES:   # callers check __dlpack_device__ first; never read it
        raise DtypeError(f"DLPack tensor on device {DEVICE_NAMES.get(t.device.device_type, t.device.device_type)}")
    dtype = dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes)   # before consuming: a refusal leaves it whole
    _api.PyCapsule_SetName(capsule, ctypes.addressof(_USED[name]))
    deleter = m.deleter if m.deleter else None
    shape = tuple(t.shape[i] for i in range(t.ndim))
    item = dtype.itemsize
    dense, run = [], item   # C-contiguous byte strides
    for n in reversed(shape):
        dense.append(run)
        run *= n
    dense = tuple(reversed(dense))
    strides = tuple(t.strides[i] * item for i in range(t.ndim)) if t.strides and t.ndim else dense
    contiguous = all(s == c for s, c, n in zip(strides, dense, shape) if n != 1)
    if 0 in shape or t.data is None:
        arr = np.empty(shape, dtype)   # nothing to read: the producer's memory goes back at once
        if deleter is not None:
            deleter(address)
    else:
        low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
        high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + item
        start = t.data + t.byte_offset + low
        buf = (ctypes.c_char * (high - low)).from_address(start)
        if deleter is not None:
            weakref.finalize(buf, _release, address, deleter)
        arr = np.ndarray(shape, dtype, buffer=buf, offset=-low, strides=strides)
    arr.flags.writeable = False
    return Imported(arr, version, bool(flags & READ_ONLY), bool(flags & IS_COPIED), contiguous)


# --------------------------------------------------------------------------- device memory (GPU lanes)
@dataclass(frozen=True)
class DeviceView:
    """A device tensor's address and layout, read from a capsule (nothing is dereferenced)."""
    ptr: int                          # data + byte_offset
    shape: tuple[int, ...]
    strides: tuple[int, ...]          # in bytes
    dtype: np.dtype
    device_type: int
    device_id: int
    read_only: bool
    version: tuple[int, int]
    release: object                   # call once the kernels reading it are queued (the producer's deleter)


def device_view(capsule) -> DeviceView:
    """The capsule's tensor as an address and layout (consumes the capsule; ``release()`` gives it back)."""
    name, address, m, version, flags = _open(capsule)
    t = m.dl_tensor
    dtype = dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    _api.PyCapsule_SetName(capsule, ctypes.addressof(_USED[name]))
    deleter = m.deleter if m.deleter else None
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides and t.ndim:
        strides = tuple(t.strides[i] * dtype.itemsize for i in range(t.ndim))
    else:
        strides = _dense(shape, dtype.itemsize)
    done = []

    def release():
        if deleter is not None and not done:
            done.append(1)
            deleter(address)
    return DeviceView(int(t.data or 0) + int(t.byte_offset), shape, strides, dtype, int(t.device.device_type),
                      int(t.device.device_id), bool(flags & READ_ONLY), version, release)


def _dense(shape, item: int) -> tuple[int, ...]:
    out, run = [], item
    for n in reversed(shape):
        out.append(run)
        run *= n
    return tuple(reversed(out))


_CODES = {"f": FLOAT, "i": INT, "u": UINT, "b": BOOL, "c": COMPLEX}
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_EXPORTED: dict[int, tuple] = {}   # a managed tensor's address -> (its ctypes memory, the owner): alive until deleted
_NAME_V1, _NAME_V0 = b"dltensor_versioned", b"dltensor"
# the capsule's destructor runs while the capsule dies (refcount 0): it takes the raw pointer, never a py_object
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_raw_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))


@_Deleter
def _export_deleter(address):
    _EXPORTED.pop(address, None)   # drops the owner: its memory goes when nothing else holds it


@ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    for name in (_NAME_V1, _NAME_V0):   # never consumed: the protocol says the producer deletes
        if _raw_is_valid(capsule, name):
            _EXPORTED.pop(_raw_pointer(capsule, name), None)


def export(owner, ptr: int, shape, dtype, device_type: int, device_id: int, versioned: bool = True,
           read_only: bool = False):
    """A DLPack capsule of the memory at ``ptr`` (C-contiguous ``shape``/``dtype``) that keeps ``owner``
    alive until the consumer calls the deleter (or the capsule dies unconsumed)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "V" and dtype.name == "bfloat16":
        code = BFLOAT
    elif dtype.kind in _CODES:
        code = _CODES[dtype.kind]
    else:
        raise DtypeError(f"dtype {dtype} cannot be exported through DLPack")
    ndim = len(shape)
    dims = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*[s // dtype.itemsize for s in _dense(shape, dtype.itemsize)])
    managed = _ManagedVersioned() if versioned else _Managed()
    t = managed.dl_tensor
    t.data, t.ndim, t.byte_offset = ptr or None, ndim, 0
    t.device.device_type, t.device.device_id = device_type, device_id
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, dtype.itemsize * 8, 1
    t.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    managed.deleter = _export_deleter
    if versioned:
        managed.version.major, managed.version.minor = 1, 0
        managed.flags = READ_ONLY if read_only else 0
    address = ctypes.addressof(managed)
    _EXPORTED[address] = (managed, dims, strides, owner)
    return _api.PyCapsule_New(address, _NAME_V1 if versioned else _NAME_V0,
                              ctypes.cast(_capsule_destructor, ctypes.c_void_p))
