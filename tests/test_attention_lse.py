"""The attention forward's saved log-sum-exp (issue 28): ``tessera.attention``'s optional second
result, written only in programs whose gradient reads it, and read by ``tessera.attention_grad``
instead of a statistics pass over the keys.

Checks, each against a float64 numpy oracle on fresh random inputs: the saved LSE itself (causal,
masked with a fully-masked row: +inf, grouped heads, float64); the gradient through both paths
(the saved one under ``tessera.grad``; the recomputing one where ``attention_backward`` is called
on its own); a plain forward keeps one result; the backward kernel of the saved path runs one
GEMM-like product fewer per key block (5 instead of 6); planted bugs (an LSE off by a constant,
the LSE of the wrong head) fail while the recomputing path is untouched by them."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from tessera.errors import GraphShapeError
from tessera.frontend.attention_grad import saved_lse
from tessera.frontend.reference import attention64, attention_lse64
from tessera.passes.tile.kernels import attention as A
from tessera.passes.tile.kernels import attention_backward as AB

from test_attention_backward import _check, _inputs, _grad_fn, _steps, oracle

O = ts.ops


def _with_lse(causal=False, masked=False):
    """A program returning attention's output and the log-sum-exp it saves for a gradient."""
    def f(q, k, v, *m):
        o = O.attention(q, k, v, causal=causal, mask=m[0] if masked else None)
        assert o._node.op == "attention"
        return o, saved_lse(o._node)
    return ts.jit(f)


@pytest.mark.parametrize("b,h,hk,s,d,causal,mask,dtype", [
    (1, 2, 2, 37, 16, False, None, np.float32),
    (2, 4, 2, 150, 64, True, None, np.float32),     # grouped heads, two query blocks
    (1, 2, 1, 70, 32, False, "bool", np.float64),   # a fully-masked row: +inf
    (1, 2, 2, 45, 24, True, "add", np.float32),
    (1, 2, 2, 100, 128, True, None, np.float32),   # head dim 128
])
def test_saved_lse_matches_float64(rng, b, h, hk, s, d, causal, mask, dtype):
    q, k, v, _ = _inputs(rng, b, h, hk, s, d, dtype)
    args, m = [q, k, v], None
    if mask == "bool":
        m = rng.random((b, 1, s, s)) > 0.4
        m[0, 0, 5] = False
    elif mask == "add":
        m = (rng.standard_normal((1, 1, s, s)) * 2).astype(dtype)
    if m is not None:
        args.append(m)
    f = _with_lse(causal, m is not None)
    o, lse = f(*args)
    sc = 1 / np.sqrt(d)
    want = attention_lse64(*(x.astype(np.float64) for x in (q, k, v)), m if m is None or m.dtype == bool
                           else m.astype(np.float64), sc, causal)
    assert lse.shape == (b, h, s) and lse.dtype == (np.float64 if dtype == np.float64 else np.float32)
    assert np.array_equal(np.isinf(lse), np.isinf(want))
    if mask == "bool":
        assert np.isposinf(lse[0, :, 5]).all()   # every key masked: exp(s - lse) = 0
    fin = np.isfinite(want)
    assert np.abs(lse[fin] - want[fin]).max() < (2e-5 if dtype == np.float32 else 1e-12)
    ow = attention64(*(x.astype(np.float64) for x in (q, k, v)), m if m is None or m.dtype == bool
                     else m.astype(np.float64), sc, causal)
    assert np.abs(o - ow).max() < (2e-5 if dtype == np.float32 else 1e-12)
    kinds = {st.kernel: len(st.out_types) for st in _steps(f, args)}
    assert [n for n in kinds.values()] == [2]   # one kernel writes both


def test_plain_forward_keeps_one_result(rng):
    q, k, v, _ = _inputs(rng, 1, 2, 2, 64, 32, np.float32)
    f = ts.jit(lambda q, k, v: O.attention(q, k, v, causal=True))
    steps = _steps(f, [q, k, v])
    assert [len(st.out_types) for st in steps if "attention" in st.kernel] == [1]
    graph = ts.compile(f, q, k, v).ir("graph")
    assert "tessera.attention " in graph and not re.search(r"%\d+, %\d+ = tessera\.attention ", graph)


def _bwd_tile_ir(f, args) -> str:
    tile = ts.compile(f, *args).ir("tile")
    return re.search(r"func\.func @k\d+_attention_bwd.*?(?=func\.func @|\Z)", tile, re.S).group(0)


