"""A causal mask built in the graph (``pos[:, None] >= pos[None, :]`` from ``arange``) inside a
GEMM epilogue on the GPU lanes: ``canonicalize`` turns each reshaped ``arange`` into an iota of its
own, ``fuse-matmul-epilogue`` takes the iotas, the comparison and the ``where`` into the GEMM's
epilogue, and on the GPU (no int / bool registers) ``gemm_dag`` applies the ``where`` as the tile's
diagonal ``tile.mask`` -- the row and column indices compared in registers, the mask never stored.
Checked in the warp emulator against float64, with a planted off-by-one on the diagonal."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.toolchain import find_llvm_tool, find_ptxas

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def masked_scores(q, k):
    S = q.shape[-2]
    pos = ts.ops.arange(S)
    s = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return ts.ops.where(pos[:, None] >= pos[None, :], s, -np.inf)


def masked_scores_le(q, k):            # the same mask spelled col <= row
    S = q.shape[-2]
    pos = ts.ops.arange(S)
    return ts.ops.where(pos[None, :] <= pos[:, None], q @ k.swapaxes(-1, -2), -1e4)


def _oracle(q, k, scale, pad):
    q, k = q.astype(np.float64), k.astype(np.float64)
    s = q @ k.swapaxes(-1, -2) * scale
    S = s.shape[-1]
    return np.where(np.tril(np.ones((S, S), bool)), s, pad)


def _check(fn, scale, pad, rng, arch="sm_80", shape=(2, 80, 32), target="nvidia"):
    q, k = (rng.standard_normal(shape).astype(ml_dtypes.bfloat16) for _ in range(2))
    art = ts.compile(fn, q, k, target=target, arch=arch)
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and len(rep.kernels) == 1, rep.kernels     # one GEMM, mask fused
    got = np.asarray(art.emulate(q, k), np.float64)
    want = _oracle(q, k, scale, pad)
    same_mask = np.array_equal(got == float(ml_dtypes.bfloat16(pad)), want == pad)   # the output is bf16
    keep = want != pad
    err = np.abs(got[keep] - want[keep]).max() / np.abs(want[keep]).max()
    return same_mask, err, rep.kernels[0]["registers" if target == "nvidia" else "vgprs"]


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    return monkeypatch


def test_causal_where_in_a_bf16_gemm_epilogue_matches_float64(fresh, rng):
    same, err, regs = _check(masked_scores, 1.0 / math.sqrt(32), -np.inf, rng)
    assert same and 0 < err < 1e-2 and regs > 0, (same, err, regs)


@pytest.mark.slow
def test_causal_where_spelled_le_on_sm_90(fresh, rng):
    same, err, _ = _check(masked_scores_le, 1.0, -1e4, rng, arch="sm_90", shape=(1, 72, 16))
    assert same and 0 < err < 1e-2, (same, err)


@pytest.mark.skipif(find_llvm_tool("ld.lld") is None, reason="ld.lld >= 19 not installed")
def test_causal_where_on_rocm(fresh, rng):
    same, err, vgprs = _check(masked_scores, 1.0 / math.sqrt(32), -np.inf, rng, arch="gfx942", target="rocm")
    assert same and 0 < err < 1e-2 and vgprs > 0, (same, err, vgprs)


def test_teeth_an_off_by_one_diagonal_fails(fresh, rng):
    from tessera.passes.tile.kernels import gemm_dag
    fresh.setattr(gemm_dag, "causal_diag", lambda b, row, col: b.sub(b.add(row, 1), col))
    same, _, _ = _check(masked_scores, 1.0 / math.sqrt(32), -np.inf, rng)
    assert not same


def test_another_mask_in_a_gpu_epilogue_runs_from_its_iotas(rng):
    """``row > col`` is not the diagonal mask: its int iotas are computed per accumulator item in the
    GEMM's epilogue (tests/test_gpu_iota.py), with the same result as numpy."""
    def strict(q, k):
        pos = ts.ops.arange(q.shape[-2])
        return ts.ops.where(pos[:, None] > pos[None, :], q @ k.swapaxes(-1, -2), -np.inf)
    q, k = (rng.standard_normal((2, 32, 16)).astype(ml_dtypes.bfloat16) for _ in range(2))
    art = ts.compile(strict, q, k, target="nvidia", arch="sm_80")
    assert [kr["kind"] for kr in art.report().kernels] == ["gemm"]
    got = np.asarray(art.emulate(q, k), np.float64)
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2)
    keep = np.arange(32)[:, None] > np.arange(32)[None, :]
    assert np.all(got[:, ~keep] == -np.inf)
    assert np.abs(got[:, keep] - s[:, keep]).max() <= 2 ** -7 * np.abs(s).max()
