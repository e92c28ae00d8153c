"""Slices, transposes and reshapes that kernels read through strides instead of copying.

A fused qkv projection split into q, k and v (slices of one buffer) feeds attention directly
(offsets into the projection's output); a slice feeding a GEMM is packed from where it lies;
a transpose that a reshape cannot see through is copied once and the reshape of the copy is
free.  Every check compares with a float64 oracle and counts the kernels that ran.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera.toolchain import find_ptxas


def _heads(t, b, s, h):
    return t.reshape(b, s, h, t.shape[-1] // h).transpose(0, 2, 1, 3)


def split_attention(qkv, h):
    b, s, three_d = qkv.shape
    q, k, v = ts.ops.split(qkv, 3, axis=-1)
    q, k, v = _heads(q, b, s, h), _heads(k, b, s, h), _heads(v, b, s, h)
    att = ts.ops.softmax((q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(three_d // 3 // h)))
    return (att @ v).transpose(0, 2, 1, 3).reshape(b, s, three_d // 3)


def split_attention_ref(qkv, h):
    x = O.f64(qkv)
    b, s, three_d = x.shape
    q, k, v = (t.reshape(b, s, h, -1).transpose(0, 2, 1, 3) for t in np.split(x, 3, -1))
    sc = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(b, s, -1)


def kinds(fn, *args, **kw):
    return [(k["kind"], k.get("ops", [])) for k in ts.explain(fn, *args, **kw).kernels]


SPLIT = ts.jit(split_attention, static_argnames="h")


@pytest.mark.parametrize("shape", [(2, 37, 3 * 64, 2), (1, 100, 3 * 96, 3)])
def test_a_split_qkv_feeds_attention_without_copies(rng, shape):
    b, s, d3, h = shape
    qkv = rng.standard_normal((b, s, d3)).astype(np.float32)
    O.assert_close(SPLIT(qkv, h=h), split_attention_ref(qkv, h), 1e-5)
    ks = kinds(SPLIT, qkv, h=h)
    att = [ops for kind, ops in ks if kind == "attention"]
    assert len(att) == 1 and att[0].count("tessera.slice") == 3, ks
    # heads merged back by the kernel's stores, and the reshape of its result is free: one kernel
    assert [kind for kind, _ in ks] == ["attention"], ks


def test_teeth_an_ignored_slice_offset_fails(rng, monkeypatch):
    """Attention reading every head from offset 0 (q, k and v all the q slice) must fail."""
    from tessera.ir import strided
    real = strided.StridedView.slice

    def no_offset(self, starts, steps, sizes):
        v = real(self, starts, steps, sizes)
        return strided.StridedView(v.arg, v.dims, v.strides, ())
    monkeypatch.setattr(strided.StridedView, "slice", no_offset)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    qkv = rng.standard_normal((1, 19, 3 * 32)).astype(np.float32)
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(split_attention, static_argnames="h")(qkv, h=1), split_attention_ref(qkv, 1), 1e-5)


def test_a_sliced_gemm_operand_is_packed_in_place(rng):
    x, w = rng.standard_normal((45, 70)).astype(np.float32), rng.standard_normal((33, 29)).astype(np.float32)
    f = ts.jit(lambda a, b: ts.ops.relu(a[3:36, 7:40].T @ b))
    O.assert_close(f(x, w), np.maximum(O.f64(x)[3:36, 7:40].T @ O.f64(w), 0), 1e-5)
    assert [kind for kind, _ in kinds(f, x, w)] == ["gemm"]


def test_sliced_qkv_attention_on_the_nvidia_emulator(rng):
    """The GPU attention kernel adds the views' offsets and writes [B, S, H, D] too (sm_90
    mma.sync, emulated)."""
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    qkv = rng.standard_normal((1, 20, 3 * 64)).astype(np.float16)

    def f(t):
        q, k, v = ts.ops.split(t, 3, axis=-1)
        q, k, v = (x.reshape(1, 20, 2, 32).transpose(0, 2, 1, 3) for x in (q, k, v))
        return ts.ops.attention(q, k, v).transpose(0, 2, 1, 3).reshape(1, 20, 64)
    art = ts.compile(f, qkv, target="nvidia", arch="sm_90")
    got = art.emulate(qkv)
    want = split_attention_ref(qkv, 2)
    assert np.abs(got.astype(np.float64) - want).max() / np.abs(want).max() < 5e-3
    assert [k["kind"] for k in art.report().kernels] == ["attention"]


def _rotate_half(t):
    h = t.shape[-1] // 2
    return ts.ops.concatenate([-t[..., h:], t[..., :h]], axis=-1)


def rope_ref(x, c, s):
    x = O.f64(x)
    h = x.shape[-1] // 2
    return x * c + np.concatenate([-x[..., h:], x[..., :h]], -1) * s


@pytest.mark.parametrize("dims", [(2, 3, 37, 64), (1, 2, 5, 22)])
def test_rope_rotate_half_is_one_kernel(rng, dims):
    """x * cos + rotate_half(x) * sin: the join along the last axis is computed per column
    segment inside one elementwise kernel, and x (used three times) is read in place."""
    x = rng.standard_normal(dims).astype(np.float32)
    c, s = (rng.standard_normal(dims[-2:]).astype(np.float32) for _ in range(2))
    f = ts.jit(lambda a, cc, ss: a * cc + _rotate_half(a) * ss)
    O.assert_close(f(x, c, s), rope_ref(x, c, s), 1e-6)
    assert [k for k, _ in kinds(f, x, c, s)] == ["elementwise"]


def test_rope_on_heads_split_from_a_projection_reads_them_in_place(rng):
    """q = (h @ w).reshape(...).transpose(0, 2, 1, 3) used three times by RoPE: the view chain
    is cloned per use (canonicalize), so the RoPE kernel reads the GEMM's output through
    strides; no transpose or reshape copy runs."""
    h, w = rng.standard_normal((2, 19, 32)).astype(np.float32), rng.standard_normal((32, 64)).astype(np.float32)
    c, s = (rng.standard_normal((19, 16)).astype(np.float32) for _ in range(2))

    def f(a, b, cc, ss):
        q = (a @ b).reshape(2, 19, 4, 16).transpose(0, 2, 1, 3)
        return q * cc + _rotate_half(q) * ss
    jf = ts.jit(f)
    q = (O.f64(h) @ w).reshape(2, 19, 4, 16).transpose(0, 2, 1, 3)
    O.assert_close(jf(h, w, c, s), rope_ref(q, c, s), 1e-5)
    assert [k for k, _ in kinds(jf, h, w, c, s)] == ["gemm", "elementwise"]


def test_teeth_a_join_segment_read_at_the_wrong_column_fails(rng, monkeypatch):
    """Reading a segment's leaves at the output column (not less the segment's start) breaks
    the second half of rotate_half."""
    from tessera.passes.tile.kernels import rows as R
    real = R.load_leaf
    calls = []

    def shifted(kf, b, lf, row_off, c, cols_left, chunk, pad=None):
        calls.append(1)
        return real(kf, b, lf, row_off, c if len(calls) % 2 else b.add(c, 1), cols_left, chunk, pad)
    monkeypatch.setattr(R, "load_leaf", shifted)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.standard_normal((3, 24)).astype(np.float32)
    c, s = (rng.standard_normal(24).astype(np.float32) for _ in range(2))
    with pytest.raises(AssertionError):
        O.assert_close(ts.jit(lambda a, cc, ss: a * cc + _rotate_half(a) * ss)(x, c, s), rope_ref(x, c, s), 1e-6)
