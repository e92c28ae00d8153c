"""pad, conv2d, max_pool2d, avg_pool2d on the CPU lane against float64 numpy oracles."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.errors import ArgumentError, RankMismatchError, ShapeMismatchError, TesseraError

import oracle as O

DTYPES = [np.float32, np.float64, dt.bfloat16]
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12, np.dtype(dt.bfloat16): 1e-2}


def arr(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- pad
PAD_CASES = [("constant", ((1, 2), (0, 0), (3, 2)), {"constant_values": 1.5}),
             ("edge", ((2, 1), (1, 0), (2, 3)), {}),
             ("reflect", ((1, 2), (2, 1), (3, 2)), {})]
_pads = {}


def _pad_fn(mode, widths, kw):
    key = (mode, widths)
    if key not in _pads:
        _pads[key] = ts.jit(lambda x: ts.ops.pad(x, widths, mode=mode, **kw))
    return _pads[key]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode,widths,kw", PAD_CASES, ids=[c[0] for c in PAD_CASES])
def test_pad_matches_numpy(rng, mode, widths, kw, dtype):
    x = arr(rng, 3, 5, 7, dtype=dtype)
    want = np.pad(O.f64(x), widths, mode=mode, **kw)
    got = _pad_fn(mode, widths, kw)(x)
    assert got.dtype == x.dtype and got.shape == want.shape
    O.assert_close(got, want.astype(x.dtype), TOL[np.dtype(dtype)])


@pytest.mark.parametrize("width", [2, (1, 3), ((1, 0),), ((0, 0), (2, 1))], ids=str)
def test_pad_width_forms(rng, width):
    """numpy's pad_width spellings: n, (lo, hi), ((lo, hi),), one pair per axis."""
    x = arr(rng, 4, 9)
    got = ts.jit(lambda v: ts.ops.pad(v, width, mode="edge"))(x)
    O.assert_close(got, np.pad(O.f64(x), width, mode="edge"), 1e-7)


def test_pad_of_a_transposed_view_and_varying_batch(rng):
    """The input read through strides; an unpadded leading axis stays symbolic (one compile)."""
    f = ts.jit(lambda v: ts.ops.pad(v.T, ((0, 0), (2, 2)), mode="reflect") * 2.0)
    for n in (5, 9):
        x = arr(rng, 6, n)
        O.assert_close(f(x), 2 * np.pad(O.f64(x).T, ((0, 0), (2, 2)), mode="reflect"), 1e-6)


def test_pad_errors(rng):
    x = arr(rng, 4, 5)
    for fn, cls in [(lambda v: ts.ops.pad(v, -1), ArgumentError),
                    (lambda v: ts.ops.pad(v, ((1, -1), (0, 0))), ArgumentError),
                    (lambda v: ts.ops.pad(v, 1, mode="wrap"), ArgumentError),
                    (lambda v: ts.ops.pad(v, (0, 5), mode="reflect"), ShapeMismatchError),
                    (lambda v: ts.ops.pad(v, ((1, 1), (1, 1), (1, 1))), ArgumentError),
                    (lambda v: ts.ops.pad(v, 1, constant_values=(1, 2)), ArgumentError),
                    (lambda v: ts.ops.pad(v, 1.5), ArgumentError)]:
        with pytest.raises(cls) as e:
            ts.jit(fn)(x)
        assert "pad" in str(e.value) and e.value.code


def test_plant_a_reflect_off_by_one_is_caught(rng, monkeypatch):
    """Planted: the kernel's reflect mapping repeats the edge (numpy's 'symmetric'); caught."""
    from tessera.passes.tile.kernels import pad as K
    real = K._map
    monkeypatch.setattr(K, "_map", lambda b, mode, j, n: real(b, mode, b.sub(j, 1) if mode == "reflect" else j, n))
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = arr(rng, 5, 7)
    got = ts.jit(lambda v: ts.ops.pad(v, 2, mode="reflect"))(x)
    with pytest.raises(AssertionError):
        O.assert_close(got, np.pad(O.f64(x), 2, mode="reflect"), 1e-6)
