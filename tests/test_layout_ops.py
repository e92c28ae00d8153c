"""View and statistics ops made of reshapes, transposes and means (frontend/layout.py):
expand_dims, squeeze, swapaxes, moveaxis, indexing with None / ... / :, var and std -- each
against numpy in float64 on random data, with bad input coded and a planted bug caught."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.errors import RankMismatchError, ShapeMismatchError, TesseraError

import oracle as O


def arr(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CASES = {
    "expand_dims": (lambda a: ts.ops.expand_dims(a, 1) * 2, lambda a: np.expand_dims(a, 1) * 2),
    "expand_dims_tuple": (lambda a: ts.ops.expand_dims(a, (0, -1)) + 1, lambda a: np.expand_dims(a, (0, -1)) + 1),
    "squeeze_all": (lambda a: ts.ops.squeeze(a) - 1, lambda a: np.squeeze(a) - 1),
    "squeeze_axis": (lambda a: a.squeeze(1) * 3, lambda a: np.squeeze(a, 1) * 3),
    "swapaxes": (lambda a: a.swapaxes(0, 2) + 0.5, lambda a: np.swapaxes(a, 0, 2) + 0.5),
    "moveaxis": (lambda a: ts.ops.moveaxis(a, 0, -1) * 2, lambda a: np.moveaxis(a, 0, -1) * 2),
    "moveaxis_pair": (lambda a: ts.ops.moveaxis(a, (0, 1), (-1, 0)) - 2, lambda a: np.moveaxis(a, (0, 1), (-1, 0)) - 2),
    "index_none": (lambda a: a[None, ..., None] * 2, lambda a: a[None, ..., None] * 2),
    "index_mid": (lambda a: a[:, None] + 1, lambda a: a[:, None] + 1),
    "index_full": (lambda a: a[...] * 1.5, lambda a: a[...] * 1.5),
    "var": (lambda a: a.var(-1), lambda a: a.var(-1)),
    "var_axes_keep": (lambda a: ts.ops.var(a, (0, 2), keepdims=True), lambda a: a.var((0, 2), keepdims=True)),
    "var_ddof": (lambda a: a.var(0, ddof=1), lambda a: a.var(0, ddof=1)),
    "std_all": (lambda a: a.std(), lambda a: a.std()),
    "std_ddof": (lambda a: ts.ops.std(a, 2, ddof=1), lambda a: a.std(2, ddof=1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layout_and_statistics_ops_match_numpy(rng, name, dtype):
    fn, ref = CASES[name]
    x = arr(rng, 5, 1, 37, dtype=dtype) if "squeeze" in name else arr(rng, 5, 3, 37, dtype=dtype)
    x = x + 3.0   # an offset mean: a one-pass E[x^2] - E[x]^2 would lose digits here
    got = ts.jit(fn)(x)
    want = ref(O.f64(x))
    assert got.shape == np.shape(want) and got.dtype == x.dtype
    O.assert_close(got, want, 1e-12 if dtype == np.float64 else 1e-5)


def test_bf16_var_computes_like_numpy_on_the_rounded_input(rng):
    x = arr(rng, 4, 64).astype(dt.bfloat16)
    O.assert_close(ts.jit(lambda a: a.var(-1))(x), O.f64(x).var(-1), 3e-2)


def test_var_without_ddof_serves_every_size(rng):
    """No size is compiled in (ddof=0): one compile for two row lengths; ddof=1 specialises."""
    f = ts.jit(lambda a: a.var(-1))
    for n in (33, 70):
        x = arr(rng, 4, n)
        O.assert_close(f(x), O.f64(x).var(-1), 1e-5)
    g = ts.jit(lambda a: a.var(-1, ddof=1))
    for n in (33, 70):
        x = arr(rng, 4, n)
        O.assert_close(g(x), O.f64(x).var(-1, ddof=1), 1e-5)   # n/(n-1) is right for each size


def test_bad_layout_arguments_are_coded(rng):
    x = arr(rng, 3, 4)
    for fn, cls in [(lambda a: ts.ops.squeeze(a, 0), ShapeMismatchError),
                    (lambda a: ts.ops.expand_dims(a, 5), RankMismatchError),
                    (lambda a: ts.ops.expand_dims(a, (0, 0)), RankMismatchError),
                    (lambda a: ts.ops.swapaxes(a, 0, 2), RankMismatchError),
                    (lambda a: ts.ops.moveaxis(a, (0, 1), 0), RankMismatchError),
                    (lambda a: a[None, :, :, :], RankMismatchError),
                    (lambda a: a.var(ddof=1.5), ShapeMismatchError)]:
        with pytest.raises(cls):
            ts.jit(fn)(x)
    for item in (lambda a: a[0], lambda a: a[:, 1:3], lambda a: a[::2], lambda a: a[..., ...]):
        with pytest.raises(TesseraError) as info:
            ts.jit(item)(x)
        assert info.value.code == "UNSUPPORTED_CONSTRUCT"
    with pytest.raises(TesseraError, match=r"x\[:, 1:3\]"):
        ts.jit(lambda a: a[:, 1:3])(x)


def test_plant_a_one_pass_variance_is_caught(rng, monkeypatch):
    """Planted: var as E[x^2] - E[x]^2 (cancels on data with an offset mean): the check fails."""
    from tessera.frontend import layout, ops

    def one_pass(x, axis=None, keepdims=False, ddof=0):
        axes = tuple(range(x.ndim)) if axis is None else layout._axes(axis, x.ndim, "var")
        m = ops.reduce_mean(x, axes, keepdims=keepdims)
        return ops.reduce_mean(x * x, axes, keepdims=keepdims) - m * m
    x = arr(rng, 8, 4096) * 0.01 + 300.0
    O.assert_close(ts.jit(lambda a: layout.var(a, -1))(x), O.f64(x).var(-1), 1e-5)   # the real one passes
    monkeypatch.setattr(layout, "var", one_pass)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(lambda a: layout.var(a, -1))(x), O.f64(x).var(-1), 1e-5)
