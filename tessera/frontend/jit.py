"""``tessera.jit``, ``tessera.compile`` and ``tessera.explain``.

A call is specialised on the arguments' dtypes and ranks, which dimensions are 1,
and any Python scalars; sizes stay symbolic, so a sweep of shapes reuses one
compiled kernel.  Dispatch is strict: the compiled lane runs or the call raises.
Only ``strict=False`` lets a failed compile run the numpy reference instead, and
the lane log records it.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError, DtypeError, FrontendError, SpecializeRequest, TesseraError
from tessera.frontend import graphgen, reference
from tessera.frontend.compile import Compiled, check_pins, compile_graph, feature_list, resolve_arch
from tessera.frontend.report import LaneReport
from tessera.frontend.trace import trace
from tessera.runtime.cpu import bind_symbols
from tessera.runtime.lanes import LOG, LaneDecision

_ACCEPTED: set = set()   # argument dtypes already checked by dtypes.as_dtype
MAX_PLANS = 64           # call plans kept per function (a shape sweep replaces them)


def _scalar_key(a) -> tuple:
    """A Python number by type and value, a float by its bits: -0.0 == 0.0, but the compiled
    kernel bakes the scalar in."""
    return (type(a).__name__, a.hex() if isinstance(a, float) else a)


def _signature(args) -> tuple | None:
    """What a call plan is keyed by: each argument's dtype and shape (C-contiguous arrays
    only: others are copied first) or its type and value; None where no plan may serve."""
    sig = []
    for a in args:
        if type(a) is np.ndarray:
            if not a.flags.c_contiguous:
                return None
            sig.append((a.dtype, a.shape))
        elif type(a) is float or type(a) is int:
            sig.append(_scalar_key(a))
        else:
            return None
    return tuple(sig)


@dataclass
class Variant:
    static: dict[tuple[int, int], int]      # (array index, axis) -> size
    compiled: Compiled | None
    graph: object                            # the TraceGraph (for the reference lane)
    reason: str = ""                         # why the reference lane is used (strict=False only)
    copies: tuple[str, ...] = ()
    decision: LaneDecision | None = None     # what a compiled call records (one immutable entry)

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


class JitFunction:
    def __init__(self, fn, *, target: str = "cpu", arch: str | None = None, strict: bool = True,
                 schedule: dict | None = None):
        if target in ("rocm", "nvidia") and arch is None:
            resolve_arch(target, None)   # GPU lanes have no default chip: this raises, naming the known ones
        self.fn = fn
        self.target = target
        self.arch = arch
        self.strict = strict
        self.schedule = check_pins(schedule, target)
        self.name = getattr(fn, "__name__", "fn")
        self._variants: dict[tuple, list[Variant]] = {}
        # signature -> (variant, CallPlan): a repeated call goes straight to its launches
        self._plans: dict[tuple, tuple] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def with_schedule(self, **pins) -> "JitFunction":
        """The same function with schedule choices pinned (per-call overrides)."""
        return JitFunction(self.fn, target=self.target, arch=self.arch, strict=self.strict,
                           schedule={**self.schedule, **pins})

    # ------------------------------------------------------------------ arguments
    def _split_args(self, args) -> tuple[list, list[bool], list[np.ndarray], list[str]]:
        is_t, arrays, copies, prepared = [], [], [], []
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray) or hasattr(a, "__array_interface__"):
                a = np.asarray(a)
                try:
                    if a.dtype not in _ACCEPTED:
                        _ACCEPTED.add(dt.as_dtype(a.dtype))  # float dtypes, and bool (attention masks)
                except DtypeError:
                    raise DtypeError(f"argument {i} of {self.name}: dtype {a.dtype} is not supported "
                                     f"(supported: {', '.join(dt.SUPPORTED)})") from None
                if not a.flags.c_contiguous:
                    a = np.ascontiguousarray(a)
                    copies.append(f"argument {i} copied to C-contiguous layout")
                is_t.append(True)
                arrays.append(a)
                prepared.append(a)
            elif isinstance(a, (int, float)) and not isinstance(a, bool):
                is_t.append(False)
                prepared.append(a)
            else:
                raise ArgumentError(f"argument {i} of {self.name}: expected a numpy array or a Python number, got "
                                    f"{type(a).__name__}")
        return prepared, is_t, arrays, copies

    def _key(self, prepared, is_t) -> tuple:
        parts = []
        for a, t in zip(prepared, is_t):
            if t:
                parts.append(("a", a.dtype, tuple(s == 1 for s in a.shape)))
            else:
                parts.append(("s",) + _scalar_key(a))
        return tuple(parts)

    # ------------------------------------------------------------------ compile
    def _variant(self, args) -> tuple[Variant, list[np.ndarray], dict | None]:
        prepared, is_t, arrays, copies = self._split_args(args)
        key = self._key(prepared, is_t)
        with self._lock:
            for v in self._variants.get(key, []):
                env = v.matches(arrays)
                if env is not None:
                    if copies:
                        v.copies = tuple(copies)
                    return v, arrays, env
        v = self._build(prepared, is_t, arrays)
        v.copies = tuple(copies)
        with self._lock:
            self._variants.setdefault(key, []).append(v)
        return v, arrays, None

    def _build(self, prepared, is_t, arrays) -> Variant:
        graph = trace(self.fn, prepared, is_t)
        # arrays index -> position among traced args
        pos = [i for i, t in enumerate(is_t) if t]
        try:
            fixed: frozenset = frozenset()
            while True:
                gir = graphgen.build(graph, fixed)
                try:
                    c = compile_graph(gir.module, name=self.name, target=self.target, arch=self.arch,
                                      pins=self.schedule)
                    break
                except SpecializeRequest as e:   # a generator needs these sizes fixed: specialise, again
                    more = fixed | {(a.index, axis) for a in graph.args for axis in range(len(a.shape))
                                    if f"d{a.index}_{axis}" in e.symbols}
                    if more == fixed:
                        raise
                    fixed = frozenset(more)
            static = {(pos.index(a), axis): arrays[pos.index(a)].shape[axis] for a, axis in gir.static}
            c.static = frozenset(static)
            return Variant(static, c, graph)
        except FrontendError:
            raise
        except TesseraError as e:
            if self.strict:
                raise
            return Variant({(i, ax): s for i, a in enumerate(arrays) for ax, s in enumerate(a.shape)}, None, graph,
                           reason=f"{e.code}: {e.message}")

    # ------------------------------------------------------------------ call
    def __call__(self, *args):
        sig = _signature(args)
        hit = self._plans.get(sig) if sig is not None else None
        if hit is not None:
            v, plan = hit
            outs = v.compiled.executable.run_plan(plan, [a for a in args if type(a) is np.ndarray])
            LOG.record(v.decision)
            return tuple(outs) if v.graph.tuple_output else outs[0]
        v, arrays, env = self._variant(args)
        if v.compiled is None:
            LOG.record(LaneDecision(self.name, "reference", v.reason, requested_fallback=True))
            outs = reference.evaluate(v.graph, arrays)
        else:
            exe = v.compiled.executable
            if sig is not None and hasattr(exe, "run_plan"):   # the CPU lane: keep this call's plan
                if env is None:
                    env = bind_symbols(exe.program.inputs, arrays)
                plan = exe.plan(env)
                outs = exe.run_plan(plan, arrays)
                if len(self._plans) >= MAX_PLANS:
                    self._plans.clear()
                self._plans[sig] = (v, plan)
            else:
                outs = exe.run(arrays, env)   # raises if the lane cannot run here
            if v.decision is None:
                v.decision = LaneDecision(self.name, self.lane, "compiled")
            LOG.record(v.decision)
        return tuple(outs) if v.graph.tuple_output else outs[0]

    @property
    def lane(self) -> str:
        return "cpu-x86" if self.target == "cpu" else f"{self.target}-{self.arch}"

    def compile(self, *args) -> "Artifact":
        v, _, _ = self._variant(args)
        return Artifact(self, v)

    def explain(self, *args) -> LaneReport:
        return self.compile(*args).report()


class Artifact:
    """A compiled specialisation: IR of every layer, machine code, the report; callable."""

    def __init__(self, fn: JitFunction, variant: Variant):
        self.fn = fn
        self.variant = variant

    @property
    def compiled(self) -> Compiled:
        if self.variant.compiled is None:
            raise FrontendError(f"{self.fn.name} runs on the reference lane ({self.variant.reason}); "
                                "it has no compiled artifact")
        return self.variant.compiled

    def ir(self, layer: str = "graph") -> str:
        if layer == "llvm":
            return self.compiled.llvm_ir
        if layer not in self.compiled.layer_ir:
            raise ArgumentError(f"no IR for layer {layer!r}; layers: graph (as traced), graph-fused, schedule, "
                                "tile, target, llvm")
        return self.compiled.layer_ir[layer]

    def asm(self) -> str:
        return self.compiled.asm()

    def binary(self) -> bytes:
        """GPU: the code object (.hsaco) or cubin bytes; CPU: the object code."""
        return self.compiled.binary or self.compiled.meta.get("obj", b"") or b""

    def ptx(self) -> str:
        if self.compiled.target != "nvidia":
            raise ArgumentError(f"ptx() is for the NVIDIA lane; this artifact is for {self.compiled.target}")
        return self.compiled.ptx

    def abi(self) -> list[dict]:
        """GPU: each kernel's launch contract (symbol, argument offsets, block, grid, shared memory)."""
        return [dict(a) for a in self.compiled.abis]

    def emulate(self, *args):
        """Run the GPU kernels in the wave/warp emulator (numpy); returns what the call would."""
        c = self.compiled
        if c.target not in ("rocm", "nvidia"):
            raise ArgumentError("emulate() runs GPU artifacts; this one is for the CPU")
        v, arrays, env = self.fn._variant(args)
        outs = c.executable.emulate(arrays, env)
        return tuple(outs) if v.graph.tuple_output else outs[0]

    def report(self) -> LaneReport:
        v = self.variant
        if v.compiled is None:
            return LaneReport(self.fn.name, "reference", self.fn.target, str(self.fn.arch), "", [], [], [], [], {},
                              "none", "", list(v.copies), [], v.reason)
        c = v.compiled
        isa = resolve_arch(c.target, c.arch)
        m = c.meta
        static = [f"argument {i} axis {ax} = {n}" for (i, ax), n in sorted(v.static.items())]
        return LaneReport(self.fn.name, c.lane, c.target, c.arch, c.cpu, feature_list(isa), m["layers"],
                          m["passes"], m["kernels"], m["compile_ms"], c.cache_status, m["pipeline"], list(v.copies),
                          static)

    def __call__(self, *args):
        return self.fn(*args)


