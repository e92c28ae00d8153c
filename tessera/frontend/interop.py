"""Arrays of other frameworks in and out of a jitted function.

An argument with ``__dlpack__`` (torch CPU tensors, JAX arrays, CuPy, numpy) is read through
DLPack with no copy (DLPack 1.0 asked for first, the legacy protocol otherwise; see
``dlpack.py``); one with only ``__array_interface__`` through ``numpy.asarray``, also with no
copy.  A view that is not C-contiguous is copied once to C-contiguous layout (the kernels read
dense rows) and the lane report says so; a contiguous one is read in place.  Every imported
view is read-only: nothing of the caller's is ever written.  torch CPU tensors and JAX CPU
arrays take a faster zero-copy way first (``fastread.py``).

Ordinary calls note the same in the lane log when ``tessera.lane_log.inputs = True`` (off by
default, so a call pays one flag read): the call's entry gets ``inputs``, one line per foreign
argument, "read in place" or "copied to C-contiguous layout".

Refused, with a coded error:

- a torch tensor with ``requires_grad=True`` (REQUIRES_GRAD): a silent detach would lose its
  gradient; detach it, or call under ``torch.no_grad()`` on a detached tensor;
- an array in device memory (``__dlpack_device__`` CUDA, ROCm, ..., or ``__cuda_array_interface__``)
  on the CPU lane (DEVICE_ARRAY), naming the device and the lane: the CPU lane reads host memory.
  On ``target="nvidia"`` such arrays are taken where they are, with no copy (``device_call.py``:
  its rule for streams, devices, layouts and host/device mixes); the ROCm lane takes host arrays;
- a donated argument (``tessera.jit(donate_argnums=...)``) that may not be written (BAD_DONATION):
  a JAX array (immutable), a DLPack tensor whose producer marks it read-only, or one exported
  through the legacy protocol or ``__array_interface__`` (which do not say).  A donated tensor
  whose DLPack 1.0 export is writable is the one view Tessera may write (``donated_host``).

Results come back in the caller's framework: all array arguments torch -> torch tensors, all
JAX -> JAX arrays; numpy, or arrays of more than one framework, -> numpy arrays.  Python
numbers do not count.  A result is exported with no negative strides.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tessera.errors import ArgumentError, DeviceArrayError, DonationError, RequiresGradError
from tessera.frontend import device_call, dlpack, fastread
from tessera.runtime.lanes import LOG

_PLAIN = (np.ndarray, float, int, bool, type(None))
_PLAIN_TYPES = frozenset(_PLAIN)
_KINDS: dict[type, str] = {}   # an array type -> its framework ('torch', 'jax', 'numpy')


def is_array(a) -> bool:
    """Whether ``a`` is an array Tessera reads (numpy, or through DLPack / the array interface)."""
    return (isinstance(a, np.ndarray) or hasattr(a, "__dlpack__") or hasattr(a, "__array_interface__")
            or hasattr(a, "__cuda_array_interface__"))


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
    if not hasattr(a, "__dlpack__") and hasattr(a, "__cuda_array_interface__"):
        raise DeviceArrayError(
            f"{where} ({_describe(a)}) lives in CUDA memory (__cuda_array_interface__); the {fn.lane} lane reads "
            "host memory here" + (" (device arrays are taken by a call of the function, not by compile/explain)"
                                  if fn.target == "nvidia" else "") + ". Copy it to the host first")
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
            f"{where} ({_describe(a)}) lives on {dev}; " + (
                "a call of the function takes it where it is, but compile/explain read host arrays"
                if fn.target == "nvidia" else f"the {fn.lane} lane takes host arrays (device arrays are taken on "
                "the nvidia lane only so far)") + ". Copy it to the host first")
    imp = dlpack.from_capsule(_capsule(a, where))
    if notes is not None:
        proto = f"DLPack {imp.version[0]}.{imp.version[1]}" if imp.version != (0, 0) else "legacy DLPack"
        if imp.contiguous:
            notes.append(f"argument {i} ({_describe(a)}) read in place through {proto}, no copy")
        else:
            elems = tuple(s // imp.array.itemsize for s in imp.array.strides)
            notes.append(f"argument {i} ({_describe(a)}, strides {elems}) read through {proto}: not C-contiguous")
    return imp.array


def donated_host(a, i: int, fn) -> np.ndarray:
    """Donated argument ``i`` (a foreign array) as a WRITABLE numpy view of its memory, where its
    producer says through DLPack 1.0 that it may be written; else BAD_DONATION."""
    where = f"argument {i} of {fn.name}"
    if getattr(a, "requires_grad", False) is True:
        as_host(a, i, fn)   # REQUIRES_GRAD, as for any argument
    if framework(a) == "jax":
        raise DonationError(f"{where} is donated but is a JAX array (immutable): Tessera cannot write it; "
                            "donate numpy arrays or writable torch tensors")
    if not hasattr(a, "__dlpack__"):
        raise DonationError(f"{where} is donated but {_describe(a)} is read through __array_interface__, which does "
                            "not say whether it may be written; pass a numpy array or a DLPack 1.0 tensor")
    kind, _ = _device(a)
    if kind not in dlpack.HOST_DEVICES:
        as_host(a, i, fn)   # DEVICE_ARRAY, naming the device
    imp = dlpack.from_capsule(_capsule(a, where))
    if imp.version < (1, 0) or imp.read_only:
        why = "marks it read-only" if imp.read_only else "exports it through the legacy DLPack protocol, which does " \
            "not say whether it may be written"
        raise DonationError(f"{where} is donated but its producer ({_describe(a)}) {why}: Tessera never writes "
                            "such memory; do not donate it")
    if not imp.contiguous:
        raise DonationError(f"{where} is donated but not C-contiguous ({_describe(a)}): a result cannot take its "
                            "buffer; pass a contiguous tensor")
    arr = imp.array
    arr.flags.writeable = True   # the producer said it may be written
    return arr


def has_foreign(fn, args) -> bool:
    """Whether a call has an array argument other than a numpy array (static arguments aside)."""
    skip = fn._static
    return any(type(a) not in _PLAIN_TYPES and (fastread.reader(a) is not None or is_array(a))
               and not isinstance(a, np.ndarray) and i not in skip and i not in fn._learned
               for i, a in enumerate(args))


def call(fn, args: tuple):
    """``fn(*args)`` with foreign arrays read as numpy views, and its results in the callers' framework."""
    if fn.target != "cpu" and device_call.wants(fn, args):
        return device_call.call(fn, args)   # device-resident (nvidia), or its coded refusal
    kind, conv, static, learned = None, list(args), fn._static, fn._learned
    for i, a in enumerate(args):
        t = type(a)
        if t in _PLAIN_TYPES or i in static or i in learned:
            if t is np.ndarray and i not in static and i not in learned:
                kind = "numpy" if kind in (None, "numpy") else "mixed"
            continue
        if i in getattr(fn, "donate_argnums", ()):   # a buffer a result may take: it must be writable
            conv[i] = donated_host(a, i, fn)
            k = framework(a)
            kind = k if kind in (None, k) else "mixed"
            continue
        read = fastread.reader(a)
        arr = read(a) if read is not None else None
        if arr is None:
            if not is_array(a):
                continue
            arr = as_host(a, i, fn)
        k = _KINDS.get(t)
        if k is None:
            k = _KINDS[t] = "numpy" if isinstance(a, np.ndarray) else framework(a)
        kind = k if kind in (None, k) else "mixed"
        conv[i] = arr
    out = fn(*conv)
    if LOG.inputs:   # off by default: the notes cost a few microseconds a call
        _note_inputs(fn, args, conv)
    return export(out, kind if kind in ("torch", "jax") else "numpy")


