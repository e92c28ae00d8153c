"""The per-call fast path for torch CPU tensors and JAX CPU arrays (issue 29's interop).

Reading a DLPack capsule through ctypes costs tens of microseconds per tensor; for the two
common producers a cheaper zero-copy view exists:

- a torch CPU tensor (exactly ``torch.Tensor``, no grad, not conjugated / negated, not bf16):
  ``tensor.numpy()`` is a view of its storage, strides and offset honoured;
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


def _torch_reader(torch):
    bf16 = torch.bfloat16

    def read(a):
        if a.requires_grad or not a.is_cpu or a.dtype is bf16 or a.is_conj() or a.is_neg():
            return None   # refused, or read through DLPack (bf16: numpy has no such dtype)
        arr = a.numpy()   # a view of the tensor's storage
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
