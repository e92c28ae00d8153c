"""Negative-step slices (strided views with negative strides) and gathers (take, x[idx],
take_along_axis, one_hot): each against numpy in float64 on fresh random data, with a planted
bug caught and bad input coded."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.errors import ShapeMismatchError, TesseraError

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


def test_reversed_axes_are_read_in_place(rng):
    """A negative step joins the elementwise group it feeds (negative strides, no copy): off the
    last axis through the row offsets, on it as a column stride of -1 (lanes gathered backwards).
    Axes taken whole stay symbolic."""
    x = arr(rng, 4, 9, 16)
    kinds = ts.explain(lambda a: a[::-1, 7:0:-3] * 0.5 + a[:, 1:4], x).kernels
    assert len(kinds) == 1 and kinds[0]["kind"] == "elementwise" and "tessera.slice" in kinds[0]["ops"], kinds
    kinds = ts.explain(lambda a: a[..., 13:2:-2] * 2 + a[..., 3:9], x).kernels
    assert [k["kind"] for k in kinds] == ["transpose", "elementwise"], kinds   # a column step of -2: copied first
    kinds = ts.explain(lambda a: a[..., ::-1] * 2, x).kernels
    assert [k["kind"] for k in kinds] == ["elementwise"], kinds
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


# --------------------------------------------------------------------------- gathers
def policy(i, n):
    """The documented index policy: numpy's meaning in [-n, n), clamped into the axis outside."""
    i = np.asarray(i, dtype=np.int64)
    return np.clip(np.where(i < 0, i + n, i), 0, n - 1)


def ids(rng, shape, n, itype=np.int32, spill=3):
    """Random indices with repeats, negatives and (spill) out-of-range values on both sides."""
    return rng.integers(-n - spill, n + spill, size=shape).astype(itype)


# name -> (program, numpy oracle on float64 inputs with the policy applied, table shape, index shape, axis n)
GATHERS = {
    "embedding": (lambda t, i: ts.ops.take(t, i), lambda t, i: t[policy(i, t.shape[0])], (37, 19), (4, 5)),
    "getitem_scaled": (lambda t, i: t[i] * 2.0 - 1.0, lambda t, i: t[policy(i, t.shape[0])] * 2.0 - 1.0, (37, 19), (3, 7)),
    "index_0d": (lambda t, i: t[i] + 1, lambda t, i: t[policy(i, t.shape[0])] + 1, (9, 21), ()),
    "index_3d": (lambda t, i: ts.ops.take(t, i, 0), lambda t, i: t[policy(i, t.shape[0])], (11, 6, 5), (2, 3, 4)),
    "mid_axis": (lambda t, i: t[:, i], lambda t, i: t[:, policy(i, t.shape[1])], (5, 13, 7), (6,)),
    "last_axis": (lambda t, i: ts.ops.take(t, i, -1), lambda t, i: np.take(t, policy(i, t.shape[-1]), -1), (4, 6, 17), (2, 9)),
    "ellipsis": (lambda t, i: t[..., i, :] * 3, lambda t, i: t[..., policy(i, t.shape[-2]), :] * 3, (3, 10, 8), (5,)),
    "int_then_array": (lambda t, i: t[1, i], lambda t, i: t[1, policy(i, t.shape[1])], (4, 12, 9), (3, 2)),
    "apart": (lambda t, i: t[i, :, 2], lambda t, i: t[policy(i, t.shape[0]), :, 2], (7, 5, 6), (4,)),
    "apart_moved": (lambda t, i: t[:, i, :, 0], lambda t, i: t[:, policy(i, t.shape[1]), :, 0], (3, 8, 5, 2), (2, 3)),
    "flat": (lambda t, i: ts.ops.take(t, i, axis=None), lambda t, i: np.take(t, policy(i, t.size)), (4, 5), (11,)),
    "along_labels": (lambda t, i: ts.ops.take_along_axis(t, i, -1),
                     lambda t, i: np.take_along_axis(t, policy(i, t.shape[-1]), -1), (6, 23), (6, 3)),
    "along_axis0_bcast": (lambda t, i: ts.ops.take_along_axis(t, i, 0),
                          lambda t, i: np.take_along_axis(t, np.broadcast_to(policy(i, t.shape[0]), (4, 5, 7)), 0),
                          (9, 5, 7), (4, 1, 7)),
}


