"""``top_k`` on the GPU lanes (kernels/gpu_topk.py): compiled for ``target="nvidia"`` (sm_80, sm_90:
every kernel assembled by ptxas) and ``target="rocm"`` (gfx942 wave64, gfx1100 wave32: linked code
objects), run in the warp/wave emulator on random rows against an independent numpy oracle (a
stable descending argsort with NaN first): values and int64 indices exact.  Rows of one chunk, of
two (held in registers) and longer (re-read per step), lengths that are no multiple of the chunk;
ties everywhere (small integers), NaN and -inf rows.  The emulator faults on any access outside an
array, so the masked tails are checked by every run; a planted unmasked tail makes it fault.
Planted bugs (ties by the highest column, an order without the stable tie-break) fail the checks.
``take_along_axis`` along the last axis (the sampler's other gather) is checked here too, with its
index policy (negative as numpy's, out of range clamped); unbounded indices fault in the emulator.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.errors import EmulatorFaultError, ScheduleIllegalError
from tessera.toolchain import find_llvm_tool, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
needs_lld = pytest.mark.skipif(find_llvm_tool("ld.lld") is None, reason="ld.lld >= 19 not installed")


def np_top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's stable descending order with a NaN above everything: the k first (values, indices)."""
    x64 = x.astype(np.float64)
    nan = np.isnan(x64)
    idx = np.lexsort((np.where(nan, 0.0, -x64), ~nan), axis=-1)[..., :k]   # lexsort is stable
    return np.take_along_axis(x, idx, -1), idx


