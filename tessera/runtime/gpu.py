"""The GPU lanes' executable: the host program of a GPU Target IR module with its code
object (ROCm ``.hsaco``) or cubin (NVIDIA), the kernel ABI records — and the emulator.

``run`` launches on the device when this machine has one of the kind the code was
built for (NVIDIA through ``cuda-python``; ROCm through ``hip-python``); otherwise it
raises ``LaneUnavailableError`` — it never runs another lane instead.  On NVIDIA, ``run``
copies host arrays in and the results out (the lane report says "host copy in/out"), and
``run_device`` takes device pointers and returns device buffers with no host copy; both go
through one launch plan per input signature (``launch_plan.py``), kept with the loaded module
per device for the executable's life.  ``emulate``
executes the same host program with :class:`tessera.emulate.simt.Emulator` over the
kernels' Target IR: every lane of every wave of every workgroup, in numpy.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from tessera.errors import DeviceMismatchError, LaneUnavailableError, ShapeMismatchError
from tessera.ir import dims as D
from tessera.runtime import launch_plan
from tessera.runtime.cpu import HostProgram, _eval, bind_symbols
from tessera.runtime.launch_plan import INDEX_LIMIT, DeviceBuffer

MAX_PLANS = 64   # launch plans kept per executable (a shape sweep replaces them, least recent first)


@dataclass
class GpuExecutable:
    program: HostProgram
    target: str                 # rocm | nvidia
    arch: str
    binary: bytes               # .hsaco or .cubin
    abis: list[dict]
    target_ir: str              # the Target IR text the emulator executes
    _emulator: object = field(default=None, repr=False)
    _cuda: dict = field(default_factory=dict, repr=False)           # device ordinal -> CudaModule
    _plans: OrderedDict = field(default_factory=OrderedDict, repr=False)   # (device, shapes, dtypes) -> plan
    plans_built: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self):   # pickled by the compile cache: loaded modules and plans stay behind
        d = dict(self.__dict__)
        d.update(_emulator=None, _cuda={}, _plans=OrderedDict(), plans_built=0)
        d.pop("_lock")
        return d

    def __setstate__(self, d):
        self.__dict__.update(d, _lock=threading.Lock())

    copy_note = "; host copy in/out"   # what a call with host arrays costs (the lane log's reason says so)

    @property
    def lane(self) -> str:
        return f"{self.target}-{self.arch}"

    # ------------------------------------------------------------------ host program
    def _steps(self, arrays: list[np.ndarray], env: dict | None, launch) -> list[np.ndarray]:
        prog = self.program
        if env is None:
            env = bind_symbols(prog.inputs, arrays)
        vals: dict[int, np.ndarray] = dict(zip(prog.input_ids, arrays))
        for s in prog.steps:
            sizes = [_eval(d, env) for d in s.dims]
            outs = []
            for t in s.out_types:
                shape = tuple(_eval(d, env) for d in t.dims)
                outs.append(np.zeros(shape, t.np_dtype))
            for o, a in zip(s.outs, outs):
                vals[o] = a
            for a in [vals[i] for i in s.args] + outs:
                if a.size >= INDEX_LIMIT:
                    raise ShapeMismatchError(f"kernel {s.kernel}: a {a.shape} array has {a.size} elements; the GPU "
                                             f"kernels index with 32 bits (at most {INDEX_LIMIT - 1} per array)")
            grid = tuple(D.evaluate_extent(e, env) for e in s.grid)
            if all(a.size for a in outs):
                launch(s, grid, [vals[i] for i in s.args] + outs, sizes, len(s.args))
        return [vals[i] for i in prog.results]

    # ------------------------------------------------------------------ NVIDIA: modules and plans
    def cuda_module(self, device: int = 0, mismatch: type = LaneUnavailableError):
        """The cubin loaded on CUDA device ``device`` (once; kept while the executable lives)."""
        mod = self._cuda.get(device)
        if mod is not None:
            return mod
        from tessera.runtime import cuda
        ok, why = cuda.device_available()
        if not ok:
            raise LaneUnavailableError(f"the {self.lane} lane needs an NVIDIA GPU: {why}; compile() still builds "
                                       "the cubin, and .emulate() runs it in the warp emulator")
        dev = cuda.device_arch(device)
        if dev is not None and dev.rstrip("a") != self.arch.rstrip("a"):
            raise mismatch(f"this code is for {self.arch}; CUDA device {device} is {dev}")
        with self._lock:
            mod = self._cuda.get(device)
            if mod is None:
                mod = self._cuda[device] = cuda.CudaModule(self.binary, device)
        return mod

    def plan(self, mod, inputs: list, env: dict | None = None) -> launch_plan.LaunchPlan:
        """The launch plan for inputs of these shapes and dtypes on ``mod``'s device (built once)."""
        key = (mod.ordinal, tuple(tuple(a.shape) for a in inputs), tuple(np.dtype(a.dtype).str for a in inputs))
        p = self._plans.get(key)
        if p is None:
            if env is None:
                env = bind_symbols(self.program.inputs, inputs)
            p = launch_plan.build(mod, self.program, self.abis, env, inputs, key)
            with self._lock:
                self._plans[key] = p
                self.plans_built += 1
                while len(self._plans) > MAX_PLANS:
                    self._plans.popitem(last=False)[1].close(mod)
        return p

    def run_device(self, inputs: list, stream: int = 0, device: int = 0, capture: bool = False,
                   env: dict | None = None) -> list[DeviceBuffer]:
        """The program on device-resident inputs (objects with ``ptr``, ``shape``, ``dtype``; a 0-d numpy
        array is a runtime scalar, whose few bytes are uploaded), queued on ``stream``; the results as
        device buffers.  Nothing is synchronised: the results are ready in ``stream``'s order."""
        mod = self.cuda_module(device, DeviceMismatchError)
        with mod.entered():
            return self._run_device(mod, inputs, stream, capture, env)

    def _run_device(self, mod, inputs, stream, capture, env):
        plan = self.plan(mod, inputs, env)
        ptrs, scalars = [], []
        try:
            for a in inputs:
                if isinstance(a, np.ndarray):
                    a = np.ascontiguousarray(a)
                    p = mod.alloc(a.nbytes, stream)
                    scalars.append(p)
                    mod.copy_in(p, a, stream, kind="HtoD scalar")
                    ptrs.append(p)
                else:
                    ptrs.append(int(a.ptr))
            outs = plan.execute(mod, ptrs, stream, capture)
        finally:
            for p in scalars:
                mod.free(p, stream)
        return [DeviceBuffer(mod, p, plan.nbytes(r), *plan.specs[r], stream) for p, r in zip(outs, plan.results)]

    def _run_cuda_host(self, arrays: list[np.ndarray], env: dict | None) -> list[np.ndarray]:
        """Host arrays: copied in, the plan run on the legacy default stream, results copied out."""
        mod = self.cuda_module(0)
        with mod.entered():
            return self._run_host(mod, arrays, env)

    def _run_host(self, mod, arrays, env):
        arrays = [np.ascontiguousarray(a) for a in arrays]
        plan = self.plan(mod, arrays, env)
        stream, ins, outs = 0, [], []
        try:
            for a in arrays:
                ins.append(mod.alloc(a.nbytes, stream) if a.nbytes else 0)
                mod.copy_in(ins[-1], a, stream)
            outs = plan.execute(mod, ins, stream)
            host = [np.empty(*plan.specs[r]) for r in plan.results]
            for h, p in zip(host, outs):
                mod.copy_out(h, p, stream)
            mod.synchronize(stream)
        finally:
            for p in ins + outs:
                if p:
                    launch_plan._quiet_free(mod, p, stream)
        return host

    def run(self, arrays: list[np.ndarray], env: dict | None = None) -> list[np.ndarray]:
        if self.target == "nvidia":
            return self._run_cuda_host(arrays, env)
        from tessera.runtime import hip
        ok, why = hip.device_available()
        if not ok:
            raise LaneUnavailableError(f"the {self.lane} lane needs an AMD GPU with ROCm: {why}; compile() still "
                                       "builds the code object, and .emulate() runs it in the wave emulator")
        if why and why != self.arch:
            raise LaneUnavailableError(f"this code object is for {self.arch}; the ROCm device is {why}")
        module = hip.HipModule(self.binary)

        def launch_hip(s, grid, bufs, sizes, nin):
            module.launch(s.kernel, grid, (s.block, 1, 1), 0, [np.ascontiguousarray(b) for b in bufs], sizes,
                          list(range(nin, len(bufs))))
        try:
            return self._steps(arrays, env, launch_hip)
        finally:
            module.close()

    def emulate(self, arrays: list[np.ndarray], env: dict | None = None) -> list[np.ndarray]:
        from tessera.emulate.simt import Emulator
        from tessera.ir.text import parse_module
        if self._emulator is None:
            self._emulator = Emulator(parse_module(self.target_ir), self.target, self.arch)
        emu = self._emulator

        def launch(s, grid, bufs, sizes, nin):
            emu.launch(s.kernel, grid, bufs, sizes)
        return self._steps([np.ascontiguousarray(a) for a in arrays], env, launch)
