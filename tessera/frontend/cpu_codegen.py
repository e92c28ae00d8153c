"""The CPU lane's code generation, started as soon as the last pass has run.

Right after the last pass transforms the module (``run_pipeline``'s ``after_apply``), the Target
IR is translated to LLVM IR here and LLVM starts on a thread of its own; the pipeline then prints
and verifies that Target IR (about 0.8 CPU s on the Llama example) while LLVM runs: llvmlite
releases the GIL inside LLVM.  LLVM itself may use a helper process for half of a large module
(``codegen/llvm_parallel.py``).

Nothing is reported before the pipeline has verified the module: an exception of the translation
or of LLVM is kept and raised by :meth:`CodegenJob.result`, which ``compile._build`` calls only
after the pipeline returned (a verifier error wins over a translation that met IR the verifier
rejects).  The thread is joined whatever happens.
"""
from __future__ import annotations

import threading
import time

from tessera.codegen import jit as cj
from tessera.codegen import llvm_parallel
from tessera.codegen import x86 as cg


def objects(llvm_ir: str, kernels: list[str], isa) -> list[bytes]:
    """The object code: a large module on two cores (``codegen/llvm_parallel.py``), else whole."""
    cpu = isa.llvm_cpu or ""
    try:
        objs = llvm_parallel.emit_objects(llvm_ir, kernels, cpu, isa.llvm_features, cj.CPU_OPT, cj.CPU_LOOP_PASSES)
    except RuntimeError:   # LLVM rejected a part: compiled whole, the error is reported as for any module
        objs = None
    return objs if objs is not None else [cj.emit_cpu(llvm_ir, cpu, isa.llvm_features).obj]


class CodegenJob:
    def __init__(self, isa, last_pass):
        self.isa = isa
        self.last = last_pass
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.llvm_ir, self.names, self.objs = "", [], []
        self.translate_s = self.llvm_s = 0.0

    def after_apply(self, p, module) -> None:
        if p is self.last and self.thread is None and self.error is None:
            self.start(module)

    def start(self, module) -> None:
        t0 = time.perf_counter()
        try:
            self.llvm_ir, self.names = cg.translate(module, cj.host_triple())
        except Exception as e:  # noqa: BLE001 - raised by result(), after the verifier has spoken
            self.error = e
            return
        finally:
            self.translate_s = time.perf_counter() - t0
        self.thread = threading.Thread(target=self._llvm, name="tessera-llvm", daemon=True)
        self.thread.start()

    def _llvm(self) -> None:
        t0 = time.perf_counter()
        try:
            self.objs = objects(self.llvm_ir, self.names, self.isa)
        except BaseException as e:  # noqa: BLE001 - re-raised in the compiling thread
            self.error = e
        finally:
            self.llvm_s = time.perf_counter() - t0

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def result(self, module) -> tuple[str, list[str], list[bytes]]:
        """LLVM IR, kernel names, objects (started here if the pipeline had no last pass)."""
        if self.thread is None and self.error is None:
            self.start(module)
        self.join()
        if self.error is not None:
            raise self.error
        return self.llvm_ir, self.names, self.objs
