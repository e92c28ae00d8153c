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

Everything that depends only on the sizes is a ``CallPlan`` (result shapes, thread counts,
the argument words of ``<kernel>.entry``); the frontend keeps one per argument signature, so
a repeated call only allocates its results and fills in the buffer addresses.
"""
from __future__ import annotations

import ctypes
import functools
import math
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float8E4M3FNType,
    Float8E5M2Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    ModuleOp,
)

from tessera import forksafe, host
from tessera.runtime import donation, memory, threads, workers
from tessera.errors import ArgumentError, LaneUnavailableError, OutOfMemoryError, ShapeMismatchError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir.attrs import ival, strs
from tessera.ir.target import gpu as G
from tessera.ir.target import x86 as x

NP_DTYPE = {Float32Type: np.dtype(np.float32), BFloat16Type: np.dtype(ml_dtypes.bfloat16),
            Float16Type: np.dtype(np.float16), Float64Type: np.dtype(np.float64)}


def np_dtype(elem) -> np.dtype:
    if isinstance(elem, (Float8E4M3FNType, Float8E5M2Type)):
        from tessera.dtypes import from_ir
        return from_ir(elem)
    for cls, dt in NP_DTYPE.items():
        if isinstance(elem, cls):
            return dt
    if isinstance(elem, IntegerType):
        return np.dtype(np.bool_) if elem.width.data == 1 else np.dtype(
            f"{'u' if elem.signedness.data.name == 'UNSIGNED' else ''}int{elem.width.data}")
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
    in_types: tuple = ()         # the arguments' specs (a step unpickled from an older cache has none)
    # (i, j): the kernel reads argument i only at the element it writes result j (runtime/donation.py)
    inplace: tuple = ()


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
                                  tuple(strs(op.limits)) if op.limits else (),
                                  in_types=tuple(TensorSpec.of(v.type) for v in op.args),
                                  inplace=tuple(tuple(int(n) for n in p.split(":")) for p in strs(op.inplace))
                                  if op.inplace else ()))
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

# ``tessera.profile``: while set, every kernel launch's seconds are appended to it as
# (kernel name, seconds) (one attribute read per launch otherwise)
STEP_TIMES: list | None = None
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


def _data_address_reader():
    """A function giving an ndarray's data address.  ``a.ctypes.data`` costs ~2 us here,
    several times a whole small call; numpy's C ABI puts the data pointer right after the
    object header (``PyArrayObject_fields.data``, which ``PyArray_DATA`` reads in every
    compiled extension), so it is read from there, after checking on probes (a view with an
    offset among them) that this interpreter and numpy agree; otherwise the slow way."""
    off = object.__basicsize__
    read = ctypes.c_void_p.from_address
    base = np.arange(12, dtype=np.float32)
    probes = [base, base[3:], base.reshape(3, 4)[1:], np.empty((2, 3), np.float64)]
    try:
        if all(read(id(a) + off).value == a.ctypes.data for a in probes):
            return lambda a: read(id(a) + off).value
    except (OSError, ValueError):   # pragma: no cover - an interpreter without that layout
        pass
    return lambda a: a.ctypes.data   # pragma: no cover


data_address = _data_address_reader()
_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)   # <kernel>.entry(args, tid)


def launch_work(step: Step, env: dict[str, int], sizes: list[int]) -> tuple[bool, int]:
    """(whether the work is multiply-adds of a GEMM, about how much work) for the thread split.
    A GEMM's multiply-adds from its operands: sqrt(|A| |B| |C|) = M N K for C = A B (an
    implicit-GEMM convolution too: |x| |w| |y| ~ (N H W Ci)(9 Ci Co)(N H W Co)); its epilogue's
    operands (bias, residual: rank 1 or the output's shape) are left out.  An attention
    kernel's work grows with the KV cache it reads, not its output (a decode step writes one
    row per head): the largest of its tensors.  Others: the largest output."""
    def n(spec: TensorSpec) -> int:
        return math.prod(_eval(d, env) for d in spec.dims)
    out = max((n(t) for t in step.out_types), default=1)
    kind = step.kernel.split("_", 1)[-1]
    if kind == "gemm" and step.in_types:
        shapes = [t.dims for t in step.out_types]
        ops = sorted((n(t) for t in step.in_types if t.rank > 1 and t.dims not in shapes), reverse=True)
        if len(ops) >= 2:
            return True, max(1, math.isqrt(ops[0] * ops[1] * out))
    if kind == "gemm":
        return True, (out * max(1, sizes[-1]) if sizes else out)   # (a step from an older cache)
    if kind in ("attention", "attention_bwd") and len(step.in_types) >= 2 and step.in_types[1].rank >= 2:
        # flash attention (q, k, v, ...): multiply-adds |Q| SK for Q K^T and as many for P V (more
        # in the backward); its largest tensor undercounts it by SK (16 x 1024 x 64 is 2^20
        # elements but 2^31 multiply-adds: counted as elements it never woke the workers)
        return True, 2 * n(step.in_types[0]) * _eval(step.in_types[1].dims[-2], env)
    if kind.startswith("attention") or kind == "scatter":   # a scatter's work: the updates it adds
        return False, max([out] + [n(t) for t in step.in_types])
    return False, out


@dataclass
class PlannedStep:
    """One launch of a call, with everything that depends only on the sizes worked out."""

    step: Step
    shapes: list[tuple]
    dtypes: list[np.dtype]
    need: int                    # result bytes, when large enough to be checked against free memory
    nthreads: int
    skip: bool                   # an empty result: nothing to compute
    words: np.ndarray            # <kernel>.entry's argument words; the buffer slots are filled per call
    words_addr: int
    team_header: np.ndarray      # the team buffer's barrier words and work counter (zeroed per call)
    nthreads_at: int = 0         # the index of the thread count in ``words`` (set per launch)
    wake: bool = False           # worth waking sleeping workers for (runtime/workers.py: ready)


@dataclass
class CallPlan:
    """A call's launches for one binding of the symbolic sizes.  The frontend keeps one per
    argument shapes and dtypes, so a repeated call skips binding, size evaluation, thread
    choice and workspace lookup.  ``gen`` is the executable's buffer generation the words were
    built in: a later call that grew a workspace or the team buffer makes them stale, and the
    plan is rebuilt before it runs; so does a change of the thread setting (``threads_version``,
    runtime/threads.py) since the plan chose its thread counts."""

    env: dict[str, int]
    steps: list[PlannedStep]
    gen: int
    threads_version: int = 0
    donation: donation.Donation = donation.NONE   # which results go into donated arguments


def _empty(step: Step, shapes: list[tuple]) -> bool:
    """Nothing to compute: an empty result.  An elementwise kernel may hold several independent
    groups (passes/graph/fuse_multi_tensor.py), each over its own shape: it is empty only when every
    result is (a group with no rows hands out no work)."""
    empty = [math.prod(sh) == 0 for sh in shapes]
    return all(empty) if step.kernel.endswith("_elementwise") else any(empty)


def drop_after(program: HostProgram) -> list[list[int]]:
    """Per step, the intermediates it is the last to touch: a call lets go of each right after that
    step, so its buffer serves a later kernel of the same call (the pool's, or malloc's for fresh
    buffers) instead of every intermediate living until the call returns.  Arguments and results
    are kept."""
    keep = set(program.results) | set(program.input_ids)
    last: dict[int, int] = {}
    for i, s in enumerate(program.steps):
        for v in (*s.args, *s.outs):
            last[v] = i
    out: list[list[int]] = [[] for _ in program.steps]
    for v, i in last.items():
        if v not in keep:
            out[i].append(v)
    return out


class CpuExecutable:
    def __init__(self, program: HostProgram, addresses: dict[str, int], max_threads: int, amx: bool = False,
                 missing_features: tuple[str, ...] = ()):
        self.program = program
        self._ninputs = len(program.input_ids)   # value ids below this are the arguments
        self.max_threads = max_threads
        self.amx = amx   # its kernels run AMX tile instructions: the process needs the tile state
        # features the code was compiled for that this CPU lacks (an arch= other than the host's):
        # running it would die of SIGILL, so a call is refused instead
        self.missing_features = tuple(missing_features)
        # <kernel>.entry (codegen/x86.py: add_entry), what every call enters: its address (for the
        # worker threads) and its ctypes function (for the caller); a kernel missing here cannot run
        self.entries = {s.kernel: addresses[s.kernel + x.ENTRY_SUFFIX] for s in program.steps
                        if s.kernel + x.ENTRY_SUFFIX in addresses}
        self.fns = {k: _ENTRY(a) for k, a in self.entries.items()}
        # per step, what a call needs that does not depend on the sizes
        self._limits = {s.kernel: [(e, int(n)) for e, n in (lim.split("<=") for lim in s.limits)]
                        for s in program.steps}
        self._ws_pool: dict[int, tuple[np.ndarray, int]] = {}   # tid -> (buffer, 64-byte aligned address)
        self._team: tuple[np.ndarray, int] = (np.zeros(0, np.uint8), 0)
        self._gen = 0      # bumped whenever a workspace or the team buffer moves (plans hold addresses)
        self._drop_after = drop_after(program)
        self._donations: dict = {}   # donated argument positions -> donation.Donation
        forksafe.lock(self, "_run_lock")   # one call at a time uses the workspaces and the team buffer

    def _workspace(self, tid: int, size: int) -> int:
        ent = self._ws_pool.get(tid)
        if ent is None or ent[0].nbytes < size + 64:
            buf = np.empty(max(size, 64) + 64, np.uint8)
            ent = self._ws_pool[tid] = (buf, _aligned(buf))
            self._gen += 1
        return ent[1]

    def _team_buffer(self, size: int) -> int:
        if self._team[0].nbytes < size + 64:
            buf = np.zeros(size + 64, np.uint8)
            self._team = (buf, _aligned(buf))
            self._gen += 1
        return self._team[1]

    def threads_for(self, step: Step, env: dict[str, int], sizes: list[int]) -> int:
        n = step.threads or self.max_threads
        n = min(n, self.max_threads, threads.get_num_threads() or n)   # TESSERA_NUM_THREADS / set_num_threads
        if step.parallel == "none":
            return 1
        gemm, work = launch_work(step, env, sizes)
        return 1 if work < ((1 << 21) if gemm else (1 << 15)) else n

    @staticmethod
    def worth_waking(step: Step, env: dict[str, int], sizes: list[int]) -> bool:
        """Whether a launch is long enough (about a millisecond on one core) to wake workers
        that went to sleep (a wake-up costs 0.1-0.5 ms, more on a loaded machine); shorter
        ones use only the workers spinning on a core at the time."""
        gemm, work = launch_work(step, env, sizes)
        return work >= ((1 << 25) if gemm else (1 << 21))

    def _refuse_here(self) -> None:
        if self.missing_features:
            raise LaneUnavailableError(
                f"the compiled kernels need CPU features this machine lacks ({', '.join(self.missing_features)}); "
                "compile for arch=None (the host) to run here, or run the artifact on a CPU that has them")
        if self.amx and (why := host.amx_refusal()):   # never reach a tile instruction without the state
            raise LaneUnavailableError(f"the compiled kernels use AMX and cannot run here: {why}")

    def donation_for(self, donated=frozenset()) -> donation.Donation:
        """Which results go into which donated argument positions (runtime/donation.py)."""
        donated = frozenset(donated)
        d = self._donations.get(donated)
        if d is None:
            d = self._donations[donated] = donation.plan(self.program, donated)
        return d

    def _plan(self, env: dict[str, int], donated=frozenset()) -> CallPlan:
        """The launches for sizes ``env`` (the caller holds the run lock)."""
        self._refuse_here()
        prog = self.program
        tver = threads.version()
        work = []
        for s in prog.steps:
            for expr, bound in self._limits[s.kernel]:
                if _eval(expr, env) > bound:
                    raise ShapeMismatchError(f"kernel {s.kernel} supports {expr} <= {bound}, got {_eval(expr, env)}")
            sizes = [_eval(d, env) for d in s.dims]
            shapes = [tuple(_eval(d, env) for d in t.dims) for t in s.out_types]
            need = sum(math.prod(sh) * t.np_dtype.itemsize for sh, t in zip(shapes, s.out_types))
            work.append((s, sizes, shapes, need, self.threads_for(s, env, sizes)))
        # every buffer first, at its largest: an address taken for one step must not move for the next
        team = self._team_buffer(max((s.team for s in prog.steps), default=0))
        wss = [self._workspace(tid, max((s.workspace for s, *_, n in work if n > tid), default=0))
               for tid in range(max((n for *_, n in work), default=1))]
        off = team - self._team[0].ctypes.data
        header = self._team[0][off:off + x.TEAM_HEADER]
        steps = []
        for s, sizes, shapes, need, nthreads in work:
            lead = [0] * (len(s.args) + len(s.outs))
            words = np.array(lead + sizes + [nthreads, team] + wss[:nthreads], np.int64)
            steps.append(PlannedStep(
                s, shapes, [t.np_dtype for t in s.out_types], need if need > CHECK_MEMORY_ABOVE else 0, nthreads,
                _empty(s, shapes), words, words.ctypes.data, header,
                len(lead) + len(sizes), nthreads > 1 and self.worth_waking(s, env, sizes)))
        return CallPlan(env, steps, self._gen, tver, self.donation_for(donated))

    def plan(self, env: dict[str, int], donated=frozenset()) -> CallPlan:
        with self._run_lock:
            return self._plan(env, donated)

    def run(self, arrays: list[np.ndarray], env: dict[str, int] | None = None, donated=frozenset()) -> list[np.ndarray]:
        with self._run_lock:  # workspaces and the team buffer belong to one call at a time
            if env is None:
                env = bind_symbols(self.program.inputs, arrays)
            return self._execute(self._plan(env, donated), arrays)

    def run_plan(self, plan: CallPlan, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run a plan made by ``plan`` for arrays of the sizes it was made for."""
        with self._run_lock:
            if plan.gen != self._gen or plan.threads_version != threads.version():
                # a buffer moved, or the thread setting changed, since: rebuild the words in place
                fresh = self._plan(plan.env, plan.donation.donated)
                plan.steps, plan.gen, plan.threads_version = fresh.steps, fresh.gen, fresh.threads_version
            elif self.amx or self.missing_features:
                self._refuse_here()
            return self._execute(plan, arrays)

    def _execute(self, plan: CallPlan, arrays: list[np.ndarray]) -> list[np.ndarray]:
        prog = self.program
        vals: dict[int, np.ndarray] = dict(zip(prog.input_ids, arrays))
        results = set(prog.results)   # the others are intermediates (memory.scratch)
        given = plan.donation
        if given.honoured:
            donation.check_call(arrays, given, data_address)
        for n_step, ps in enumerate(plan.steps):
            if n_step:   # intermediates the previous step read last go back (to the pool, or to malloc)
                for v in self._drop_after[n_step - 1]:
                    del vals[v]
            s = ps.step
            # reading /proc costs ~150 us: only results that could matter are checked
            if ps.need and ps.need > host.memory_available():
                raise OutOfMemoryError(f"kernel {s.kernel} needs {ps.need / 2**20:.1f} MiB for its results; "
                                       f"{host.memory_available() / 2**20:.1f} MiB available")
            outs = [(memory.empty if o in results else memory.scratch)(sh, dt)
                    for o, sh, dt in zip(s.outs, ps.shapes, ps.dtypes)] if not given.honoured else \
                self._outputs(ps, given.per_step[n_step], arrays, results)
            for o, a in zip(s.outs, outs):
                vals[o] = a
            call = self.fns.get(s.kernel)
            if call is None:  # never substitute another lane: the call fails
                raise LaneUnavailableError(f"compiled kernel {s.kernel} is not loaded; the cpu-x86 lane cannot run "
                                           "this program")
            if ps.skip:
                continue
            words = ps.words
            k = 0
            for i in s.args:
                words[k] = data_address(vals[i])
                k += 1
            for a in outs:
                words[k] = data_address(a)
                k += 1
            ps.team_header.fill(0)   # barrier words and the work counter
            timed = STEP_TIMES
            if timed is not None:
                t0 = time.perf_counter()
            n = ps.nthreads
            if n > 1:   # the workers on a core now (or asleep, for a long launch): never wait on a parked one
                pool = workers.pool(n - 1)
                n = 1 + pool.ready(n - 1, ps.wake)
                words[ps.nthreads_at] = n   # every thread of the launch sees the same count
            if n == 1:
                call(ps.words_addr, 0)
            else:
                pool.run(self.entries[s.kernel], ps.words_addr, n, call)
            if timed is not None:
                timed.append((s.kernel, time.perf_counter() - t0))
        out = [self._fresh(vals[i]) if i < self._ninputs else vals[i] for i in prog.results]
        if given.honoured:   # results in donated buffers are views: the donated arrays become read-only
            mine = {id(arrays[a]) for a in given.honoured}
            out = [o.view() if id(o) in mine else o for o in out]
            donation.consume(arrays, given)
        return out

    @staticmethod
    def _outputs(ps: PlannedStep, aliases, arrays, results) -> list[np.ndarray]:
        """A step's result buffers when arguments were donated: a donated argument's where the
        donation plan put one (``aliases``: (result position, argument position)), else fresh."""
        s = ps.step
        into = dict(aliases)
        return [arrays[into[j]] if j in into else (memory.empty if o in results else memory.scratch)(sh, dt)
                for j, (o, sh, dt) in enumerate(zip(s.outs, ps.shapes, ps.dtypes))]

    @staticmethod
    def _fresh(a: np.ndarray) -> np.ndarray:
        """A result that is an argument returned as is (``lambda x: x``, ``-(-x)`` simplified away):
        a new array, so writing to the result never changes the argument."""
        out = memory.empty(a.shape, a.dtype)
        np.copyto(out, a)
        return out

