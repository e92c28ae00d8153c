"""``tessera.jit``, ``tessera.compile`` and ``tessera.explain``.

A call is specialised on the arguments' dtypes and ranks, which dimensions are 1,
and any Python scalars; sizes stay symbolic, so a sweep of shapes reuses one
compiled kernel.  Dispatch is strict: the compiled lane runs or the call raises.
Only ``strict=False`` lets a failed compile run the numpy reference instead, and
the lane log records it.
"""
from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np

from tessera import dtypes as dt
from tessera import forksafe
from tessera.errors import (
    ArgumentError,
    FrontendError,
    ScalarSpecialize,
    SpecializeRequest,
    TesseraError,
    UnsupportedConstructError,
)
from tessera.frontend import graphgen, interop, reference
from tessera.frontend.artifact import Artifact
from tessera.frontend.compile import check_pins, compile_graph, resolve_arch
from tessera.frontend.jit_prepare import Variant, split_args  # noqa: F401  (artifact.py imports Variant here)
from tessera.frontend.jit_args import (  # noqa: F401  (to_scalar and _scalar_key are imported from here)
    _as_tuple, _call_params, _donate_positions, _donated_indices, _dynamic_hint, _int_scalars, _is_number, _pattern,
    _scalar_key, _settings, _static_positions, _with_deterministic, to_scalar,
)
from tessera.frontend.report import LaneReport
from tessera.frontend.trace import ARRAY, SCALAR, STATIC, Tensor, current_lane, scalar_dtype_for, trace
from tessera.frontend.trace import results  # nested tuples of outputs (value_and_grad's)
from tessera.runtime.cpu import bind_symbols
from tessera.runtime import threads as _threads
from tessera.runtime.lanes import LOG, LaneDecision


MAX_PLANS = 64           # call plans kept per function (a shape sweep replaces them)
# compiled specialisations kept per function, least recently used first out: each distinct Python
# float is one (the kernel bakes it in), and each holds its machine code (~1 MB)
MAX_VARIANTS = 64
# compiles of one function after which a RecompileWarning names their causes (once per function)
RECOMPILE_WARNING_AFTER = 8



