"""One launch plan per call signature on a GPU lane, and optional CUDA-graph replay.

A GPU executable's host program is a list of kernel launches over value ids.  For one call
signature (the input shapes on one device) everything about those launches is fixed: each
kernel's handle and its dynamic shared-memory opt-in, the grid and block, the sizes passed as
scalars, the bytes of every intermediate and result.  :func:`build` computes that once into a
:class:`LaunchPlan`; a call then only allocates its buffers (stream-ordered), writes the
pointers into the plan's packed parameter arrays and launches on the caller's stream.

With ``capture=True`` the launches are recorded once with stream capture on a private stream
(capturing runs nothing), instantiated into a CUDA graph and replayed on the caller's stream
with ``cuGraphLaunch``: one launch for the whole program.  A call whose pointers all equal the
last replay's replays as it is; one with new pointers (fresh results, other inputs) captures
again and patches the instantiated graph with ``cuGraphExecUpdate`` (instantiating afresh only
where CUDA refuses the update).

The driver is reached only through the module object (``runtime/cuda.py``'s ``CudaModule``):
``function``, ``alloc``, ``free``, ``copy_device``, ``launch_on`` and the graph calls.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.errors import ShapeMismatchError
from tessera.ir import dims as D
from tessera.ir import tensor_map as TM
from tessera.runtime.cpu import _eval
from tessera.runtime.cuda import KernelParams, pack_params

INDEX_LIMIT = 1 << 31    # GPU kernels compute addresses in 32 bits (codegen.gpu.GpuFn.index_bits)


@dataclass
class StepPlan:
    kernel: str
    fn: Any                      # the driver's function handle (opted in to ``shared`` once)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    slots: tuple[int, ...]       # value ids in parameter order: the kernel's arguments, then its outputs
    params: KernelParams         # the scalars written once; the pointer slots patched per call
    launch: bool                 # False where an output is empty (nothing to compute)
    maps: list = field(default_factory=list)       # tensor-map records (ABI "tensormap" params), in order
    sizes: list = field(default_factory=list)      # the kernel's evaluated size arguments
    map_addresses: list = field(default_factory=list)   # the address each map was last encoded for

    def patch(self, ptr: dict[int, int]) -> None:
        vals = self.params.values
        for i, v in enumerate(self.slots):
            vals[i].value = ptr[v]

    def encode_maps(self, mod, ptr: dict[int, int]) -> None:
        """Tensor maps hold their tensor's address: each is encoded (by the driver) again when it moves."""
        for j, p in enumerate(self.maps):
            addr = ptr[self.slots[p["buffer"]]]
            if self.map_addresses[j] != addr:
                self.params.set_map(j, mod.encode_tensor_map(TM.spec_for(p["record"], addr, self.sizes)))
                self.map_addresses[j] = addr


@dataclass
class GraphState:
    exec: Any
    key: tuple                   # the pointers the instantiated graph launches with


@dataclass
class LaunchPlan:
    key: tuple
    inputs: list[int]                      # value ids of the host program's inputs
    steps: list[StepPlan]
    allocs: list[tuple[int, int]]          # (value id, bytes) allocated per call: every kernel output
    temps: list[int]                       # ... of which these are freed at the end of the call
    results: list[int]
    specs: dict[int, tuple[tuple[int, ...], np.dtype]]   # every value's shape and dtype
    graph: GraphState | None = None
    captures: int = 0                      # stream captures made (the first, then one per pointer change)
    replays: int = 0                       # cuGraphLaunch calls
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def nbytes(self, vid: int) -> int:
        shape, dtype = self.specs[vid]
        return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    # ------------------------------------------------------------------ a call
    def execute(self, mod, in_ptrs: list[int], stream: int, capture: bool = False) -> list[int]:
        """Run the program on ``stream`` over the inputs at ``in_ptrs``; the results' pointers, each
        a fresh allocation the caller owns (an argument returned as is is copied: no aliasing)."""
        ptr = dict(zip(self.inputs, in_ptrs))
        owned: list[int] = []
        try:
            for vid, n in self.allocs:
                ptr[vid] = mod.alloc(n, stream) if n else 0
                if n:
                    owned.append(ptr[vid])
            with self.lock:   # the packed parameter arrays are shared by the calls of this plan
                if capture and any(s.launch for s in self.steps):
                    self._replay(mod, ptr, stream)
                else:
                    for s in self.steps:
                        if s.launch:
                            s.patch(ptr)
                            s.encode_maps(mod, ptr)
                            mod.launch_on(s.fn, s.kernel, s.grid, s.block, s.shared, s.params, stream)
            out, given = [], set()
            for vid in self.results:
                if vid in self.inputs or vid in given:   # an argument, or a result returned twice: a copy
                    n = self.nbytes(vid)
                    p = mod.alloc(n, stream) if n else 0
                    if n:
                        owned.append(p)
                        mod.copy_device(p, ptr[vid], n, stream)
                    out.append(p)
                else:
                    out.append(ptr[vid])
                    given.add(vid)
        except BaseException:
            for p in owned:
                _quiet_free(mod, p, stream)
            raise
        for vid in self.temps:
            if ptr[vid]:
                mod.free(ptr[vid], stream)   # stream-ordered: after the kernels that read it
        return out

    def _replay(self, mod, ptr: dict[int, int], stream: int) -> None:
        key = tuple(ptr[v] for s in self.steps if s.launch for v in s.slots)
        g = self.graph
        if g is None or g.key != key:
            cs = mod.capture_stream()
            mod.begin_capture(cs)
            try:
                for s in self.steps:
                    if s.launch:
                        s.patch(ptr)
                        s.encode_maps(mod, ptr)
                        mod.launch_on(s.fn, s.kernel, s.grid, s.block, s.shared, s.params, cs)
            finally:
                graph = mod.end_capture(cs)
            self.captures += 1
            try:
                if g is None:
                    self.graph = GraphState(mod.instantiate(graph), key)
                elif mod.update(g.exec, graph):
                    g.key = key
                else:
                    mod.destroy_exec(g.exec)
                    self.graph = None
                    self.graph = GraphState(mod.instantiate(graph), key)
            finally:
                mod.destroy_graph(graph)
        mod.graph_launch(self.graph.exec, stream)
        self.replays += 1

    def close(self, mod) -> None:
        if self.graph is not None:
            try:
                mod.destroy_exec(self.graph.exec)
            except Exception:   # noqa: BLE001 - closing: the context may be gone already
                pass
            self.graph = None


