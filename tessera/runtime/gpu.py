"""The GPU lanes' executable: the host program of a GPU Target IR module with its code
object (ROCm ``.hsaco``) or cubin (NVIDIA), the kernel ABI records — and the emulator.

``run`` launches on the device when this machine has one of the kind the code was
built for (NVIDIA through ``cuda-python``; ROCm through ``hip-python``); otherwise it
raises ``LaneUnavailableError`` — it never runs another lane instead.  ``emulate``
executes the same host program with :class:`tessera.emulate.simt.Emulator` over the
kernels' Target IR: every lane of every wave of every workgroup, in numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tessera.errors import LaneUnavailableError, ShapeMismatchError
from tessera.ir import dims as D
from tessera.runtime.cpu import HostProgram, _eval, bind_symbols


INDEX_LIMIT = 1 << 31    # GPU kernels compute addresses in 32 bits (codegen.gpu.GpuFn.index_bits)


@dataclass
class GpuExecutable:
    program: HostProgram
    target: str                 # rocm | nvidia
    arch: str
    binary: bytes               # .hsaco or .cubin
    abis: list[dict]
    target_ir: str              # the Target IR text the emulator executes
    _emulator: object = field(default=None, repr=False)

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

    def run(self, arrays: list[np.ndarray], env: dict | None = None) -> list[np.ndarray]:
        if self.target == "nvidia":
            from tessera.runtime import cuda
            ok, why = cuda.device_available()
            if ok:
                dev = cuda.device_arch()
                if dev is not None and dev.rstrip("a") != self.arch.rstrip("a"):
                    raise LaneUnavailableError(f"this code is for {self.arch}; the CUDA device is {dev}")
                module = cuda.CudaModule(self.binary)
                shared = {a["symbol"]: a["shared_bytes"] for a in self.abis}   # dynamic shared memory

                def launch(s, grid, bufs, sizes, nin):
                    module.launch(s.kernel, grid, (s.block, 1, 1), shared.get(s.kernel, 0),
                                  [np.ascontiguousarray(b) for b in bufs], sizes, list(range(nin, len(bufs))))
                try:
                    return self._steps(arrays, env, launch)
                finally:
                    module.close()
            raise LaneUnavailableError(f"the {self.lane} lane needs an NVIDIA GPU: {why}; compile() still builds "
                                       "the cubin, and .emulate() runs it in the warp emulator")
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
