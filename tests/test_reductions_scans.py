"""logsumexp / log_softmax (row kernels), cumsum / cumprod (scans), prod: float64 numpy oracles on
fresh random data (odd row lengths, large magnitudes, -inf / +inf / NaN rows), planted bugs, coded
refusals, and the GPU lanes' refusal by op name."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.errors import RankMismatchError, ScheduleIllegalError, TesseraError

BF16 = ml_dtypes.bfloat16


# ----------------------------------------------------------------------------- float64 oracles
def lse64(x, axis=-1, keepdims=False):
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        r = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis)


def log_softmax64(x, axis=-1):
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        return (x - m) - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def close(got, want, tol):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    same_special = (np.isnan(got) == np.isnan(want)).all() and \
        (got[np.isinf(want)] == want[np.isinf(want)]).all() and not np.isinf(got[np.isfinite(want)]).any()
    fin = np.isfinite(want)
    err = np.max(np.abs(got[fin] - want[fin]) / (1 + np.abs(want[fin])), initial=0.0)
    return same_special and err <= tol, err


# one compiled function per distinct form, shared by the parametrizations
LSE = ts.jit(lambda x: ts.ops.logsumexp(x * 2.0))                    # a fused prologue
LSM = ts.jit(lambda x: ts.ops.log_softmax(x * 2.0) + 1.0)            # prologue and epilogue
TOL = {np.float32: 4e-6, np.float64: 1e-13}


def _rows(rng, shape, dtype, scale=40.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logsumexp_and_log_softmax_match_float64(rng, dtype):
    x = _rows(rng, (9, 37), dtype)     # |2x| up to ~300: exp(x) overflows f32 without the shift
    ok, err = close(LSE(x), lse64(2.0 * x.astype(np.float64)), TOL[dtype])
    assert ok, err
    ok, err = close(LSM(x), log_softmax64(2.0 * x.astype(np.float64)) + 1.0, TOL[dtype])
    assert ok, err


def test_special_rows_follow_scipy(rng):
    x = _rows(rng, (6, 21), np.float32)
    x[0, :] = -np.inf                  # all -inf: lse -inf, log_softmax NaN
    x[1, 5] = np.inf                   # +inf: lse +inf
    x[2, 7] = np.nan                   # NaN row
    x[3, ::2] = -np.inf                # some -inf entries: weight 0
    x[4, -1] = np.nan                  # NaN in the masked tail's vector
    want_l, want_s = lse64(2.0 * x.astype(np.float64)), log_softmax64(2.0 * x.astype(np.float64)) + 1.0
    assert np.isneginf(want_l[0]) and np.isposinf(want_l[1]) and np.isnan(want_l[2])
    ok, err = close(LSE(x), want_l, TOL[np.float32])
    assert ok, (LSE(x), want_l)
    ok, err = close(LSM(x), want_s, TOL[np.float32])
    assert ok, (LSM(x)[:5], want_s[:5])


def test_other_axes_keepdims_and_fusion(rng):
    x = _rows(rng, (3, 13, 5), np.float32, 10.0)
    f = ts.jit(lambda a: ts.ops.logsumexp(a, axis=1, keepdims=True))
    ok, err = close(f(x), lse64(x, 1, True), TOL[np.float32])
    assert ok, err
    g = ts.jit(lambda a: ts.ops.log_softmax(a, axis=0))
    ok, err = close(g(x), log_softmax64(x, 0), TOL[np.float32])
    assert ok, err
    # the last axis: one row kernel with the prologue and epilogue in it
    assert [k["kind"] for k in ts.explain(LSM, x[0]).kernels] == ["rowwise"]
    assert [k["kind"] for k in ts.explain(LSE, x[0]).kernels] == ["rowwise"]


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_narrow_floats_compute_in_f32(rng, dtype):
    x = _rows(rng, (5, 19), dtype, 8.0)
    f = ts.jit(lambda a: ts.ops.logsumexp(a))
    got = f(x)
    assert got.dtype == dtype
    ok, err = close(got, lse64(x.astype(np.float64)), 2 * float(np.finfo(dtype).eps))
    assert ok, err


def test_plant_without_max_shift_overflows(rng, monkeypatch):
    """With the shift forced to 0 (the max subtraction dropped), exp overflows on these rows."""
    from tessera.passes.tile.kernels import logrows
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(logrows, "F32_MAX", 0.0)
    x = _rows(rng, (4, 33), np.float32)
    ok, _ = close(ts.jit(lambda a: ts.ops.logsumexp(a * 2.0))(x), lse64(2.0 * x.astype(np.float64)), 4e-6)
    assert not ok


def test_bad_axis_is_coded(rng):
    x = _rows(rng, (4, 5), np.float32)
    for fn in (lambda a: ts.ops.logsumexp(a, axis=2), lambda a: ts.ops.log_softmax(a, axis=-3),
               lambda a: ts.ops.logsumexp(a, axis=(0, 1))):
        with pytest.raises(RankMismatchError) as e:
            ts.jit(fn)(x)
        assert e.value.code == "RANK_MISMATCH"


@pytest.mark.parametrize("name, op", [("logsumexp", "logsumexp")])
def test_gpu_lanes_refuse_by_op_name(rng, name, op):   # log_softmax, argmax, cumsum: GPU kernels now
    x = _rows(rng, (8, 16), np.float32)
    for target, arch in (("nvidia", "sm_90"), ("rocm", "gfx1151")):
        with pytest.raises(ScheduleIllegalError, match=rf"tessera\.{op}\).*{target} lane"):
            ts.compile(lambda a: getattr(ts.ops, name)(a, axis=-1), x, target=target, arch=arch)


def test_reference_lane_evaluates_the_new_ops(rng):
    from tessera.frontend.reference import evaluate
    from tessera.frontend.trace import trace
    x = _rows(rng, (4, 9), np.float64, 30.0)
    x[0] = -np.inf
    got = evaluate(trace(lambda a: ts.ops.log_softmax(a) + ts.ops.logsumexp(a, keepdims=True), [x], [True]), [x])[0]
    want = log_softmax64(x) + lse64(x, -1, True)
    assert close(got, want, 1e-15)[0]


# ----------------------------------------------------------------------------- scans and prod
SCAN = {(name, ax): ts.jit(lambda a, name=name, ax=ax: getattr(ts.ops, name)(a, ax))
        for name in ("cumsum", "cumprod") for ax in (0, 1, 2, None)}
NP_SCAN = {"cumsum": np.cumsum, "cumprod": np.cumprod}


def _scan_input(rng, dtype, shape=(3, 37, 5), nan=True):
    """Magnitudes around 1 with random signs (products neither vanish nor overflow), one NaN."""
    x = rng.uniform(0.6, 1.6, shape) * rng.choice([-1.0, 1.0], shape)
    if nan:
        x.flat[x.size // 2 + 3] = np.nan
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scans_match_float64_along_every_axis(rng, dtype, name):
    x = _scan_input(rng, dtype)
    for ax in (0, 1, 2, None):
        got = SCAN[name, ax](x)
        ok, err = close(got, NP_SCAN[name](x.astype(np.float64), ax), 1e-5 if dtype == np.float32 else 1e-13)
        assert ok, (name, ax, err)
        if dtype == np.float32:   # in order along the axis, in f32: numpy's own f32 result
            np.testing.assert_array_equal(got, NP_SCAN[name](x, ax))


def test_bf16_scan_accumulates_in_f32(rng):
    x = _scan_input(rng, BF16, (2, 301, 3), nan=False)
    got = SCAN["cumsum", 1](x).astype(np.float64)
    want = np.cumsum(x.astype(np.float64), 1)
    # one bf16 rounding of an f32 sum per output (a bf16 accumulator drifts far past this)
    bound = float(np.finfo(BF16).eps) / 2 * np.abs(want) + 1e-5 * np.cumsum(np.abs(x.astype(np.float64)), 1)
    assert SCAN["cumsum", 1](x).dtype == BF16
    assert np.all(np.abs(got - want) <= bound)


def test_plant_exclusive_scan_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import scan
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(scan, "INCLUSIVE", False)
    x = _scan_input(rng, np.float32)
    for ax in (1, 2):   # the vector path and the last-axis path
        got = ts.jit(lambda a, ax=ax: ts.ops.cumsum(a, ax))(x)
        assert not close(got, np.cumsum(x.astype(np.float64), ax), 1e-5)[0]


def test_prod_matches_float64(rng):
    x = _scan_input(rng, np.float32, (4, 29, 7))
    for ax, keep in ((1, False), (2, True), ((0, 2), False), (None, False)):
        got = ts.jit(lambda a, ax=ax, keep=keep: ts.ops.prod(a, ax, keep))(x)
        want = np.prod(x.astype(np.float64), ax, keepdims=keep)
        ok, err = close(got / np.where(want == 0, 1, want).astype(np.float32), want / np.where(want == 0, 1, want),
                        1e-5)
        assert ok, (ax, err)
    x = x[:, :, 0].astype(np.float64)
    ok, err = close(ts.jit(lambda a: ts.ops.prod(a, 1))(x), np.prod(x, 1), 1e-13)
    assert ok, err


def test_plant_prod_as_sum_fails(rng, monkeypatch):
    """reduce.py's tree for prod planted to add its lanes: the product check fails."""
    from tessera.codegen import x86 as cg
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = cg._Fn.op_tessera_x86_vreduce if hasattr(cg, "_Fn") else None
    assert real is not None

    def planted(self, op):
        if op.kind.data == "mul":
            op.kind = type(op.kind)("add")
        return real(self, op)

    monkeypatch.setattr(cg._Fn, "op_tessera_x86_vreduce", planted)
    x = _scan_input(rng, np.float32, (3, 41), nan=False)
    want = np.prod(x.astype(np.float64), 1)
    got = ts.jit(lambda a: ts.ops.prod(a, 1))(x)
    assert not close(got, want, 1e-4)[0]