def _quiet_free(mod, p: int, stream: int) -> None:
    try:
        mod.free(p, stream)
    except Exception:   # noqa: BLE001 - already failing: the first error is the one to report
        pass


def build(mod, program, abis: list[dict], env: dict, inputs: list, key: tuple) -> LaunchPlan:
    """The plan of ``program`` for inputs shaped as ``inputs`` (objects with ``.shape``/``.dtype``)
    under the bound sizes ``env``: handles, opt-ins, grids and packed scalars computed here, once."""
    shared = {a["symbol"]: int(a["shared_bytes"]) for a in abis}
    maps = {a["symbol"]: [p for p in a["params"] if p["kind"] == "tensormap"] for a in abis}
    specs = {vid: (tuple(a.shape), np.dtype(a.dtype)) for vid, a in zip(program.input_ids, inputs)}
    steps, allocs = [], []
    for s in program.steps:
        sizes = [_eval(d, env) for d in s.dims]
        for vid, t in zip(s.outs, s.out_types):
            specs[vid] = (tuple(_eval(d, env) for d in t.dims), t.np_dtype)
        for vid in [*s.args, *s.outs]:
            n = int(np.prod(specs[vid][0], dtype=np.int64))
            if n >= INDEX_LIMIT:
                raise ShapeMismatchError(f"kernel {s.kernel}: a {specs[vid][0]} array has {n} elements; the GPU "
                                         f"kernels index with 32 bits (at most {INDEX_LIMIT - 1} per array)")
        grid = tuple(int(D.evaluate_extent(e, env)) for e in s.grid)
        grid = grid + (1,) * (3 - len(grid))
        launch = all(int(np.prod(specs[v][0], dtype=np.int64)) for v in s.outs)
        smem = shared.get(s.kernel, 0)
        fn = mod.function(s.kernel, smem) if launch else None
        slots = tuple(s.args) + tuple(s.outs)
        tmaps = maps.get(s.kernel, [])
        for p in tmaps:          # the shapes' part of each map checked now, before anything is allocated
            TM.spec_for(p["record"], 256, sizes)
        steps.append(StepPlan(s.kernel, fn, grid, (s.block, 1, 1), smem, slots,
                              pack_params([0] * len(slots), sizes, len(tmaps)), launch, tmaps, list(sizes),
                              [None] * len(tmaps)))
        allocs += [(vid, 0) for vid in s.outs]
    plan = LaunchPlan(key, list(program.input_ids), steps, [], [], list(program.results), specs)
    plan.allocs = [(vid, plan.nbytes(vid)) for vid, _ in allocs]
    plan.temps = [vid for vid, _ in allocs if vid not in program.results]
    return plan


class DeviceBuffer:
    """A result's device memory: freed (stream-ordered, on the stream it was made on) when the last
    reference goes; holding it keeps the module, and so the context, alive."""
    __slots__ = ("ptr", "nbytes", "shape", "dtype", "device", "stream", "module", "__weakref__")

    def __init__(self, mod, ptr: int, nbytes: int, shape, dtype, stream: int):
        self.ptr, self.nbytes, self.shape, self.dtype = int(ptr), int(nbytes), tuple(shape), np.dtype(dtype)
        self.device, self.stream, self.module = mod.ordinal, int(stream), mod
        if self.ptr:
            weakref.finalize(self, _release, mod, self.ptr, self.stream)


def _release(mod, ptr: int, stream: int) -> None:
    try:
        with mod.entered():
            mod.free(ptr, stream)
    except Exception:   # noqa: BLE001 - a finaliser (the context may be gone at exit)
        pass