class JitFunction:
    def __init__(self, fn, *, target: str | None = None, arch: str | None = None, strict: bool = True,
                 schedule: dict | None = None, static_argnums=(), static_argnames=(), dynamic=None,
                 tune: bool | None = None, donate_argnums=()):
        self.tune = tune
        # arguments whose buffers a result may take (runtime/donation.py; jax.jit's donate_argnums)
        self.donate_argnums = _donate_positions(donate_argnums)   # tune on first compile (None: TESSERA_TUNE=1); frontend/tune.py
        # what the caller asked for (None: not given), which tessera.compile's own settings may not contradict
        self.requested = {"target": target, "arch": arch, "schedule": dict(schedule or {})}
        self.static_argnums, self.static_argnames = _as_tuple(static_argnums), _as_tuple(static_argnames)
        # argument positions whose values are baked in: asked for, and learned from a trace that read
        # a Python-number argument as a Python value (ScalarSpecialize)
        self._params = _call_params(fn)
        # parameters before the keyword-only ones (which _call_fn passes by name)
        self._npositional = sum(p.kind != p.KEYWORD_ONLY for p in self._params or ())
        self._static = _static_positions(fn, self.static_argnums, self.static_argnames)
        self._learned: dict[int, str] = {}   # position -> where the trace read it as a Python value
        # the dtype runtime scalars are passed in, learned from a trace (trace.scalar_dtype_for), per
        # pattern of argument kinds and array dtypes
        self._scalar_dtypes: dict[tuple, np.dtype] = {}
        target = "cpu" if target is None else target
        if target in ("rocm", "nvidia") and arch is None:
            resolve_arch(target, None)   # GPU lanes have no default chip: this raises, naming the known ones
        self.fn = fn
        self.target = target
        self.arch = arch
        self.strict = strict
        self.schedule = check_pins(schedule, target)
        self.name = getattr(fn, "__name__", "fn")
        # key -> its specialisations; least recently used key first (bounded by MAX_VARIANTS in all)
        self._variants: OrderedDict[tuple, list[Variant]] = OrderedDict()
        self._nvariants = 0
        # signature -> (variant, CallPlan): a repeated call goes straight to its launches
        self._plans: dict[tuple, tuple] = {}
        self.compiles: list[str] = []   # why each specialisation was compiled, oldest first
        self._keys_seen: set[tuple] = set()
        self._warned = False
        forksafe.lock(self, "_lock")
        functools.update_wrapper(self, fn)
        self.dynamic = dynamic   # dynamic-shape buckets (frontend/dynamic.py): arg -> axes
        self._dyn = None
        if dynamic:   # a dynamic-shape bucket wrapper (frontend/dynamic.py imports this module)
            from tessera.frontend.dynamic import Buckets
            self._dyn = Buckets(self, dynamic)

    # ------------------------------------------------------------------ keyword arguments
    def _flat(self, args: tuple, kwargs: dict) -> tuple:
        """The call's arguments in parameter order: keywords (keyword-only ones too) take their
        parameter's position; a parameter skipped before the last one given takes its default.
        Specialisation, static_argnames and the runtime-scalar rules then see positions only."""
        if not kwargs:
            return args
        params = self._params
        if params is None:
            raise ArgumentError(f"{self.name}: keyword arguments need a function whose signature has no "
                                "*args or **kwargs (pass them by position)")
        names = [p.name for p in params]
        vals = list(args)
        if len(vals) > len(params):
            raise ArgumentError(f"{self.name} takes {len(params)} arguments, got {len(vals)}")
        given = {}
        for k, val in kwargs.items():
            if k not in names:
                raise ArgumentError(f"{self.name} has no parameter {k!r} (parameters: {', '.join(names)})")
            i = names.index(k)
            if params[i].kind == params[i].POSITIONAL_ONLY:
                raise ArgumentError(f"{self.name}: parameter {k!r} is positional-only")
            if i < len(vals):
                raise ArgumentError(f"{self.name}: argument {k!r} given by position and by keyword")
            given[i] = val
        for i in range(len(vals), max(given) + 1):
            if i in given:
                vals.append(given[i])
            elif params[i].default is not params[i].empty:
                vals.append(params[i].default)
            else:
                raise ArgumentError(f"{self.name}: missing argument {names[i]!r}")
        return tuple(vals)

    def _call_fn(self, *flat):
        """``fn`` called with arguments in parameter order (keyword-only ones by name)."""
        n = self._npositional
        if self._params is None or len(flat) <= n:
            return self.fn(*flat)
        return self.fn(*flat[:n], **{p.name: v for p, v in zip(self._params[n:], flat[n:])})

    def with_schedule(self, **pins) -> "JitFunction":
        """The same function with schedule choices pinned (per-call overrides)."""
        return JitFunction(self.fn, target=self.requested["target"], arch=self.arch, strict=self.strict,
                           schedule={**self.schedule, **pins}, static_argnums=self.static_argnums,
                           static_argnames=self.static_argnames, dynamic=self.dynamic, tune=self.tune,
                           donate_argnums=self.donate_argnums)

    def retarget(self, target: str | None = None, arch: str | None = None, schedule: dict | None = None,
                 what: str = "tessera.compile") -> "JitFunction":
        """This function for the settings ``what`` was given: each one not given keeps this function's;
        one this function was decorated with and ``what`` contradicts is refused, naming both."""
        req = self.requested
        clash = []
        if target is not None and req["target"] is not None and target != req["target"]:
            clash.append(f"target={req['target']!r} vs target={target!r}")
        if arch is not None and req["arch"] is not None and arch != req["arch"]:
            clash.append(f"arch={req['arch']!r} vs arch={arch!r}")
        for k, v in (schedule or {}).items():
            if k in req["schedule"] and req["schedule"][k] != v:
                clash.append(f"schedule {k}={req['schedule'][k]!r} vs {k}={v!r}")
        if clash:
            raise ArgumentError(f"{self.name} is decorated with tessera.jit({_settings(req)}) and {what} asks for "
                                f"{_settings({'target': target, 'arch': arch, 'schedule': schedule})}: "
                                f"{'; '.join(clash)}; give the setting in one place (or pass the undecorated "
                                f"function, {self.name}.fn)")
        new_target = req["target"] if target is None else target
        same_target = (new_target or "cpu") == self.target
        new_arch = arch if arch is not None else (self.arch if same_target else None)
        pins = {**req["schedule"], **(schedule or {})}
        if same_target and new_arch == self.arch and pins == req["schedule"]:
            return self
        return JitFunction(self.fn, target=new_target, arch=new_arch, strict=self.strict, schedule=pins,
                           static_argnums=self.static_argnums, static_argnames=self.static_argnames,
                           dynamic=self.dynamic, tune=self.tune, donate_argnums=self.donate_argnums)

    # ------------------------------------------------------------------ called while tracing
    def _inline(self, args):
        """Called inside another jitted function: trace ``fn`` into the caller's graph.  Its settings
        must agree with the caller's (they cannot apply to part of one compiled graph)."""
        lane = current_lane()
        if lane is not None:
            target, arch, pins = lane
            req = self.requested
            clash = []
            if req["target"] not in (None, target):
                clash.append(f"target={req['target']!r} (the caller compiles for {target!r})")
            if req["arch"] not in (None, arch):
                clash.append(f"arch={req['arch']!r} (the caller's is {arch!r})")
            clash += [f"schedule {k}={v!r} (the caller's: {pins.get(k, 'unpinned')!r})"
                      for k, v in req["schedule"].items() if pins.get(k) != v]
            if clash:
                raise UnsupportedConstructError(
                    f"{self.name} is called inside a traced function, so its graph is compiled as part of the "
                    f"caller's, but it was decorated with {'; '.join(clash)}; put the setting on the outermost "
                    "tessera.jit, or drop it here")
        return self._call_fn(*args)

    # ------------------------------------------------------------------ arguments
    def _split_args(self, args) -> tuple[list, list[str], list[np.ndarray], list[str]]:
        """Each argument prepared for the trace, its kind, the kernel's arrays and the copies made."""
        return split_args(self, args)


    def _key(self, prepared, kinds) -> tuple:
        parts = []
        for a, k in zip(prepared, kinds):
            if k == ARRAY:
                parts.append(("a", a.dtype, tuple(s == 1 for s in a.shape)))
            elif k == SCALAR:
                parts.append(("w", a.dtype))
            else:
                parts.append(("s",) + _scalar_key(a))
        return tuple(parts)

    # ------------------------------------------------------------------ compile
    def _variant(self, args) -> tuple[Variant, list[np.ndarray], dict | None]:
        while True:
            prepared, kinds, arrays, copies = self._split_args(args)
            ints = _int_scalars(args, kinds)
            key = self._key(prepared, kinds)
            nthreads = None   # the thread count calls run with now (asked for when a specialisation depends on it)
            with self._lock:
                vs = self._variants.get(key)
                for v in vs or ():
                    if v.ints is not None and v.ints != ints:   # a Python int traced unlike a float here
                        continue
                    if v.threads is not None:   # its schedule was chosen for a thread count: that count only
                        if nthreads is None:
                            nthreads = self._run_threads()
                        if nthreads not in v.threads:
                            continue
                        v.threads_version = _threads.version()
                    env = v.matches(arrays)
                    if env is not None:
                        if copies:
                            v.copies = tuple(copies)
                        self._variants.move_to_end(key)
                        if vs[-1] is not v:
                            vs.remove(v)
                            vs.append(v)
                        return v, arrays, env
            try:
                v = self._build(prepared, kinds, arrays, ints)
            except ScalarSpecialize as e:   # the trace read a number argument as a Python value
                if not self._learn(e, kinds):
                    raise
                continue
            if v is None:   # the numbers are better passed in another dtype (learned): again
                continue
            if v.threads is not None:   # another count's specialisation with the same schedule serves this one too
                with self._lock:
                    same = next((w for w in self._variants.get(key, ()) if w.threads is not None and w.compiled
                                 is not None and v.compiled is not None and w.compiled.key == v.compiled.key
                                 and w.static == v.static and w.ints == v.ints), None)
                    if same is not None:
                        for n in v.threads:
                            same.serve_threads(n)
                        same.threads_version = _threads.version()
                        if copies:
                            same.copies = tuple(copies)
                        return same, arrays, None
            break
        v.copies = tuple(copies)
        v.key = key
        self._count_compile(key, kinds, prepared, arrays, next(iter(v.threads)) if v.threads else None)
        v.scalars = tuple(i for i, k in enumerate(kinds) if k == SCALAR)
        v.scalar_dtype = next((a.dtype for a, k in zip(prepared, kinds) if k == SCALAR), v.scalar_dtype)
        v.donated_positions = _donated_indices(self.name, self.donate_argnums, kinds)
        v.donated = frozenset(v.donated_positions.values())
        with self._lock:
            self._variants.setdefault(key, []).append(v)
            self._variants.move_to_end(key)
            self._nvariants += 1
            self._evict()
        return v, arrays, None

    def _learn(self, e: ScalarSpecialize, kinds) -> bool:
        """Whether tracing again can help: the arguments ``e`` names become static (or the numbers
        float64), for this call and every later one."""
        with self._lock:
            new = {i for i in e.indices if kinds[i] == SCALAR}
            where = f" at {e.location}" if e.location else ""
            self._learned.update({i: f"{e.message.split(' of a Python-number')[0]}{where}" for i in new})
            return bool(new)

    def _run_threads(self) -> int:
        from tessera.frontend.tune import run_threads
        return run_threads(self.schedule)

    def _count_compile(self, key, kinds, prepared, arrays, nthreads: int | None = None) -> None:
        """Record why this specialisation was compiled; past RECOMPILE_WARNING_AFTER, warn once."""
        import warnings

        from tessera.errors import RecompileWarning
        with self._lock:
            if not self.compiles:
                cause = "first call"
            elif key in self._keys_seen and nthreads is not None and any(
                    v.threads is not None and nthreads not in v.threads for v in self._variants.get(key, ())):
                cause = (f"thread count {nthreads} (the schedule comes from a tuning-database entry per thread "
                         "count; tessera.set_num_threads / TESSERA_NUM_THREADS changed)")
            elif key in self._keys_seen:
                cause = (f"sizes {[a.shape for a in arrays]} (a size is compiled in)" if key in self._variants
                         else "compiled again after eviction (MAX_VARIANTS specialisations are kept)")
            else:
                statics = [f"argument {i} = {a!r}" + (f" (read as a Python value: {self._learned[i]})"
                                                       if i in self._learned else " (static)")
                           for i, (a, k) in enumerate(zip(prepared, kinds)) if k == STATIC]
                arr = ", ".join(f"{dt.name(a.dtype)}{list(a.shape)}" for a in arrays)
                cause = f"new arguments: {arr}" + (f"; {'; '.join(statics)}" if statics else "")
            self._keys_seen.add(key)
            self.compiles.append(cause)
            warn = len(self.compiles) > RECOMPILE_WARNING_AFTER and not self._warned
            self._warned |= warn
        if warn:
            last = "\n  ".join(self.compiles[-RECOMPILE_WARNING_AFTER:])
            warnings.warn(RecompileWarning(
                f"tessera.jit: {self.name} has been compiled {len(self.compiles)} times; the last causes:\n  {last}\n"
                "a value compiled in (static_argnames, or a number read as a Python value) compiles once per "
                "value" + _dynamic_hint(self.compiles[-RECOMPILE_WARNING_AFTER:])), stacklevel=4)

    def _evict(self) -> None:
        """Drop the least recently used specialisations beyond MAX_VARIANTS, and their call plans
        (the caller holds the lock)."""
        gone = []
        while self._nvariants > max(1, MAX_VARIANTS):
            # single dict operations: a call's move_to_end (no lock) may run between any two
            key, vs = self._variants.popitem(last=False)
            gone.append(vs.pop(0))
            self._nvariants -= 1
            if vs:
                self._variants[key] = vs
                self._variants.move_to_end(key, last=False)
        if gone:
            ids = {id(v) for v in gone}
            self._plans = {s: p for s, p in self._plans.items() if id(p[0]) not in ids}

    def _build(self, prepared, kinds, arrays, ints=frozenset()) -> Variant | None:
        """The compiled specialisation, or None where the trace shows the runtime scalars are
        better passed in another dtype (recorded: the caller prepares the arguments again)."""
        graph = self._trace(prepared, kinds, ints)
        if SCALAR in kinds:
            have = next(a.dtype for a, k in zip(prepared, kinds) if k == SCALAR)
            want = np.dtype(scalar_dtype_for(graph, have))
            if want != have:
                pattern = _pattern(kinds, [a for a, k in zip(prepared, kinds) if k == ARRAY], ints)
                with self._lock:
                    if self._scalar_dtypes.get(pattern) is None:   # learned once: no back and forth
                        self._scalar_dtypes[pattern] = want
                        return None
        # arrays index -> position among traced args
        pos = [i for i, k in enumerate(kinds) if k != STATIC]
        from tessera.frontend import tune as tuning
        # the tuning database's pins, or the caller's; nthreads: the thread count they were chosen for
        pins, source, nthreads = tuning.schedule_for(self, graph, arrays)
        try:
            fixed: frozenset = frozenset()
            while True:
                gir = graphgen.build(graph, fixed)
                try:
                    c = compile_graph(gir.module, name=self.name, target=self.target, arch=self.arch,
                                      pins=pins)
                    break
                except SpecializeRequest as e:   # a generator needs these sizes fixed: specialise, again
                    more = fixed | {(a.index, axis) for a in graph.args for axis in range(len(a.shape))
                                    if f"d{a.index}_{axis}" in e.symbols}
                    if more == fixed:
                        raise
                    fixed = frozenset(more)
            static = {(pos.index(a), axis): arrays[pos.index(a)].shape[axis] for a, axis in gir.static}
            c.static = frozenset(static)
            v = Variant(static, c, graph, ints=ints if graph.int_sensitive else None, schedule_source=source,
                        threads_version=_threads.version())
            if nthreads is not None:
                v.serve_threads(nthreads)
            return v
        except FrontendError:
            raise
        except TesseraError as e:
            if self.strict:
                raise
            return Variant({(i, ax): s for i, a in enumerate(arrays) for ax, s in enumerate(a.shape)}, None, graph,
                           reason=f"{e.code}: {e.message}", ints=ints if graph.int_sensitive else None)

    def _trace(self, prepared, kinds, ints):
        """The function traced for these arguments (dynamic.BucketedJit adds its masks here)."""
        return trace(self._call_fn, prepared, kinds, lane=(self.target, self.arch, self.schedule), int_scalars=ints)

    # ------------------------------------------------------------------ call
    def _signature(self, args) -> tuple | None:
        """What a call plan is keyed by: each argument's dtype and shape (C-contiguous arrays
        only: others are copied first), a number's type (its value too where it is static);
        None where no plan may serve."""
        sig = []
        static = self._static.union(self._learned)
        for i, a in enumerate(args):
            if type(a) is np.ndarray:
                if not a.flags.c_contiguous or i in static:
                    return None
                sig.append((a.dtype, a.shape))
            elif type(a) is float or type(a) is int:
                sig.append(_scalar_key(a) if i in static else type(a))
            else:
                return None
        return tuple(sig)

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._flat(args, kwargs)
        if self._dyn is not None and not any(isinstance(a, Tensor) for a in args):
            if interop.has_foreign(self, args):   # read as numpy first; the results go back in kind
                return interop.call(self, args)
            return self._dyn.call(args)   # padded to its bucket, masked, sliced back (frontend/dynamic.py)
        sig = self._signature(args)
        hit = self._plans.get(sig) if sig is not None else None
        if hit is not None and hit[0].threads is not None and hit[0].threads_version != _threads.version():
            hit = None   # the thread setting moved since: its schedule may be another count's (checked below)
        if hit is not None:
            v, plan = hit
            try:
                self._variants.move_to_end(v.key)   # recently used (one C call; evicted meanwhile: no matter)
            except KeyError:
                pass
            outs = v.compiled.executable.run_plan(plan, v.bind(args))
            LOG.record(v.decision)
            return results(v.graph, outs)
        if sig is None and any(isinstance(a, Tensor) for a in args):
            return self._inline(args)   # called by a function being traced: compose
        if sig is None and interop.has_foreign(self, args):   # torch / JAX / DLPack arrays: in and out
            return interop.call(self, args)
        v, arrays, env = self._variant(args)
        if v.compiled is None:
            LOG.record(LaneDecision(self.name, "reference", v.reason, requested_fallback=True))
            # a result never aliases an argument (numpy's transpose and reshape are views)
            outs = [o.copy() if any(np.may_share_memory(o, a) for a in arrays) else o
                    for o in reference.evaluate(v.graph, arrays)]
        else:
            exe = v.compiled.executable
            if sig is not None and hasattr(exe, "run_plan"):   # the CPU lane: keep this call's plan
                if env is None:
                    env = bind_symbols(exe.program.inputs, arrays)
                plan = exe.plan(env, v.donated)
                outs = exe.run_plan(plan, arrays)
                if len(self._plans) >= MAX_PLANS:
                    self._plans.clear()
                self._plans[sig] = (v, plan)
            else:
                # raises if the lane cannot run here; only the CPU lane writes into donated buffers
                outs = exe.run(arrays, env, v.donated) if v.donated and hasattr(exe, "donation_for") else \
                    exe.run(arrays, env)
            if v.decision is None:
                v.decision = LaneDecision(self.name, self.lane, "compiled" + getattr(exe, "copy_note", ""))
            LOG.record(v.decision)
        return results(v.graph, outs)

    @property
    def lane(self) -> str:
        return "cpu-x86" if self.target == "cpu" else f"{self.target}-{self.arch}"

    def compile(self, *args, **kwargs) -> "Artifact":
        if self._dyn is not None:
            return self._dyn.compile(self._flat(args, kwargs))
        v, arrays, _ = self._variant(self._flat(args, kwargs))
        return Artifact(self, v, [a.shape for a in arrays])   # the sizes it was compiled for (tessera.export)

    def explain(self, *args, **kwargs) -> LaneReport:
        return self.compile(*args, **kwargs).report()