@pytest.mark.parametrize("name", sorted(GATHERS))
@pytest.mark.parametrize("dtype,itype", [(np.float32, np.int32), (np.float64, np.int64), (dt.bfloat16, np.int64)])
def test_gathers_match_numpy(rng, name, dtype, itype):
    fn, want_fn, tshape, ishape = GATHERS[name]
    t = arr(rng, *tshape, dtype=dtype)
    n = {"mid_axis": tshape[1], "last_axis": tshape[-1], "ellipsis": tshape[-2], "int_then_array": tshape[1],
         "apart_moved": tshape[1], "flat": int(np.prod(tshape)), "along_labels": tshape[-1]}.get(name, tshape[0])
    i = ids(rng, ishape, n, itype)
    got = ts.jit(fn)(t, i)
    want = want_fn(O.f64(t), i)
    assert got.shape == want.shape and got.dtype == t.dtype, (got.shape, want.shape)
    assert got.flags["C_CONTIGUOUS"] and not np.shares_memory(got, t)
    O.assert_close(got, want, tol(dtype))


@pytest.mark.parametrize("dtype,itype", [(np.float32, np.int32), (np.float64, np.int64), (dt.bfloat16, np.int32)])
def test_one_hot_matches_its_definition(rng, dtype, itype):
    """labels[..., None] == arange(C): labels outside [0, C) (negative too) give zero rows."""
    f = ts.jit(lambda y: ts.ops.one_hot(y, 37, dtype=dtype) * 1)
    for shape in ((5, 3), (), (2, 3, 4)):
        y = rng.integers(-4, 41, size=shape).astype(itype)
        got = f(y)
        assert got.shape == shape + (37,) and got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(O.f64(got), (y[..., None] == np.arange(37)).astype(np.float64))


def test_a_take_feeding_elementwise_is_read_in_place(rng):
    """An embedding lookup feeding arithmetic is one elementwise kernel reading table rows through
    the ids (no gathered tensor written); the ids' shape and the row width stay symbolic."""
    f = ts.jit(lambda t, i, p: t[i] * 0.5 + p)
    for b, s, d in ((2, 5, 16), (3, 7, 19), (1, 4, 8)):
        t, p = arr(rng, 29, d), arr(rng, s, d)
        i = ids(rng, (b, s), 29)
        O.assert_close(f(t, i, p), O.f64(t)[policy(i, 29)] * 0.5 + O.f64(p), 1e-6)
    assert len(f.compiles) <= 2, f.compiles   # (a batch of 1 is a broadcast dim: its own key)
    kinds = ts.explain(f, t, i, p).kernels
    assert [k["kind"] for k in kinds] == ["elementwise"] and "tessera.take" in kinds[0]["ops"], kinds
    # a take along the last axis, or one that is returned, runs as its own gather kernel
    assert [k["kind"] for k in ts.explain(lambda a, j: ts.ops.take(a, j, -1) * 2, t, i).kernels] == \
        ["gather", "elementwise"]


@pytest.mark.parametrize("itab", [np.int8, np.int32, np.int64])
def test_integer_tables_are_copied_exactly(rng, itab):
    """Integers stay in integer lanes: int64 values past 2**53 come back bit for bit, gathered by
    the take kernel, read in place by an elementwise kernel, and along an axis."""
    info = np.iinfo(itab)
    t = rng.integers(info.min, info.max, size=(13, 21), dtype=itab)
    i = ids(rng, (3, 4), 13)
    np.testing.assert_array_equal(ts.jit(lambda a, j: a[j])(t, i), t[policy(i, 13)])
    np.testing.assert_array_equal(ts.jit(lambda a, j: a[j] - 1)(t, i), t[policy(i, 13)] - itab(1))
    k = ids(rng, (5, 21), 13, np.int64)
    np.testing.assert_array_equal(ts.jit(lambda a, j: ts.ops.take_along_axis(a, j, 0))(t, k),
                                  np.take_along_axis(t, policy(k, 13), 0))


def test_empty_index_arrays_and_tables_of_one_row(rng):
    t = arr(rng, 1, 6)
    i = ids(rng, (3, 2), 1)
    O.assert_close(ts.jit(lambda a, j: a[j])(t, i), O.f64(t)[policy(i, 1)], 1e-7)
    e = ts.jit(lambda a, j: ts.ops.take(a, j) + 1)(arr(rng, 5, 6), np.zeros((0, 3), np.int32))
    assert e.shape == (0, 3, 6)


