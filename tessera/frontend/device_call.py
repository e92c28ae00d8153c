"""Device-resident calls of a function compiled for ``target="nvidia"``.

The rule (``docs/gpu.md``, "Device arrays"):

- An array argument in CUDA memory (``__cuda_array_interface__``: torch CUDA tensors, CuPy, Numba;
  or ``__dlpack__`` with ``__dlpack_device__`` CUDA) is passed to the kernels at its own address:
  no copy.  A C-contiguous array whose address is 16-byte aligned is read in place; rows of a
  fixed pitch (a slice ``x[:, :k]``) or a misaligned address are made dense by one device copy,
  noted in the lane log; any other layout (a transpose, a broadcast) is refused (DEVICE_LAYOUT).
- Results are allocated on the device (stream-ordered) and returned in the callers' framework:
  all torch -> torch tensors (``torch.from_dlpack``), all CuPy -> CuPy arrays, otherwise
  :class:`tessera.frontend.device_array.DeviceArray` (``__cuda_array_interface__``, ``__dlpack__``).
- The stream: ``tessera.device_options(stream=...)`` where given; else the callers' framework's
  current stream (torch, CuPy); else the first ``__cuda_array_interface__`` stream; else the
  legacy default stream.  Everything is queued on it and nothing is synchronised: results are
  ready in that stream's order, as a torch op's are.  A ``__cuda_array_interface__`` producer
  on another stream is waited for with an event; a DLPack producer is handed the stream
  (``__dlpack__(stream=...)``) and orders its own work.
- All device arrays of one call live on one device (else DEVICE_MISMATCH), the one set with
  ``device_options(device=...)`` where given, of the arch the cubin was built for (DEVICE_MISMATCH);
  the runtime asks the driver which device each address belongs to.
- A host array beside device arrays in one call is refused (DEVICE_HOST_MIX): no hidden copies.
  Python numbers are fine (runtime scalars: their few bytes are uploaded, counted apart).
- ``device_options(capture=True)``: the launches are replayed as one CUDA graph (runtime/launch_plan.py).
- A result's memory is freed stream-ordered on the stream it was made on when its last holder lets
  go; a consumer that uses it on another stream orders that itself (as with torch's ``record_stream``).
- A torch tensor that requires grad is refused (REQUIRES_GRAD), as on every lane.

The ROCm lane takes host arrays only so far (DEVICE_ARRAY); the CPU lane never takes device arrays.
"""
from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager

import numpy as np

from tessera.errors import (DeviceArrayError, DeviceHostMixError, DeviceLayoutError, DeviceMismatchError,
                            RequiresGradError)
from tessera.frontend import dlpack
from tessera.frontend.device_array import DEVICE_LANES, DeviceArray, DeviceRef, cai_of, device_of, read, to_framework
from tessera.runtime.lanes import LOG, LaneDecision

_OPTIONS = threading.local()
ALIGN = 16   # bytes: kernels may load 16 bytes at a time


@contextmanager
def device_options(*, stream=None, device: int | None = None, capture: bool | None = None):
    """Options for the device-resident calls made inside the ``with``: the CUDA stream to run on (a
    handle, or an object with ``cuda_stream`` / ``ptr``), the device they must run on, and whether to
    replay the program as a CUDA graph."""
    old = getattr(_OPTIONS, "v", None)
    new = dict(old or {})
    if stream is not None:
        new["stream"] = int(getattr(stream, "cuda_stream", getattr(stream, "ptr", stream)))
    if device is not None:
        new["device"] = int(device)
    if capture is not None:
        new["capture"] = bool(capture)
    _OPTIONS.v = new
    try:
        yield
    finally:
        _OPTIONS.v = old


def _options() -> dict:
    return getattr(_OPTIONS, "v", None) or {}


def framework(a) -> str:
    mod = type(a).__module__.split(".")[0]
    return mod if mod in ("torch", "cupy") else "other"


def wants(fn, args) -> bool:
    """Whether a call has an argument in device memory (then ``call`` takes it, or refuses it)."""
    skip = fn._static
    return any(i not in skip and i not in fn._learned and not isinstance(a, (np.ndarray, int, float, bool))
               and a is not None and device_of(a) is not None for i, a in enumerate(args))


def _describe(a) -> str:
    return f"{type(a).__module__.split('.')[0]}.{type(a).__name__} {getattr(a, 'dtype', '?')}{list(getattr(a, 'shape', ()))}"


def _stream(kinds: set[str], device: int, first_cai) -> int:
    opts = _options()
    if "stream" in opts:
        return opts["stream"]
    if kinds == {"torch"}:
        import torch
        return int(torch.cuda.current_stream(device).cuda_stream)
    if kinds == {"cupy"}:
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    s = _cai_stream(first_cai)
    return 0 if s is None else (0 if s in (0, 1) else s)


