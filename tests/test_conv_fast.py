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


# --------------------------------------------------------------------------- the conv block's copies
def _block(x, w1, b1, w2, b2):
    h = ts.ops.relu(ts.ops.conv2d(x, w1, b1, padding="same"))
    h = ts.ops.relu(ts.ops.conv2d(h, w2, b2, padding="same") + x)
    return ts.ops.max_pool2d(h, 2)


def conv_nchw_ref(x, w, b):
    """'same' 3x3 (odd kernel: one row / column each side), float64, NCHW / OIHW."""
    y = conv_nhwc_ref(np.transpose(x, (0, 2, 3, 1)), np.transpose(w, (2, 3, 1, 0)), 1) + O.f64(b)
    return np.transpose(y, (0, 3, 1, 2))


def block_ref(x, w1, b1, w2, b2):
    h = np.maximum(conv_nchw_ref(x, w1, b1), 0)
    h = np.maximum(conv_nchw_ref(h, w2, b2) + O.f64(x), 0)
    n, c, hh, ww = h.shape
    return h[:, :, :hh // 2 * 2, :ww // 2 * 2].reshape(n, c, hh // 2, 2, ww // 2, 2).max((3, 5))


def _block_args(rng, n=3, c=5, s=9):
    return [arr(rng, n, c, s, s), arr(rng, c, c, 3, 3) / 4, arr(rng, c), arr(rng, c, c, 3, 3) / 4, arr(rng, c)]


def test_conv_block_copies_fused_and_matches_float64(rng):
    """The ResNet block in NCHW (odd sizes; the pool drops the last row and column): the pool's
    windows are read in place from the second GEMM's NHWC result and only the pooled tensor is
    transposed; the residual x is read from the first conv's padded NHWC copy (a slice in the
    second GEMM's epilogue), not transposed again.  Kernels: pad (x to NHWC), w1 to HWIO, GEMM,
    pad, w2 to HWIO, GEMM, the pool, its transpose to NCHW."""
    args = _block_args(rng)
    f = ts.jit(_block)
    O.assert_close(f(*args), block_ref(*args), 2e-5)
    ks = ts.explain(f, *args).kernels
    assert [k["kind"] for k in ks] == ["pad", "transpose", "gemm", "pad", "transpose", "gemm", "elementwise",
                                       "transpose"], ks
    assert ks[6]["ops"].count("tessera.slice") == 4 and ks[6]["ops"].count("tessera.maximum") == 3, ks[6]
    assert "tessera.slice" in ks[5]["ops"], ks[5]


POOLS = {"max3s2": lambda h: ts.ops.max_pool2d(h, 3, stride=2),
         "avg2": lambda h: ts.ops.avg_pool2d(h, 2),
         "max3p1": lambda h: ts.ops.max_pool2d(h, 3, stride=2, padding=1)}


def _pool_ref(name, h):
    n, c, hh, ww = h.shape
    if name == "avg2":
        return h[:, :, :hh // 2 * 2, :ww // 2 * 2].reshape(n, c, hh // 2, 2, ww // 2, 2).mean((3, 5))
    p = 1 if name == "max3p1" else 0
    hp = np.pad(h, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
    ho, wo = (hh + 2 * p - 3) // 2 + 1, (ww + 2 * p - 3) // 2 + 1
    wins = [hp[:, :, i:i + 2 * (ho - 1) + 1:2, j:j + 2 * (wo - 1) + 1:2] for i in range(3) for j in range(3)]
    return np.max(wins, axis=0)


@pytest.mark.parametrize("name", list(POOLS))
def test_pools_of_an_nchw_conv_match_float64(rng, name):
    x, w, b = arr(rng, 2, 6, 11, 10), arr(rng, 7, 6, 3, 3), arr(rng, 7)
    f = ts.jit(lambda x, w, b: POOLS[name](ts.ops.relu(ts.ops.conv2d(x, w, b, padding=1))))
    O.assert_close(f(x, w, b), _pool_ref(name, np.maximum(conv_nchw_ref(x, w, b), 0)), 2e-5)


def test_plant_pool_windows_on_the_wrong_axes_is_caught(rng, monkeypatch):
    """Planted: the moved windows lose their step along W (axis 2 of the GEMM's NHWC result)."""
    from tessera.passes.graph import sink_transpose_pool as stp
    real = stp._source_window

    def wrong(op, perm):
        starts, steps, dims = real(op, perm)
        steps[2] = 1
        return starts, steps, dims
    monkeypatch.setattr(stp, "_source_window", wrong)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    args = _block_args(rng)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(_block)(*args), block_ref(*args), 2e-5)


def test_plant_residual_read_one_pixel_off_is_caught(rng, monkeypatch):
    """Planted: the residual reads the padded copy one column right of the interior."""
    from tessera.passes.graph import reuse_padded as rp
    real = rp._interior_starts
    monkeypatch.setattr(rp, "_interior_starts", lambda p: [*real(p)[:2], real(p)[2] + 1, *real(p)[3:]])
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    args = _block_args(rng)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(_block)(*args), block_ref(*args), 2e-5)


# --------------------------------------------------------------------------- intermediates pooled
def test_intermediates_are_pooled_and_results_never_reused(rng):
    """The block's intermediates (pads, transposed weights, GEMM results: 64 KiB and up here) come
    from the pool and are reused by the next call without new mappings; results are not: one
    handed out keeps its values through later calls."""
    from tessera.runtime import memory
    args = _block_args(rng, n=4, c=16, s=20)   # 4 x 22 x 22 x 16 f32: 124 KiB
    f = ts.jit(_block)
    want = block_ref(*args)
    r1 = f(*args)
    maps = len(memory.POOL.maps)
    r2 = f(*args)
    assert len(memory.POOL.maps) == maps
    assert not np.shares_memory(r1, r2)
    O.assert_close(r1, want, 2e-5)
    O.assert_close(r2, want, 2e-5)


def test_plant_scratch_reused_while_alive_is_caught(rng, monkeypatch):
    """Planted: the pool's liveness test always says free, so two intermediates of one call share
    a mapping and the block's values are overwritten."""
    from tessera.runtime import memory
    pool = memory.BufferPool()            # a pool of its own: live results elsewhere stay safe
    monkeypatch.setattr(pool, "_free_index", lambda i: True)
    monkeypatch.setattr(memory, "POOL", pool)
    args = _block_args(rng, n=4, c=16, s=20)
    f = ts.jit(_block)
    with pytest.raises(AssertionError):
        O.assert_close(f(*args), block_ref(*args), 2e-5)