def test_the_reference_lane_applies_the_same_policy(rng):
    from tessera.frontend import reference, trace as tr
    t, i = arr(rng, 7, 5), ids(rng, (4, 3), 7, np.int64)
    fn = lambda a, j: ts.ops.take_along_axis(a[j], j[..., None], 2) + ts.ops.one_hot(j, 9)[..., :1]  # noqa
    graph = tr.trace(fn, [t, i], [tr.ARRAY, tr.ARRAY])
    (ref,) = reference.evaluate(graph, [t, i])
    np.testing.assert_allclose(ref, ts.jit(fn)(t, i), rtol=1e-6)
    big = rng.integers(-2 ** 62, 2 ** 62, size=(7, 5))   # an int64 table: exact in both lanes
    graph = tr.trace(lambda a, j: a[j], [big, i], [tr.ARRAY, tr.ARRAY])
    np.testing.assert_array_equal(reference.evaluate(graph, [big, i])[0], ts.jit(lambda a, j: a[j])(big, i))


def test_bad_gathers_are_coded(rng):
    t, i, m = arr(rng, 6, 4), ids(rng, (3,), 6), rng.standard_normal(6) > 0
    cases = [
        (lambda a, j: a[a[:, 0]], "DTYPE_UNSUPPORTED", "index arrays must be int32 or int64"),
        (lambda a, j, k: a[k], "DTYPE_UNSUPPORTED", "bool index array is a mask"),
        (lambda a, j: a[j, j], "UNSUPPORTED_CONSTRUCT", "2 index arrays"),
        (lambda a, j: a[[0, 1]], "UNSUPPORTED_CONSTRUCT", "constant array"),
        (lambda a, j: ts.ops.take(a, j, 2), "RANK_MISMATCH", "axis 2 is out of range"),
        (lambda a, j: ts.ops.take(a, [1, 2]), "UNSUPPORTED_CONSTRUCT", "constant index array"),
        (lambda a, j: ts.ops.take(a, 1.5), "DTYPE_UNSUPPORTED", "int32/int64 index tensor"),
        (lambda a, j, k: ts.ops.take(k, j), "DTYPE_UNSUPPORTED", "take: dtype bool"),
        (lambda a, j: ts.ops.take(a[:0], j), "SHAPE_MISMATCH", "size 0"),
        (lambda a, j: ts.ops.take_along_axis(a, j, 0), "RANK_MISMATCH", "must match"),
        (lambda a, j: ts.ops.take_along_axis(a, ts.ops.reshape(j, (3, 1)), 1), "SHAPE_MISMATCH", "do not broadcast"),
        (lambda a, j: ts.ops.one_hot(j, -1), "SHAPE_MISMATCH", "num_classes must be >= 0"),
        (lambda a, j: ts.ops.one_hot(a, 3), "DTYPE_UNSUPPORTED", "int32 or int64"),
        (lambda a, j: a[j, 0, 0], "RANK_MISMATCH", "3 indices for a rank-2"),
    ]
    for fn, code, words in cases:
        with pytest.raises(TesseraError) as info:
            ts.jit(fn)(t, i, m) if fn.__code__.co_argcount == 3 else ts.jit(fn)(t, i)
        assert info.value.code == code and words in str(info.value), (code, str(info.value))


def test_the_graph_verifier_checks_gathers():
    from tessera.ir.text import parse_and_verify
    good = ("func.func @f(%t : !tessera.tensor<[7, D], f32>, %i : !tessera.tensor<[N], i32>) {\n"
            "  %r = tessera.take %t, %i {axis = 0 : i64} : (!tessera.tensor<[7, D], f32>, !tessera.tensor<[N], i32>)"
            " -> !tessera.tensor<[N, D], f32>\n  func.return\n}\n")
    parse_and_verify(good)
    for old, new, code in [("[N], i32>", "[N], f32>", "GRAPH_DTYPE"), ("axis = 0", "axis = 2", "GRAPH_ATTRIBUTE"),
                           ("[7, D], f32>", "[M, D], f32>", "GRAPH_SHAPE"), ("[N, D], f32>\n", "[D, N], f32>\n",
                                                                           "GRAPH_RESULT_TYPE")]:
        with pytest.raises(TesseraError) as info:
            parse_and_verify(good.replace(old, new))
        assert info.value.code == code, (old, info.value)


