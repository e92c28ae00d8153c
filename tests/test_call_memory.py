"""A call lets go of each intermediate after the last kernel that reads it (runtime/cpu.py:
``drop_after``), so a later kernel of the same call reuses its buffer: the pooled memory of a
chain of kernels is below the sum of its intermediates, the results stay right (float64 oracle),
and a planted 'keep every intermediate to the end' needs more."""
from __future__ import annotations

import numpy as np

import tessera as ts
from tessera.runtime import cpu, memory

import oracle as O


def chain(x, w1, w2, w3):
    a = x @ w1                      # a chain of kernels; each intermediate is read by the next only
    b = ts.ops.softmax(a, -1)
    c = b @ w2
    d = ts.ops.rms_norm(c)
    return d @ w3


def chain64(x, w1, w2, w3):
    a = x @ w1
    e = np.exp(a - a.max(-1, keepdims=True))
    c = (e / e.sum(-1, keepdims=True)) @ w2
    d = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-6)
    return d @ w3


def _pooled_bytes(jf, args, monkeypatch) -> int:
    fresh = memory.BufferPool()
    monkeypatch.setattr(memory, "POOL", fresh)
    for _ in range(2):
        out = jf(*args)
    O.assert_close(out, chain64(*[O.f64(a) for a in args]), 1e-4)
    del out
    return fresh.total


def test_intermediates_are_released_after_their_last_reader(rng, monkeypatch):
    x = rng.standard_normal((512, 256)).astype(np.float32)
    w1 = rng.standard_normal((256, 1024)).astype(np.float32) / 16
    w2 = rng.standard_normal((1024, 256)).astype(np.float32) / 32
    w3 = rng.standard_normal((256, 256)).astype(np.float32) / 16
    jf = ts.jit(chain)
    jf(x, w1, w2, w3)
    live = _pooled_bytes(jf, (x, w1, w2, w3), monkeypatch)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(cpu, "drop_after", lambda program: [[] for _ in program.steps])   # planted: keep all
    jf_all = ts.jit(lambda *a: chain(*a))
    kept = _pooled_bytes(jf_all, (x, w1, w2, w3), monkeypatch)
    assert live < kept, (live, kept)
