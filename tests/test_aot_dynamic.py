"""Ahead-of-time export with dynamic sizes (issue 29): ``tessera.export(..., dynamic=..., max_sizes=...)``.

One library serves every batch / sequence length up to its maximum: the sizes are C arguments
(``int64_t``) after the buffers, the kernels run at the true sizes (nothing padded), the
workspace is laid out for the maxima.  Checked against float64 numpy at several sizes (through
ctypes and from a C program built against the header); sizes out of range get ``ERR_SIZE``
from the library itself; a planted driver bug (the size words left at the example's sizes)
fails the oracle; axes that cannot be dynamic are refused at export with the reason.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import tessera as ts
from tessera.aotlib import driver
from tessera.errors import ExportError
from tessera.toolchain import find_llvm_tool

pytestmark = pytest.mark.skipif(find_llvm_tool("ld.lld", 19) is None, reason="no ld.lld >= 19 (the ziglang wheel)")


def block(x, w, b, g, c):
    """A dense layer with GELU, then softmax and layer_norm over the features: rows of any count."""
    h = ts.ops.gelu(x @ w + b)
    return ts.ops.layer_norm(h, g, c), ts.ops.softmax(h).sum(axis=0)


def block64(x, w, b, g, c):
    u = x @ w + b
    h = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
    mu = h.mean(-1, keepdims=True)
    ln = (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + c
    e = np.exp(h - h.max(-1, keepdims=True))
    return ln, (e / e.sum(-1, keepdims=True)).sum(0)


def attn(q, k, v):
    """Causal-free attention over a dynamic sequence length (keys and queries)."""
    return ts.ops.softmax(q @ ts.ops.swapaxes(k, -1, -2) * 0.125) @ v


def attn64(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * 0.125
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _args(rng, n, d=24, f=40):
    return [rng.standard_normal(s).astype(np.float32) for s in ((n, d), (d, f), (f,), (f,), (f,))]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    rng = np.random.default_rng(1)
    return ts.export(block, *_args(rng, 37), path=str(tmp_path_factory.mktemp("dyn")), name="block", threads=2,
                     dynamic={"x": {0: "rows"}}, max_sizes={"rows": 600})


def _close(got, want, tol=3e-4):
    return np.abs(got.astype(np.float64) - want).max() <= tol * max(1.0, float(np.abs(want).max()))


def test_one_library_serves_every_row_count(lib, rng):
    assert lib.plan.sizes == [("rows", 600)]
    loaded = lib.load()
    for n in (1, 2, 37, 129, 600):                   # 1, the example's, odd, the maximum
        args = _args(rng, n)
        ln, sm = loaded(*args)
        want = block64(*[a.astype(np.float64) for a in args])
        assert ln.shape == (n, 40) and sm.shape == (40,)
        assert _close(ln, want[0]) and _close(sm, want[1]), n


def test_sizes_out_of_range_get_the_error_code(lib, rng):
    loaded = lib.load()
    args = _args(rng, 8)
    for bad in (0, -3, 601):
        rc, _ = loaded.call_raw(*args, sizes={"rows": bad})
        assert rc == driver.ERR_SIZE, bad
    assert b"dynamic size" in loaded.strerror(driver.ERR_SIZE)
    with pytest.raises(ExportError, match="shape"):
        loaded(args[0], args[1][:, :5], *args[2:])   # a fixed size that differs is refused before the call


def test_header_declares_the_size_arguments(lib):
    hdr = open(lib.header_path).read()
    assert "int block(const float *x, const float *w, const float *b, const float *g, const float *c, " \
           "float *out0, float *out1, int64_t rows);" in hdr
    assert "#define BLOCK_MAX_ROWS 600" in hdr and "#define BLOCK_IN0_DIM0 BLOCK_MAX_ROWS" in hdr
    assert "#define BLOCK_ERR_SIZE 5" in hdr and "#define BLOCK_IN0_MAX_NUMEL 14400" in hdr


def test_two_inputs_share_a_dynamic_length(tmp_path, rng):
    q, k, v = (rng.standard_normal((2, 50, 16)).astype(np.float32) for _ in range(3))
    lib = ts.export(attn, q, k, v, path=str(tmp_path), name="attn",
                    dynamic={"q": {1: "seq"}, "k": {1: "seq"}, "v": {1: "seq"}}, max_sizes={"seq": 256})
    loaded = lib.load()
    for s in (3, 50, 200):
        a = [rng.standard_normal((2, s, 16)).astype(np.float32) for _ in range(3)]
        (got,) = loaded(*a)
        assert got.shape == (2, s, 16) and _close(got, attn64(*[x.astype(np.float64) for x in a])), s


def test_planted_size_words_fixed_at_the_example_fail_the_oracle(tmp_path, monkeypatch, rng):
    import importlib
    E = importlib.import_module("tessera.aotlib")
    real = E.make_plan

    def frozen(*a, **k):
        plan = real(*a, **k)
        for ln in plan.launches:                      # the bug: every size word the example's
            ln.sizes = [s if isinstance(s, int) else s[0] * 37 for s in ln.sizes]
        return plan
    monkeypatch.setattr(E, "make_plan", frozen)
    lib = ts.export(block, *_args(rng, 37), path=str(tmp_path), name="frozen", dynamic={"x": {0: "rows"}},
                    max_sizes={"rows": 600})
    args = _args(rng, 90)
    ln, _ = lib.load()(*args)
    assert not _close(ln, block64(*[a.astype(np.float64) for a in args])[0])


def test_cli_exports_a_dynamic_library(tmp_path, rng, capsys):
    from tessera.tools import cli
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert cli.main(["aot", os.path.join(root, "examples/aot/mlp.py") + ":mlp", "--shape", "8x16", "--shape",
                     "16x32", "--shape", "32", "--dynamic", "x:0:batch", "--max", "batch=64",
                     "--out", str(tmp_path)]) == 0
    hdr = (tmp_path / "mlp.h").read_text()
    assert "int mlp(const float *x, const float *w, const float *b, float *out, int64_t batch);" in hdr
    assert "#define MLP_MAX_BATCH 64" in hdr
    assert cli.main(["aot", os.path.join(root, "examples/aot/mlp.py") + ":mlp", "--shape", "8x16", "--shape", "16x32",
                     "--shape", "32", "--dynamic", "x:batch", "--out", str(tmp_path)]) != 0
    assert "ARG:AXIS:SIZE" in capsys.readouterr().err


def test_xla_ffi_handler_refuses_a_dynamic_library(lib):
    from tessera.aotlib import xla_ffi
    with pytest.raises(ExportError, match="dynamic sizes"):
        xla_ffi.handler_source(lib)


def test_axes_that_cannot_be_dynamic_are_refused(tmp_path, rng):
    args = _args(rng, 37)
    with pytest.raises(ExportError, match="mark it dynamic too"):   # w's rows are x's columns
        ts.export(block, *args, path=str(tmp_path), name="b1", dynamic={"x": {1: "feat"}})
    with pytest.raises(ExportError, match="fixed size 1"):
        ts.export(block, *_args(rng, 1), path=str(tmp_path), name="b2", dynamic={"x": {0: "rows"}})
    with pytest.raises(ExportError, match="at least the example"):
        ts.export(block, *args, path=str(tmp_path), name="b3", dynamic={"x": {0: "rows"}}, max_sizes={"rows": 8})
    with pytest.raises(ExportError, match="no array argument"):
        ts.export(block, *args, path=str(tmp_path), name="b4", dynamic={"nope": {0: "rows"}})
    with pytest.raises(ExportError, match="no axis 2"):
        ts.export(block, *args, path=str(tmp_path), name="b5", dynamic={"x": {2: "rows"}})


C_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include "block.h"
int main(int argc, char **argv) {
    int64_t n = atoll(argv[1]);
    FILE *f = fopen(argv[2], "rb");
    size_t sz[5] = {(size_t)n * BLOCK_IN0_DIM1, BLOCK_IN1_NUMEL, BLOCK_IN2_NUMEL, BLOCK_IN3_NUMEL, BLOCK_IN4_NUMEL};
    float *in[5];
    for (int i = 0; i < 5; i++) { in[i] = malloc(sz[i] * sizeof(float)); if (fread(in[i], sizeof(float), sz[i], f) != sz[i]) return 9; }
    fclose(f);
    float *ln = malloc((size_t)n * BLOCK_OUT0_DIM1 * sizeof(float)), *sm = malloc(BLOCK_OUT1_NUMEL * sizeof(float));
    int rc = block(in[0], in[1], in[2], in[3], in[4], ln, sm, n);
    if (rc != BLOCK_OK) { fprintf(stderr, "%s\n", block_strerror(rc)); return rc; }
    if (block(in[0], in[1], in[2], in[3], in[4], ln, sm, BLOCK_MAX_ROWS + 1) != BLOCK_ERR_SIZE) return 8;
    f = fopen(argv[3], "wb");
    fwrite(ln, sizeof(float), (size_t)n * BLOCK_OUT0_DIM1, f);
    fwrite(sm, sizeof(float), BLOCK_OUT1_NUMEL, f);
    fclose(f);
    return 0;
}
"""


def test_c_program_calls_the_library_at_a_runtime_size(lib, tmp_path, rng):
    cc = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler")
    d = os.path.dirname(lib.so_path)
    (tmp_path / "main.c").write_text(C_MAIN)
    exe = tmp_path / "main"
    p = subprocess.run([cc, "-O1", "-std=c99", "-Wall", "-Werror", f"-I{d}", str(tmp_path / "main.c"), f"-L{d}",
                        "-lblock", f"-Wl,-rpath,{d}", "-o", str(exe)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    n = 77
    args = _args(rng, n)
    np.concatenate([a.ravel() for a in args]).tofile(tmp_path / "in.bin")
    p = subprocess.run([str(exe), str(n), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = np.fromfile(tmp_path / "out.bin", np.float32)
    want = block64(*[a.astype(np.float64) for a in args])
    assert _close(out[:n * 40].reshape(n, 40), want[0]) and _close(out[n * 40:], want[1])