def _note_inputs(fn, args, conv) -> None:
    """The lane log's entry of this call (the last one, of ``fn``) with how each foreign array was read."""
    notes = tuple(f"argument {i} ({_describe(a)}) " + ("read in place" if c.flags.c_contiguous else
                                                      "copied to C-contiguous layout")
                  for i, (a, c) in enumerate(zip(args, conv)) if a is not c and isinstance(c, np.ndarray))
    with LOG.lock:   # a call of the same function on another thread in between may take the note
        if LOG.entries and LOG.entries[-1].function == fn.name:
            LOG.entries[-1] = dataclasses.replace(LOG.entries[-1], inputs=notes)


def _positive(o: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(o) if any(s < 0 for s in o.strides) else o


def _to_torch(o: np.ndarray):
    import torch
    o = _positive(o)
    if not o.flags.writeable:   # torch has no read-only tensors: a copy of its own
        o = o.copy()
    if o.dtype.kind == "V" and o.dtype.name == "bfloat16":   # torch.from_numpy does not know ml_dtypes: the bits, viewed
        return torch.from_numpy(o.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(o)


def _to_jax(o: np.ndarray):
    o = _positive(o)
    fast = fastread.to_jax(np.ascontiguousarray(o))
    if fast is not None:
        return fast
    import jax.numpy as jnp
    if o.dtype.kind != "V" or o.dtype.name != "bfloat16":   # numpy does not export bfloat16 through DLPack
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
