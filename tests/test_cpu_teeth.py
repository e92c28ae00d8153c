"""The numeric gates have teeth: a bug planted in the compiler makes them fail.

Each test patches one piece of the lowering (caches off, so the patched compiler
really runs), compiles a fresh kernel and shows the float64 oracle check rejects it.
"""
from __future__ import annotations

import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera.passes.target.x86.lower_tile_to_x86 import _Lowerer
from tessera.passes.tile.kernels import gemm, rowwise


def test_off_by_one_remainder_tile_is_caught(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b = rng.standard_normal((37, 41)).astype(np.float32), rng.standard_normal((41, 29)).astype(np.float32)
    f = lambda x, w: x @ w  # noqa: E731
    ok = ts.jit(f)(a, b)
    O.assert_close(ok, O.f64(a) @ b, 1e-5)  # the gate passes on the real compiler
    orig = _Lowerer._count

    def planted(self, bld, cols, v):  # masks one column too many at every edge
        return orig(self, bld, bld.sub(cols, 1), v)

    monkeypatch.setattr(_Lowerer, "_count", planted)
    bad = ts.jit(f)(a, b)
    assert not O.gate(bad, O.f64(a) @ b, 1e-5)


def test_dropping_the_incoming_accumulator_is_caught(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((20, 30), (30, 25), (20, 25)))
    ref = O.f64(a) @ b + c
    orig = gemm.analyse

    def planted(kop):
        plan = orig(kop)
        plan.c0 = None  # a synthesised zero instead of the real accumulator
        return plan

    monkeypatch.setattr(gemm, "analyse", planted)
    assert not O.gate(ts.jit(lambda x, w, r: x @ w + r)(a, b, c), ref, 1e-5)


def test_softmax_pipeline_slot_mixup_is_caught(rng, monkeypatch):
    """Planted: every row keeps e in the same scratch slot, so row r - 1 is written from row r's
    values (with row r - 1's normaliser)."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.standard_normal((23, 300)).astype(np.float32) * 3
    O.assert_close(ts.jit(ts.ops.softmax)(x), O.softmax(x), 1e-5)
    monkeypatch.setattr(rowwise, "_slot", lambda b, r: 0)
    assert not O.gate(ts.jit(ts.ops.softmax)(x), O.softmax(x), 1e-5)


def test_wrong_softmax_normaliser_is_caught(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.standard_normal((9, 70)).astype(np.float32)
    O.assert_close(ts.jit(ts.ops.softmax)(x), O.softmax(x), 1e-5)
    orig = rowwise._reduce
    monkeypatch.setattr(rowwise, "_reduce", lambda b, kind, v: orig(b, "max", v))  # sum replaced by max
    assert not O.gate(ts.jit(ts.ops.softmax)(x), O.softmax(x), 1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # unwritten rows: any bits
def test_a_lost_work_chunk_is_caught(rng, monkeypatch):
    # rows of a shared-panel GEMM are handed out from the team's work counter: numbering
    # that skips a chunk leaves rows of C unwritten, and the gate sees it
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b = rng.standard_normal((300, 70)).astype(np.float32), rng.standard_normal((70, 90)).astype(np.float32)
    f = lambda x, w: x @ w  # noqa: E731
    art = ts.compile(f, a, b)
    assert "tile.claim" in art.ir("tile") and "tessera_x86.claim" in art.ir("target")
    O.assert_close(ts.jit(f)(a, b), O.f64(a) @ b, 1e-5)
    orig = _Lowerer.op_tile_claim

    def planted(self, op, bld):  # every claim one too far on
        orig(self, op, bld)
        self.vmap[op.result] = bld.add(self.vmap[op.result], 1)

    monkeypatch.setattr(_Lowerer, "op_tile_claim", planted)
    bad = ts.jit(f, schedule={"threads": 1})(a, b)
    assert not O.gate(bad, O.f64(a) @ b, 1e-5)


def test_a_mask_that_keeps_the_padding_columns_is_caught(rng, monkeypatch):
    """tile.mask skips its selects where a row chunk keeps every column; taking that branch
    for the last, partial chunk too lets the lanes past the row into softmax's max and sum."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.standard_normal((9, 45)).astype(np.float32)
    f = lambda x: ts.ops.softmax(x, axis=-1)  # noqa: E731
    xd = O.f64(x)
    want = np.exp(xd - xd.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    O.assert_close(ts.jit(f)(x), want, 1e-5)
    monkeypatch.setattr(_Lowerer, "_keeps_every_column", staticmethod(lambda b, cols, C: b.cmp("sge", cols, 0)))
    assert not O.gate(ts.jit(f)(x), want, 1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_row_chunks_cover_every_row_once(rng, monkeypatch, threads):
    """A shared-panel GEMM splits its row tiles into chunks of equal size (a multiple of the thread
    count, differing by one tile at most); row counts that are and are not multiples of the
    register tile, one compile for all of them.  Teeth: chunks that start one tile late leave the
    first rows of C unwritten."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    b = rng.standard_normal((70, 90)).astype(np.float32)
    f = ts.jit(lambda x, w: x @ w, schedule={"threads": threads})
    for m in (1, 7, 13, 121, 1000, 1023, 1025):
        a = rng.standard_normal((m, 70)).astype(np.float32)
        O.assert_close(f(a, b), O.f64(a) @ b, 1e-5)
    orig = gemm.chunk_start
    monkeypatch.setattr(gemm, "chunk_start", lambda bb, item, tiles, chunks: bb.add(orig(bb, item, tiles, chunks), 1))
    a = rng.standard_normal((1000, 70)).astype(np.float32)
    bad = ts.jit(lambda x, w: x @ w, schedule={"threads": threads})(a, b)
    with np.errstate(all="ignore"):   # unwritten rows hold whatever the output buffer held
        assert not O.gate(bad, O.f64(a) @ b, 1e-5)
