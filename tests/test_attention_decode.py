"""Split-K decode attention (kernels/attention_decode.py) on the CPU lane against a float64 oracle.

Shapes vary the key length (symbolic: one compile serves every length) and the group size (static:
one compile each), so the module-level jit objects compile once per (heads, queries, dtype, mask).
"""
from __future__ import annotations

import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera.frontend.reference import attention64
from tessera.passes.tile.kernels import attention_decode as decode_kernel


def qkv(rng, b, h, hk, sq, sk, d, dtype=np.float32):
    return (rng.standard_normal((b, h, sq, d)).astype(dtype), rng.standard_normal((b, hk, sk, d)).astype(dtype),
            rng.standard_normal((b, hk, sk, d)).astype(dtype))


def ref(q, k, v, mask=None, causal=False, rows="zero"):
    return attention64(O.f64(q), O.f64(k), O.f64(v), mask if mask is None or mask.dtype == bool else O.f64(mask),
                       1 / np.sqrt(q.shape[-1]), causal, rows)


def steps(fn, *args):
    return fn.compile(*args).compiled.executable.program.steps


ATT = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))
ATT_C = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True))
# reading q's shape specialises on it: a query length above 1 is then static (a length-1 axis always is)
ATT_SQ = ts.jit(lambda q, k, v: ts.ops.attention(q.reshape(q.shape), k, v))
ATT_SQ_C = ts.jit(lambda q, k, v: ts.ops.attention(q.reshape(q.shape), k, v, causal=True))
ATT_M = ts.jit(lambda q, k, v, m: ts.ops.attention(q, k, v, mask=m))
HEADS = {1: (2, 2), 4: (8, 2), 8: (8, 1)}   # GQA ratio -> (query heads, kv heads)


@pytest.mark.parametrize("ratio", [1, 4, 8])
@pytest.mark.parametrize("sk", [1, 37, 1000, 4099])
@pytest.mark.parametrize("causal", [False, True])
def test_one_query(rng, ratio, sk, causal):
    h, hk = HEADS[ratio]
    q, k, v = qkv(rng, 1, h, hk, 1, sk, 64)
    O.assert_close((ATT_C if causal else ATT)(q, k, v), ref(q, k, v, causal=causal), 1e-5)


