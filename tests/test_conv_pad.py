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


def test_pad_rows_joined_when_the_last_axis_is_unpadded(rng):
    """Constant mode joins an unpadded last axis to the padded one before it (rows of W*C, as a
    convolution's NHWC input); the batch stays symbolic (one compile for both sizes)."""
    f = ts.jit(lambda v: ts.ops.pad(v, ((0, 0), (1, 2), (2, 1), (0, 0)), constant_values=-3.0))
    for n in (2, 3):
        x = arr(rng, n, 5, 6, 4)
        O.assert_close(f(x), np.pad(O.f64(x), ((0, 0), (1, 2), (2, 1), (0, 0)), constant_values=-3.0), 1e-7)
    assert len(f.compiles) == 1, f.compiles


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


# --------------------------------------------------------------------------- conv2d
def conv_ref(x, w, b, stride, pads, dil, groups, layout):
    """float64 conv2d: a sum over taps of einsums of shifted (strided) windows of the padded
    input; NCHW / OIHW internally."""
    x, w = O.f64(x), O.f64(w)
    if layout == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)
    n, _, _, _ = x.shape
    co, cig, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), pads[0], pads[1]))
    ho = (xp.shape[2] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    wo = (xp.shape[3] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    cog = co // groups
    y = np.zeros((n, co, ho, wo))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                h0, w0 = i * dil[0], j * dil[1]
                win = xp[:, g * cig:(g + 1) * cig, h0:h0 + (ho - 1) * stride[0] + 1:stride[0],
                         w0:w0 + (wo - 1) * stride[1] + 1:stride[1]]
                y[:, g * cog:(g + 1) * cog] += np.einsum("nchw,oc->nohw", win, w[g * cog:(g + 1) * cog, :, i, j])
    if b is not None:
        y += O.f64(b)[None, :, None, None]
    return y.transpose(0, 2, 3, 1) if layout == "NHWC" else y


def same_pads(n, k, s, d):
    """TF / JAX 'SAME' written out: ceil(n / s) outputs; the odd pad goes to the end."""
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
    return (total // 2, total - total // 2)


# (layout, N, C_in, H, W, C_out, (Kh, Kw), stride, padding, dilation, groups, bias, dtype)
CONV_CASES = {
    "nchw-3to5-pad1": ("NCHW", 2, 3, 9, 11, 5, (3, 3), 1, 1, 1, 1, True, np.float32),
    "nhwc-3to5-s2-d2": ("NHWC", 2, 3, 13, 10, 5, (3, 3), 2, (2, 1), 2, 1, True, np.float32),
    "nhwc-same-even": ("NHWC", 1, 3, 7, 9, 5, (2, 4), 1, "same", 1, 1, False, np.float32),
    "nchw-same-s2": ("NCHW", 2, 3, 9, 8, 5, (4, 3), 2, "same", 1, 1, True, np.float32),
    "nchw-groups2": ("NCHW", 2, 4, 9, 11, 6, (3, 2), (2, 1), 1, (1, 2), 2, True, np.float32),
    "nhwc-depthwise-x2": ("NHWC", 2, 3, 9, 11, 6, (3, 3), 1, 1, 1, 3, True, np.float32),
    "nchw-depthwise": ("NCHW", 2, 3, 10, 7, 3, (3, 3), 2, 1, 1, 3, False, np.float32),
    "nhwc-f64": ("NHWC", 2, 3, 9, 11, 5, (3, 3), 1, "valid", 1, 1, True, np.float64),
    "nhwc-bf16": ("NHWC", 2, 3, 9, 11, 5, (3, 3), 1, 1, 1, 1, True, dt.bfloat16),
}
_convs = {}


def _conv_args(rng, case):
    lay, n, ci, h, w_, co, (kh, kw), st, pad_, dil, g, bias, dtype = case
    x = arr(rng, *((n, ci, h, w_) if lay == "NCHW" else (n, h, w_, ci)), dtype=dtype)
    w = arr(rng, *((co, ci // g, kh, kw) if lay == "NCHW" else (kh, kw, ci // g, co)), dtype=dtype)
    b = arr(rng, co, dtype=dtype) if bias else None
    return x, w, b


def _conv_fn(name):
    lay, *_, kern, st, pad_, dil, g, bias, _dtype = CONV_CASES[name]
    if name not in _convs:
        kw = dict(stride=st, padding=pad_, dilation=dil, groups=g, layout=lay)
        _convs[name] = (ts.jit(lambda x, w, b: ts.ops.relu(ts.ops.conv2d(x, w, b, **kw))) if bias else
                        ts.jit(lambda x, w: ts.ops.conv2d(x, w, **kw)))
    return _convs[name]


def _check_conv(rng, name, tol=None):
    case = CONV_CASES[name]
    lay, n, ci, h, w_, co, (kh, kw), st, pad_, dil, g, bias, dtype = case
    x, w, b = _conv_args(rng, case)
    st2 = st if isinstance(st, tuple) else (st, st)
    dil2 = dil if isinstance(dil, tuple) else (dil, dil)
    if pad_ == "same":
        pads = (same_pads(h, kh, st2[0], dil2[0]), same_pads(w_, kw, st2[1], dil2[1]))
    elif pad_ == "valid":
        pads = ((0, 0), (0, 0))
    else:
        p2 = pad_ if isinstance(pad_, tuple) else (pad_, pad_)
        pads = ((p2[0], p2[0]), (p2[1], p2[1]))
    want = conv_ref(x, w, b, st2, pads, dil2, g, lay)
    got = _conv_fn(name)(x, w, b) if bias else _conv_fn(name)(x, w)
    if bias:
        want = np.maximum(want, 0)
    assert got.dtype == x.dtype and got.shape == want.shape, (got.shape, want.shape)
    O.assert_close(got, want, tol or TOL[np.dtype(dtype)], name)
    return x, w, b


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_conv2d_matches_numpy(rng, name):
    _check_conv(rng, name, 5e-5 if CONV_CASES[name][-1] == np.float32 else None)


def test_same_padding_puts_the_odd_pad_last():
    """'same' as TF/JAX: an even kernel's extra row/column is at the bottom/right."""
    from tessera.frontend.nn import _same
    assert _same(7, 2, 1, 1) == (0, 1) and _same(9, 4, 1, 1) == (1, 2) == same_pads(9, 4, 1, 1)
    assert _same(9, 4, 2, 1) == same_pads(9, 4, 2, 1) == (1, 2) and _same(8, 3, 2, 1) == (0, 1)


def test_conv_bias_relu_is_one_gemm_kernel(rng):
    """relu(conv2d(x, w) + b) in NHWC: the pad kernel, then one GEMM kernel whose A panels are
    packed through conv_patches (no im2col tensor) with the bias and relu in its epilogue."""
    x, w, b = _check_conv(rng, "nhwc-3to5-s2-d2")
    rep = ts.explain(_conv_fn("nhwc-3to5-s2-d2"), x, w, b)
    kernels = [k for k in rep.kernels]
    gemms = [k for k in kernels if k["kind"] == "gemm"]
    assert len(gemms) == 1 and len(kernels) == 2, kernels
    fused = gemms[0]["ops"]
    assert {"tessera.conv_patches", "tessera.matmul", "tessera.add", "tessera.relu"} <= set(fused), fused


def test_conv_batch_varies_without_recompiling(rng):
    f = ts.jit(lambda x, w: ts.ops.conv2d(x, w, padding=1, layout="NHWC"))
    w = arr(rng, 3, 3, 3, 5)
    for n in (2, 5):
        x = arr(rng, n, 7, 9, 3)
        O.assert_close(f(x, w), conv_ref(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "NHWC"), 5e-5)
    assert len(f.compiles) == 1, f.compiles


def test_plant_an_off_by_one_tap_address_is_caught(rng, monkeypatch):
    """Planted: the implicit GEMM's packing reads each tap one column (one pixel) too far right."""
    from dataclasses import replace

    from tessera.passes.tile.kernels import common
    real = common.patches_view

    def shifted(op, block):
        v = real(op, block)
        return replace(v, offset=v.offset + (v.taps[3],))
    monkeypatch.setattr(common, "patches_view", shifted)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    _convs.clear()
    with pytest.raises(AssertionError):
        _check_conv(rng, "nhwc-3to5-s2-d2")
    _convs.clear()


def test_plant_same_padding_on_the_wrong_side_is_caught(rng, monkeypatch):
    from tessera.frontend import nn
    real = nn._same
    monkeypatch.setattr(nn, "_same", lambda *a: tuple(reversed(real(*a))))
    _convs.clear()
    with pytest.raises(AssertionError):
        _check_conv(rng, "nhwc-same-even")
    _convs.clear()


def test_conv2d_errors(rng):
    x = arr(rng, 2, 3, 9, 11)
    w = arr(rng, 5, 3, 3, 3)
    for fn, cls, words in [
            (lambda x, w: ts.ops.conv2d(x, w[:, :2]), ShapeMismatchError, "channels"),
            (lambda x, w: ts.ops.conv2d(x, w, groups=2), ShapeMismatchError, "groups"),
            (lambda x, w: ts.ops.conv2d(x, w, dilation=6), ShapeMismatchError, "larger than the padded"),
            (lambda x, w: ts.ops.conv2d(x, w, layout="NWHC"), ArgumentError, "layout"),
            (lambda x, w: ts.ops.conv2d(x, w, padding="full"), ArgumentError, "padding"),
            (lambda x, w: ts.ops.conv2d(x, w, stride=0), ArgumentError, "stride"),
            (lambda x, w: ts.ops.conv2d(x[0], w), RankMismatchError, "rank 4"),
            (lambda x, w: ts.ops.conv2d(x, w, w[0, 0, 0]), ShapeMismatchError, "bias")]:
        with pytest.raises(cls) as e:
            ts.jit(fn)(x, w)
        assert "conv2d" in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.parametrize("target,arch", [("nvidia", "sm_90"), ("rocm", "gfx1151")])
def test_gpu_lanes_refuse_by_name(rng, target, arch):
    x, w = arr(rng, 1, 3, 8, 8), arr(rng, 4, 3, 3, 3)
    for op, fn in [("conv2d", lambda x, w: ts.ops.conv2d(x, w)),
                   ("pad", lambda x, w: ts.ops.pad(x, 1) + 1.0),
                   ("max_pool2d", lambda x, w: ts.ops.max_pool2d(x, 2)),
                   ("avg_pool2d", lambda x, w: ts.ops.avg_pool2d(x, 2))]:
        with pytest.raises(TesseraError) as e:
            ts.compile(fn, x, w, target=target, arch=arch)
        assert op in str(e.value) and target in str(e.value) and e.value.code == "UNSUPPORTED_CONSTRUCT"


# --------------------------------------------------------------------------- pooling
def pool_ref(x, k, s, p, layout, kind):
    x = O.f64(x)
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    ho = (xp.shape[2] - k[0]) // s[0] + 1
    wo = (xp.shape[3] - k[1]) // s[1] + 1
    wins = [xp[:, :, i:i + (ho - 1) * s[0] + 1:s[0], j:j + (wo - 1) * s[1] + 1:s[1]]
            for i in range(k[0]) for j in range(k[1])]
    y = np.max(wins, axis=0) if kind == "max" else np.sum(wins, axis=0) / (k[0] * k[1])
    return y.transpose(0, 2, 3, 1) if layout == "NHWC" else y


POOL_CASES = {"max-nchw-k3s2p1": ("max", "NCHW", (3, 3), (2, 2), (1, 1)),
              "max-nhwc-k2": ("max", "NHWC", (2, 2), None, (0, 0)),
              "avg-nhwc-k3s1p1": ("avg", "NHWC", (3, 3), (1, 1), (1, 1)),
              "avg-nchw-k2x3": ("avg", "NCHW", (2, 3), (2, 1), (1, 0))}


@pytest.mark.parametrize("name", list(POOL_CASES))
def test_pool_matches_numpy(rng, name):
    kind, lay, k, s, p = POOL_CASES[name]
    x = arr(rng, *((2, 3, 9, 11) if lay == "NCHW" else (2, 9, 11, 3)))
    x.flat[7] = np.nan   # a NaN in a window gives NaN (max as torch; avg as the sum)
    fn = ts.ops.max_pool2d if kind == "max" else ts.ops.avg_pool2d
    got = ts.jit(lambda v: fn(v, k, s, p, layout=lay))(x)
    want = pool_ref(x, k, s or k, p, lay, kind)
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    O.assert_close(got[ok], want[ok], 1e-6, name)


def test_plant_a_dropped_pool_window_is_caught(rng, monkeypatch):
    from tessera.frontend import nn
    real = nn._pool_windows
    monkeypatch.setattr(nn, "_pool_windows", lambda *a: real(*a)[:-1])
    x = arr(rng, 2, 3, 9, 11)
    got = ts.jit(lambda v: ts.ops.avg_pool2d(v, 3, 2, 1))(x)
    with pytest.raises(AssertionError):
        O.assert_close(got, pool_ref(x, (3, 3), (2, 2), (1, 1), "NCHW", "avg"), 1e-6)


def test_pool_errors(rng):
    x = arr(rng, 2, 3, 9, 11)
    for fn, cls in [(lambda v: ts.ops.max_pool2d(v, 3, padding=2), ArgumentError),
                    (lambda v: ts.ops.max_pool2d(v[0], 2), RankMismatchError),
                    (lambda v: ts.ops.avg_pool2d(v, 2, layout="CHW"), ArgumentError),
                    (lambda v: ts.ops.avg_pool2d(v, 2, count_include_pad=False), ArgumentError),
                    (lambda v: ts.ops.max_pool2d(v, 12), ShapeMismatchError)]:
        with pytest.raises(cls) as e:
            ts.jit(fn)(x)
        assert "pool2d" in str(e.value)


# --------------------------------------------------------------------------- larger sweeps
@pytest.mark.slow
@pytest.mark.parametrize("lay", ["NCHW", "NHWC"])
@pytest.mark.parametrize("st,pad_,dil,g", [(1, "same", 1, 1), (2, 2, 1, 2), (3, "valid", 2, 1), (1, 1, 1, 8),
                                           (2, "same", (2, 1), 4)])
def test_conv2d_sweep(rng, lay, st, pad_, dil, g):
    ci, co = 8, 16
    x = arr(rng, *((3, ci, 17, 23) if lay == "NCHW" else (3, 17, 23, ci)))
    w = arr(rng, *((co, ci // g, 3, 5) if lay == "NCHW" else (3, 5, ci // g, co)))
    got = ts.jit(lambda x, w: ts.ops.conv2d(x, w, stride=st, padding=pad_, dilation=dil, groups=g, layout=lay))(x, w)
    s2 = (st, st)
    d2 = dil if isinstance(dil, tuple) else (dil, dil)
    pads = ((same_pads(17, 3, st, d2[0]), same_pads(23, 5, st, d2[1])) if pad_ == "same" else
            ((0, 0), (0, 0)) if pad_ == "valid" else ((pad_, pad_), (pad_, pad_)))
    O.assert_close(got, conv_ref(x, w, None, s2, pads, d2, g, lay), 5e-5)


# --------------------------------------------------------------------------- NCHW epilogues
def test_nchw_bias_relu_ride_the_gemm(rng):
    """relu(conv2d(x, w) + b[:, None, None]) in NCHW: canonicalize moves the add and relu above
    the transpose back to NCHW, so they run in the GEMM's epilogue (no elementwise kernel)."""
    x, w, b = arr(rng, 2, 3, 9, 11), arr(rng, 5, 3, 3, 3), arr(rng, 5)
    f = ts.jit(lambda x, w, b: ts.ops.relu(ts.ops.conv2d(x, w, padding=1) + b.reshape(5, 1, 1)))
    O.assert_close(f(x, w, b), np.maximum(conv_ref(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "NCHW"), 0), 5e-5)
    kernels = ts.explain(f, x, w, b).kernels
    assert [k["kind"] for k in kernels].count("elementwise") == 0, kernels
    gemm = next(k for k in kernels if k["kind"] == "gemm")
    assert {"tessera.add", "tessera.relu"} <= set(gemm["ops"]), gemm


SINK_CASES = {
    "sub-row": lambda y, c: 2.0 - y.transpose(0, 2, 1) * c[:, None],     # c along the transposed axis
    "div-full": lambda y, c: ts.ops.tanh(c[None, :, None] / y.transpose(0, 2, 1)),
    "perm3": lambda y, c: ts.ops.maximum(y.transpose(2, 0, 1), c[:, None, None] * 0.5),
}


@pytest.mark.parametrize("name", list(SINK_CASES))
def test_ops_sunk_below_a_transposed_gemm_keep_their_meaning(rng, name):
    a, w, c = arr(rng, 3, 7, 4), arr(rng, 4, 5), arr(rng, 5)
    fn = SINK_CASES[name]
    got = ts.jit(lambda a, w, c: fn(a @ w, c))(a, w, c)
    y, c64 = O.f64(a) @ O.f64(w), O.f64(c)
    want = {"sub-row": lambda: 2.0 - y.transpose(0, 2, 1) * c64[:, None],
            "div-full": lambda: np.tanh(c64[None, :, None] / y.transpose(0, 2, 1)),
            "perm3": lambda: np.maximum(y.transpose(2, 0, 1), c64[:, None, None] * 0.5)}[name]()
    O.assert_close(got, want, 1e-5, name)


def test_plant_a_sunk_operand_in_the_wrong_axis_order_is_caught(rng, monkeypatch):
    """Planted: the moved bias is laid out by the permutation instead of its inverse: with
    Wo == C_out it broadcasts along W instead of the channels."""
    from tessera.passes.graph import sink_transpose as S
    monkeypatch.setattr(S, "_in_source_order", _unpermuted)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x, w, b = arr(rng, 2, 3, 5, 5), arr(rng, 5, 3, 3, 3), arr(rng, 5)
    got = ts.jit(lambda x, w, b: ts.ops.conv2d(x, w, padding=1) + b.reshape(5, 1, 1))(x, w, b)
    with pytest.raises(AssertionError):
        O.assert_close(got, conv_ref(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "NCHW"), 5e-5)


def _unpermuted(c, perm, at):
    from tessera.ir import graph as g
    from tessera.passes.util import insert_before
    dims = (1,) * (len(perm) - c.type.rank) + tuple(c.type.dims)
    dims = [dims[p] for p in perm]
    rs = g.ReshapeOp.create(operands=[c], result_types=[g.TensorType.of(dims, c.type.element_type)])
    insert_before(at, rs)
    return rs.result
