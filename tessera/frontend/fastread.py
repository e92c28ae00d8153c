"""The per-call fast path for torch CPU tensors and JAX CPU arrays (issue 29's interop).

Reading a DLPack capsule through ctypes costs tens of microseconds per tensor; for the two
common producers a cheaper zero-copy view exists:

- a torch CPU tensor (exactly ``torch.Tensor``, no grad, not conjugated / negated, not bf16):
  a view of its memory through ``__array_interface__`` (``data_ptr``, strides in bytes), strides
  and offset honoured (not ``tensor.numpy()``, which marks the storage not resizable for good);
- a JAX array on one CPU device (exactly ``jaxlib``'s ``ArrayImpl``): ``numpy.asarray`` reads
  it through the buffer protocol, a read-only view of its buffer.

Each view handed out is read-only.  Anything else (a subclass, a device array, bf16 torch, a
sharded JAX array, a producer this module does not know) returns ``None`` and goes the general
way (``interop.as_host``: DLPack / ``__array_interface__``, its checks and coded errors).

Results go back the cheap way too: torch through ``torch.from_numpy`` (``interop``), JAX through
the one-device put that ``jax.device_put`` ends in (about 5x cheaper than ``jnp.asarray``), for
dtypes JAX holds as they are whatever ``jax_enable_x64`` says (64-bit ones take ``jnp.asarray``).
"""
from __future__ import annotations

import numpy as np

_READERS: dict[type, object] = {}   # exact type -> reader(a) -> read-only ndarray | None
_LOOKED: set[str] = set()           # frameworks whose readers were looked for
_JAX_HOST: dict = {}                # a JAX sharding -> whether it is one CPU device
_JAX_PUT: list = []                 # [put(o) -> jax.Array | None] once made


def reader(a):
    """The fast reader for ``type(a)``, or None (then ``interop.as_host`` reads it)."""
    t = type(a)
    r = _READERS.get(t)
    if r is None and t not in _READERS:
        mod = t.__module__.split(".")[0]
        if mod not in _LOOKED:
            _LOOKED.add(mod)
            _register(mod)
        r = _READERS.setdefault(t, None)
    return r


def _register(mod: str) -> None:
    if mod == "torch":
        import torch
        _READERS[torch.Tensor] = _torch_reader(torch)
    elif mod in ("jaxlib", "jax"):
        try:
            from jax.sharding import SingleDeviceSharding
            from jaxlib import _jax
            impl = _jax.ArrayImpl
        except (ImportError, AttributeError):   # another jaxlib layout: the general way
            return
        _READERS[impl] = _jax_reader(SingleDeviceSharding)


class _TorchView:
    """A torch tensor's memory as ``__array_interface__`` (read-only); it holds the tensor, so numpy's
    view (whose ``base`` this is) keeps the storage alive."""

    __slots__ = ("__array_interface__", "tensor")


def _torch_reader(torch):
    types = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2", torch.int8: "|i1",
             torch.int32: "<i4", torch.int64: "<i8", torch.bool: "|b1", torch.uint8: "|u1", torch.int16: "<i2"}

    def read(a):
        if a.requires_grad or not a.is_cpu or a.is_conj() or a.is_neg():
            return None   # refused, or read through DLPack
        typestr = types.get(a.dtype)
        if typestr is None:
            return None   # bf16 (numpy has no such dtype) and the rest: DLPack
        # Not ``a.numpy()``: that marks the tensor's storage not resizable for good, and FSDP frees
        # an unsharded parameter by resizing its storage to 0 after the backward.
        if a.numel() == 0:
            arr = np.empty(tuple(a.shape), typestr)
        else:
            v = _TorchView()
            v.tensor = a
            item = a.element_size()
            v.__array_interface__ = {"data": (a.data_ptr(), True), "shape": tuple(a.shape), "typestr": typestr,
                                     "strides": tuple(s * item for s in a.stride()), "version": 3}
            arr = np.asarray(v)   # a read-only view of the tensor's memory, strides and offset honoured
        arr.flags.writeable = False
        return arr
    return read


def _jax_reader(single):
    def host(sharding) -> bool:
        ok = _JAX_HOST.get(sharding)
        if ok is None:
            ok = type(sharding) is single and all(d.platform == "cpu" for d in sharding.device_set)
            if len(_JAX_HOST) > 64:
                _JAX_HOST.clear()
            _JAX_HOST[sharding] = ok
        return ok

    def read(a):
        if not host(a.sharding):
            return None
        arr = np.asarray(a)   # the buffer protocol: a view of the device buffer in host memory
        if arr.flags.writeable:   # never expected: a JAX array is immutable
            arr = arr.view()
            arr.flags.writeable = False
        return arr
    return read


_JAX_FAST_DTYPES = frozenset(np.dtype(d) for d in ("float32", "float16", "int32", "int8", "bool"))


def to_jax(o: np.ndarray):
    """``o`` as a JAX array on the CPU device (a copy), or None where the general way must."""
    if o.dtype not in _JAX_FAST_DTYPES and (o.dtype.kind != "V" or o.dtype.name != "bfloat16"):
        return None
    if not _JAX_PUT:
        _JAX_PUT.append(_jax_put())
    put = _JAX_PUT[0]
    return None if put is None else put(o)


def _jax_put():
    try:
        import jax
        from jax._src import core
        from jax._src.lib import xla_client as xc
        dev = jax.devices("cpu")[0]
        sharding = jax.sharding.SingleDeviceSharding(dev)
        batched = xc.batched_device_put
    except (ImportError, AttributeError, RuntimeError):   # a JAX without these: jnp.asarray
        return None
    avals: dict = {}

    def put(o):
        key = (o.shape, o.dtype)
        aval = avals.get(key)
        if aval is None:
            if len(avals) > 256:
                avals.clear()
            aval = avals[key] = core.ShapedArray(o.shape, o.dtype)
        return batched(aval, sharding, [o], [dev], False)   # uncommitted, as jnp.asarray makes it
    return put
