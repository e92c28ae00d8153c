"""The conv block's fast paths against float64 oracles: B packed once per thread for GEMMs whose
B is shared by every batch entry (kernels/gemm_hoist.py), with planted bugs that break them."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts

import oracle as O


def arr(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_nhwc_ref(x, w, pad):
    x, w = O.f64(x), O.f64(w)
    N, H, W, _ = x.shape
    kh, kw = w.shape[:2]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    Ho, Wo = H + 2 * pad - kh + 1, W + 2 * pad - kw + 1
    out = np.zeros((N, Ho, Wo, w.shape[3]))
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i:i + Ho, j:j + Wo, :] @ w[i, j]
    return out


# (N, H, W, C_in, C_out): odd sizes; one with C_in > 64 so a tap spans several k-blocks' worth
# of slivers, one with several row tiles per batch entry and a remainder tile
CONV_CASES = [(3, 7, 9, 5, 11), (2, 5, 13, 70, 33)]
_fns: dict = {}


def _conv():
    if "conv" not in _fns:
        _fns["conv"] = ts.jit(lambda x, w, b: ts.ops.relu(ts.ops.conv2d(x, w, b, padding=1, layout="NHWC")))
    return _fns["conv"]


def _bmm():
    if "bmm" not in _fns:
        _fns["bmm"] = ts.jit(lambda a, b: a @ b)
    return _fns["bmm"]


def _check_conv(rng, case):
    n, h, w_, ci, co = case
    x, w, b = arr(rng, n, h, w_, ci), arr(rng, 3, 3, ci, co), arr(rng, co)
    O.assert_close(_conv()(x, w, b), np.maximum(conv_nhwc_ref(x, w, 1) + O.f64(b), 0), 2e-5)


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv_with_b_packed_once_matches_float64(rng, case):
    _check_conv(rng, case)


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_gemm_with_shared_b_matches_float64(rng, threads):
    """[5, 37, 1100] @ [1100, 45]: two plain k-blocks in their own slots, batch entries split
    between the threads (each packs B for its first entry)."""
    a, b = arr(rng, 5, 37, 1100), arr(rng, 1100, 45)
    ts.set_num_threads(threads)
    try:
        got = _bmm()(a, b)
    finally:
        ts.set_num_threads(None)
    O.assert_close(got, O.f64(a) @ O.f64(b), 2e-5)


def test_hoist_applies_only_to_a_shared_static_b():
    from tessera.passes.tile.kernels import gemm_hoist
    assert gemm_hoist.k_block_rows(1100, 1024, 4) == 552
    assert gemm_hoist.k_block_rows(576, 1024, 4) == 576


def test_plant_every_k_block_in_one_slot_is_caught(rng, monkeypatch):
    """Planted: every k-block's packed B goes to slot 0, so batch entries after a thread's first
    read the last k-block's B for all of them."""
    from tessera.passes.tile.kernels import gemm_hoist
    real = gemm_hoist.plan_slots
    monkeypatch.setattr(gemm_hoist, "plan_slots", lambda *a, **k: 0 if real(*a, **k) is not None else None)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    _fns.clear()
    with pytest.raises(AssertionError):
        _check_conv(rng, CONV_CASES[0])
    _fns.clear()
