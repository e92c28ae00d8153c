"""``Artifact``: one compiled specialisation of a jitted function -- the IR of every layer,
its machine code, its launch contracts and its lane report; calling it calls the function."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.errors import ArgumentError, FrontendError
from tessera.frontend.compile import Compiled, feature_list, resolve_arch
from tessera.frontend import remat
from tessera.frontend.report import LaneReport
from tessera.frontend.trace import results

if TYPE_CHECKING:
    from tessera.frontend.jit import JitFunction
    from tessera.frontend.jit_prepare import Variant


class Artifact:
    """A compiled specialisation: IR of every layer, machine code, the report; callable."""

    def __init__(self, fn: JitFunction, variant: Variant, shapes: list | None = None):
        self.fn = fn
        self.variant = variant
        # the example arguments' shapes (a variant with symbolic sizes serves many; export fixes these)
        self.example_shapes = [tuple(s) for s in shapes] if shapes is not None else None
        self._obj: bytes | None = None

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
        """GPU: the code object (.hsaco) or cubin bytes; CPU: the object code (an x86-64 ELF
        relocatable object holding every kernel and its ``.entry``)."""
        c = self.compiled
        if c.target != "cpu":
            return c.binary
        if self._obj is None:   # LLVM's output for this IR, CPU and features: the object the lane loaded
            # (a large module is loaded as two objects built from its kernels: codegen/llvm_parallel.py)
            from tessera.codegen import jit as cj
            self._obj = cj.emit_cpu(c.llvm_ir, c.cpu, c.features).obj
        return self._obj

    def export_library(self, path: str = ".", name: str | None = None, threads: int = 1):
        """Write ``lib<name>.so`` + ``<name>.h`` (a C library of this CPU artifact, sizes fixed to the
        ones it was compiled for): ``tessera/aotlib/``."""
        from tessera.aotlib import export_artifact   # the export layer sits above the frontend
        return export_artifact(self, path, name, threads)

    def ptx(self) -> str:
        if self.compiled.target != "nvidia":
            raise ArgumentError(f"ptx() is for the NVIDIA lane; this artifact is for {self.compiled.target}")
        return self.compiled.ptx

    def abi(self) -> list[dict]:
        """GPU: each kernel's launch contract (symbol, argument offsets, block, grid, shared memory)."""
        return [dict(a) for a in self.compiled.abis]

    def emulate(self, *args, **kwargs):
        """Run the GPU kernels in the wave/warp emulator (numpy); returns what the call would.
        Keywords are the function's (static settings such as ``n_head=``), as for a call."""
        c = self.compiled
        if c.target not in ("rocm", "nvidia"):
            raise ArgumentError("emulate() runs GPU artifacts; this one is for the CPU")
        v, arrays, env = self.fn._variant(self.fn._flat(args, kwargs) if kwargs else args)
        outs = c.executable.emulate(arrays, env)
        return results(v.graph, outs)

    def report(self) -> LaneReport:
        v = self.variant
        if v.compiled is None:
            return LaneReport(self.fn.name, "reference", self.fn.target, str(self.fn.arch), "", [], [], [], [], {},
                              "none", "", list(v.copies), [], v.reason)
        c = v.compiled
        isa = resolve_arch(c.target, c.arch)
        m = c.meta
        static = [f"argument {i} axis {ax} = {n}" for (i, ax), n in sorted(v.static.items())]
        static += [f"argument {i} (a number read as a Python value: {w})" for i, w in sorted(self.fn._learned.items())]
        return LaneReport(self.fn.name, c.lane, c.target, c.arch, c.cpu, feature_list(isa), m["layers"],
                          m["passes"], m["kernels"], m["compile_ms"], c.cache_status, m["pipeline"], list(v.copies),
                          static, compiles=list(self.fn.compiles),
                          notes=_thread_notes(c, m["kernels"]), schedule=v.schedule_source,
                          saved=remat.saved_lines(v.graph), saved_bytes=remat.saved_bytes(v.graph),
                          donated=_donation_lines(self.fn, v))

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _donation_lines(fn, v) -> list[str]:
    """Per donated argument, whether a result is written into its buffer and why (runtime/donation.py)."""
    if not fn.donate_argnums:
        return []
    exe = v.compiled.executable
    if not hasattr(exe, "donation_for"):
        return [f"argument {p}: refused: the {v.compiled.lane} lane allocates every result" for p in fn.donate_argnums]
    from tessera.runtime.donation import report
    return report(exe.donation_for(v.donated), {k: f"argument {p}" for p, k in v.donated_positions.items()})


def _thread_notes(c: Compiled, kernels: list[dict]) -> list[str]:
    """Kernels scheduled (or pinned) for more threads than a CPU call may use now."""
    if c.target != "cpu":
        return []
    from tessera.runtime import threads
    cap = threads.get_num_threads()
    over = [f"{k['kernel']} ({k['threads']})" for k in kernels if cap and k.get("threads", 1) > cap]
    if not over:
        return []
    return [f"calls run at most {cap} threads (TESSERA_NUM_THREADS or tessera.set_num_threads); scheduled "
            f"for more: {', '.join(over)}"]