def test_grad_reads_the_saved_lse(rng):
    """Under grad the forward writes its LSE and the backward takes it: the Graph IR says so,
    explain lists it as saved, and the backward kernel has 5 register-tile products per key block
    (S^T, dP^T, dV, dK, dQ) instead of 6 (the statistics pass's S^T is gone)."""
    q, k, v, w = _inputs(rng, 1, 2, 2, 64, 32, np.float32)
    f = _grad_fn(True)
    graph = ts.compile(f, q, k, v, w).ir("graph")
    assert re.search(r"%\d+, %\d+ = tessera\.attention ", graph), graph
    assert re.search(r"tessera\.attention_grad .* lse %", graph), graph
    assert "attention_lse [1, 2, 64] float32: 512 B" in str(ts.explain(f, q, k, v, w))
    alone = ts.jit(lambda q, k, v, o, g: O.attention_backward(q, k, v, o, g, causal=True))
    saved_mma = _bwd_tile_ir(f, [q, k, v, w]).count("tile.mma")
    alone_mma = _bwd_tile_ir(alone, [q, k, v, w, w]).count("tile.mma")
    assert saved_mma * 6 == alone_mma * 5, (saved_mma, alone_mma)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_recompute_path_when_the_forward_is_elsewhere(rng, causal, dtype):
    """attention_backward on its own (the forward's output an input): the kernel recomputes the LSE."""
    q, k, v, w = _inputs(rng, 2, 4, 2, 150, 32, dtype)
    o = attention64(*(x.astype(np.float64) for x in (q, k, v)), None, 1 / np.sqrt(32), causal).astype(dtype)
    f = ts.jit(lambda q, k, v, o, g: O.attention_backward(q, k, v, o, g, causal=causal))
    graph = ts.compile(f, q, k, v, o, w).ir("graph")
    assert "attention_grad" in graph and " lse " not in graph
    _check(f(q, k, v, o, w), oracle(q, k, v, w, causal=causal), dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_saved_path_gradient_at_head_dim_128(rng, causal):
    q, k, v, w = _inputs(rng, 1, 4, 2, 140, 128, np.float32)
    _check(_grad_fn(causal)(q, k, v, w), oracle(q, k, v, w, causal=causal), np.float32)


def test_checkpointed_attention_saves_lse_of_the_recomputed_forward(rng):
    q, k, v, w = _inputs(rng, 1, 2, 2, 90, 32, np.float32)

    def loss(q, k, v, w):
        return O.reduce_sum(ts.checkpoint(lambda a, b, c: O.attention(a, b, c, causal=True))(q, k, v) * w)
    f = ts.jit(ts.grad(loss, argnums=(0, 1, 2)))
    _check(f(q, k, v, w), oracle(q, k, v, w, causal=True), np.float32)
    assert len(re.findall(r"%\d+, %\d+ = tessera\.attention ", ts.compile(f, q, k, v, w).ir("graph"))) == 1


def test_lse_of_the_wrong_shape_is_refused(rng):
    q, k, v, w = _inputs(rng, 1, 2, 2, 16, 8, np.float32)
    f = ts.jit(lambda q, k, v, o, g, l: O.attention_backward(q, k, v, o, g, lse=l))
    with pytest.raises(GraphShapeError, match="lse"):
        f(q, k, v, w, w, np.zeros((1, 2, 15), np.float32))


def _grad_error(monkeypatch, causal=False, alone=False):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    rng = np.random.default_rng(11)
    q, k, v, w = _inputs(rng, 1, 4, 2, 160, 32, np.float32)
    if alone:
        o = attention64(*(x.astype(np.float64) for x in (q, k, v)), None, 1 / np.sqrt(32), causal)
        got = ts.jit(lambda q, k, v, o, g: O.attention_backward(q, k, v, o, g, causal=causal))(
            q, k, v, o.astype(np.float32), w)
    else:
        got = _grad_fn(causal)(q, k, v, w)
    want = oracle(q, k, v, w, causal=causal)
    return max(np.abs(a - x).max() / np.abs(x).max() for a, x in zip(got, want))


def test_planted_lse_bugs_fail(monkeypatch):
    """Teeth: the forward's LSE off by a constant, or the backward reading the LSE of the next
    head, give gradients far off; the seams themselves are sound, and the recomputing path does
    not read the saved LSE (the same plants leave it exact)."""
    assert _grad_error(monkeypatch) < 2e-4
    real_lse, real_at = A.row_lse, AB.lse_at
    monkeypatch.setattr(A, "row_lse", lambda b, m, l, F: A.elementwise(b, "add", [real_lse(b, m, l, F),
                                                                                  A.tile_const(b, 0.25, F)]))
    assert _grad_error(monkeypatch) > 1e-2
    assert _grad_error(monkeypatch, causal=True, alone=True) < 2e-4
    monkeypatch.setattr(A, "row_lse", real_lse)
    monkeypatch.setattr(AB, "lse_at", lambda b, bidx, h, nh, ns, row: real_at(b, bidx, b.rem(b.add(h, 1), nh), nh,
                                                                             ns, row))
    assert _grad_error(monkeypatch, causal=True) > 1e-2
    assert _grad_error(monkeypatch, alone=True) < 2e-4