@pytest.mark.parametrize("dtype,itype", [(np.float32, np.int32), (np.float64, np.int64), (dt.bfloat16, np.int64)])
def test_a_take_feeding_a_gemm_packs_rows_through_the_index(rng, dtype, itype):
    """table[ids] @ w + b: one gemm kernel whose A blocks are staged from the table rows the ids
    pick (the gathered A is never written); odd sizes, 3-d ids (a batch of row blocks)."""
    f = ts.jit(lambda t, j, w, b: t[j] @ w + b)
    (v, k, n), ishape = (61, 130, 40), (2, 3, 11)
    t, w, b = arr(rng, v, k, dtype=dtype), arr(rng, k, n, dtype=dtype), arr(rng, n, dtype=dtype)
    i = ids(rng, ishape, v, itype)
    y = O.f64(t)[policy(i, v)] @ O.f64(w) + O.f64(b)
    O.assert_close(f(t, i, w, b), y, {np.float64: 1e-12, np.float32: 1e-5}.get(dtype, 2e-2))
    assert [k["kind"] for k in ts.explain(f, t, i, w, b).kernels] == ["gemm"]


@pytest.mark.parametrize("target,arch", [("rocm", "gfx1151"), ("nvidia", "sm_90")])
def test_gpu_lanes_refuse_gathers_by_name(rng, target, arch):
    t, i = arr(rng, 4, 16), ids(rng, (4,), 4)
    # take, one_hot and take_along_axis along the last axis have GPU kernels (tests/test_gpu_int.py,
    # test_gpu_topk.py); along another axis take_along_axis does not
    for fn, op in ((lambda a, j: ts.ops.take_along_axis(a, j[:, None], 0), "tessera.take_along_axis"),):
        with pytest.raises(TesseraError) as info:
            ts.compile(fn, t, i, target=target, arch=arch)
        assert info.value.code == "SCHEDULE_ILLEGAL" and op in str(info.value) and f"the {target} lane" in \
            str(info.value)
    h = arr(rng, 64, 64, dtype=np.float16)   # a take feeding an f16 GEMM: refused by the GEMM generator
    with pytest.raises(TesseraError, match=f"tessera.take feeding a matmul has no lowering on the {target} lane"
                       ) as info:
        ts.compile(lambda a, j: a[j] @ a, h, ids(rng, (64,), 64), target=target, arch=arch)
    assert info.value.code == "SCHEDULE_ILLEGAL"


def test_plant_an_off_by_one_row_address_is_caught(rng, monkeypatch):
    """Planted: every index read one row further (still clamped, so in bounds): the gathered
    rows -- gather kernel, read in place, packed for a GEMM -- differ and the gate fails (the
    real kernels pass the numeric tests above on the same programs)."""
    from tessera.passes.tile.kernels import gather, gather_leaf, gemm_gather
    progs = [lambda a, j: ts.ops.take(a, j), lambda a, j: a[j] * 2, lambda a, j: ts.ops.take_along_axis(a, j, 0),
             lambda a, j: a[j] @ a.T]
    wants = [lambda a, j: a[policy(j, a.shape[0])], lambda a, j: a[policy(j, a.shape[0])] * 2,
             lambda a, j: np.take_along_axis(a, policy(j, a.shape[0]), 0), lambda a, j: a[policy(j, a.shape[0])] @ a.T]
    real = gather.bounded_index
    plant = lambda b, k, n: real(b, b.add(k, 1), n)  # noqa: E731
    monkeypatch.setattr(gather, "bounded_index", plant)
    monkeypatch.setattr(gather_leaf, "bounded_index", plant)
    monkeypatch.setattr(gemm_gather, "bounded_index", plant)
    t = arr(rng, 24, 9)   # (a static size no other test compiles: not a cached kernel)
    i = ids(rng, (5, 9), 24)
    for p, w in zip(progs, wants):
        with pytest.raises(AssertionError):
            O.assert_close(ts.jit(p)(t, i), w(O.f64(t), i), 1e-6)


def test_plant_a_reversed_column_read_as_a_broadcast_is_caught(rng, monkeypatch):
    """Planted: a column stride of -1 classified as 0 (each row's first element repeated, still in
    bounds): the in-place reversed last axis gives wrong values and the gate fails."""
    from tessera.passes.tile.kernels import rows
    real = rows.classify
    fn = lambda a: a[:, ::-1] * 2 + 1   # noqa: E731
    x = arr(rng, 5, 21)
    O.assert_close(ts.jit(fn)(x), fn(O.f64(x)), 1e-6)   # the real one passes
    monkeypatch.setattr(rows, "classify", lambda v, d: (lambda m, cs: (m, 0 if cs == -1 else cs))(*real(v, d)))
    x = arr(rng, 5, 22)   # (another static size: not the cached kernel)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(fn)(x), fn(O.f64(x)), 1e-6)