def _with_deterministic(schedule: dict | None, deterministic: bool) -> dict | None:
    """``deterministic=True`` is the schedule pin of that name (docs/numerics.md)."""
    return {**(schedule or {}), "deterministic": True} if deterministic else schedule


def jit(fn=None, *, target: str = "cpu", arch: str | None = None, strict: bool = True, schedule: dict | None = None,
        deterministic: bool = False):
    """Compile a Python function over arrays.  Usable as ``@jit`` or ``@jit(target=..., ...)``.
    ``deterministic=True``: results bit-identical whatever the calling thread's floating-point
    mode too (kernels run with FTZ/DAZ off); every kernel already gives the same bits for every
    thread count and run (docs/numerics.md)."""
    schedule = _with_deterministic(schedule, deterministic)

    def wrap(f):
        return JitFunction(f, target=target, arch=arch, strict=strict, schedule=schedule)
    return wrap(fn) if fn is not None else wrap


def compile(fn, *example_args, target: str = "cpu", arch: str | None = None, schedule: dict | None = None,  # noqa: A001
            deterministic: bool = False):
    """Compile ``fn`` for the example arguments without running it."""
    jf = fn if isinstance(fn, JitFunction) else JitFunction(fn, target=target, arch=arch,
                                                            schedule=_with_deterministic(schedule, deterministic))
    if deterministic and isinstance(fn, JitFunction):
        jf = jf.with_schedule(deterministic=True)
    return jf.compile(*example_args)


def explain(fn, *args) -> LaneReport:
    jf = fn if isinstance(fn, JitFunction) else JitFunction(fn)
    return jf.explain(*args)
