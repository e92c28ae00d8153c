"""Negative-step slices (strided views with negative strides) and gathers (take, x[idx],
take_along_axis, one_hot): each against numpy in float64 on fresh random data, with a planted
bug caught and bad input coded."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.errors import ShapeMismatchError

import oracle as O


def arr(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


TOL = {np.float64: 1e-12, np.float32: 1e-6}


def tol(dtype) -> float:
    return TOL.get(np.dtype(dtype).type, 1e-2)


# --------------------------------------------------------------------------- negative steps
REVERSALS = {
    "rev_first": lambda a: a[::-1] * 2,
    "rev_last": lambda a: a[..., ::-1] + 1,
    "mid_step": lambda a: a[:, 9:1:-2],
    "returned": lambda a: a[::-1],
    "every_axis": lambda a: a[::-2, ::-3, ::-1],
    "twice": lambda a: a[::-1][1:4, ::-1] * 3,
    "int_and_rev": lambda a: a[-2, ::-1, 3:12] - 0.5,
    "empty": lambda a: a[:, 2:5:-1] + 1,
    "matmul": lambda a: a[0, ::-1, :] @ a[1, ::-1].T,
    "reduce": lambda a: a[::-1, :, ::-2].sum(-1),
}


@pytest.mark.parametrize("name", sorted(REVERSALS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, dt.bfloat16])
def test_negative_steps_match_numpy(rng, name, dtype):
    fn = REVERSALS[name]
    x = arr(rng, 5, 11, 13, dtype=dtype)
    got = ts.jit(fn)(x)
    want = fn(O.f64(x))
    assert got.shape == want.shape and got.dtype == x.dtype
    # handed back: its own contiguous buffer, never a view of the argument, no negative strides
    assert got.flags["C_CONTIGUOUS"] and not np.shares_memory(got, x) and min(got.strides, default=0) >= 0
    if got.size:
        O.assert_close(got, want, 2e-2 if name == "matmul" and dtype == dt.bfloat16 else tol(dtype))


def test_a_reversed_leading_axis_is_read_in_place(rng):
    """A negative step off the last axis joins the elementwise group (negative strides, no copy);
    one on the last axis is copied by its own kernel first.  Axes taken whole stay symbolic."""
    x = arr(rng, 4, 9, 16)
    kinds = ts.explain(lambda a: a[::-1, 7:0:-3] * 0.5 + a[:, 1:4], x).kernels
    assert len(kinds) == 1 and kinds[0]["kind"] == "elementwise" and "tessera.slice" in kinds[0]["ops"], kinds
    kinds = ts.explain(lambda a: a[..., ::-1] * 2, x).kernels
    assert [k["kind"] for k in kinds] == ["transpose", "elementwise"], kinds
    f = ts.jit(lambda a: a[:, ::-1] * 2 - a)
    for b, d in ((3, 16), (6, 5), (2, 33)):
        y = arr(rng, b, 7, d)
        O.assert_close(f(y), O.f64(y)[:, ::-1] * 2 - O.f64(y), 1e-6)
    assert f.compiles == ["first call"]


def test_a_zero_step_is_coded(rng):
    with pytest.raises(ShapeMismatchError) as info:
        ts.jit(lambda a: a[::0])(arr(rng, 3, 4))
    assert info.value.code == "SHAPE_MISMATCH"


def test_plant_a_reversal_without_its_sign_is_caught(rng, monkeypatch):
    """Planted: the view's strides keep the step's size but drop its sign (the slice read
    forwards from its start): values differ and the gate fails."""
    from tessera.ir.strided import StridedView
    real = StridedView.slice
    fn = lambda a: a[4::-1] * 2   # noqa: E731
    x = arr(rng, 6, 10)
    O.assert_close(ts.jit(fn)(x), fn(O.f64(x)), 1e-6)   # the real one passes
    monkeypatch.setattr(StridedView, "slice", lambda self, a, st, sz: real(self, a, [abs(s) for s in st], sz))
    x = arr(rng, 7, 10)   # (another static size: not the cached kernel)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(fn)(x), fn(O.f64(x)), 1e-6)
