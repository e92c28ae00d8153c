"""Graph IR -> a CPU executable, through the named pipeline, LLVM and the cache.

``compile_graph`` runs ``tessera-cpu{arch=<resolved>}`` (instrumented: every pass
is recorded), keeps the IR of each layer, translates the Target IR to LLVM IR,
emits object code for the resolved CPU name and features, and loads it.  ``arch``
None means the host: it is resolved to LLVM's host CPU name and feature set before
any lowering runs, and those are what the cache key holds.

Compiled graphs are kept in memory (least recently used evicted past ``MEMORY_MAX``) and on
disk (``runtime/cache.py``).  Threads compiling the same key at once wait for the first.
A disk entry that fails its field checks, or does not load, is discarded and recompiled.
A failure inside the compiler (a Python exception, or ``PASS_FAILED``) writes a reproducer
(``frontend/repro.py``) and names it in the error.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp

from tessera import forksafe
from tessera.codegen import jit as cj
from tessera.errors import (CompilerInternalError, PassFailedError, ScheduleIllegalError, TesseraError,
                            UnknownArchError)
from tessera.frontend import cpu_codegen, gc_pause, repro
from tessera.ir import schedule as s
from tessera.ir.attrs import ints, strs
from tessera.ir.context import LAYERS, layer_of
from tessera.ir.target.x86 import ENTRY_SUFFIX
from tessera.ir.text import print_ir
from tessera.mma import x86 as X
from tessera.mma.selector import get_isa, record_by_id
from tessera.passes.base import fmt_option
from tessera.passes.pipeline import parse_pipeline, run_pipeline
from tessera.runtime import cache
from tessera.runtime.cpu import CpuExecutable, HostProgram

PIN_KEYS = {"tile_m": int, "tile_n": int, "tile_k": int, "register_tile": tuple, "mma_shape": tuple,
            "parallel": str, "threads": int, "unroll": int, "chunk": int, "deterministic": bool, "pin_kinds": str,
            "split": int}
GPU_PIN_KEYS = {"tile_m": int, "tile_n": int, "tile_k": int, "register_tile": tuple, "mma_shape": tuple,
                "staging": int, "mma_family": str, "math_mode": str, "copy_engine": str}
TARGETS = ("cpu", "rocm", "nvidia")
KNOWN_TARGETS = ("cpu", "rocm", "nvidia", "apple")
GPU_TARGETS = ("rocm", "nvidia")


def check_pins(pins: dict | None, target: str = "cpu") -> dict:
    pins = dict(pins or {})
    keys = GPU_PIN_KEYS if target in GPU_TARGETS else PIN_KEYS
    for k, v in list(pins.items()):
        if k not in keys:
            raise ScheduleIllegalError(f"unknown schedule key {k!r} for target {target!r}; legal: {', '.join(keys)}")
        want = keys[k]
        if want is bool:   # deterministic: the pipeline option of that name (docs/numerics.md)
            if not isinstance(v, bool):
                raise ScheduleIllegalError(f"schedule {k}={v!r}: expected True or False")
            if not v:
                del pins[k]   # the default: the same pipeline, the same cache key
        elif want is tuple:
            if not (isinstance(v, (tuple, list)) and all(isinstance(i, int) and i > 0 for i in v)):
                raise ScheduleIllegalError(f"schedule {k}={v!r}: expected a tuple of positive ints")
            pins[k] = tuple(v)
        elif want is int:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or (k in ("threads", "unroll") and v < 1):
                raise ScheduleIllegalError(f"schedule {k}={v!r}: expected a positive int")
        elif k == "pin_kinds":   # the kernel kinds schedule-cpu knows
            from tessera.passes.schedule.schedule_cpu import PARALLEL_LEGAL
            if not (isinstance(v, str) and v and all(x in PARALLEL_LEGAL for x in v.split("+"))):
                raise ScheduleIllegalError(f"schedule pin_kinds={v!r}: '+'-joined kernel kinds of "
                                           f"{', '.join(PARALLEL_LEGAL)}")
        elif k == "math_mode":
            if v not in ("tf32", "xf32"):
                raise ScheduleIllegalError(f"schedule math_mode={v!r}; legal: 'tf32' (nvidia), 'xf32' (rocm gfx942)")
        elif k == "copy_engine":
            if v not in ("threads", "tma"):
                raise ScheduleIllegalError(f"schedule copy_engine={v!r}; legal: 'threads' (every thread copies its "
                                           "share), 'tma' (the tensor copy engine, NVIDIA sm_90a)")
        elif k == "mma_family":
            if v not in ("wmma", "mfma", "mma_sync", "wgmma"):
                raise ScheduleIllegalError(f"schedule mma_family={v!r}; GPU families: wmma, mfma, mma_sync, wgmma")
        elif not isinstance(v, str) or v not in ("m", "b*m", "r", "none"):
            raise ScheduleIllegalError(f"schedule parallel={v!r}; legal: 'm' (gemm rows, shared B), 'b*m' (gemm "
                                       "batch x rows), 'r' (rows of other kernels), 'none'")
    from tessera.passes.schedule.bounds import check_static   # the ranges the schedule passes enforce too
    check_static(pins, target)
    return pins


def pipeline_spec(arch: str, pins: dict, target: str = "cpu") -> str:
    opts = [f"arch={arch}"]
    for k, v in sorted(pins.items()):
        spelled = k.replace("_", "-")
        opts.append(f"{spelled}={fmt_option(v)}")
    return f"tessera-{target}{{" + " ".join(opts) + "}"


def resolve_arch(target: str, arch: str | None):
    if target not in KNOWN_TARGETS:
        raise UnknownArchError(f"unknown target {target!r}; known: {', '.join(KNOWN_TARGETS)}")
    if target not in TARGETS:
        raise UnknownArchError(f"target {target!r} has no production pipeline in this build yet; "
                               f"available: {', '.join(TARGETS)}")
    return get_isa("x86" if target == "cpu" else target, arch)


def _highest_layer(census: dict[str, int]) -> str:
    present = {layer_of(n) for n in census} - {None}
    for layer in reversed(LAYERS):
        if layer in present:
            return layer
    return "graph"


def layers_traversed(initial: dict[str, int], records) -> list[str]:
    """Layers in order of first appearance in the op census (input, then after each pass)."""
    seen: list[str] = []
    for census in [initial] + [r.census_after for r in records]:
        for layer in LAYERS:
            if layer not in seen and any(layer_of(n) == layer for n in census):
                seen.append(layer)
    return seen


def kernel_info(module: ModuleOp) -> list[dict]:
    out = []
    for op in module.walk():
        if isinstance(op, s.KernelOp):
            info = {"kernel": op.sym_name.data, "kind": op.kind.data,
                    "tiles": dict(zip(strs(op.loops), ints(op.tiles))), "order": strs(op.order),
                    "parallel": op.parallel.data, "threads": op.threads.value.data,
                    "vector": op.vector.value.data, "unroll": op.unroll.value.data,
                    "ops": [o.name for o in op.body.block.ops if o.name != "tessera.yield"]}
            if op.split is not None:   # the thread / key-chunk split (ir/schedule.py)
                info["split"] = op.split.value.data
            if op.mma.data:
                rec = record_by_id(op.mma.data)
                info["mma"] = {"record": rec.id, "mnemonic": rec.mnemonic, "shape": list(rec.shape),
                               "lowered_by": rec.lowered_by}
                info["register_tile"] = ints(op.register_tile)
            out.append(info)
    return out


@dataclass
class Compiled:
    name: str
    target: str
    arch: str
    cpu: str
    features: str
    spec: str
    key: str
    layer_ir: dict[str, str]
    llvm_ir: str
    meta: dict
    executable: CpuExecutable
    cache_status: str
    kernels: list[str]
    arg_dims: list = field(default_factory=list)
    static: frozenset = frozenset()
    _asm: str | None = None
    binary: bytes = b""          # GPU: the .hsaco / .cubin
    ptx: str = ""                # NVIDIA: the PTX text
    abis: list = field(default_factory=list)

    @property
    def lane(self) -> str:
        return "cpu-x86" if self.target == "cpu" else f"{self.target}-{self.arch}"

    def asm(self) -> str:
        if self._asm is None:
            self._asm = cj.emit_cpu(self.llvm_ir, self.cpu, self.features, want_asm=True).asm or ""
        return self._asm


# Compiled graphs of this process by key, least recently used first; bounded so that a stream of
# distinct graphs (e.g. distinct Python scalars baked into them) does not grow memory without end.
MEMORY_MAX = 256
_MEMORY: OrderedDict[str, Compiled] = OrderedDict()
_MEMORY_LOCK = forksafe.lock(sys.modules[__name__], "_MEMORY_LOCK")
_KEY_LOCKS: dict[str, list] = {}     # key -> [lock, threads using it]: one compile per key at a time


def _memory_get(key: str) -> Compiled | None:
    with _MEMORY_LOCK:
        c = _MEMORY.get(key)
        if c is not None:
            _MEMORY.move_to_end(key)
        return c


def _memory_put(key: str, c: Compiled) -> None:
    with _MEMORY_LOCK:
        _MEMORY[key] = c
        _MEMORY.move_to_end(key)
        while len(_MEMORY) > max(MEMORY_MAX, 0):
            _MEMORY.popitem(last=False)


@contextmanager
def _key_lock(key: str):
    """Held while ``key`` is looked up on disk, compiled and stored: threads compiling the same
    graph at once wait for the first and take its result from memory."""
    with _MEMORY_LOCK:
        slot = _KEY_LOCKS.setdefault(key, [threading.Lock(), 0])
        slot[1] += 1
    try:
        with slot[0]:
            yield
    finally:
        with _MEMORY_LOCK:
            slot[1] -= 1
            if slot[1] == 0:
                del _KEY_LOCKS[key]


def _reset_locks_in_child() -> None:
    """After ``fork``: a lock some other parent thread held stays held forever in the child (that
    thread does not exist there), so the child starts with fresh ones (``_MEMORY_LOCK`` is
    renewed by ``tessera.forksafe``)."""
    _KEY_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_in_child)


def compile_key(graph_text: str, spec: str, isa, target: str) -> str:
    """The cache key: the graph, the pipeline, the CPU name and features the code is built for
    (a cache shared by two chips never hands one the other's instructions), the external
    tools a GPU artifact passes through; ``cache.make_key`` adds the sources and versions."""
    return cache.make_key(graph_text, spec, f"cpu={isa.llvm_cpu or ''}", f"features={isa.llvm_features}",
                          cache.toolchain_identity(target))


def compile_graph(module: ModuleOp, *, name: str, target: str = "cpu", arch: str | None = None,
                  pins: dict | None = None, use_disk: bool = True) -> Compiled:
    t0 = time.perf_counter()
    isa = resolve_arch(target, arch)
    pins = check_pins(pins, target)
    spec = pipeline_spec(isa.arch, pins, target)
    passes = parse_pipeline(spec)  # options are checked before any IR is touched
    graph_text = print_ir(module)
    key = compile_key(graph_text, spec, isa, target)
    if os.environ.get("TESSERA_NO_CACHE"):  # tests that patch the compiler must not reuse old code
        use_disk, use_memory = False, False
    else:
        use_memory = True
    hit = _memory_get(key) if use_memory else None
    if hit is not None:
        return hit
    with _key_lock(key):
        hit = _memory_get(key) if use_memory else None
        if hit is not None:         # another thread compiled it while this one waited
            return hit
        c = _load_or_build(module, name, target, isa, spec, passes, graph_text, key, use_disk, t0)
        if use_memory:
            _memory_put(key, c)
        return c


def _load_or_build(module, name, target, isa, spec, passes, graph_text, key, use_disk, t0) -> Compiled:
    if use_disk:
        entry = cache.load(key, validate=lambda e: entry_ok(e, target))
        if entry is not None:
            try:
                return _materialize(entry, name, target, isa, spec, key, "disk", t0)
            except Exception:  # noqa: BLE001 - an entry that passed its checks but does not load
                cache.discard(key)
    builder = _build_gpu if target in GPU_TARGETS else _build
    progress = _Progress(name, target)
    try:
        with gc_pause.paused():
            entry = builder(module, passes, isa, spec, graph_text)
    except Exception as e:  # noqa: BLE001 - a compiler failure: leave a reproducer, then raise
        coded = _with_reproducer(e, graph_text, spec, target, isa, name, key)
        if coded is e:
            raise
        raise coded from e
    finally:
        progress.done()
    if use_disk:
        cache.store(key, entry, {"function": name, "target": target})
    return _materialize(entry, name, target, isa, spec, key, "compiled", t0)


class _Progress:
    """On a terminal, a compile that takes longer than ``PROGRESS_AFTER_S`` says so on stderr
    (once, then its total when it ends); elsewhere (logs, tests, pipes) nothing is printed."""

    def __init__(self, name: str, target: str):
        import sys
        import threading
        self.t0 = time.perf_counter()
        self.shown = False
        self.name, self.target = name, target
        self.timer = None
        if sys.stderr is not None and sys.stderr.isatty() and not os.environ.get("TESSERA_QUIET"):
            self.timer = threading.Timer(PROGRESS_AFTER_S, self._show)
            self.timer.daemon = True
            self.timer.start()

    def _show(self) -> None:
        import sys
        self.shown = True
        sys.stderr.write(f"tessera: compiling {self.name} for {self.target} ...")
        sys.stderr.flush()

    def done(self) -> None:
        import sys
        if self.timer is not None:
            self.timer.cancel()
        if self.shown:
            sys.stderr.write(f" {time.perf_counter() - self.t0:.1f} s\n")
            sys.stderr.flush()


PROGRESS_AFTER_S = 1.0


def entry_ok(entry: dict, target: str) -> bool:
    """The fields ``_materialize`` reads, with their types (an entry that fails is recompiled)."""
    def strs(v):
        return isinstance(v, list) and all(isinstance(i, str) for i in v)
    meta, layers = entry.get("meta"), entry.get("layer_ir")
    ok = (isinstance(entry.get("program"), HostProgram) and isinstance(entry.get("llvm_ir"), str)
          and strs(entry.get("kernels")) and isinstance(meta, dict) and isinstance(meta.get("compile_ms"), dict)
          and isinstance(meta.get("kernels"), list) and all(isinstance(k, dict) for k in meta["kernels"])
          and isinstance(layers, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in layers.items())
          and isinstance(entry.get("asm", ""), (str, type(None))))
    if not ok:
        return False
    if target in GPU_TARGETS:
        return (isinstance(entry.get("binary"), bytes) and isinstance(entry.get("abis"), list)
                and isinstance(entry.get("ptx", ""), str) and "target" in layers)
    objs = entry.get("objs")
    return isinstance(objs, list) and bool(objs) and all(isinstance(o, bytes) for o in objs)


def _with_reproducer(e: Exception, graph_text, spec, target, isa, name, key) -> Exception:
    """``e`` with the path of a reproducer in its message, for an internal failure (a Python
    exception, or a pass that could not transform its input); other coded errors unchanged."""
    if isinstance(e, TesseraError) and not isinstance(e, PassFailedError):
        return e
    reason = f"{e.code}: {e.message}" if isinstance(e, TesseraError) else f"{type(e).__name__}: {e}"
    path, why = repro.write(graph_text, spec, target=target, arch=isa.arch, cpu=isa.llvm_cpu or "",
                            features=isa.llvm_features, name=name, key=key, reason=reason)
    where = (f"reproducer: {path} (replay: {repro.replay_command(path, spec)})" if path is not None
             else f"no reproducer written ({why})")
    if isinstance(e, TesseraError):
        e.message = f"{e.message}; {where}"
        e.args = (e.message,)
        return e
    return CompilerInternalError(f"compiling {name!r} for {target} ({isa.arch}) failed inside the compiler: "
                                 f"{type(e).__name__}: {e}; {where}")


def _materialize(entry: dict, name, target, isa, spec, key, status, t0) -> Compiled:
    t_load = time.perf_counter()
    program = entry["program"]
    if target in GPU_TARGETS:
        from tessera.runtime.gpu import GpuExecutable
        exe = GpuExecutable(program, target, isa.arch, entry["binary"], entry["abis"], entry["layer_ir"]["target"])
    else:
        loaded = cj.LoadedObject(entry["objs"], entry["kernels"] + [k + ENTRY_SUFFIX for k in entry["kernels"]])
        from tessera import host
        amx = any(record_by_id(k["mma"]["record"]).family == "amx" for k in entry["meta"]["kernels"] if "mma" in k)
        exe = CpuExecutable(program, loaded.addresses, host.usable_cpus(), amx=amx,
                            missing_features=host.missing_features(isa.features))
        exe._loaded = loaded  # keep the engine alive
    meta = dict(entry["meta"])
    meta["compile_ms"] = dict(meta["compile_ms"])
    meta["compile_ms"]["load"] = round((time.perf_counter() - t_load) * 1e3, 2)
    if status == "disk":
        meta["compile_ms"] = {"disk_cache": round((time.perf_counter() - t0) * 1e3, 2)}
    return Compiled(name, target, isa.arch, isa.llvm_cpu or "", isa.llvm_features, spec, key, entry["layer_ir"],
                    entry["llvm_ir"], meta, exe, status, entry["kernels"], binary=entry.get("binary", b""),
                    ptx=entry.get("ptx", ""), abis=entry.get("abis", []), _asm=entry.get("asm"))


def _run_passes(module: ModuleOp, passes, graph_text: str, after_apply=None):
    """Run the pipeline (instrumented); the IR of each layer and the kernels' schedule."""
    snapshots: dict[str, str] = {"graph": graph_text}
    kernels: list[dict] = []

    def after(p, mod, rec, text):
        layer = _highest_layer(rec.census_after)
        snapshots["graph-fused" if layer == "graph" else layer] = text
        if not kernels and "schedule.kernel" in rec.census_after:
            kernels.extend(kernel_info(mod))

    run = run_pipeline(module, passes, after_pass=after, after_apply=after_apply)
    return run, snapshots, kernels


def _build(module: ModuleOp, passes, isa, spec: str, graph_text: str) -> dict:
    t0 = time.perf_counter()
    module = module.clone()
    job = cpu_codegen.CodegenJob(isa, passes[-1] if passes else None)   # LLVM runs while the last
    try:                                                                 # pass's IR is printed, verified
        run, snapshots, kernels = _run_passes(module, passes, graph_text, after_apply=job.after_apply)
        t1 = time.perf_counter()
        llvm_ir, names, objs = job.result(module)
    finally:
        job.join()
    t3 = time.perf_counter()
    meta = {
        "passes": [r.to_dict() for r in run.records],
        "layers": layers_traversed(run.initial_census, run.records),
        "kernels": kernels,
        # translate and llvm overlap the last pass's printing and verification: passes + translate +
        # llvm exceeds the total (t3 - t0) by that overlap
        "compile_ms": {"passes": round((t1 - t0 - job.translate_s) * 1e3, 2),
                       "translate": round(job.translate_s * 1e3, 2), "llvm": round(job.llvm_s * 1e3, 2),
                       "total": round((t3 - t0) * 1e3, 2)},
        "pipeline": spec,
    }
    return {"objs": objs, "llvm_ir": llvm_ir, "kernels": names, "layer_ir": snapshots, "meta": meta,
            "program": HostProgram.from_module(module)}


def _build_gpu(module: ModuleOp, passes, isa, spec: str, graph_text: str) -> dict:
    """GPU lanes: the same passes, then the target's translation, code object and ABI records."""
    from tessera.frontend import gpu_build
    t0 = time.perf_counter()
    module = module.clone()
    run, snapshots, kernels = _run_passes(module, passes, graph_text)
    t1 = time.perf_counter()
    out = gpu_build.build(module, isa.target, isa.arch)
    t2 = time.perf_counter()
    for k in kernels:      # resources the toolchain reports, per kernel
        k.update(out["resources"].get(k["kernel"], {}))
    meta = {
        "passes": [r.to_dict() for r in run.records],
        "layers": layers_traversed(run.initial_census, run.records),
        "kernels": kernels,
        "compile_ms": {"passes": round((t1 - t0) * 1e3, 2), **{k: round(v, 2) for k, v in out["ms"].items()},
                       "total_codegen": round((t2 - t1) * 1e3, 2)},
        "pipeline": spec,
        "mma_records": out["records"],
    }
    return {"llvm_ir": out["llvm_ir"], "kernels": [a["symbol"] for a in out["abis"]], "layer_ir": snapshots,
            "meta": meta, "program": HostProgram.from_module(module), "binary": out["binary"],
            "asm": out["asm"], "ptx": out.get("ptx", ""), "abis": out["abis"]}


def feature_list(isa) -> list[str]:
    interesting = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512bf16", "avx512vnni", "amx-tile",
                   "amx-bf16", "amx-int8")
    return [f for f in interesting if f in isa.features]


__all__ = ["compile_graph", "Compiled", "check_pins", "TesseraError", "X"]