def jit(fn=None, *, target: str | None = None, arch: str | None = None, strict: bool = True,
        schedule: dict | None = None, deterministic: bool = False, static_argnums=(), static_argnames=(),
        dynamic=None, tune: bool | None = None, donate_argnums=()):
    """Compile a Python function over arrays.  Usable as ``@jit`` or ``@jit(target=..., ...)``;
    ``target`` None is the CPU (``"cpu"``), ``arch`` None its host chip (GPU targets need one).
    ``deterministic=True``: results bit-identical whatever the calling thread's floating-point
    mode too (kernels run with FTZ/DAZ off); every kernel already gives the same bits for every
    thread count and run (docs/numerics.md).

    A Python float or int argument is a runtime value: one compiled kernel serves every learning rate
    or temperature.  It takes the dtype of the arrays it meets (NEP 50).  Where the function reads it
    as a Python value (a size, an axis, ``eps=``, ``if s > 0``, ``math.sqrt(s)``) the call is
    specialised on its value instead; ``static_argnums`` / ``static_argnames`` ask for that up
    front (and pass other hashable values: strings, tuples).  ``None`` and bools are always
    static.

    ``dynamic={"x": 1}`` (a parameter name or position -> an axis, a tuple of axes, or a dict
    ``{axis: "length name"}`` for independent lengths such as batch and sequence) marks a
    dimension whose size changes from call to call (a sequence length): calls are compiled once
    per power-of-two bucket (at least ``dynamic.MIN_BUCKET``; lengths 65..128 share the 128
    compile), the arguments padded with zeros to the bucket, every reduction, contraction and
    normalisation over the padded axis masked with its neutral element (the true length is a
    runtime value), and results sliced back to the true length.  Ops that cannot be masked along
    the axis (a reshape merging it, a slice or pad along it, conv, layer_norm over it) are
    refused with ``DYNAMIC_SHAPE`` (docs/architecture.md, "Recompiles and dynamic shapes").

    ``tune=True`` (or ``TESSERA_TUNE=1``) measures schedule candidates on the first compile of a
    shape and keeps the best in the tuning database; without it an entry there is still used
    (frontend/tune.py, docs/tuning.md).

    ``donate_argnums`` (as in ``jax.jit``): arguments whose buffers a result may take, so that
    ``params = step(params, grads)`` updates in place.  The host program writes a result into a
    donated array only where the kernel computing it reads that array at no other element than it
    writes, and no later kernel reads it (``tessera.explain`` lists each donation as honoured or
    refused, and why); otherwise the result is allocated as usual.  After a call whose donation was
    honoured, the donated numpy array's content is undefined (it holds the result's) and it is
    marked read-only: a write through it raises, and donating it again is ``BAD_DONATION``; keep the
    result.  A read-only array (a JAX array, a DLPack tensor whose producer marks it read-only or
    does not say) or one sharing memory with another argument is refused with ``BAD_DONATION``.
    A result never shares memory with an argument that was not donated."""
    schedule = _with_deterministic(schedule, deterministic)

    def wrap(f):
        return JitFunction(f, target=target, arch=arch, strict=strict, schedule=schedule,
                           static_argnums=static_argnums, static_argnames=static_argnames, dynamic=dynamic,
                           tune=tune, donate_argnums=donate_argnums)
    return wrap(fn) if fn is not None else wrap


