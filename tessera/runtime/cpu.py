"""The CPU lane's executable: the host program of a Target IR module, run with
compiled kernels.

The host program is ``@main``'s list of ``tessera_x86.launch`` ops.  For a call,
the runtime binds the symbolic sizes from the input arrays, checks them, then for
every launch: evaluates its size list, allocates its outputs (after checking the
memory this process may use), and calls the kernel from up to ``threads`` threads
(``tid`` = 0..n-1: the caller and ``runtime.workers``' spinning pool) through ctypes, which
releases the GIL.  Each thread has its own
workspace of the launch's size.  There is no other path: if a kernel cannot run,
the call fails.
"""
from __future__ import annotations

import ctypes
import functools
import math
import threading
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    ModuleOp,
)

from tessera import host
from tessera.runtime import memory, workers
from tessera.errors import ArgumentError, LaneUnavailableError, OutOfMemoryError, ShapeMismatchError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir.attrs import ival, strs
from tessera.ir.target import gpu as G
from tessera.ir.target import x86 as x

NP_DTYPE = {Float32Type: np.dtype(np.float32), BFloat16Type: np.dtype(ml_dtypes.bfloat16),
            Float16Type: np.dtype(np.float16), Float64Type: np.dtype(np.float64)}


def np_dtype(elem) -> np.dtype:
    for cls, dt in NP_DTYPE.items():
        if isinstance(elem, cls):
            return dt
    if isinstance(elem, IntegerType):
        return np.dtype(np.bool_) if elem.width.data == 1 else np.dtype(f"int{elem.width.data}")
    raise ArgumentError(f"no numpy dtype for {elem}")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's symbolic dims and dtype, as plain data (the cache pickles it)."""

    dims: tuple
    dtype: str

    @staticmethod
    def of(t: g.TensorType) -> "TensorSpec":
        return TensorSpec(tuple(t.dims), np_dtype(t.element_type).str)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @functools.cached_property   # read on every call; kept in the instance dict (frozen dataclass)
    def np_dtype(self) -> np.dtype:
        if self.dtype == "<V2":
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.dtype)


@dataclass
class Step:
    kernel: str
    args: list[int]              # value ids
    outs: list[int]
    out_types: list[TensorSpec]
    dims: list[str]
    workspace: int
    team: int
    threads: int
    parallel: str
    limits: tuple = ()
    grid: tuple = ()             # GPU: workgroups along x, y, z ("D/b" = ceil(D / b))
    block: int = 0               # GPU: threads per workgroup


@dataclass
class HostProgram:
    inputs: list[TensorSpec]
    steps: list[Step]
    results: list[int]           # value ids (an input id when an argument is returned as is)
    input_ids: list[int]

    @staticmethod
    def from_module(module: ModuleOp) -> "HostProgram":
        main = next(op for op in module.body.block.ops if isinstance(op, func.FuncOp) and "workspace" not in
                    op.attributes and "gpu.kernel" not in op.attributes)
        ids: dict = {}
        for a in main.body.block.args:
            ids[a] = len(ids)
        steps = []
        results: list[int] = []
        for op in main.body.block.ops:
            if isinstance(op, x.LaunchOp):
                for r in op.outs:
                    ids[r] = len(ids)
                steps.append(Step(op.callee.root_reference.data, [ids[v] for v in op.args], [ids[r] for r in op.outs],
                                  [TensorSpec.of(r.type) for r in op.outs], strs(op.dims), ival(op.workspace),
                                  ival(op.team), ival(op.threads), op.parallel.data if op.parallel else "none",
                                  tuple(strs(op.limits)) if op.limits else ()))
            elif isinstance(op, G.LaunchOp):
                for r in op.outs:
                    ids[r] = len(ids)
                steps.append(Step(op.callee.root_reference.data, [ids[v] for v in op.args], [ids[r] for r in op.outs],
                                  [TensorSpec.of(r.type) for r in op.outs], strs(op.dims), 0, ival(op.shared), 1,
                                  "grid", (), tuple(strs(op.grid)), ival(op.block)))
            elif isinstance(op, func.ReturnOp):
                results = [ids[v] for v in op.operands]
            else:
                raise ArgumentError(f"host program holds {op.name}; only launches are executable")
        return HostProgram([TensorSpec.of(a.type) for a in main.body.block.args], steps, results,
                           list(range(len(main.body.block.args))))


