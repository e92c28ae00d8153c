"""The NVIDIA lane on a real GPU: ``@tessera.jit(target="nvidia")`` compiled here, launched through
``tessera.runtime.cuda`` on the device, checked against float64 and against the warp emulator.

Skipped (saying why) on machines without a CUDA device; run on a GPU machine with
``python -m pytest tests/test_nvidia_device.py`` (see benchmarks/gpu/device_run.sh).
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from gpu_common import SHAPES, batched, gemm_acc, gemm_epilogue, gelu64, inputs, oracle_acc, rel_err, swap_acc_rows
from tessera.runtime import cuda
from tessera.toolchain import find_ptxas

ARCH = cuda.device_arch()
pytestmark = [pytest.mark.skipif(not cuda.device_available()[0], reason="no CUDA device"),
              pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")]


def _ran(fn_name: str) -> str:
    hits = [e.lane for e in ts.lane_log.entries if e.function == fn_name]
    return hits[-1] if hits else ""


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES + [(520, 384, 272)])
def test_gemm_with_accumulator_on_the_device(dtype, shape, rng):
    a, b, c0 = inputs(rng, dtype, *shape)
    f = ts.jit(gemm_acc, target="nvidia", arch=ARCH)
    got = f(a, b, c0)
    want = oracle_acc(a, b, c0)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert rel_err(got, want) < 1e-5                       # f32 accumulation of exact f16/bf16 products
    assert _ran(f.name) == f"nvidia-{ARCH}"
    emulated = ts.compile(gemm_acc, a, b, c0, target="nvidia", arch=ARCH).emulate(a, b, c0)
    # the emulator's lane layouts against the hardware's: a misread fragment is an O(1) error
    assert rel_err(got, emulated.astype(np.float64)) < 1e-5


def test_planted_layout_bug_is_caught_on_the_device(rng, monkeypatch):
    """Teeth: a compiler whose mma.sync accumulator lane map lists rows g and g + 8 the wrong way
    round (swap_acc_rows) builds a kernel the device runs without complaint; the float64 check
    rejects it (the emulator catches the same plant in test_nvidia.py)."""
    a, b, c0 = inputs(rng, "f16", 70, 72, 48)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    assert rel_err(ts.jit(gemm_acc, target="nvidia", arch=ARCH)(a, b, c0), oracle_acc(a, b, c0)) < 1e-5
    swap_acc_rows(monkeypatch)
    f = ts.jit(gemm_acc, target="nvidia", arch=ARCH)
    got = f(a, b, c0)
    assert _ran(f.name) == f"nvidia-{ARCH}"       # it really ran on the device
    assert rel_err(got, oracle_acc(a, b, c0)) > 1e-2


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_fused_epilogue_and_batch_on_the_device(dtype, rng):
    a, b, _ = inputs(rng, dtype, 130, 72, 48)
    bias = rng.standard_normal(72).astype(a.dtype)
    got = ts.jit(gemm_epilogue, target="nvidia", arch=ARCH)(a, b, bias)
    want = gelu64(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64))
    assert rel_err(got, want) < 1e-2
    a, b, c0 = inputs(rng, dtype, 33, 40, 24, batch=(3,))
    got = ts.jit(batched, target="nvidia", arch=ARCH)(a, b, c0)
    x = oracle_acc(a, b, c0)
    assert rel_err(got, x / (1 + np.exp(-x))) < 1e-5


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_flash_attention_on_the_device(dtype, rng):
    from test_gpu_attention import TOL, oracle, qkv, rel
    q, k, v = qkv(rng, dtype, 2, 4, 2, 150, 129, 64)            # grouped heads, edge blocks
    mask = rng.random((150, 129)) > 0.2
    mask[5] = False                                             # a fully-masked row gives 0
    for causal in (False, True):
        def f(q, k, v, m):
            return ts.ops.attention(q, k, v, mask=m, causal=causal)
        jf = ts.jit(f, target="nvidia", arch=ARCH)
        got = jf(q, k, v, mask)
        assert _ran(jf.name) == f"nvidia-{ARCH}"
        assert rel(got, oracle(q, k, v, causal=causal, mask=mask)) < TOL[dtype]
        assert (got[:, :, 5] == 0).all()
        emulated = ts.compile(f, q, k, v, mask, target="nvidia", arch=ARCH).emulate(q, k, v, mask)
        assert rel(got, emulated.astype(np.float64)) < 1e-2
