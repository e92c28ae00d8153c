"""LLVM IR text -> optimised object code -> callable addresses (llvmlite's LLVM).

Object code (not IR) is what the compile cache stores: loading an object into an
MCJIT engine takes milliseconds, re-optimising IR takes hundreds.  Object code is
produced for an explicit CPU name and feature string — never an unknown CPU name,
which makes LLVM abort the process at codegen (the selector refuses those first).
``emit_guarded`` runs the same compilation in a subprocess for inputs that might
make LLVM abort, turning a crash into a ``LLVMAbortError``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import llvmlite.binding as llvm

from tessera import forksafe
from tessera.codegen import llvm_core
from tessera.errors import CodegenError, LLVMAbortError

_lock = forksafe.lock(sys.modules[__name__], "_lock")   # renewed in a forked child
_initialised: set[str] = set()


def init(all_targets: bool = False) -> None:
    """Initialise LLVM's native target (cheap), or every target (GPU lanes; ~0.4 s once)."""
    with _lock:
        if "native" not in _initialised:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _initialised.add("native")
        if all_targets and "all" not in _initialised:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialised.add("all")


def host_triple() -> str:
    init()
    return llvm.get_process_triple()


def target_machine(cpu: str, features: str, triple: str | None = None, opt: int = 3):
    init()
    return llvm_core.target_machine(cpu, features, triple, opt)


# The CPU lane's optimisation level.  Its IR is already blocked, unrolled and vectorised by the
# lowering, so -O2 generates the same inner loops as -O3 in a quarter less LLVM time (measured: gemm +
# gelu kernel: LLVM 1.47 -> 1.12 s, alternating in one process; gelu(x@w+b), softmax and a GEMM ran the
# same or faster).
CPU_OPT = 2
# ... and without LLVM's own loop transformations (loop and SLP vectorisers, unrolling,
# interleaving): they re-vectorise scalar edge loops and unroll what the lowering already
# unrolled.  Measured on the gemm+gelu kernel: LLVM 0.88-1.04 -> 0.59-0.85 s (separate cold
# processes); gemm+gelu, softmax, layer_norm, attention, an odd-shaped GEMM and a transpose ran the
# same (interleaved minimums within 3 %).
CPU_LOOP_PASSES = False


optimise = llvm_core.optimise


@dataclass
class ObjectCode:
    obj: bytes
    asm: str | None
    optimised_ir: str


def emit(llvm_ir: str, cpu: str, features: str, *, want_asm: bool = False, opt: int = 3,
         want_object: bool = True, loop_passes: bool = True) -> ObjectCode:
    """Parse, verify, optimise and emit object code (in this process).  A module for
    another target than the host (its ``target triple``) initialises every LLVM target."""
    init()
    try:
        mod = llvm.parse_assembly(llvm_ir)
        if mod.triple and mod.triple != llvm.get_process_triple():
            init(all_targets=True)
        mod.verify()
    except RuntimeError as e:
        lines = str(e).strip().splitlines()
        why = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else "?")
        raise CodegenError(f"LLVM rejected the generated IR: {why.strip()}") from None
    tm = target_machine(cpu, features, mod.triple or None, opt)
    mod.data_layout = str(tm.target_data)
    optimise(mod, tm, opt, loop_passes)
    text = str(mod)
    # code generation rewrites the module (AMDGPU inserts control-flow intrinsics): the
    # assembly is generated from its own copy of the optimised IR
    asm = tm.emit_assembly(llvm.parse_assembly(text) if want_object else mod) if want_asm else None
    obj = tm.emit_object(mod) if want_object else b""   # NVPTX has assembly (PTX) only
    return ObjectCode(obj, asm, text)


def emit_cpu(llvm_ir: str, cpu: str, features: str, *, want_asm: bool = False) -> ObjectCode:
    """:func:`emit` with the CPU lane's settings (the object and its listing agree)."""
    return emit(llvm_ir, cpu, features, want_asm=want_asm, opt=CPU_OPT, loop_passes=CPU_LOOP_PASSES)


def emit_guarded(llvm_ir: str, cpu: str, features: str, *, want_asm: bool = False, opt: int = 3,
                 timeout: float = 300, want_object: bool = True) -> ObjectCode:
    """As :func:`emit`, in a subprocess: an LLVM abort becomes ``LLVMAbortError``."""
    import pickle
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "in.pkl")
        out = os.path.join(d, "out.pkl")
        with open(src, "wb") as f:
            pickle.dump((llvm_ir, cpu, features, want_asm, opt, want_object), f)
        code = ("import pickle,sys\nfrom tessera.codegen.jit import emit\n"
                "ir_, cpu, feat, asm, opt, obj = pickle.load(open(sys.argv[1],'rb'))\n"
                "r = emit(ir_, cpu, feat, want_asm=asm, opt=opt, want_object=obj)\n"
                "pickle.dump(r, open(sys.argv[2],'wb'))\n")
        try:
            p = subprocess.run([sys.executable, "-c", code, src, out], capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CodegenError(f"code generation for {cpu} timed out after {timeout} s") from None
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            if p.returncode < 0 or p.returncode == 134:
                raise LLVMAbortError(f"LLVM aborted (signal {-p.returncode if p.returncode < 0 else 6}) "
                                     f"compiling for {cpu}: {tail}")
            raise CodegenError(f"code generation failed for {cpu}: {tail}")
        with open(out, "rb") as f:
            return pickle.load(f)


def check_resolvable(obj: bytes) -> None:
    """Refuse object code that calls a symbol this process does not define.  MCJIT binds such
    a call to address 0, so the first call of it would crash the process (LLVM emits libcalls
    for operations a chip lacks, e.g. ``__truncsfbf2`` for a bfloat ``fptrunc`` without
    AVX512-BF16; the x86 translation avoids those, and this check keeps any that slip in from
    being run)."""
    import ctypes

    from tessera.codegen import elf
    process = ctypes.CDLL(None)       # what MCJIT's resolver sees: the process's global symbols

    def defined(name: str) -> bool:
        try:
            getattr(process, name)
            return True
        except AttributeError:
            return bool(llvm.address_of_symbol(name))
    missing = [s for s in elf.undefined(obj) if not defined(s)]
    if missing:
        raise CodegenError(f"the compiled object calls {', '.join(missing)}, which this process does not "
                           "define (an operation LLVM turned into a library call); refused before loading")


class LoadedObject:
    """Object code (one object, or several that together define ``symbols``) loaded into an
    MCJIT engine; keeps the engine alive."""

    def __init__(self, obj: bytes | list[bytes], symbols: list[str]):
        init()
        objs = [obj] if isinstance(obj, bytes) else list(obj)
        for o in objs:
            check_resolvable(o)
        tm = llvm.Target.from_default_triple().create_target_machine()
        empty = llvm.parse_assembly("")
        self.engine = llvm.create_mcjit_compiler(empty, tm)
        for o in objs:
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(o))
        self.engine.finalize_object()
        self.addresses = {}
        for s in symbols:
            addr = self.engine.get_function_address(s)
            if not addr:
                raise CodegenError(f"symbol {s} missing from the compiled object")
            self.addresses[s] = addr