def bind_symbols(types: list[TensorSpec], arrays: list[np.ndarray]) -> dict[str, int]:
    """Bind each symbol to a size; a symbol seen twice must have one size."""
    env: dict[str, int] = {}
    simple = True
    for t, a in zip(types, arrays):  # fast path: every dim an int or a plain symbol
        if a.ndim != t.rank:
            simple = False
            break
        for d, n in zip(t.dims, a.shape):
            if isinstance(d, int):
                if d != n:
                    simple = False
            elif "*" in d:
                simple = False
            elif env.setdefault(d, n) != n:
                simple = False
    if simple and len(types) == len(arrays):
        return env
    env = {}
    for i, (t, a) in enumerate(zip(types, arrays)):
        if a.ndim != t.rank:
            raise ShapeMismatchError(f"argument {i} has rank {a.ndim}; the compiled function expects {t.rank}")
        for axis, (d, n) in enumerate(zip(t.dims, a.shape)):
            if isinstance(d, int):
                if d != n:
                    raise ShapeMismatchError(f"argument {i} dimension {axis} is {n}; compiled for {d}")
            else:
                syms = D.symbols(d)
                if len(syms) == 1 and D.canon(d) == syms[0]:
                    if syms[0] in env and env[syms[0]] != n:
                        raise ShapeMismatchError(f"argument {i} dimension {axis} is {n} but {syms[0]} is "
                                                 f"{env[syms[0]]} elsewhere")
                    env[syms[0]] = n
    for i, (t, a) in enumerate(zip(types, arrays)):  # products of symbols, once all symbols are bound
        for axis, (d, n) in enumerate(zip(t.dims, a.shape)):
            if not isinstance(d, int) and D.evaluate(d, env) != n:
                raise ShapeMismatchError(f"argument {i} dimension {axis} is {n}, expected {d} = {D.evaluate(d, env)}")
    return env


CHECK_MEMORY_ABOVE = 64 << 20
_EVAL_CACHE: dict = {}


def _eval(d, env: dict[str, int]) -> int:
    """Evaluate a size expression (``int``, ``"M"``, ``"2*B*S"``) with a parse cache."""
    if isinstance(d, int):
        return d
    f = _EVAL_CACHE.get(d)
    if f is None:
        coef, syms = D._factors(D.parse_dim(d) if isinstance(d, str) else d)
        f = _EVAL_CACHE[d] = (coef, tuple(syms))
    coef, syms = f
    for sym in syms:
        coef *= env[sym]
    return coef


def _aligned(buf: np.ndarray) -> int:
    addr = buf.ctypes.data
    return addr + (-addr % 64)


