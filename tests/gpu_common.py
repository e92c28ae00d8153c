"""Shared pieces of the GPU-lane tests: programs, inputs, and the float64 / rounding models."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import oracle as O

import tessera as ts

DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
# (M, N, K): edge tiles in every dimension; K = 37 and N = 29 make rows unaligned (the
# element-by-element copy path), K = 48 / N = 72 aligned ones (16-byte vector / cp.async path)
SHAPES = [(70, 72, 48), (33, 29, 37), (130, 17, 16)]


def gemm_acc(a, b, c0):
    """C = A @ B + C0 with f32 accumulation (the real incoming accumulator)."""
    return ts.ops.matmul(a, b, out_dtype=np.float32) + c0


def gemm_epilogue(a, b, bias):
    """gelu(A @ B + bias) in the inputs' dtype (bias row broadcast)."""
    return ts.ops.gelu(a @ b + bias)


def batched(a, b, c0):
    """[batch] C = A @ B + C0, B shared by the batch."""
    return ts.ops.silu(ts.ops.matmul(a, b, out_dtype=np.float32) + c0)


def inputs(rng, dtype: str, m: int, n: int, k: int, batch: tuple = ()):
    dt = DTYPES[dtype]
    a = rng.standard_normal((*batch, m, k)).astype(dt)
    b = rng.standard_normal((k, n)).astype(dt)
    c0 = (rng.standard_normal((*batch, m, n)) * 4).astype(np.float32)
    return a, b, c0


def oracle_acc(a, b, c0) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64) + c0.astype(np.float64)


def rounding_model(a, b, c0, k_step: int) -> np.ndarray:
    """The kernel's arithmetic exactly: the accumulator starts as C0 (f32) and each
    instruction adds one k_step-wide slice of A @ B, rounded to f32 once per instruction.
    f16/bf16 products and their sums over one slice are exact in float64, so the order
    inside a slice does not matter and the model is bit-exact."""
    acc = c0.astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for k0 in range(0, a.shape[-1], k_step):
        acc = (acc.astype(np.float64) + a64[..., k0:k0 + k_step] @ b64[k0:k0 + k_step]).astype(np.float32)
    return acc


def gelu64(x):
    return O.gelu_tanh(x)


def rel_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def drop_c0(monkeypatch) -> None:
    """Plant the seeds' bug: the accumulator fragment becomes a synthesized zero instead of C0."""
    from tessera.passes.target.gpu import simt
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = simt.SimtLowerer.op_tile_fragment_pack

    def zero_acc(self, op, b):
        if op.result.type.role.data == "acc":
            return simt.SimtLowerer.op_tile_fragment_zero(self, op, b)
        return orig(self, op, b)
    monkeypatch.setattr(simt.SimtLowerer, "op_tile_fragment_pack", zero_acc)


def swap_acc_rows(monkeypatch) -> None:
    """Plant a layout bug in the compiler: the NVIDIA lowering's mma.sync accumulator lane map
    (MmaSyncMap.c) lists its entries c2, c3, c0, c1, so each lane's registers c0/c1 (row g of
    the tile, per the PTX ISA's fragment layout) are read and written as row g + 8 and c2/c3 as
    row g. C0 goes in and comes out through the same wrong map, so it survives; the products
    the instruction put in rows g and g + 8 land in each other's rows."""
    from tessera.passes.target.gpu.simt import OperandMap
    from tessera.passes.target.nvidia import lower_tile_to_nvidia as NVL
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = NVL.MmaSyncMap.build

    def swapped(self, b_, lane):
        orig(self, b_, lane)
        items = list(self.c.items)
        self.c = OperandMap(items[2:] + items[:2], self.c.parts)
    monkeypatch.setattr(NVL.MmaSyncMap, "build", swapped)


def check_relu_propagates_nan(rng, compile_fn) -> None:
    """relu(NaN) is NaN (numpy.maximum), in the emulator and in the generated code: the
    translation selects instead of calling llvm.maxnum, which would return 0."""
    a, b, c0 = inputs(rng, "f16", 40, 32, 32)
    c0[3, 5], c0[7, :] = np.nan, np.nan
    art = compile_fn(lambda a, b, c0: ts.ops.relu(ts.ops.matmul(a, b, out_dtype=np.float32) + c0), (a, b, c0))
    want = np.maximum(oracle_acc(a, b, c0), 0)
    got = art.emulate(a, b, c0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert rel_err(np.nan_to_num(got), np.nan_to_num(want)) < 1e-2
    assert "maxnum" not in art.ir("llvm")
