"""Shared helpers of tests/test_interop.py and tests/test_interop_torch.py (no framework imported here)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

import tessera as ts
from tessera.runtime.cpu import CpuExecutable


@ts.jit
def fma(x, y):
    return x * y + x


@ts.jit
def pair(x, y):
    return x + y, x * y


TOL = {"float32": 1e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2, "int32": 0}
DTYPES = list(TOL)


def np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def inputs(rng, name, shape=(5, 7)):
    if name == "int32":
        return [rng.integers(-50, 50, shape).astype(np.int32) for _ in range(2)]
    return [rng.standard_normal(shape).astype(np_dtype(name)) for _ in range(2)]


def host(r) -> np.ndarray:
    if type(r).__module__.startswith("torch"):
        import torch
        if r.dtype == torch.bfloat16:
            return r.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return r.numpy()
    return np.asarray(r)


def check(r, x, y, name):
    want = x.astype(np.float64) * y.astype(np.float64) + x.astype(np.float64)
    got = host(r)
    assert got.dtype == np_dtype(name) and got.shape == want.shape
    err = np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max())
    assert err <= TOL[name], f"{name}: relative error {err}"


def spy(monkeypatch) -> list:
    """The data pointers of the arrays each kernel launch reads."""
    seen = []
    real = CpuExecutable._execute

    def run(self, plan, arrays):
        seen.append([a.ctypes.data for a in arrays])
        return real(self, plan, arrays)
    monkeypatch.setattr(CpuExecutable, "_execute", run)
    return seen


class Legacy:
    """A producer of the pre-1.0 protocol only (``__dlpack__`` takes no max_version)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()