def _rows(rng, C, dtype=np.float32, rows=7):
    x = rng.integers(-3, 4, (rows, C)).astype(np.float64)       # small ints: ties in every row
    x[1, C // 2:] = np.nan                                        # more NaN than k: NaN first, by index
    x[1, C // 3] = np.nan
    x[2] = -np.inf                                                # a row of -inf only
    x[3, -1] = 9.0                                                # the maximum in the tail's chunk
    x[4] = rng.standard_normal(C)                                 # distinct values
    x[5, ::2] = np.inf
    return x.astype(dtype)


def _emulated(k, x, target="nvidia", arch="sm_80"):
    art = ts.compile(lambda a: ts.ops.top_k(a, k), x, target=target, arch=arch)
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and not rep.reason, (rep.lane, rep.reason)
    assert [k_["kind"] for k_ in rep.kernels] == ["rowwise"], rep.kernels
    for kr in rep.kernels:     # a real binary: ptxas's registers / the AMDGPU object's VGPRs
        assert kr["registers" if target == "nvidia" else "vgprs"] > 0, kr
    return art.emulate(x)


def _check(got, x, k):
    v, i = got
    wv, wi = np_top_k(x, k)
    assert i.dtype == np.int64 and v.dtype == x.dtype and i.shape == v.shape == x.shape[:-1] + (k,)
    assert np.array_equal(i, wi), (i, wi)
    assert np.array_equal(v.astype(np.float64), wv.astype(np.float64), equal_nan=True)


def test_oracle_is_numpys_stable_descending_sort():
    x = np.array([[1.0, np.nan, 3.0, 3.0, -np.inf, np.nan, np.inf]])
    v, i = np_top_k(x, 7)
    assert i.tolist() == [[1, 5, 6, 2, 3, 0, 4]]


@needs_ptxas
@pytest.mark.parametrize("C,k,arch", [(12, 5, "sm_80"), (300, 12, "sm_90"), (700, 64, "sm_80"),
                                      (2500, 9, "sm_90"), (40, 40, "sm_80")])
def test_top_k_on_nvidia_matches_numpy(rng, C, k, arch):
    x = _rows(rng, C)
    _check(_emulated(k, x, "nvidia", arch), x, k)


@needs_ptxas
def test_top_k_bf16_on_nvidia_matches_numpy(rng):
    x = _rows(rng, 333, ml_dtypes.bfloat16)
    x[6] = rng.standard_normal(333).astype(ml_dtypes.bfloat16)   # bf16 rounding: ties among random values
    _check(_emulated(17, x), x, 17)


@needs_lld
@pytest.mark.parametrize("arch,C,k", [("gfx942", 300, 20), ("gfx1100", 1100, 7)])
def test_top_k_on_rocm_matches_numpy(rng, arch, C, k):
    x = _rows(rng, C)
    _check(_emulated(k, x, "rocm", arch), x, k)


@needs_ptxas
@pytest.mark.parametrize("plant", ["last_tie", "unstable"])
def test_planted_top_k_bugs_fail(rng, monkeypatch, plant):
    from tessera.passes.tile.kernels import gpu_topk, topk
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    if plant == "last_tie":
        monkeypatch.setattr(gpu_topk, "FIRST", False)
    else:
        monkeypatch.setattr(topk, "STABLE", False)
    x = _rows(rng, 50)
    v, i = _emulated(6, x)
    assert not np.array_equal(i, np_top_k(x, 6)[1])


@needs_ptxas
def test_planted_unmasked_tail_faults_in_the_emulator(rng, monkeypatch):
    from tessera.passes.tile.kernels import gpu_rowin
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gpu_rowin, "MASK_TAIL", False)
    x = _rows(rng, 50)
    with pytest.raises(EmulatorFaultError):
        _emulated(6, x)


@needs_ptxas
def test_top_k_over_the_bound_is_refused_by_name(rng):
    x = rng.standard_normal((2, 300)).astype(np.float32)
    with pytest.raises(ScheduleIllegalError) as ei:
        ts.compile(lambda a: ts.ops.top_k(a, 129), x, target="nvidia", arch="sm_80")
    assert "tessera.top_k" in str(ei.value) and "k <= 128" in str(ei.value) and 'target="cpu"' in str(ei.value)
    v, i = ts.jit(lambda a: ts.ops.top_k(a, 129))(x)        # the CPU lane compiles it
    assert np.array_equal(i, np_top_k(x, 129)[1])


@needs_ptxas
@pytest.mark.parametrize("target,arch", [("nvidia", "sm_90"), ("rocm", "gfx942")])
def test_prologue_fused_into_top_k_and_argmax(rng, target, arch):
    """An elementwise prologue (a broadcast row, a scale, exp) is computed inside the row kernels as
    their input is read; results as numpy's on the float32 values."""
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")
    x = _rows(rng, 301)
    bias = rng.integers(-2, 3, 300).astype(np.float32)

    def prog(a, bb):
        v, i = ts.ops.top_k(a[:, 1:] * 2.0 - bb, 11)
        return v, i, ts.ops.argmax(a[:, :300] * 3.0 + bb, axis=-1), ts.ops.argmin(ts.ops.exp(a), axis=-1)
    art = ts.compile(prog, x, bias, target=target, arch=arch)
    rows = [k["ops"] for k in art.report().kernels if k["kind"] == "rowwise"]
    assert sorted(r[-1] for r in rows) == ["tessera.argmax", "tessera.argmin", "tessera.top_k"], rows
    assert all("tessera.mul" in r or "tessera.exp" in r for r in rows), rows    # the prologue fused
    v, i, amax, amin = art.emulate(x, bias)
    with np.errstate(invalid="ignore"):
        y, z = x[:, 1:] * np.float32(2.0) - bias, x[:, :300] * np.float32(3.0) + bias
    _check((v, i), y, 11)
    assert np.array_equal(amax, np.argmax(z, -1)) and np.array_equal(amin, np.argmin(np.exp(x), -1))


def _clamped(i, n):
    return np.clip(np.where(i < 0, i + n, i), 0, n - 1)


@needs_ptxas
@pytest.mark.parametrize("target,arch", [("nvidia", "sm_80"), ("rocm", "gfx942")])
def test_take_along_axis_on_the_gpu_lanes(rng, target, arch):
    """take_along_axis along the last axis (float and int tables, int64 indices, negative ones as
    numpy's, out-of-range ones clamped: the documented index policy, never a read outside)."""
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")
    x = rng.standard_normal((2, 3, 50)).astype(np.float32)
    xi = rng.integers(-100, 100, (2, 3, 50)).astype(np.int32)
    idx = rng.integers(-70, 70, (2, 3, 7)).astype(np.int64)
    art = ts.compile(lambda a, b, i: (ts.ops.take_along_axis(a, i, -1), ts.ops.take_along_axis(b, i, -1)),
                     x, xi, idx, target=target, arch=arch)
    assert [k["kind"] for k in art.report().kernels] == ["gather", "gather"]
    g1, g2 = art.emulate(x, xi, idx)
    j = _clamped(idx, 50)
    assert np.array_equal(g1, np.take_along_axis(x, j, -1)) and g2.dtype == np.int32
    assert np.array_equal(g2, np.take_along_axis(xi, j, -1))


@needs_ptxas
def test_planted_unbounded_take_along_axis_faults(rng, monkeypatch):
    from tessera.passes.tile.kernels import gather
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gather, "bounded_index", lambda b, i, n: i)
    x = rng.standard_normal((2, 50)).astype(np.float32)
    idx = np.array([[3, -1], [60, 2]], np.int64)
    with pytest.raises(EmulatorFaultError):
        ts.compile(lambda a, i: ts.ops.take_along_axis(a, i, -1), x, idx, target="nvidia", arch="sm_80").emulate(x, idx)
