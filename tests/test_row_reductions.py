"""``fuse-row-reductions`` + ``kernels/rowreduce.py``: a row-shaped result computed from last-axis
keepdims reductions of its own row is ONE kernel, against float64 numpy oracles (odd row lengths,
rank 3, broadcast inputs, NaN rows); softmax / log_softmax backward are the forward's row kernel
plus one, layer_norm's backward 5 kernels (were 15); a value also used elsewhere is recomputed inside; a
planted wrong tail pad is caught."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.ir import graph as g
from tessera.passes.tile.kernels import rowreduce

import oracle as O

OPS = ts.ops


def _kinds(fn, *args):
    return [k["kind"] for k in ts.explain(fn, *args).kernels]


def centre(x):
    return x - x.mean(-1, keepdims=True)


def softmax_by_hand(x):
    e = OPS.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def norm_by_hand(x, gamma, beta):
    xc = x - x.mean(-1, keepdims=True)
    return xc * OPS.rsqrt((xc * xc).mean(-1, keepdims=True) + 1e-5) * gamma + beta


def _norm64(x, gamma, beta):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5) * gamma + beta


def _softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


CASES = {"centre": (centre, lambda x: x - x.mean(-1, keepdims=True), 1),
         "softmax": (softmax_by_hand, _softmax64, 1),
         "layer_norm": (norm_by_hand, _norm64, 3)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(37, 203), (3, 5, 77), (4, 16)], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_user_written_row_programs_are_one_kernel(rng, case, shape, dtype):
    fn, ref, nargs = CASES[case]
    args = [rng.standard_normal(shape).astype(dtype)]
    if nargs == 3:   # a [C] scale and shift, broadcast along the rows
        args += [rng.standard_normal(shape[-1]).astype(dtype), rng.standard_normal(shape[-1]).astype(dtype)]
    jf = ts.jit(fn)
    got = jf(*args)
    O.assert_close(got, ref(*[O.f64(a) for a in args]), 1e-5 if dtype == np.float32 else 1e-12)
    assert _kinds(jf, *args) == ["rowreduce"]


def test_row_scalar_inputs_and_nan_rows(rng):
    """A [rows, 1] input joins the row scalars; a NaN in a row reaches every output of its row
    through the max, as numpy's."""
    x = rng.standard_normal((9, 50)).astype(np.float32)
    t = rng.uniform(0.5, 2.0, (9, 1)).astype(np.float32)
    x[4, 17] = np.nan
    jf = ts.jit(lambda x, t: (x - x.max(-1, keepdims=True)) / t)
    got = jf(x, t)
    want = (O.f64(x) - O.f64(x).max(-1, keepdims=True)) / O.f64(t)
    assert np.isnan(got[4]).all() and not np.isnan(np.delete(got, 4, 0)).any()
    O.assert_close(np.delete(got, 4, 0), np.delete(want, 4, 0), 1e-6)
    assert _kinds(jf, x, t) == ["rowreduce"]


def test_a_reduction_also_returned_is_recomputed_in_the_row_kernel(rng):
    x = rng.standard_normal((12, 40)).astype(np.float32)
    def both(x):
        m = x.mean(-1, keepdims=True)
        return x - m, m

    jf = ts.jit(both)
    c, m = jf(x)
    O.assert_close(m, O.f64(x).mean(-1, keepdims=True), 1e-6)
    O.assert_close(c, O.f64(x) - O.f64(x).mean(-1, keepdims=True), 1e-6)
    assert sorted(_kinds(jf, x)) == ["reduce", "rowreduce"]   # the returned mean: its own kernel


@pytest.mark.parametrize("which", ["softmax", "log_softmax"])
def test_softmax_backward_is_the_forward_row_kernel_and_one_more(rng, which):
    x = rng.standard_normal((33, 130)).astype(np.float32)
    w = rng.standard_normal((33, 130)).astype(np.float32)
    op = getattr(OPS, which)
    jf = ts.jit(ts.grad(lambda x, w: (op(x, -1) * w).sum()))
    got = jf(x, w)
    x64, w64 = O.f64(x), O.f64(w)
    y = _softmax64(x64)
    want = y * (w64 - (w64 * y).sum(-1, keepdims=True)) if which == "softmax" else \
        w64 - y * w64.sum(-1, keepdims=True)
    O.assert_close(got, want, 1e-5)
    assert sorted(_kinds(jf, x, w)) == ["rowreduce", "rowwise"]


def test_planted_wrong_tail_pad_is_caught(rng, monkeypatch):
    """Teeth: a max whose columns past the row's end read 0 instead of -inf is wrong on rows of
    negative numbers whose length is not a multiple of the chunk."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setitem(rowreduce.COMBINE, g.ReduceMaxOp, ("max", 0.0))
    x = -rng.uniform(1, 2, (8, 45)).astype(np.float32)
    got = ts.jit(lambda x: x - x.max(-1, keepdims=True))(x)
    assert O.rel_err(got, O.f64(x) - O.f64(x).max(-1, keepdims=True)) > 0.1


@pytest.mark.parametrize("which", ["layer_norm", "rms_norm"])
def test_norm_backward_kernels(rng, which):
    """dx is one row kernel, dgamma's rows (g * xhat) another, then the column sums: 5 kernels for
    layer_norm (15 before the row kernels), 3 for rms_norm (11).  The forward is not run: the
    seed's broadcast no longer reads it (canonicalize drops ``where(c, t, t)``)."""
    x, w = rng.standard_normal((40, 96)).astype(np.float32), rng.standard_normal((40, 96)).astype(np.float32)
    gam, bet = rng.standard_normal(96).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    if which == "layer_norm":
        f, args = (lambda x, g, b, w: (OPS.layer_norm(x, g, b) * w).sum()), (x, gam, bet, w)
    else:
        f, args = (lambda x, g, w: (OPS.rms_norm(x, g) * w).sum()), (x, gam, w)
    jf = ts.jit(ts.grad(f, argnums=tuple(range(len(args) - 1))))
    got = jf(*args)
    x64, g64, w64 = O.f64(x), O.f64(gam), O.f64(w)
    xc = x64 - x64.mean(-1, keepdims=True) if which == "layer_norm" else x64
    eps = 1e-5 if which == "layer_norm" else 1e-6
    r = 1 / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps)
    xhat = xc * r
    gh = w64 * g64
    inner = gh - xhat * (gh * xhat).mean(-1, keepdims=True)
    if which == "layer_norm":
        inner = inner - gh.mean(-1, keepdims=True)
    want = [r * inner, (w64 * xhat).sum(0)] + ([w64.sum(0)] if which == "layer_norm" else [])
    for gv, wv in zip(got, want):
        O.assert_close(gv, wv, 1e-4)
    kinds = sorted(_kinds(jf, *args))
    assert kinds == sorted(["rowreduce", "rowreduce", "reduce"] + (["elementwise", "reduce"] if which == "layer_norm"
                                                                   else []))
