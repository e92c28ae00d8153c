"""Arrays of other frameworks in and out of a jitted function.

An argument with ``__dlpack__`` (torch CPU tensors, JAX arrays, CuPy, numpy) is read through
DLPack with no copy (DLPack 1.0 asked for first, the legacy protocol otherwise; see
``dlpack.py``); one with only ``__array_interface__`` through ``numpy.asarray``, also with no
copy.  A view that is not C-contiguous is copied once to C-contiguous layout (the kernels read
dense rows) and the lane report says so; a contiguous one is read in place.  Every imported
view is read-only: nothing of the caller's is ever written.

Refused, with a coded error:

- a torch tensor with ``requires_grad=True`` (REQUIRES_GRAD): a silent detach would lose its
  gradient; detach it, or call under ``torch.no_grad()`` on a detached tensor;
- an array in device memory (``__dlpack_device__`` CUDA, ROCm, ...) (DEVICE_ARRAY), naming the
  device and the lane: the CPU lane reads host memory, and the GPU lanes take host arrays today.

Results come back in the caller's framework: all array arguments torch -> torch tensors, all
JAX -> JAX arrays; numpy, or arrays of more than one framework, -> numpy arrays.  Python
numbers do not count.  A result is exported with no negative strides.
"""
from __future__ import annotations

import numpy as np

from tessera.errors import ArgumentError, DeviceArrayError, RequiresGradError
from tessera.frontend import dlpack

_PLAIN = (np.ndarray, float, int, bool, type(None))


def is_array(a) -> bool:
    """Whether ``a`` is an array Tessera reads (numpy, or through DLPack / the array interface)."""
    return isinstance(a, np.ndarray) or hasattr(a, "__dlpack__") or hasattr(a, "__array_interface__")


def framework(a) -> str:
    """'torch', 'jax' or 'numpy' (any other array is returned as numpy)."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith(("jax", "jaxlib")):
        return "jax"
    return "numpy"


def _describe(a) -> str:
    shape = list(getattr(a, "shape", ()))
    return f"{type(a).__module__.split('.')[0]}.{type(a).__name__} {getattr(a, 'dtype', '?')}{shape}"


def _device(a) -> tuple[int, int]:
    try:
        dev = a.__dlpack_device__()
    except AttributeError:
        return dlpack.CPU, 0
    return int(dev[0]), int(dev[1])


def _capsule(a, where: str):
    try:
        try:
            return a.__dlpack__(max_version=(1, 0))
        except TypeError:   # a producer of the legacy protocol only
            return a.__dlpack__()
    except (BufferError, RuntimeError, ValueError) as e:
        raise ArgumentError(f"{where}: {_describe(a)} cannot be exported through DLPack: {e}") from None


def as_host(a, i: int, fn, notes: list | None = None) -> np.ndarray:
    """Argument ``i`` of ``fn`` (a JitFunction) as a read-only numpy view of the caller's memory."""
    if isinstance(a, np.ndarray):
        return np.asarray(a)   # a subclass (np.matrix, a masked array) as its plain data
    where = f"argument {i} of {fn.name}"
    if getattr(a, "requires_grad", False) is True:
        raise RequiresGradError(
            f"{where} is a torch tensor that requires grad: Tessera would have to detach it and its gradient "
            "would be lost. Pass x.detach() (no gradient flows through a tessera.jit call), or register the "
            "function as a torch op (tessera.torch.op)")
    if not hasattr(a, "__dlpack__"):
        arr = np.asarray(a)   # __array_interface__: a view of the object's buffer
        if notes is not None and arr.flags.c_contiguous:
            notes.append(f"argument {i} ({_describe(a)}) read in place through __array_interface__")
        return arr
    kind, dev_id = _device(a)
    if kind not in dlpack.HOST_DEVICES:
        dev = f"{dlpack.DEVICE_NAMES.get(kind, f'device type {kind}')}:{dev_id}"
        if fn.target == "cpu":
            raise DeviceArrayError(
                f"{where} ({_describe(a)}) lives on {dev}; the {fn.lane} lane reads host memory. Copy it to the "
                "host first (torch: x.cpu(); JAX: jax.device_get(x)), or compile for the device's lane")
        raise DeviceArrayError(
            f"{where} ({_describe(a)}) lives on {dev}; the {fn.lane} lane takes host arrays today (device "
            "arrays without a host round trip are not built yet). Copy it to the host first")
    imp = dlpack.from_capsule(_capsule(a, where))
    if notes is not None:
        proto = f"DLPack {imp.version[0]}.{imp.version[1]}" if imp.version != (0, 0) else "legacy DLPack"
        if imp.contiguous:
            notes.append(f"argument {i} ({_describe(a)}) read in place through {proto}, no copy")
        else:
            elems = tuple(s // imp.array.itemsize for s in imp.array.strides)
            notes.append(f"argument {i} ({_describe(a)}, strides {elems}) read through {proto}: not C-contiguous")
    return imp.array


def has_foreign(fn, args) -> bool:
    """Whether a call has an array argument other than a numpy array (static arguments aside)."""
    skip = fn._static
    return any(type(a) not in _PLAIN and is_array(a) and not isinstance(a, np.ndarray)
               and i not in skip and i not in fn._learned for i, a in enumerate(args))


def call(fn, args: tuple):
    """``fn(*args)`` with foreign arrays read as numpy views, and its results in the callers' framework."""
    kinds, conv = set(), []
    for i, a in enumerate(args):
        if i in fn._static or i in fn._learned or not is_array(a):
            conv.append(a)
            continue
        kinds.add("numpy" if isinstance(a, np.ndarray) else framework(a))
        conv.append(as_host(a, i, fn))
    out = fn(*conv)
    return export(out, kinds.pop() if len(kinds) == 1 else "numpy")


def _positive(o: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(o) if any(s < 0 for s in o.strides) else o


def _to_torch(o: np.ndarray):
    import torch
    o = _positive(o)
    if not o.flags.writeable:   # torch has no read-only tensors: a copy of its own
        o = o.copy()
    if o.dtype.name == "bfloat16":   # torch.from_numpy does not know ml_dtypes: the bits, viewed
        return torch.from_numpy(o.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(o)


def _to_jax(o: np.ndarray):
    import jax.numpy as jnp
    o = _positive(o)
    if o.dtype.name != "bfloat16":   # numpy does not export bfloat16 through DLPack
        try:
            return jnp.from_dlpack(o)   # no copy where JAX takes the buffer as it is
        except (BufferError, RuntimeError, TypeError, ValueError):
            pass
    return jnp.asarray(o)


def export(out, kind: str):
    """A result (an array or a tuple of them) in framework ``kind`` ('torch', 'jax' or 'numpy')."""
    if isinstance(out, tuple):
        return tuple(export(o, kind) for o in out)
    if not isinstance(out, np.ndarray):
        return out
    if kind == "torch":
        return _to_torch(out)
    if kind == "jax":
        return _to_jax(out)
    return _positive(out)