def _resolve(fn, target, arch, schedule, what: str) -> JitFunction:
    if isinstance(fn, Artifact):
        fn = fn.fn
    if isinstance(fn, JitFunction):   # its own settings hold where these are not given; a contradiction is refused
        return fn.retarget(target, arch, schedule, what)
    return JitFunction(fn, target=target, arch=arch, schedule=schedule)


def compile(fn, *example_args, target: str | None = None, arch: str | None = None,  # noqa: A001
            schedule: dict | None = None, deterministic: bool = False, **example_kwargs) -> Artifact:
    """Compile ``fn`` for the example arguments without running it.  ``fn`` may be a
    ``tessera.jit`` function: settings given here apply to it, and one that contradicts its
    decorator's is refused (``BAD_ARGUMENT``, naming both).  Other keywords are ``fn``'s."""
    return _resolve(fn, target, arch, _with_deterministic(schedule, deterministic),
                    "tessera.compile").compile(*example_args, **example_kwargs)


def explain(fn, *args, target: str | None = None, arch: str | None = None,
            schedule: dict | None = None, **kwargs) -> LaneReport:
    """The lane report of ``fn`` compiled for ``args`` (settings as in ``tessera.compile``; other
    keywords are ``fn``'s)."""
    return _resolve(fn, target, arch, schedule, "tessera.explain").explain(*args, **kwargs)
