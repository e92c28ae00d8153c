"""What ``tessera.jit`` keeps per specialisation (``Variant``) and how a call's arguments are
prepared for the trace and the kernel: arrays read in place or copied once to C-contiguous layout,
Python numbers passed as runtime scalars of the dtype their pattern learned, static values kept."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera import dtypes as dt
from tessera import host
from tessera.errors import ArgumentError, DtypeError, OutOfMemoryError, TesseraError
from tessera.frontend import interop
from tessera.frontend.compile import Compiled
from tessera.frontend.jit_args import _int_scalars, _is_number, _pattern, to_scalar
from tessera.frontend.trace import ARRAY, SCALAR, STATIC
from tessera.runtime.cpu import CHECK_MEMORY_ABOVE, bind_symbols
from tessera.runtime.lanes import LaneDecision

_ACCEPTED: set = set()   # argument dtypes already checked by dtypes.as_dtype


@dataclass
class Variant:
    static: dict[tuple[int, int], int]      # (array index, axis) -> size
    compiled: Compiled | None
    graph: object                            # the TraceGraph (for the reference lane)
    reason: str = ""                         # why the reference lane is used (strict=False only)
    copies: tuple[str, ...] = ()
    decision: LaneDecision | None = None     # what a compiled call records (one immutable entry)
    key: tuple = ()                          # its key in JitFunction._variants
    scalars: tuple[int, ...] = ()            # argument positions passed as runtime scalars
    scalar_dtype: np.dtype = np.dtype(np.float32)   # ... as 0-d arrays of this dtype
    ints: frozenset | None = None            # which scalars were Python ints, where that changed the trace
    schedule_source: str = ""                # where the pins came from (frontend/tune.py)
    donated: frozenset = frozenset()         # donated arrays, as indices into the kernel's arrays
    donated_positions: dict = None           # donated argument position -> its index there
    # the thread counts whose tuning-database lookup gave its schedule (an entry is per count), or
    # None where the schedule does not depend on the count; serves calls at those counts only
    threads: frozenset | None = None
    threads_version: int = -1                # runtime/threads.version() when that was last checked

    def serve_threads(self, n: int) -> None:
        """Serve calls at ``n`` threads too; the lane report's schedule line names the counts."""
        self.threads = (self.threads or frozenset()) | {n}
        base = self.schedule_source.split(" for ")[0]
        counts = sorted(self.threads)
        self.schedule_source = (f"{base} for {', '.join(map(str, counts))} thread"
                                f"{'s' if counts != [1] else ''}")

    def bind(self, args) -> list[np.ndarray]:
        """The kernel's arrays for a call whose signature matched: arrays and runtime scalars
        (0-d arrays), in argument order; static arguments are baked in."""
        sd, sc = self.scalar_dtype, self.scalars
        return [to_scalar(a, sd, i) if i in sc else a for i, a in enumerate(args)
                if i in sc or type(a) is np.ndarray]

    def matches(self, arrays: list[np.ndarray]) -> dict | None:
        """The bound sizes if this specialisation serves ``arrays``, else None."""
        for (i, axis), size in self.static.items():
            if arrays[i].shape[axis] != size:
                return None
        if self.compiled is None:
            return {} if all(a.shape == n.shape for a, n in zip(arrays, self.graph.args)) else None
        try:
            return bind_symbols(self.compiled.executable.program.inputs, arrays)
        except TesseraError:
            return None


def split_args(jf, args) -> tuple[list, list[str], list[np.ndarray], list[str]]:
    """Each argument prepared for the trace, its kind (trace.ARRAY / SCALAR / STATIC), the
    kernel's arrays (runtime scalars as 0-d arrays) and the copies made."""
    kinds, arrays, copies, prepared = [], [], [], []
    for i, a in enumerate(args):
        if i in jf._static or i in jf._learned:
            try:
                hash(a)
            except TypeError:
                raise ArgumentError(f"argument {i} of {jf.name} is static (its value is compiled in) but a "
                                    f"{type(a).__name__} has no hash: pass a tuple, number or string") from None
            kinds.append(STATIC)
            prepared.append(a)
        elif interop.is_array(a):   # numpy, or read through DLPack / __array_interface__
            a = np.asarray(a) if isinstance(a, np.ndarray) else interop.as_host(a, i, jf, copies)
            try:
                if a.dtype not in _ACCEPTED:
                    _ACCEPTED.add(dt.as_dtype(a.dtype))  # float, int8/int32/int64 and bool dtypes
            except DtypeError:
                raise DtypeError(f"argument {i} of {jf.name}: dtype {a.dtype} is not supported "
                                 f"(supported: {', '.join(dt.SUPPORTED)})") from None
            if not a.flags.c_contiguous:
                a = contiguous(jf.name, a, i)
                copies.append(f"argument {i} copied to C-contiguous layout")
            kinds.append(ARRAY)
            arrays.append(a)
            prepared.append(a)
        elif _is_number(a):
            kinds.append(SCALAR)
            prepared.append(a)
        elif a is None or isinstance(a, bool):
            kinds.append(STATIC)   # a flag: compiled in, as a static argument
            prepared.append(a)
        else:
            raise ArgumentError(f"argument {i} of {jf.name}: expected an array (numpy; torch, JAX or any "
                                "__dlpack__ object; one with __array_interface__) or a Python number, got "
                                f"{type(a).__name__} (another value may be passed as a static argument: "
                                "tessera.jit(static_argnums=..., static_argnames=...))")
    if SCALAR in kinds:   # the numbers' dtype follows the arrays' (below), so it is known before tracing
        sd = scalar_dtype(jf, kinds, arrays, _int_scalars(args, kinds))
        it = iter(arrays)
        arrays = [to_scalar(a, sd, i) if k == SCALAR else next(it) for i, (a, k) in enumerate(zip(args, kinds))
                  if k != STATIC]
        prepared = [to_scalar(a, sd, i) if k == SCALAR else a for i, (a, k) in enumerate(zip(prepared, kinds))]
    return prepared, kinds, arrays, copies

def scalar_dtype(jf, kinds, arrays, ints=frozenset()) -> np.dtype:
    """The dtype runtime scalars are passed in: what a trace of this pattern learned, else
    float64 where an argument is float64 and float32 otherwise (a first guess)."""
    learned = jf._scalar_dtypes.get(_pattern(kinds, arrays, ints))
    if learned is not None:
        return learned
    return np.dtype(np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32)

def contiguous(name: str, a: np.ndarray, i: int) -> np.ndarray:
    """A C-contiguous copy of argument ``i`` (a broadcast view may stand for far more memory)."""
    need = a.size * a.itemsize
    if need > CHECK_MEMORY_ABOVE and need > host.memory_available():
        raise OutOfMemoryError(f"argument {i} of {name} ({a.shape}, {a.dtype}, strides {a.strides}) must be "
                               f"copied to C-contiguous layout: {need / 2**20:.1f} MiB; "
                               f"{host.memory_available() / 2**20:.1f} MiB available")
    try:
        return np.ascontiguousarray(a)
    except MemoryError:
        raise OutOfMemoryError(f"argument {i} of {name} ({a.shape}, {a.dtype}) must be copied to "
                               f"C-contiguous layout: {need / 2**20:.1f} MiB could not be allocated") from None