@pytest.mark.parametrize("sk", [5, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_a_few_queries(rng, sk, causal):
    """Three queries of four heads per kv head: rows are query-major (query i, then head g)."""
    q, k, v = qkv(rng, 2, 8, 2, 3, sk, 32)
    fn = ATT_SQ_C if causal else ATT_SQ
    assert steps(fn, q, k, v)[0].kernel.endswith("attention_decode")
    O.assert_close(fn(q, k, v), ref(q, k, v, causal=causal), 1e-5)


@pytest.mark.parametrize("sk", [37, 1000])
def test_bf16_cache(rng, sk):
    q, k, v = qkv(rng, 1, 8, 2, 1, sk, 64, dtype=ts.bfloat16)
    y = ATT(q, k, v)
    assert y.dtype == ts.bfloat16
    O.assert_close(y, ref(q, k, v), 2e-2)


def test_float64(rng):
    q, k, v = qkv(rng, 1, 8, 2, 1, 1000, 40, dtype=np.float64)
    O.assert_close(ATT(q, k, v), ref(q, k, v), 1e-12)


def test_odd_head_dim_packs_v(rng):
    """A head dim that is not a whole number of O tiles reads V through per-block panels."""
    q, k, v = qkv(rng, 1, 8, 2, 1, 600, 72)
    O.assert_close(ATT(q, k, v), ref(q, k, v), 1e-5)


def test_strided_cache_is_read_in_place(rng):
    """A KV cache allocated for more keys than are filled: k/v are slices of it, not copies."""
    cache_k = rng.standard_normal((1, 2, 2048, 64)).astype(np.float32)
    cache_v = rng.standard_normal((1, 2, 2048, 64)).astype(np.float32)
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    fn = ts.jit(lambda q, ck, cv: ts.ops.attention(q, ck[:, :, :1500], cv[:, :, :1500]))
    O.assert_close(fn(q, cache_k, cache_v), ref(q, cache_k[:, :, :1500], cache_v[:, :, :1500]), 1e-5)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks(rng, kind):
    q, k, v = qkv(rng, 2, 8, 2, 1, 500, 64)
    if kind == "bool":
        m = rng.random((2, 1, 1, 500)) > 0.3
        m[1] = False   # batch 1: every key masked -> zeros, as the prefill kernel
    else:
        m = rng.standard_normal((2, 8, 1, 500)).astype(np.float32)
    y = ATT_M(q, k, v, m)
    O.assert_close(y, ref(q, k, v, mask=m), 1e-5)
    if kind == "bool":
        assert np.all(y[1] == 0)


def test_composed_form_runs_as_decode(rng):
    """softmax(q k^T * s + m) @ v recognised as attention keeps its NaN-for-empty-rows semantics."""
    q, k, v = qkv(rng, 1, 4, 4, 1, 300, 32)
    m = rng.standard_normal((1, 1, 1, 300)).astype(np.float32)
    fn = ts.jit(lambda q, k, v, m: ts.ops.softmax((q @ k.transpose(0, 1, 3, 2)) * (1 / np.sqrt(32)) + m) @ v)
    assert steps(fn, q, k, v, m)[0].kernel.endswith("attention_decode")
    O.assert_close(fn(q, k, v, m), ref(q, k, v, mask=m, rows="nan"), 1e-5)


def test_decode_kernel_is_chosen_by_shape(rng):
    q, k, v = qkv(rng, 1, 8, 2, 1, 100, 64)
    (st,) = steps(ATT, q, k, v)
    assert st.kernel.endswith("attention_decode") and st.parallel == "bh*kv"
    assert "attention_decode" in str(ts.explain(ATT, q, k, v))
    q16, k16, v16 = qkv(rng, 1, 8, 2, 16, 100, 64)   # 16 queries: the prefill kernel
    (st16,) = steps(ATT_SQ, q16, k16, v16)
    assert not st16.kernel.endswith("decode") and st16.parallel == "bh*q"
    # the partials' workspace does not grow with the keys
    long = qkv(rng, 1, 8, 2, 1, 5000, 64)
    assert steps(ATT, *long)[0].team == st.team and st.team < 1 << 20


def test_dropping_a_chunk_fails_the_gate(rng, monkeypatch):
    """4099 keys run in several chunks; a combine that leaves the last one out must fail."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q, k, v = qkv(rng, 1, 8, 2, 1, 4099, 64)
    good = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))(q, k, v)
    O.assert_close(good, ref(q, k, v), 1e-5)
    monkeypatch.setattr(decode_kernel, "combined_chunks", lambda b, n: b.sub(n, 1))
    bad = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))(q, k, v)
    assert not O.gate(bad, ref(q, k, v), 1e-5)


def test_dot_path_sums_the_whole_head_dim(rng, monkeypatch):
    """Two rows per kv head (less than half a vector): S^T as dot products along the head dim, here
    37 (a partial last vector); a dot product that leaves the last column out must fail."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q, k, v = qkv(rng, 1, 4, 2, 1, 300, 37)
    assert decode_kernel.dot_path(2, 8, True) and not decode_kernel.dot_path(8, 8, True)
    good = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))(q, k, v)
    O.assert_close(good, ref(q, k, v), 1e-5)
    monkeypatch.setattr(decode_kernel, "dot_extent", lambda b, n: b.sub(n, 1))
    bad = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))(q, k, v)
    assert not O.gate(bad, ref(q, k, v), 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("sk", [8191, 32768])
@pytest.mark.parametrize("ratio", [1, 4, 8])
def test_long_caches(rng, sk, ratio):
    h, hk = HEADS[ratio]
    q, k, v = qkv(rng, 1, h * 2, hk * 2, 1, sk, 128)
    O.assert_close(ATT(q, k, v), ref(q, k, v), 1e-5)