def test_scan_and_prod_bad_axes_are_coded(rng):
    x = _rows(rng, (4, 5), np.float32)
    for fn in (lambda a: ts.ops.cumsum(a, 2), lambda a: ts.ops.cumprod(a, -3), lambda a: ts.ops.prod(a, (1, 1)),
               lambda a: ts.ops.prod(a, 5)):
        with pytest.raises(RankMismatchError):
            ts.jit(fn)(x)


@pytest.mark.parametrize("name", ["prod", "any"])   # cumsum / cumprod: GPU scan kernels now (test_gpu_scan.py)
def test_gpu_lanes_refuse_reductions_by_op_name(rng, name):
    x = _rows(rng, (8, 16), np.float32)
    op = {"prod": "reduce_prod", "any": "reduce_any"}[name]
    with pytest.raises(ScheduleIllegalError, match=rf"tessera\.{op}\).*nvidia lane"):
        ts.compile(lambda a: getattr(ts.ops, name)(a, 1), x, target="nvidia", arch="sm_90")


# ----------------------------------------------------------------------------- argmax / argmin
def _arg_input(rng, dtype, shape=(7, 45)):
    """Small integers (ties everywhere), a NaN row, two NaNs in another, an all -inf row."""
    x = rng.integers(-3, 4, shape).astype(np.float64)
    x[1, 5] = x[1, -4] = np.nan
    x[2, -1] = np.nan                  # in the last, partial chunk
    x[..., 5, 1] = np.nan              # in the first chunk of a longer row
    x[..., 3, :] = -np.inf
    x[..., 4, ::3] = np.inf
    return x.astype(dtype)