def _cai_stream(a):
    cai = cai_of(a) if a is not None else None
    return cai.get("stream") if cai is not None and int(cai.get("version", 0)) >= 3 else None


def call(fn, args: tuple):
    """``fn(*args)`` on device-resident arguments; the results in the callers' framework."""
    lane = fn.target
    where = [f"argument {i} of {fn.name}" for i in range(len(args))]
    dev_args, host_args = {}, []
    for i, a in enumerate(args):
        if i in fn._static or i in fn._learned or a is None or isinstance(a, (bool, int, float)):
            continue
        d = device_of(a)
        if d is not None:
            dev_args[i] = d
        elif isinstance(a, np.ndarray) or hasattr(a, "__dlpack__") or hasattr(a, "__array_interface__"):
            host_args.append(i)
    for i, (kind, dev) in dev_args.items():
        if kind not in DEVICE_LANES.get(lane, ()):
            name = f"{dlpack.DEVICE_NAMES.get(kind, f'device type {kind}')}:{dev}"
            built = ("only the nvidia lane takes device arrays so far (ROCm's is not built yet)" if lane == "rocm"
                     else f"the {fn.lane} lane reads {'CUDA' if lane == 'nvidia' else 'host'} memory")
            raise DeviceArrayError(f"{where[i]} ({_describe(args[i])}) lives on {name}; {built}. Copy it to the host, "
                                   "or compile for the device's lane")
    for i in dev_args:
        if getattr(args[i], "requires_grad", False) is True:
            raise RequiresGradError(
                f"{where[i]} is a torch tensor that requires grad: Tessera would have to detach it and its gradient "
                "would be lost. Pass x.detach() (no gradient flows through a tessera.jit call)")
    if host_args:
        raise DeviceHostMixError(
            f"{fn.name} was called with device arrays (arguments {sorted(dev_args)}) and host arrays (arguments "
            f"{host_args}); one call's arrays all live on the device (no copy) or all on the host (copied in and "
            "out). Move the host arrays to the device (torch: x.cuda()), or the device arrays to the host")
    if fn._dyn is not None:
        raise DeviceArrayError(f"{fn.name} uses tessera.jit(dynamic=...), which pads and slices on the host; "
                               "device arrays are not taken there yet: drop dynamic= or pass host arrays")
    kinds = {framework(args[i]) for i in dev_args}
    ids = {dev for _, dev in dev_args.values() if dev >= 0}
    if len(ids) > 1:
        raise DeviceMismatchError(f"{fn.name}: the device arrays of one call live on different devices "
                                  f"({', '.join(f'argument {i} on cuda:{d}' for i, (_, d) in dev_args.items())})")
    want = _options().get("device")
    device = want if want is not None else (ids.pop() if ids else 0)
    first_cai = next((args[i] for i in dev_args if _cai_stream(args[i]) is not None), None)
    stream = _stream(kinds, device, first_cai)

    refs: dict[int, DeviceRef] = {i: read(args[i], where[i], dev_args[i], stream) for i in dev_args}
    try:
        return _run(fn, args, refs, device, stream, kinds)
    finally:
        for r in refs.values():
            if r.release is not None:
                r.release()   # the launches are queued on the stream the producer ordered its work before


_SEEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # fn -> {shapes and dtypes: (variant, env)}


def _variant(fn, args, refs: dict[int, DeviceRef]):
    """The compiled specialisation for these arguments, their kernel-order list and bound sizes.  A call
    whose arguments are all device arrays is looked up by their shapes and dtypes (no trace key)."""
    shadows = {i: np.empty(r.shape, r.dtype) for i, r in refs.items()}   # shapes for the trace, never read
    only_arrays = len(refs) == len(args)
    sig = tuple((r.shape, r.dtype.str) for r in refs.values()) if only_arrays else None
    seen = _SEEN.get(fn)
    hit = seen.get(sig) if seen is not None and sig is not None else None
    if hit is not None:
        v, env = hit
        return v, [shadows[i] for i in range(len(args))], env, shadows
    v, arrays, env = fn._variant(tuple(shadows.get(i, a) for i, a in enumerate(args)))
    if sig is not None and v.compiled is not None:
        if env is None:
            from tessera.runtime.cpu import bind_symbols
            env = bind_symbols(v.compiled.executable.program.inputs, arrays)
        seen = _SEEN.setdefault(fn, {})
        if len(seen) >= 64:
            seen.clear()
        seen[sig] = (v, env)
    return v, arrays, env, shadows


