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
    for item in (lambda a: a[a], lambda a: a[::-1], lambda a: a[..., ...], lambda a: a[[0, 1]],
                 lambda a: a[np.array([0])], lambda a: a[True]):
        with pytest.raises(TesseraError) as info:
            ts.jit(item)(x)
        assert info.value.code == "UNSUPPORTED_CONSTRUCT"
    with pytest.raises(TesseraError, match=r"x\[:, ::-1\]"):
        ts.jit(lambda a: a[:, ::-1])(x)
    for item in (lambda a: a[3], lambda a: a[:, -5]):
        with pytest.raises(ShapeMismatchError, match="out of range"):
            ts.jit(item)(x)
    with pytest.raises(RankMismatchError):
        ts.jit(lambda a: a[0, 0, 0])(x)


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


# --------------------------------------------------------------------------- basic slicing
SLICES = {
    "head": lambda a: a[..., :8] * 2,
    "tail_neg": lambda a: a[..., -5:] + 1,
    "step_last": lambda a: a[:, :, 1::2] - 0.5,
    "step_mid": lambda a: a[:, ::3],
    "int_first": lambda a: a[1],
    "int_neg_mixed": lambda a: a[-1, 2:7, ::3] + 1,
    "rotate_half": lambda a: a[..., 8:] * 0.5 - a[..., :8] * 1.5,
    "none_and_int": lambda a: a[None, :, 3] * 2,
    "empty": lambda a: a[:, 4:4] + 1,
    "softmax_of_slice": lambda a: ts.ops.softmax(a[:, :, 3:14]),
    "matmul_of_slices": lambda a: a[:, 2] @ a[0, 1:9, :].T,
    "reduce_of_slice": lambda a: a[1:, :, ::2].sum(-1),
}


@pytest.mark.parametrize("name", sorted(SLICES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, dt.bfloat16])
def test_slicing_matches_numpy(rng, name, dtype):
    fn = SLICES[name]
    x = arr(rng, 5, 11, 16, dtype=dtype)
    got = ts.jit(fn)(x)
    want = fn(O.f64(x)) if name not in ("softmax_of_slice",) else O.softmax(O.f64(x)[:, :, 3:14])
    assert got.shape == np.shape(want) and got.dtype == x.dtype
    tol = {np.float64: 1e-12, np.float32: 1e-5}.get(np.dtype(dtype).type, 2e-2)
    if got.size:
        O.assert_close(got, want, tol)


def test_a_unit_step_slice_is_read_in_place(rng):
    """rotate-half (RoPE's shape): two slices and the arithmetic are one kernel, no copy; a step on
    the last axis is copied by its own kernel first."""
    x = arr(rng, 4, 9, 16)
    kinds = ts.explain(lambda a: a[..., 8:] * 0.5 - a[..., :8] * 1.5, x).kernels
    assert len(kinds) == 1 and kinds[0]["kind"] == "elementwise" and kinds[0]["ops"].count("tessera.slice") == 2
    kinds = ts.explain(lambda a: a[..., ::2] * 2, x).kernels
    assert [k["kind"] for k in kinds] == ["transpose", "elementwise"], kinds


def test_unsliced_axes_stay_symbolic(rng):
    f = ts.jit(lambda a: a[..., 8:] * a[..., :8])
    for b in (3, 7, 20):
        x = arr(rng, b, 5, 16)
        O.assert_close(f(x), O.f64(x)[..., 8:] * O.f64(x)[..., :8], 1e-6)
    assert f.compiles == ["first call"]


def test_a_number_as_an_index_is_specialised(rng):
    x = arr(rng, 6, 10)
    f = ts.jit(lambda a, i, n: a[i, :n] * 2.0)
    O.assert_close(f(x, 2, 5), O.f64(x)[2, :5] * 2, 1e-7)
    O.assert_close(f(x, -1, 3), O.f64(x)[-1, :3] * 2, 1e-7)
    assert set(f._learned) == {1, 2}


def test_plant_a_view_without_its_offset_is_caught(rng, monkeypatch):
    """Planted: the slice's offset dropped (every window read from the start): values differ."""
    from tessera.ir.strided import StridedView
    real = StridedView.slice
    monkeypatch.setattr(StridedView, "slice", lambda self, a, st, sz: StridedView(
        real(self, a, st, sz).arg, real(self, a, st, sz).dims, real(self, a, st, sz).strides))
    x = arr(rng, 3, 8, 16)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(lambda a: a[..., 8:] * 2)(x), O.f64(x)[..., 8:] * 2, 1e-6)
