"""LLVM on two cores (codegen/llvm_parallel.py) and while the last pass's IR is verified
(frontend/cpu_codegen.py): the same machine code as one process, the same numbers, the same
errors."""
from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest

import tessera as ts
from oracle import assert_close, f64, softmax
from tessera.codegen import jit as cj
from tessera.codegen import llvm_parallel as lp
from tessera.errors import LLVMAbortError, TesseraError
from tessera.frontend import compile as C
from tessera.frontend import cpu_codegen


def _two(x, w):
    return ts.ops.softmax(ts.ops.tanh(x @ w))


two_kernels = ts.jit(_two)


def oracle(x, w):
    return softmax(np.tanh(f64(x) @ f64(w)))


def _inputs(rng):
    return (rng.standard_normal((37, 24)).astype(np.float32), rng.standard_normal((24, 19)).astype(np.float32))


@pytest.fixture(scope="module")
def module_ir():
    x, w = _inputs(np.random.default_rng(7))
    c = two_kernels.compile(x, w).compiled
    assert len(c.kernels) >= 2, c.kernels
    return c.llvm_ir, list(c.kernels), c.cpu, c.features


def test_split_keeps_every_kernel_once_with_its_entry(module_ir):
    text, kernels, _, _ = module_ir
    parts = lp.split(text, kernels, 2)
    assert parts is not None and len(parts) == 2
    for k in kernels:
        assert sum(f'define void @"{k}"(' in p for p in parts) == 1
        assert [f'define void @"{k}.entry"(' in p for p in parts] == [f'define void @"{k}"(' in p for p in parts]


def test_split_leaves_an_unexpected_module_whole(module_ir):
    text, kernels, _, _ = module_ir
    assert lp.split(text.replace("\ndefine ", '\n@g = global i32 0\ndefine ', 1), kernels, 2) is None
    assert lp.split(text, kernels[:-1], 2) is None            # a definition that is no kernel of ours


def test_helper_process_builds_the_same_objects_as_this_process(module_ir):
    text, kernels, cpu, features = module_ir
    parts = lp.split(text, kernels, 2)
    here = lp.compile_parts(parts, cpu, features, cj.CPU_OPT, cj.CPU_LOOP_PASSES, helper=False)
    both = lp.compile_parts(parts, cpu, features, cj.CPU_OPT, cj.CPU_LOOP_PASSES, helper=True)
    assert both == here


def test_helper_abort_is_a_coded_error(module_ir, monkeypatch):
    text, kernels, cpu, features = module_ir
    monkeypatch.setattr(lp, "helper_command", lambda src, dst: [sys.executable, "-c", "import os; os.abort()"])
    with pytest.raises(LLVMAbortError, match="helper"):
        lp.compile_parts(lp.split(text, kernels, 2), cpu, features, cj.CPU_OPT, cj.CPU_LOOP_PASSES)


def test_helper_failure_compiles_its_part_here(module_ir, monkeypatch):
    text, kernels, cpu, features = module_ir
    parts = lp.split(text, kernels, 2)
    want = lp.compile_parts(parts, cpu, features, cj.CPU_OPT, cj.CPU_LOOP_PASSES, helper=False)
    monkeypatch.setattr(lp, "helper_command", lambda src, dst: [sys.executable, "-c", "raise SystemExit(3)"])
    assert lp.compile_parts(parts, cpu, features, cj.CPU_OPT, cj.CPU_LOOP_PASSES) == want


