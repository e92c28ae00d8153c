"""LLVM IR text -> object code with llvmlite alone: the step ``jit.emit`` and the parallel
helper process share (this file imports nothing of Tessera, so the helper starts in 0.1 s
rather than the 1.4 s an ``import tessera`` takes).

Run as a script it is that helper: ``python llvm_core.py IN OUT`` reads a pickled
``(texts, cpu, features, opt, loop_passes)`` from IN and writes the pickled list of objects to
OUT.  An LLVM abort kills only the helper (the parent sees SIGABRT).
"""
from __future__ import annotations

import pickle
import sys
import threading

import llvmlite.binding as llvm

_init_lock = threading.Lock()
_native = []


def init_native() -> None:
    with _init_lock:
        if not _native:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _native.append(True)


def target_machine(cpu: str, features: str, triple: str | None = None, opt: int = 3):
    init_native()
    triple = triple or llvm.get_process_triple()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic", codemodel="default")


def optimise(mod, tm, level: int = 3, loop_passes: bool = True) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    if not loop_passes:
        pto.loop_vectorization = pto.slp_vectorization = pto.loop_unrolling = pto.loop_interleaving = False
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    mpm.run(mod, pb)


def object_code(text: str, cpu: str, features: str, opt: int, loop_passes: bool) -> bytes:
    """Parse (in a context of its own), verify, optimise and emit one host module."""
    mod = llvm.parse_assembly(text, context=llvm.create_context())
    mod.verify()
    tm = target_machine(cpu, features, None, opt)
    mod.data_layout = str(tm.target_data)
    optimise(mod, tm, opt, loop_passes)
    return tm.emit_object(mod)


def _serve(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        texts, cpu, features, opt, loop_passes = pickle.load(f)
    objs = [object_code(t, cpu, features, opt, loop_passes) for t in texts]
    with open(dst, "wb") as f:
        pickle.dump(objs, f)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