ARGMAX = ts.jit(lambda a: ts.ops.argmax(a * 2.0, axis=-1))   # a fused prologue
ARGMIN = ts.jit(lambda a: ts.ops.argmin(a, axis=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
def test_argmax_argmin_first_index_and_nan_as_numpy(rng, dtype):
    x = _arg_input(rng, dtype)
    x64 = x.astype(np.float64)
    assert ARGMAX(x).dtype == np.int64
    np.testing.assert_array_equal(ARGMAX(x), np.argmax(2.0 * x64, axis=-1))
    np.testing.assert_array_equal(ARGMIN(x), np.argmin(x64, axis=1))


def test_argmax_other_axes_keepdims_and_fusion(rng):
    x = _arg_input(rng, np.float32, (3, 11, 7))
    for ax, keep in ((0, False), (1, True), (None, False), (None, True)):
        got = ts.jit(lambda a, ax=ax, keep=keep: ts.ops.argmax(a, ax, keep))(x)
        np.testing.assert_array_equal(got, np.argmax(x, ax, keepdims=keep))
    got = ts.jit(lambda a: ts.ops.argmin(a, -1, True))(x)
    np.testing.assert_array_equal(got, np.argmin(x, -1, keepdims=True))
    assert [k["kind"] for k in ts.explain(ARGMAX, x[0]).kernels] == ["rowwise"]


@pytest.mark.parametrize("plant", ["last_tie", "nan_dropped"])
def test_argmax_plants_fail(rng, monkeypatch, plant):
    from tessera.passes.tile.kernels import argrows
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    if plant == "last_tie":
        monkeypatch.setattr(argrows, "FIRST", False)
    else:
        monkeypatch.setitem(argrows.EXTREME, "max", "select_max")
    x = _arg_input(rng, np.float32, (7, 150))   # several chunks per row on every vector width
    got = ts.jit(lambda a: ts.ops.argmax(a, -1))(x)
    assert not np.array_equal(got, np.argmax(x, -1))


def test_argmax_bad_input_is_coded(rng):
    x = _rows(rng, (4, 5), np.float32)
    with pytest.raises(RankMismatchError):
        ts.jit(lambda a: ts.ops.argmax(a, 2))(x)
    with pytest.raises(RankMismatchError):
        ts.jit(lambda a: ts.ops.argmin(a, (0, 1)))(x)
    with pytest.raises(TesseraError) as e:
        ts.jit(lambda a: ts.ops.argmax(a[:, 5:]))(x)
    assert e.value.code == "SHAPE_MISMATCH"


# ----------------------------------------------------------------------------- top_k
def top_k_order64(v, k):
    """The float64 oracle's order, row by row: NaN first, then descending, ties by lower index."""
    v = np.asarray(v, np.float64)
    rows = v.reshape(-1, v.shape[-1])
    out = [sorted(range(len(r)), key=lambda i, r=r: (0, 0.0, i) if np.isnan(r[i]) else (1, -r[i], i))[:k]
           for r in rows]
    return np.array(out).reshape(v.shape[:-1] + (k,))


TOPK = ts.jit(lambda a: ts.ops.top_k(a * 2.0, 5))     # a fused prologue


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
def test_top_k_sorted_stable_nan_first(rng, dtype):
    x = _arg_input(rng, dtype)
    x[6, 9] = np.inf
    v, i = TOPK(x)
    assert i.dtype == np.int64
    want = top_k_order64(2.0 * x.astype(np.float64), 5)
    np.testing.assert_array_equal(i, want)
    np.testing.assert_array_equal(v.astype(np.float64), np.take_along_axis(2.0 * x.astype(np.float64), want, -1))
    assert v.dtype == dtype


def test_top_k_whole_row_other_axis_and_single_outputs(rng):
    x = _arg_input(rng, np.float32, (7, 13))
    v, i = ts.jit(lambda a: ts.ops.top_k(a, 13))(x)          # k = n: the whole stable sort
    np.testing.assert_array_equal(i, top_k_order64(x, 13))
    only_i = ts.jit(lambda a: ts.ops.top_k(a, 3, axis=0)[1])(x)
    np.testing.assert_array_equal(only_i, top_k_order64(x.T, 3).T)
    only_v = ts.jit(lambda a: ts.ops.top_k(a, 1)[0])(x)
    np.testing.assert_array_equal(only_v, np.take_along_axis(x, top_k_order64(x, 1), -1))
    assert [k["kind"] for k in ts.explain(TOPK, x).kernels] == ["rowwise"]


def test_top_k_plant_unstable_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import topk
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(topk, "STABLE", False)
    x = _arg_input(rng, np.float32)
    _, i = ts.jit(lambda a: ts.ops.top_k(a, 4))(x)
    assert not np.array_equal(i, top_k_order64(x, 4))


def test_top_k_bad_k_is_coded(rng):
    x = _rows(rng, (4, 5), np.float32)
    for k in (0, 6, -1):
        with pytest.raises(TesseraError) as e:
            ts.jit(lambda a, k=k: ts.ops.top_k(a, k))(x)
        assert e.value.code == "SHAPE_MISMATCH" and "top_k" in str(e.value)
    with pytest.raises(TesseraError) as e:
        ts.jit(lambda a: ts.ops.top_k(a, 2.0))(x)
    assert e.value.code == "SHAPE_MISMATCH"
    with pytest.raises(RankMismatchError):
        ts.jit(lambda a: ts.ops.top_k(a, 2, axis=3))(x)
    wide = _rows(rng, (4, 200), np.float32)   # the GPU lanes' top_k keeps k <= 128 (kernels/gpu_topk.py)
    with pytest.raises(ScheduleIllegalError, match=r"tessera\.top_k with k = 129 \(the GPU kernel takes k <= 128\)"):
        ts.compile(lambda a: ts.ops.top_k(a, 129)[0], wide, target="nvidia", arch="sm_90")


# ----------------------------------------------------------------------------- any / all
def _logical_input(rng, shape=(5, 37, 3)):
    x = rng.integers(0, 3, shape).astype(np.float32)
    x[0] = 0
    x[1] = 1
    x[2] = 0
    x[2, 4, 1] = np.nan                # NaN is nonzero: any True
    x[3] = 2
    x[3, 30, 2] = 0                    # one zero: all False
    return x


@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all_match_numpy(rng, name):
    x = _logical_input(rng)
    for ax, keep in ((None, False), (0, False), (1, True), (2, False), ((0, 2), False), ((1, 2), True)):
        got = ts.jit(lambda a, ax=ax, keep=keep: getattr(ts.ops, name)(a, ax, keep))(x)
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, getattr(np, name)(x, ax, keepdims=keep))
    b = x[..., 0] > 0.5                # bool input
    np.testing.assert_array_equal(ts.jit(lambda a: getattr(ts.ops, name)(a, 1))(b), getattr(np, name)(b, 1))
    for d in (np.int8, np.int64):      # int input (a nonzero int64 beyond 2^24 stays nonzero)
        xi = np.nan_to_num(x[..., 2]).astype(d) * d(2 ** 40 if d == np.int64 else 1)
        np.testing.assert_array_equal(ts.jit(lambda a: getattr(ts.ops, name)(a, 1))(xi), getattr(np, name)(xi, 1))
    x64 = x[..., 1].astype(np.float64)  # f64 registers
    np.testing.assert_array_equal(ts.jit(lambda a: getattr(ts.ops, name)(a, 1))(x64), getattr(np, name)(x64, 1))


def test_any_plant_nan_as_zero_fails(rng, monkeypatch):
    """tile fn 'same' planted to call a NaN equal to anything: any() of a zero row with a NaN fails."""
    from tessera.codegen import x86 as cg
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = cg._Fn.op_tessera_x86_vbinary

    def planted(self, op):
        if op.fn.data != "same":
            return real(self, op)
        a, c = self.v(op.lhs), self.v(op.rhs)
        one = cg.ir.Constant(a.type, [cg.ir.Constant(a.type.element, 1.0)] * a.type.count)
        self.set(op, self.b.select(self.b.fcmp_unordered("==", a, c), one, cg.ir.Constant(a.type, None)))

    monkeypatch.setattr(cg._Fn, "op_tessera_x86_vbinary", planted)
    x = _logical_input(rng)
    assert not np.array_equal(ts.jit(lambda a: ts.ops.any(a, (1, 2)))(x), np.any(x, (1, 2)))


def test_any_bad_input_is_coded(rng):
    x = _rows(rng, (4, 5), np.float32)
    with pytest.raises(RankMismatchError):
        ts.jit(lambda a: ts.ops.any(a, (1, 1)))(x)
    with pytest.raises(RankMismatchError):
        ts.jit(lambda a: ts.ops.all(a, 2))(x)
    with pytest.raises(ScheduleIllegalError, match=r"tessera\.reduce_any.*nvidia lane"):
        ts.compile(lambda a: ts.ops.any(a, 1), x, target="nvidia", arch="sm_90")


# ----------------------------------------------------------------------------- cross_entropy
def xent64(x, y, ignore=-100):
    """Per-row float64 loss, written apart from the reference lane's: lse - x[y], 0 where ignored."""
    x, y = np.asarray(x, np.float64), np.asarray(y).astype(np.int64)
    out = np.zeros(y.shape)
    for idx in np.ndindex(y.shape):
        if y[idx] == ignore:
            continue
        out[idx] = np.inf if not 0 <= y[idx] < x.shape[-1] else lse64(x[idx]) - x[idx][y[idx]]
    return out


def _xent_rows(reduction, ignore=-100):
    return ts.jit(lambda a, lab: ts.ops.cross_entropy(a * 2.0, lab, reduction, ignore))   # a fused prologue


XENT = {r: _xent_rows(r) for r in ("none", "sum", "mean")}


def _xent_input(rng, dtype, shape=(6, 3, 37)):
    x = _rows(rng, shape, dtype, 20.0)                 # |2x| up to ~150: exp overflows without the shift
    y = rng.integers(0, shape[-1], shape[:-1]).astype(np.int64)
    y[0, 1] = -100                                     # ignored
    y[1, 2] = shape[-1] - 1                            # the last, partial chunk
    return x, y


@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
def test_cross_entropy_matches_float64(rng, dtype):
    x, y = _xent_input(rng, dtype)
    if dtype == BF16:
        y = y.astype(np.int32)                         # any int dtype
    per = xent64(2.0 * x.astype(np.float64), y)
    tol = {np.float32: 4e-6, np.float64: 1e-13}.get(dtype, 2 * float(np.finfo(BF16).eps))
    for red, want in (("none", per), ("sum", per.sum()), ("mean", per.sum() / (y != -100).sum())):
        got = XENT[red](x, y)
        assert got.dtype == dtype
        ok, err = close(np.asarray(got), np.asarray(want), tol)
        assert ok, (red, err)


def test_cross_entropy_edges_and_one_row_kernel(rng):
    x, y = _xent_input(rng, np.float32)
    y[2, 0] = 37                                       # out of range: +inf, no read outside the row
    y[3, 1] = -1
    x[4, 0] = -np.inf                                  # an all -inf row with a label: NaN (as torch)
    with np.errstate(invalid="ignore"):
        want = xent64(2.0 * x.astype(np.float64), y)
    got = XENT["none"](x, y)
    assert np.isnan(got[4, 0]) and np.isposinf(got[2, 0]) and np.isposinf(got[3, 1]) and got[0, 1] == 0.0
    ok, err = close(got, want, 4e-6)
    assert ok, err
    y[:] = -100                                        # every row ignored: mean is 0 / 0
    assert np.isnan(XENT["mean"](x, y))
    kernels = ts.explain(XENT["none"], x, y).kernels
    assert [k["kind"] for k in kernels] == ["rowwise"] and "tessera.mul" in kernels[0]["ops"]


def test_cross_entropy_plant_without_picked_logit_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import xent
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(xent, "PICK", False)
    x, y = _xent_input(rng, np.float32)
    got = _xent_rows("none")(x, y)
    assert not close(got, xent64(2.0 * x.astype(np.float64), y), 4e-6)[0]


def test_cross_entropy_bad_input_is_coded(rng):
    x, y = _xent_input(rng, np.float32)
    cases = [((x, y.astype(np.float32)), {}, "DTYPE_UNSUPPORTED", "labels must be an integer"),   # float labels
             ((x, y > 3), {}, "DTYPE_UNSUPPORTED", "labels must be an integer"),                     # bool labels
             ((x, y[:, :2]), {}, "SHAPE_MISMATCH", "labels of shape"),
             ((x[0, 0], y[0]), {}, "SHAPE_MISMATCH", "labels of shape"),
             ((x, y), {"reduction": "avg"}, "BAD_ARGUMENT", "reduction='avg'"),
             ((x, y), {"ignore_index": 1.5}, "BAD_ARGUMENT", "ignore_index")]
    for args, kw, code, msg in cases:
        with pytest.raises(TesseraError) as e:
            ts.jit(lambda a, b, kw=kw: ts.ops.cross_entropy(a, b, **kw))(*args)
        assert e.value.code == code and msg in str(e.value), (code, str(e.value))
    # the GPU lanes have a cross_entropy kernel of their own (tests/test_gpu_int.py checks its numbers)
    art = ts.compile(lambda a, b: ts.ops.cross_entropy(a, b, "none"), x, y, target="nvidia", arch="sm_90")
    assert [k["kind"] for k in art.report().kernels] == ["rowwise"]


def test_tensor_methods_as_numpy(rng):
    x = _arg_input(rng, np.float32, (6, 9))
    f = ts.jit(lambda a: (a.argmax(-1), a.argmin(), a.cumsum(0), a.cumprod(1), a.prod(1, keepdims=True),
                          a.any(1), a.all()))
    with np.errstate(invalid="ignore"):   # inf * 0 in the products
        want = (x.argmax(-1), x.argmin(), x.cumsum(0), x.cumprod(1), x.prod(1, keepdims=True), x.any(1), x.all())
    for got, w in zip(f(x), want):
        ok, err = close(np.asarray(got, np.float64), np.asarray(w, np.float64), 1e-6)
        assert ok, (got, w)


def test_reference_lane_matches_the_oracles(rng):
    """The numpy reference lane (strict=False fallback) of every op here, against the oracles above."""
    from tessera.frontend.reference import evaluate
    from tessera.frontend.trace import trace
    x = _arg_input(rng, np.float32, (6, 11))
    y = rng.integers(0, 11, 6)
    y[1] = -100

    def fn(a, lab):
        v, i = ts.ops.top_k(a, 3)
        return (ts.ops.argmax(a, -1), ts.ops.argmin(a, 0), v, i, ts.ops.cumsum(a, 1), ts.ops.prod(a, 0),
                ts.ops.any(a, 1), ts.ops.cross_entropy(ts.ops.cumsum(a, 1) * 0.0 + a * 0.5, lab, "none"))
    got = evaluate(trace(fn, [x, y], [True, True]), [x, y])
    x64 = x.astype(np.float64)
    order = top_k_order64(x64, 3)
    with np.errstate(all="ignore"):
        want = (np.argmax(x64, -1), np.argmin(x64, 0), np.take_along_axis(x64, order, -1), order,
                np.cumsum(x64, 1), np.prod(x64, 0), np.any(x64, 1), xent64(x64 * 0.5 + np.cumsum(x64, 1) * 0.0, y))
    for k, (a, b) in enumerate(zip(got, want)):
        ok, err = close(np.asarray(a, np.float64), np.asarray(b, np.float64), 1e-6)
        assert ok, (k, a, b)
