"""``iota`` / ``arange`` / ``tril`` / ``triu`` and masks built in the graph on the GPU lanes:

- in elementwise kernels (kernels/gpu_rows.py): an iota along the last axis is the chunk's columns,
  along another axis the row's coordinate (the kernel runs row by row);
- in GEMM epilogues (passes/target/gpu/simt.py ``IndexTile``): computed per accumulator item from its
  coordinates in the lane map, so ``where(row > col, x @ w, k)``, ``tril(x @ w, k)`` and
  ``triu(x @ w, k)`` fuse into the GEMM on nvidia (mma.sync) and rocm (MFMA / WMMA).

Compiled (ptxas / linked code objects) and emulated against numpy: masked entries exact, kept ones
within the output dtype's rounding of the float64 product; edge tiles (sizes no multiple of the
tile) included.  Planted bugs (row and column swapped in the epilogue's index, every row's
coordinate 0 in an elementwise kernel) fail.
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.toolchain import find_llvm_tool, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
LANES = [("nvidia", "sm_80"), ("nvidia", "sm_90"), ("rocm", "gfx942"), ("rocm", "gfx1100")]


def _skip(target):
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")


def _i(shape, axis):
    return ts.ops.iota(shape, axis=axis, dtype=np.int32)


MASKS = {   # name -> (program on y = a @ w, numpy oracle on the float64 product)
    "row_gt_col": (lambda y: ts.ops.where(_i(y.shape, 0) > _i(y.shape, 1), y, -1.0),
                   lambda y: np.where(np.arange(y.shape[0])[:, None] > np.arange(y.shape[1]), y, -1.0)),
    "tril_m1": (lambda y: ts.ops.tril(y, k=-1), lambda y: np.tril(y, -1)),
    "triu_p2": (lambda y: ts.ops.triu(y, k=2), lambda y: np.triu(y, 2)),
    "tril": (lambda y: ts.ops.tril(y), np.tril),
    "col_mod": (lambda y: ts.ops.where(_i(y.shape, 1) % 3 == 0, 0.5, y),
                lambda y: np.where(np.arange(y.shape[1]) % 3 == 0, 0.5, y)),
}


def _gemm(rng, target, arch, name):
    a = rng.standard_normal((70, 40)).astype(np.float16)      # 70 x 90: edge tiles in both directions
    w = rng.standard_normal((40, 90)).astype(np.float16)
    prog, oracle = MASKS[name]
    art = ts.compile(lambda p, q: prog(p @ q), a, w, target=target, arch=arch)
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and not rep.reason
    assert [k["kind"] for k in rep.kernels] == ["gemm"], rep.kernels          # the mask fused into the GEMM
    assert all(k["registers" if target == "nvidia" else "vgprs"] > 0 for k in rep.kernels)
    got = np.asarray(art.emulate(a, w), np.float64)
    y = a.astype(np.float64) @ w.astype(np.float64)
    return got, oracle(y), oracle(np.full_like(y, 7.25)) != 7.25     # where the mask changed a constant


def _check_gemm(got, want, changed):
    assert np.array_equal(got[changed], want[changed])                     # masked entries: exact
    kept = ~changed
    assert np.abs(got[kept] - want[kept]).max() <= 2 ** -10 * np.abs(want).max() + 1e-3


GEMM_CASES = [(t_, a_, n) for n in MASKS for t_, a_ in (LANES[0], LANES[2])] + \
    [(*LANES[1], "row_gt_col"), (*LANES[3], "tril_m1")]


@needs_ptxas
@pytest.mark.parametrize("target,arch,name", GEMM_CASES, ids=["-".join(c) for c in GEMM_CASES])
def test_masks_built_in_the_graph_fuse_into_gpu_gemm_epilogues(rng, target, arch, name):
    _skip(target)
    _check_gemm(*_gemm(rng, target, arch, name))


@needs_ptxas
def test_planted_swapped_index_in_the_epilogue_fails(rng, monkeypatch):
    from tessera.passes.target.gpu import simt
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = simt.SimtLowerer.index_parts

    def swapped(self, b, v, like):
        return real(self, b, simt.IndexTile(v.base, v.cs, v.rs, v.elem), like)
    monkeypatch.setattr(simt.SimtLowerer, "index_parts", swapped)
    with pytest.raises(AssertionError):
        _check_gemm(*_gemm(rng, "nvidia", "sm_80", "row_gt_col"))


def _rows_prog(x):
    return (ts.ops.tril(x, k=-1), x + ts.ops.arange(x.shape[-1], dtype=np.float32) * 0.5,
            ts.ops.where(_i(x.shape, 1) > 2, x, 0.0), ts.ops.where(_i(x.shape, 0) == _i(x.shape, 2), 1.0, x))


def _rows_oracle(x):
    b, r, c = (np.arange(n).reshape([-1 if i == k else 1 for i in range(3)]) for k, n in enumerate(x.shape))
    return (np.tril(x, -1), x + np.arange(x.shape[-1], dtype=np.float32) * np.float32(0.5),
            np.where(r > 2, x, 0), np.where(b == c, np.float32(1), x))


@needs_ptxas
@pytest.mark.parametrize("target,arch", LANES)
def test_iotas_in_gpu_elementwise_kernels_match_numpy(rng, target, arch):
    _skip(target)
    x = rng.standard_normal((3, 5, 300)).astype(np.float32)
    art = ts.compile(_rows_prog, x, target=target, arch=arch)
    assert {k["kind"] for k in art.report().kernels} == {"elementwise"}
    for g, w in zip(art.emulate(x), _rows_oracle(x)):
        assert np.array_equal(g, w)


@needs_ptxas
def test_planted_row_coordinate_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import typed
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(typed, "row_digit", lambda b, kf, r, dims, axis: 0)
    x = rng.standard_normal((3, 5, 300)).astype(np.float32)
    got = ts.compile(_rows_prog, x, target="nvidia", arch="sm_80").emulate(x)
    assert not all(np.array_equal(g, w) for g, w in zip(got, _rows_oracle(x)))
