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

from xdsl.dialects import func

from tessera.codegen import jit as cj
from tessera.codegen import llvm_core, llvm_parallel
from tessera.codegen import x86 as cg


def objects(llvm_ir: str, kernels: list[str], isa, started: tuple | None = None) -> list[bytes]:
    """The object code: a large module on two cores (``codegen/llvm_parallel.py``), else whole.
    ``started``: (helper, its kernels), a helper already compiling the first kernels."""
    cpu = isa.llvm_cpu or ""
    objs = None
    try:
        if started is not None:
            helper, first = started
            rest = llvm_parallel.split(llvm_ir, kernels, 1, only=[k for k in kernels if k not in first])
            try:
                mine = [llvm_core.object_code(rest[0], cpu, isa.llvm_features, cj.CPU_OPT, cj.CPU_LOOP_PASSES)] \
                    if rest else None
            except BaseException:
                helper.abandon()
                raise
            if mine is None:
                helper.abandon()
            else:
                objs = helper.result() + mine
        else:
            objs = llvm_parallel.emit_objects(llvm_ir, kernels, cpu, isa.llvm_features, cj.CPU_OPT,
                                              cj.CPU_LOOP_PASSES)
    except RuntimeError:   # LLVM rejected a part: compiled whole, the error is reported as for any module
        objs = None
    return objs if objs is not None else [cj.emit_cpu(llvm_ir, cpu, isa.llvm_features).obj]


def first_half(module, share: float = 0.55) -> list[str] | None:
    """The leading kernels (module order) holding about ``share`` of a large module's Target IR
    ops, for a helper process to compile while the rest is translated; None for a module small
    enough for one process (or one usable core)."""
    if llvm_parallel.jobs() < 2:
        return None
    sizes = [(op.sym_name.data, sum(1 for _ in op.walk())) for op in module.body.block.ops
             if isinstance(op, func.FuncOp) and "workspace" in op.attributes]
    total = sum(n for _, n in sizes)
    if len(sizes) < 2 or total < llvm_parallel.MIN_OPS:
        return None
    first, acc = [], 0
    for name, n in sizes[:-1]:
        first.append(name)
        acc += n
        if acc >= share * total:
            break
    return first


class CodegenJob:
    def __init__(self, isa, last_pass):
        self.isa = isa
        self.last = last_pass
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.llvm_ir, self.names, self.objs = "", [], []
        self.translate_s = self.llvm_s = 0.0
        self.started = None

    def after_apply(self, p, module) -> None:
        if p is self.last and self.thread is None and self.error is None:
            self.start(module)

    def start(self, module) -> None:
        t0 = time.perf_counter()
        first: list[str] | None = None
        started: list = []

        def on_kernel(gen, names):
            # the leading kernels are complete: a helper process compiles them while the rest is
            # translated (their text is final: llvmlite caches each instruction's text)
            if not started and names == first:
                parts = llvm_parallel.split(gen.text(), first, 1)
                if parts:
                    isa = self.isa
                    started.append(llvm_parallel.Helper(parts, isa.llvm_cpu or "", isa.llvm_features, cj.CPU_OPT,
                                                        cj.CPU_LOOP_PASSES))
        try:
            first = first_half(module)
            self.llvm_ir, self.names = cg.translate(module, cj.host_triple(),
                                                    on_kernel=on_kernel if first else None)
        except Exception as e:  # noqa: BLE001 - raised by result(), after the verifier has spoken
            self.error = e
            for h in started:
                h.abandon()
            return
        finally:
            self.translate_s = time.perf_counter() - t0
        self.started = (started[0], first) if started else None
        self.thread = threading.Thread(target=self._llvm, name="tessera-llvm", daemon=True)
        self.thread.start()

    def _llvm(self) -> None:
        t0 = time.perf_counter()
        try:
            self.objs = objects(self.llvm_ir, self.names, self.isa, self.started)
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
