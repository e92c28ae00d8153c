"""Ahead-of-time export (tessera/aotlib/): lib<name>.so + <name>.h, run without Python.

Each library is exported once per module (an export compiles, emits the kernels' object and
links: a few seconds); the numeric tests call it on fresh random inputs and compare with a
float64 numpy oracle.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera.errors import ExportError, TesseraError
from tessera.aotlib import driver, link
from tessera.mma import x86 as X
from tessera.toolchain import find_llvm_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(find_llvm_tool("ld.lld", 19) is None, reason="no ld.lld >= 19 (the ziglang wheel)")


def gelu64(u):
    return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))


def ln64(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def softmax64(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def gemm_gelu(x, w, b):
    return ts.ops.gelu(x @ w + b)


def rows(x, g, b):
    return ts.ops.softmax(ts.ops.layer_norm(x, g, b)), x      # x returned as is: a copy in the library


def mlp2(x, w1, c1, w2, c2, g, b):
    h = ts.ops.gelu(x @ w1 + c1)
    return ts.ops.layer_norm(h @ w2 + c2 + x, g, b)


def mlp2_64(x, w1, c1, w2, c2, g, b):
    return ln64(gelu64(x @ w1 + c1) @ w2 + c2 + x, g, b)


SHAPES = {"gemm_gelu": [(64, 256), (256, 512), (512,)], "rows": [(24, 40), (40,), (40,)],
          "mlp2": [(16, 32), (32, 64), (64,), (64, 32), (32,), (32,), (32,)]}
FNS = {"gemm_gelu": gemm_gelu, "rows": rows, "mlp2": mlp2}


def inputs(rng, name):
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES[name]]


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("aot"))
    rng = np.random.default_rng(0)
    out = {}
    for name, fn in FNS.items():
        out[name] = ts.export(fn, *inputs(rng, name), path=d, name=name, threads=2)
    return out


@pytest.fixture(scope="module")
def loaded(libs):
    return {k: v.load() for k, v in libs.items()}


def _close(got, want, tol=2e-4):
    scale = max(1.0, float(np.abs(want).max()))
    return np.abs(got.astype(np.float64) - want).max() <= tol * scale


def test_gemm_bias_gelu_matches_oracle_on_every_thread_count(loaded, rng):
    lib = loaded["gemm_gelu"]
    x, w, b = inputs(rng, "gemm_gelu")
    want = gelu64(x.astype(np.float64) @ w + b)
    assert lib.lib.plan.launches[0].threaded        # enough work for the pthread path
    got = {}
    for n in (1, 2):
        assert lib.set_threads(n) == 0
        got[n], = lib(x, w, b)
        assert _close(got[n], want)
    assert np.array_equal(got[1], got[2])            # the same bits for every thread count
    assert lib.set_threads(0) == driver.ERR_THREADS and lib.set_threads(3) == driver.ERR_THREADS


def test_row_program_softmax_layer_norm_and_returned_argument(loaded, rng):
    x, g, b = inputs(rng, "rows")
    y, same = loaded["rows"](x, g, b)
    assert _close(y, softmax64(ln64(x.astype(np.float64), g, b)))
    assert np.array_equal(same, x)                   # an argument returned as is: copied into the output


def test_multi_kernel_program_runs_its_whole_launch_plan(libs, loaded, rng):
    assert len(libs["mlp2"].plan.launches) >= 2
    args = inputs(rng, "mlp2")
    y, = loaded["mlp2"](*args)
    assert _close(y, mlp2_64(*[a.astype(np.float64) for a in args]))


def test_planted_bug_skipping_a_launch_fails_the_oracle(tmp_path, monkeypatch, rng):
    import importlib
    E = importlib.import_module("tessera.aotlib")
    real = E.make_plan

    def skip_first(*a, **k):
        plan = real(*a, **k)
        plan.launches = plan.launches[1:]            # the first kernel never runs: its output is garbage
        return plan
    monkeypatch.setattr(E, "make_plan", skip_first)
    lib = ts.export(mlp2, *inputs(rng, "mlp2"), path=str(tmp_path), name="mlp2_bug")
    args = inputs(rng, "mlp2")
    y, = lib.load()(*args)
    assert not _close(y, mlp2_64(*[a.astype(np.float64) for a in args]))


def test_library_needs_only_the_c_library(libs):
    allowed = {"libc.so.6", "libm.so.6", "libpthread.so.0"}
    import ctypes
    system = [ctypes.CDLL(p) for p in link.system_libraries()]
    for name, lib in libs.items():
        buf = open(lib.so_path, "rb").read()
        assert set(link.needed(buf)) <= allowed and "libc.so.6" in link.needed(buf)
        for sym in link.undefined_symbols(buf):      # every one defined by libc / libm / libpthread
            assert any(hasattr(s, sym) for s in system), sym
        api = {name, f"{name}_run", f"{name}_strided", f"{name}_workspace_size", f"{name}_check_cpu",
               f"{name}_set_num_threads",
               f"{name}_get_num_threads", f"{name}_strerror"}
        assert set(link.exported_symbols(buf)) == api    # kernels hidden: two libraries never clash
    if shutil.which("ldd"):
        p = subprocess.run(["ldd", libs["mlp2"].so_path], capture_output=True, text=True)
        assert p.returncode == 0 and "python" not in p.stdout.lower()


def _cc():
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def test_cli_export_and_c_driver_match_the_oracle(tmp_path, rng):
    cc = _cc()
    from tessera.tools import cli
    out = tmp_path / "build"
    assert cli.main(["aot", os.path.join(ROOT, "examples/aot/mlp.py") + ":mlp", "--shape", "8x16", "--shape",
                     "16x32", "--shape", "32", "--out", str(out), "--threads", "2"]) == 0
    hdr = (out / "mlp.h").read_text()
    assert "int mlp(const float *x, const float *w, const float *b, float *out);" in hdr
    assert "#define MLP_OUT0_DIM1 32" in hdr
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "mlp_demo"
    p = subprocess.run([cc, "-O1", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{out}",
                        os.path.join(ROOT, "examples/aot/main.c"), f"-L{out}", "-lmlp", f"-Wl,-rpath,{out}", "-o",
                        str(exe)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32,)])
    files = []
    for i, a in enumerate((x, w, b)):
        files.append(str(tmp_path / f"in{i}.bin"))
        a.tofile(files[-1])
    yfile = str(tmp_path / "y.bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    p = subprocess.run([str(exe), *files, yfile], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("mlp: y[8][32]")
    y = np.fromfile(yfile, np.float32).reshape(8, 32)
    assert _close(y, gelu64(x.astype(np.float64) @ w + b))


def _missing_arch():
    host = X.host_cpu()[1]
    for arch in ("x86-64-v4", "avx512_bf16", "cooperlake", "sapphirerapids"):
        if X.resolve(arch)[2] - host:
            return arch
    return None


def test_cpu_without_the_features_gets_the_error_code_not_a_crash(libs, tmp_path, rng):
    assert libs["rows"].load().check_cpu() == 0         # the host's own library runs here
    arch = _missing_arch()
    if arch is None:
        pytest.skip("this CPU has every feature of the candidate archs")
    lib = ts.export(gemm_gelu, *inputs(rng, "gemm_gelu"), path=str(tmp_path), name="elsewhere", arch=arch)
    code = int(re.search(r"#define ELSEWHERE_ERR_CPU (\d+)", open(lib.header_path).read()).group(1))
    missing = set(lib.features) - X.host_cpu()[1]
    assert missing and code == driver.ERR_CPU
    loaded = lib.load()
    assert loaded.check_cpu() == code
    rc, _ = loaded.call_raw(*inputs(rng, "gemm_gelu"))
    assert rc == code
    with pytest.raises(TesseraError, match="lacks a feature"):
        loaded(*inputs(rng, "gemm_gelu"))


def test_null_pointer_is_an_error_code(loaded):
    lib = loaded["rows"]
    n = len(lib.lib.plan.inputs) + len(lib.lib.plan.outputs)
    assert lib.entry(*([None] * n)) == driver.ERR_NULL
    assert lib.strerror(driver.ERR_NULL).decode() == "a buffer pointer is NULL"


def test_bad_input_is_refused_with_a_code(loaded, tmp_path, rng):
    a = inputs(rng, "rows")
    with pytest.raises(ExportError) as e:
        ts.export(rows, *a, path=str(tmp_path), target="nvidia")
    assert e.value.code == "EXPORT"
    with pytest.raises(ExportError, match="rocm"):
        ts.export(ts.jit(rows, target="rocm", arch="gfx1151"), *a, path=str(tmp_path))
    with pytest.raises(ExportError, match="exported for"):   # the Python wrapper checks the fixed sizes
        loaded["rows"](a[0][:3], a[1], a[2])
    dyn = ts.jit(lambda x, g, b: ts.ops.softmax(x * g + b), dynamic={0: 0})
    with pytest.raises(ExportError, match="dynamic"):
        ts.export(dyn, *a, path=str(tmp_path))
    with pytest.raises(ExportError, match="C identifier"):
        ts.export(rows, *a, path=str(tmp_path), name="1bad")
    with pytest.raises(ExportError, match="threads"):
        ts.export(rows, *a, path=str(tmp_path), threads=0)


def test_one_function_exported_at_two_sizes_with_a_runtime_scalar(tmp_path, rng):
    f = ts.jit(lambda x, w, s: ts.ops.gelu(x @ w) * s)   # symbolic sizes: one compile serves both exports
    libs = []
    for m, k, n in ((6, 8, 12), (3, 8, 5)):
        x, w = (rng.standard_normal(sh).astype(np.float32) for sh in ((m, k), (k, n)))
        lib = ts.export(f, x, w, 0.5, path=str(tmp_path), name="scaled")   # the same file name again
        assert [t.shape for t in lib.plan.inputs] == [(m, k), (k, n), ()]
        libs.append((lib.load(), (m, k, n)))
    for lib, (m, k, n) in libs:      # both loaded in this process: each runs its own sizes
        x, w = (rng.standard_normal(sh).astype(np.float32) for sh in ((m, k), (k, n)))
        s = np.float32(rng.uniform(0.5, 2))
        y, = lib(x, w, s)
        assert y.shape == (m, n) and _close(y, gelu64(x.astype(np.float64) @ w) * s)


@pytest.mark.slow
def test_gpt2_block_as_a_library(tmp_path, rng):
    import sys
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from models import gpt2_block as G
    args, kw = G.make(rng, batch=1, seq=16, dim=32, heads=2)
    lib = ts.export(G.forward, *args, path=str(tmp_path), name="gpt2_block", threads=2, **kw)
    assert len(lib.plan.launches) >= 4 and [t.name for t in lib.plan.inputs][:2] == ["x", "ln1_g"]
    args, _ = G.make(rng, batch=1, seq=16, dim=32, heads=2)
    y, = lib.load()(*args)
    assert _close(y, G.reference(*args, **kw))


def test_link_refuses_a_symbol_outside_the_c_library(tmp_path):
    from tessera.codegen import jit as cj
    from tessera.mma import x86
    _, cpu, feats = x86.resolve(None)
    ir = (f'target triple = "{cj.host_triple()}"\ndeclare i32 @PyGILState_Ensure()\n'
          "define i32 @calls_python() {\n  %r = call i32 @PyGILState_Ensure()\n  ret i32 %r\n}\n")
    obj = cj.emit(ir, cpu, x86.llvm_feature_string(feats)).obj
    with pytest.raises(ExportError, match="PyGILState_Ensure"):
        link.link([obj], str(tmp_path / "libbad.so"), ["calls_python"], "libbad.so")
    assert not (tmp_path / "libbad.so").exists()