def _run(fn, args, refs: dict[int, DeviceRef], device: int, stream: int, kinds: set[str]):
    v, arrays, env, shadows = _variant(fn, args, refs)
    by_id = {id(s): i for i, s in shadows.items()}
    if v.compiled is None:
        raise DeviceArrayError(f"{fn.name} did not compile for the {fn.lane} lane ({v.reason}); strict=False's numpy "
                               "reference reads host memory and does not run on device arrays")
    exe = v.compiled.executable
    if not hasattr(exe, "run_device"):
        raise DeviceArrayError(f"the {fn.lane} lane takes host arrays only")
    mod = exe.cuda_module(device, DeviceMismatchError)
    with mod.entered():
        bufs, notes, capture = _launch(fn, exe, mod, args, arrays, by_id, refs, device, stream, env)
    kind = kinds.pop() if len(kinds) == 1 else "other"
    outs = [to_framework(kind, DeviceArray(b)) for b in bufs]
    from tessera.frontend.trace import results
    how = sorted({r.how for r in refs.values()})
    note = (f"device-resident: {len(refs)} device array(s) in place ({', '.join(how)}), no host copy; stream "
            f"{stream}{'; replayed as a CUDA graph' if capture else ''}")
    LOG.record(LaneDecision(fn.name, fn.lane, "compiled", inputs=(note, *notes)))
    return results(v.graph, outs)


def _launch(fn, exe, mod, args, arrays, by_id, refs, device, stream, env):
    notes, temps = [], []
    try:
        inputs = []
        for a in arrays:
            i = by_id.get(id(a))
            if i is None:
                inputs.append(a)   # a runtime scalar (0-d host array)
                continue
            r = refs[i]
            owner = mod.pointer_device(r.ptr) if r.nbytes else device
            if owner is None:
                raise DeviceArrayError(f"argument {i} of {fn.name} ({_describe(args[i])}) says it lives in CUDA "
                                       f"memory, but the driver does not know its address {r.ptr:#x}")
            if owner != device:
                raise DeviceMismatchError(f"argument {i} of {fn.name} is memory of CUDA device {owner}; this call "
                                          f"runs on device {device}")
            if r.stream is not None and r.stream != stream:
                mod.wait(stream, r.stream)   # the producer's pending work comes first
            dense = _dense(mod, r, i, fn.name, stream, temps, notes)
            inputs.append(dense)
        capture = bool(_options().get("capture"))
        bufs = exe.run_device(inputs, stream=stream, device=device, capture=capture, env=env)
    finally:
        for p in temps:
            mod.free(p, stream)
    return bufs, notes, capture


class _Dense:
    __slots__ = ("ptr", "shape", "dtype", "ndim")

    def __init__(self, ptr, shape, dtype):
        self.ptr, self.shape, self.dtype, self.ndim = ptr, shape, dtype, len(shape)


def _dense(mod, r: DeviceRef, i: int, name: str, stream: int, temps: list, notes: list):
    """``r`` as the kernels read it: in place when dense and aligned, else one device copy (noted)."""
    item = r.dtype.itemsize
    if r.nbytes == 0 or (r.contiguous and r.ptr % ALIGN == 0):
        return r
    if r.ptr % item:
        raise DeviceLayoutError(f"argument {i} of {name}: address {r.ptr:#x} is not aligned to its {r.dtype} "
                                f"elements ({item} bytes)")
    live = [(n, s) for n, s in zip(r.shape, r.strides) if n != 1]
    if r.contiguous:
        rows, row_bytes, pitch = 1, r.nbytes, r.nbytes
    else:
        if not live or live[-1][1] != item:
            raise DeviceLayoutError(f"argument {i} of {name}: byte strides {r.strides} for shape {r.shape} (a "
                                    "transpose or a broadcast); the kernels read dense rows. Pass x.contiguous()")
        row_bytes = live[-1][0] * item
        outer = live[:-1]
        pitch = outer[-1][1]
        for (n, s), (n2, s2) in zip(outer[:-1], outer[1:]):
            if s != s2 * n2:
                raise DeviceLayoutError(f"argument {i} of {name}: byte strides {r.strides} for shape {r.shape} are "
                                        "not rows of one pitch; pass x.contiguous()")
        if pitch < row_bytes:
            raise DeviceLayoutError(f"argument {i} of {name}: rows overlap (pitch {pitch} < {row_bytes} bytes)")
        rows = r.size // live[-1][0]
    p = mod.alloc(r.nbytes, stream)
    temps.append(p)
    if rows == 1:
        mod.copy_device(p, r.ptr, r.nbytes, stream)
        notes.append(f"argument {i}: address not {ALIGN}-byte aligned: one device copy ({r.nbytes} bytes)")
    else:
        mod.copy_rows(p, r.ptr, row_bytes, rows, pitch, stream)
        notes.append(f"argument {i}: rows {pitch} bytes apart (strides {r.strides}): one device copy "
                     f"({r.nbytes} bytes)")
    return _Dense(p, r.shape, r.dtype)