class CpuExecutable:
    def __init__(self, program: HostProgram, addresses: dict[str, int], max_threads: int, amx: bool = False,
                 missing_features: tuple[str, ...] = ()):
        self.program = program
        self.max_threads = max_threads
        self.amx = amx   # its kernels run AMX tile instructions: the process needs the tile state
        # features the code was compiled for that this CPU lacks (an arch= other than the host's):
        # running it would die of SIGILL, so a call is refused instead
        self.missing_features = tuple(missing_features)
        self.fns = {}
        self.entries: dict[str, int | None] = {}   # <kernel>.entry: what worker threads call (no Python)
        for s in program.steps:
            nbuf = len(s.args) + len(s.outs)
            argtypes = [ctypes.c_void_p] * nbuf + [ctypes.c_int64] * (len(s.dims) + 2) + [ctypes.c_void_p] * 2
            self.fns[s.kernel] = ctypes.CFUNCTYPE(None, *argtypes)(addresses[s.kernel])
            self.entries[s.kernel] = addresses.get(s.kernel + x.ENTRY_SUFFIX)
        # per step, what a call needs that does not depend on the sizes
        self._limits = {s.kernel: [(e, int(n)) for e, n in (lim.split("<=") for lim in s.limits)]
                        for s in program.steps}
        self._ws_pool: dict[int, tuple[np.ndarray, int]] = {}   # tid -> (buffer, 64-byte aligned address)
        self._ws_lock = threading.Lock()
        self._team: tuple[np.ndarray, int] = (np.zeros(0, np.uint8), 0)
        self._run_lock = threading.Lock()  # one call at a time uses the team buffer

    def _workspace(self, tid: int, size: int) -> int:
        with self._ws_lock:
            ent = self._ws_pool.get(tid)
            if ent is None or ent[0].nbytes < size + 64:
                buf = np.empty(max(size, 64) + 64, np.uint8)
                ent = self._ws_pool[tid] = (buf, _aligned(buf))
        return ent[1]

    def _team_buffer(self, size: int) -> int:
        if self._team[0].nbytes < size + 64:
            buf = np.zeros(size + 64, np.uint8)
            self._team = (buf, _aligned(buf))
        addr = self._team[1]
        ctypes.memset(addr, 0, x.TEAM_HEADER)  # barrier words and the work counter
        return addr

    def threads_for(self, step: Step, env: dict[str, int], sizes: list[int]) -> int:
        n = step.threads or self.max_threads
        n = min(n, self.max_threads)
        if step.parallel == "none":
            return 1
        work = 1
        for t in step.out_types:
            work = max(work, math.prod(_eval(d, env) for d in t.dims))
        if step.kernel.endswith("_gemm") and sizes:
            work *= max(1, sizes[-1])  # x K
            return 1 if work < (1 << 21) else n
        return 1 if work < (1 << 15) else n

    def run(self, arrays: list[np.ndarray], env: dict[str, int] | None = None) -> list[np.ndarray]:
        with self._run_lock:  # workspaces and the team buffer belong to one call at a time
            return self._run(arrays, env)

    def _run(self, arrays: list[np.ndarray], env: dict[str, int] | None = None) -> list[np.ndarray]:
        prog = self.program
        if self.missing_features:
            raise LaneUnavailableError(
                f"the compiled kernels need CPU features this machine lacks ({', '.join(self.missing_features)}); "
                "compile for arch=None (the host) to run here, or run the artifact on a CPU that has them")
        if self.amx and (why := host.amx_refusal()):   # never reach a tile instruction without the state
            raise LaneUnavailableError(f"the compiled kernels use AMX and cannot run here: {why}")
        if env is None:
            env = bind_symbols(prog.inputs, arrays)
        vals: dict[int, np.ndarray] = dict(zip(prog.input_ids, arrays))
        for s in prog.steps:
            for expr, bound in self._limits[s.kernel]:
                if _eval(expr, env) > bound:
                    raise ShapeMismatchError(f"kernel {s.kernel} supports {expr} <= {bound}, got {_eval(expr, env)}")
            sizes = [_eval(d, env) for d in s.dims]
            outs = []
            need = 0
            shapes = []
            for t in s.out_types:
                shape = tuple(_eval(d, env) for d in t.dims)
                shapes.append(shape)
                need += math.prod(shape) * t.np_dtype.itemsize
            # reading /proc costs ~150 us: only results that could matter are checked
            if need > CHECK_MEMORY_ABOVE and need > host.memory_available():
                raise OutOfMemoryError(f"kernel {s.kernel} needs {need / 2**20:.1f} MiB for its results; "
                                       f"{host.memory_available() / 2**20:.1f} MiB available")
            for t, shape in zip(s.out_types, shapes):
                outs.append(memory.empty(shape, t.np_dtype))
            for o, a in zip(s.outs, outs):
                vals[o] = a
            ptrs = [vals[i].ctypes.data for i in s.args] + [a.ctypes.data for a in outs]
            nthreads = self.threads_for(s, env, sizes)
            fn = self.fns.get(s.kernel)
            if fn is None:  # never substitute another lane: the call fails
                raise LaneUnavailableError(f"compiled kernel {s.kernel} is not loaded; the cpu-x86 lane cannot run "
                                           "this program")
            if any(a.size == 0 for a in outs):
                continue
            team = self._team_buffer(s.team)
            if nthreads == 1:
                fn(*ptrs, *sizes, 0, 1, self._workspace(0, s.workspace), team)
            else:
                # the kernel's arguments as words for <kernel>.entry (see codegen/x86.py: add_entry)
                args = np.array(ptrs + sizes + [nthreads, team] + [self._workspace(t, s.workspace)
                                                                   for t in range(nthreads)], np.int64)
                workers.pool(nthreads - 1).run(self.entries[s.kernel], args.ctypes.data, nthreads)
        return [vals[i] for i in prog.results]
