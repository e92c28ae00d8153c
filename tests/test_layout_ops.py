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
    for item in (lambda a: a[..., ...], lambda a: a[[0, 1]],
                 lambda a: a[np.array([0])], lambda a: a[True]):
        with pytest.raises(TesseraError) as info:
            ts.jit(item)(x)
        assert info.value.code == "UNSUPPORTED_CONSTRUCT"
    with pytest.raises(ShapeMismatchError, match=r"x\[:, ::0\]: slice step cannot be zero"):
        ts.jit(lambda a: a[:, ::0])(x)   # (negative steps: tests/test_gather_index.py)
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


# --------------------------------------------------------------------------- concatenate, stack, split, chunk
JOINS = {
    "cat_mid": (lambda a, b: ts.ops.concatenate([a, b], 1) * 2, lambda a, b: np.concatenate([a, b], 1) * 2),
    "cat_last": (lambda a, b: ts.ops.concatenate([a[:, :4], b[:, :4], a[:, :4]], -1),
                 lambda a, b: np.concatenate([a[:, :4], b[:, :4], a[:, :4]], -1)),
    "cat_first": (lambda a, b: ts.ops.concatenate((a, a + 1), 0), lambda a, b: np.concatenate((a, a + 1), 0)),
    "rotate_half": (lambda a, b: ts.ops.concatenate([-a[..., 9:], a[..., :9]], -1),
                    lambda a, b: np.concatenate([-a[..., 9:], a[..., :9]], -1)),
    "stack_mid": (lambda a, b: ts.ops.stack([a, a * 2], 1), lambda a, b: np.stack([a, a * 2], 1)),
    "stack_last": (lambda a, b: ts.ops.stack([a, b[:, :4]], -1), lambda a, b: np.stack([a, b[:, :4]], -1)),
    "split": (lambda a, b: ts.ops.split(b, [2, 5], 1)[1] * 3, lambda a, b: np.split(b, [2, 5], 1)[1] * 3),
    "split_even": (lambda a, b: tuple(ts.ops.split(a, 2, -1)[::-1]), lambda a, b: tuple(np.split(a, 2, -1)[::-1])),
    "chunk": (lambda a, b: ts.ops.chunk(b, 3, 1)[-1] + 1, lambda a, b: b[:, 6:] + 1),
}


@pytest.mark.parametrize("name", sorted(JOINS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, dt.bfloat16])
def test_joins_and_splits_match_numpy(rng, name, dtype):
    fn, ref = JOINS[name]
    a, b = arr(rng, 3, 4, 18, dtype=dtype), arr(rng, 3, 8, 18, dtype=dtype)
    got, want = ts.jit(fn)(a, b), ref(O.f64(a), O.f64(b))
    for g_, w_ in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g_.shape == w_.shape and g_.dtype == a.dtype
        O.assert_close(g_, w_, {np.float64: 1e-12, np.float32: 1e-6}.get(np.dtype(dtype).type, 1e-2))


def test_concat_promotes_and_keeps_other_axes_symbolic(rng):
    f = ts.jit(lambda p, q: ts.ops.concatenate([p, q], 1))
    for batch in (2, 5):
        p, q = arr(rng, batch, 3, 7), arr(rng, batch, 2, 7, dtype=np.float64)
        got = f(p, q)
        assert got.dtype == np.float64
        O.assert_close(got, np.concatenate([O.f64(p), O.f64(q)], 1), 1e-12)
    assert f.compiles == ["first call"]   # the batch is symbolic
    kinds = [k["kind"] for k in ts.explain(lambda p, q: ts.ops.concatenate([p, q], 1), arr(rng, 2, 3, 7),
                                           arr(rng, 2, 2, 7)).kernels]
    assert kinds == ["concat"]


def test_bad_joins_are_coded(rng):
    a, b = arr(rng, 3, 4), arr(rng, 3, 5)
    for fn, cls in [(lambda p, q: ts.ops.concatenate([p, q], 0), ShapeMismatchError),
                    (lambda p, q: ts.ops.concatenate([p, q[None]], 1), RankMismatchError),
                    (lambda p, q: ts.ops.concatenate(p, 0), RankMismatchError),
                    (lambda p, q: ts.ops.concatenate([p, q], 2), RankMismatchError),
                    (lambda p, q: ts.ops.stack([p, q]), ShapeMismatchError),
                    (lambda p, q: ts.ops.split(q, 2, 1), ShapeMismatchError),
                    (lambda p, q: ts.ops.chunk(q, 0, 1), ShapeMismatchError)]:
        with pytest.raises(cls):
            ts.jit(fn)(a, b)


def test_plant_segments_in_the_wrong_order_are_caught(rng, monkeypatch):
    """Planted: the concat kernel writes its operands in reverse order; the check fails."""
    from tessera.ir import graph as g
    from tessera.passes.tile.kernels import concat
    real = concat.generate

    def reversed_inputs(kop):
        cat = next(op for op in kop.body.block.ops if isinstance(op, g.ConcatOp))
        ops_ = list(cat.operands)
        for i, v in enumerate(reversed(ops_)):
            cat.operands[i] = v
        return real(kop)
    monkeypatch.setattr(concat, "generate", reversed_inputs)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b = arr(rng, 3, 4, 8), arr(rng, 3, 4, 8)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(lambda p, q: ts.ops.concatenate([p, q], 1))(a, b),
                       np.concatenate([O.f64(a), O.f64(b)], 1), 1e-6)