@pytest.fixture
def split_everything(tmp_path, monkeypatch):
    """Any module of two kernels or more goes through the split, in a fresh cache."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TESSERA_NO_CACHE", raising=False)
    monkeypatch.setattr(C, "_MEMORY", OrderedDict())
    monkeypatch.setattr(lp, "MIN_CHARS", 0)
    monkeypatch.setenv("TESSERA_LLVM_JOBS", "2")
    monkeypatch.setattr(lp, "jobs", lambda: 2)


def test_split_objects_compute_the_model(rng, split_everything):
    x, w = _inputs(rng)
    fn = ts.jit(_two)
    out = fn(x, w)
    c = fn.compile(x, w).compiled
    assert c.cache_status == "compiled"
    from tessera.runtime import cache
    assert len(cache.load(c.key)["objs"]) == 2               # it did go through the split
    assert_close(out, oracle(x, w), 1e-5, "split objects")
    C._MEMORY.clear()
    again = ts.jit(_two)
    assert_close(again(x, w), oracle(x, w), 1e-5, "split objects from the disk cache")
    assert again.compile(x, w).compiled.cache_status == "disk"


def test_planted_split_bug_is_caught(rng, split_everything, monkeypatch):
    """Teeth: a split that loses the entry wrappers fails to load (missing symbol), coded."""
    real = lp.split

    def lossy(text, kernels, n, only=None):
        parts = real(text, kernels, n, only)
        return [p.replace(".entry\"(", ".entry_lost\"(") for p in parts] if parts else parts
    monkeypatch.setattr(lp, "split", lossy)
    x, w = _inputs(rng)
    with pytest.raises(TesseraError, match="entry"):
        ts.jit(_two)(x, w)


def test_a_translation_error_waits_for_the_verifier(monkeypatch):
    """The translation runs before the last pass's IR is verified; its exception is kept."""
    job = cpu_codegen.CodegenJob(None, last_pass="last")

    def boom(module, triple, **kw):
        raise KeyError("a value the verifier would have rejected")
    monkeypatch.setattr(cpu_codegen.cg, "translate", boom)
    from xdsl.dialects.builtin import ModuleOp
    module = ModuleOp([])
    job.after_apply("last", module=module)                    # no exception here ...
    with pytest.raises(KeyError):
        job.result(module)                                    # ... but from result()


def test_llvm_core_runs_without_importing_tessera():
    """The helper's start stays cheap: llvm_core.py imports llvmlite only."""
    code = (f"import runpy, sys; sys.argv = ['x']; runpy.run_path({lp.llvm_core.__file__!r}, run_name='probe'); "
            "print(any(m == 'tessera' or m.startswith('tessera.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_verifier_error_after_the_last_pass_wins_and_the_llvm_thread_ends(rng, monkeypatch):
    """LLVM starts before the last pass's IR is verified: a verifier error is still what the
    caller sees, and the LLVM thread has been joined."""
    import threading

    from tessera.errors import IRVerifyError
    from tessera.passes import pipeline as P
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    started = []
    real_objects = cpu_codegen.objects

    def objects(*a):
        started.append(True)
        return real_objects(*a)

    def verify(module):
        if "tessera_x86" in {op.dialect_name() for op in module.walk()}:
            raise IRVerifyError("planted: the Target IR does not verify")
    monkeypatch.setattr(cpu_codegen, "objects", objects)
    monkeypatch.setattr(P, "verify", verify)
    x, w = _inputs(rng)
    with pytest.raises(IRVerifyError, match="planted"):
        ts.jit(_two)(x, w)
    assert started                                            # LLVM had started ...
    assert not [t for t in threading.enumerate() if t.name == "tessera-llvm"]   # ... and was joined


def test_helper_started_during_translation_computes_the_model(rng, split_everything, monkeypatch):
    """A large module's leading kernels go to the helper as soon as they are translated."""
    monkeypatch.setattr(lp, "MIN_OPS", 0)
    helpers = []
    real = lp.Helper

    def spy(*a, **k):
        helpers.append(real(*a, **k))
        return helpers[-1]
    monkeypatch.setattr(lp, "Helper", spy)
    x, w = _inputs(rng)
    fn = ts.jit(_two)
    out = fn(x, w)
    c = fn.compile(x, w).compiled
    from tessera.runtime import cache
    assert len(helpers) == 1 and len(cache.load(c.key)["objs"]) == 2
    assert_close(out, oracle(x, w), 1e-5, "helper started during translation")
    assert c.llvm_ir == two_kernels.compile(x, w).compiled.llvm_ir      # the IR text is the module's


def test_helper_started_then_unsplittable_rest_compiles_whole(rng, split_everything, monkeypatch):
    monkeypatch.setattr(lp, "MIN_OPS", 0)
    real_split = lp.split
    calls = []

    def split_once(text, kernels, n, only=None):
        calls.append(kernels)
        return real_split(text, kernels, n, only) if len(calls) == 1 else None
    monkeypatch.setattr(lp, "split", split_once)
    x, w = _inputs(rng)
    fn = ts.jit(_two)
    out = fn(x, w)
    from tessera.runtime import cache
    assert len(calls) == 2 and len(cache.load(fn.compile(x, w).compiled.key)["objs"]) == 1
    assert_close(out, oracle(x, w), 1e-5, "whole after an unsplittable rest")
