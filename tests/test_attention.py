"""Fused attention on the CPU lane against a float64 oracle."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera.errors import TesseraError
from tessera.frontend.reference import attention64
from tessera.mma.selector import get_isa
from tessera.passes.tile.kernels import attention as attention_kernel


def qkv(rng, b, h, hk, sq, sk, d, dv=None, dtype=np.float32, scale=1.0):
    dv = dv or d
    return (
        (rng.standard_normal((b, h, sq, d)) * scale).astype(dtype),
        rng.standard_normal((b, hk, sk, d)).astype(dtype),
        rng.standard_normal((b, hk, sk, dv)).astype(dtype),
    )


def ref(q, k, v, mask=None, causal=False, scale=None, rows="zero"):
    d = q.shape[-1]
    return attention64(O.f64(q), O.f64(k), O.f64(v), mask if mask is None or mask.dtype == bool else O.f64(mask),
                       scale if scale is not None else 1 / np.sqrt(d), causal, rows)


ATT = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))
ATT_C = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True))


@pytest.mark.parametrize("seq", [1, 7, 100, 1000, 1025])
@pytest.mark.parametrize("causal", [False, True])
def test_sequence_lengths(rng, seq, causal):
    q, k, v = qkv(rng, 1, 2, 2, seq, seq, 64)
    O.assert_close((ATT_C if causal else ATT)(q, k, v), ref(q, k, v, causal=causal), 1e-5)


@pytest.mark.parametrize("d", [32, 64, 80, 128])
@pytest.mark.parametrize("seq", [100, 1025])
def test_head_dims(rng, d, seq):
    q, k, v = qkv(rng, 1, 2, 2, seq, seq, d)
    O.assert_close(ATT(q, k, v), ref(q, k, v), 1e-5)


@pytest.mark.parametrize("sq, sk", [(7, 100), (100, 7), (1, 65), (65, 1)])
def test_causal_alignment_when_lengths_differ(rng, sq, sk):
    """Top-left alignment, as torch.nn.functional.scaled_dot_product_attention(is_causal=True)."""
    q, k, v = qkv(rng, 1, 1, 1, sq, sk, 32)
    y = ATT_C(q, k, v)
    O.assert_close(y, ref(q, k, v, causal=True), 1e-5)
    s = np.tril(np.ones((sq, sk), bool))
    assert np.allclose(y[0, 0, 0], v[0, 0, 0], atol=1e-5)  # query 0 sees key 0 only
    assert s.sum() > 0


def test_large_logits_do_not_overflow(rng):
    q, k, v = qkv(rng, 1, 2, 2, 100, 100, 64, scale=300.0)
    y = ATT(q, k, v)
    assert np.isfinite(y).all()
    # f32 rounds a logit s by |s| * 2^-24, and softmax passes that absolute error on as a relative
    # error of the weights: with logits near 1000 the bound is ~1e-4, not the 1e-5 of unit logits
    # (1.07e-5 was seen on one draw)
    s_max = float(np.abs(O.f64(q) @ O.f64(k).swapaxes(-1, -2)).max()) / np.sqrt(q.shape[-1])
    O.assert_close(y, ref(q, k, v), max(1e-5, s_max * 2.0 ** -24))


def test_grouped_query_heads(rng):
    q, k, v = qkv(rng, 2, 8, 2, 37, 53, 32, dv=48)
    O.assert_close(ATT(q, k, v), ref(q, k, v), 1e-5)
    O.assert_close(ATT_C(q, k, v), ref(q, k, v, causal=True), 1e-5)


def test_bool_mask_with_fully_masked_rows_gives_zeros(rng):
    q, k, v = qkv(rng, 2, 2, 2, 20, 30, 32)
    mask = rng.random((2, 1, 20, 30)) > 0.3
    mask[:, :, 4] = False  # every key masked for query 4
    f = ts.jit(lambda q, k, v, m: ts.ops.attention(q, k, v, mask=m))
    y = f(q, k, v, mask)
    assert np.all(y[:, :, 4] == 0)
    O.assert_close(y, ref(q, k, v, mask), 1e-5)


@pytest.mark.parametrize("mshape", [(30,), (20, 30), (2, 1, 20, 30), (1, 2, 1, 30)])
def test_additive_float_masks_broadcast(rng, mshape):
    q, k, v = qkv(rng, 2, 2, 2, 20, 30, 32)
    mask = (rng.standard_normal(mshape) * 3).astype(np.float32)
    f = ts.jit(lambda q, k, v, m: ts.ops.attention(q, k, v, mask=m, causal=True, scale=0.3))
    O.assert_close(f(q, k, v, mask), ref(q, k, v, mask, causal=True, scale=0.3), 1e-5)


def test_bf16_inputs_accumulate_in_f32(rng):
    q, k, v = qkv(rng, 1, 2, 2, 100, 120, 64, dtype=ts.bfloat16)
    y = ATT(q, k, v)
    assert y.dtype == ts.bfloat16
    O.assert_close(y, ref(q, k, v), 2e-2)


def composed(q, k, v, m):
    return ts.ops.softmax((q @ k.transpose(0, 1, 3, 2)) * 0.125 + m) @ v


def test_composed_form_is_recognised_and_keeps_nan_rows(rng):
    q, k, v = qkv(rng, 2, 3, 3, 9, 11, 16)
    mask = np.zeros((9, 11), np.float32)
    mask[2, :] = -np.inf
    mask[3, 5:] = -np.inf
    f = ts.jit(composed)
    y = f(q, k, v, mask)
    want = ref(q, k, v, mask, scale=0.125, rows="nan")
    assert np.isnan(y[:, :, 2]).all() and np.array_equal(np.isnan(y), np.isnan(want))
    fin = ~np.isnan(want)
    np.testing.assert_allclose(y[fin], want[fin], rtol=1e-4, atol=1e-5)
    rep = ts.explain(f, q, k, v, mask)
    assert [k_["kind"] for k_ in rep.kernels] == ["attention"]
    assert any(p["pass"] == "fuse-attention" and "tessera.softmax" in p["consumed"] for p in rep.passes)


def test_composed_bf16_is_left_alone(rng):
    q, k, v = qkv(rng, 1, 1, 1, 8, 8, 16, dtype=ts.bfloat16)
    m = np.zeros((8, 8), ts.bfloat16)
    assert "attention" not in [k_["kind"] for k_ in ts.explain(ts.jit(composed), q, k, v, m).kernels]


@pytest.mark.parametrize("shapes, code", [
    (((1, 2, 8, 16), (1, 2, 8, 32), (1, 2, 8, 16)), "ATTENTION_HEAD_DIM"),
    (((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 9, 16)), "ATTENTION_SEQ"),
    (((1, 3, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), "ATTENTION_HEADS"),
    (((1, 2, 8), (1, 2, 8, 16), (1, 2, 8, 16)), "RANK_MISMATCH"),
])
def test_bad_shapes(rng, shapes, code):
    arrs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    with pytest.raises(TesseraError) as e:
        ATT(*arrs)
    assert e.value.code == code


def test_bad_mask(rng):
    q, k, v = qkv(rng, 1, 2, 2, 8, 8, 16)
    f = ts.jit(lambda q, k, v, m: ts.ops.attention(q, k, v, mask=m))
    with pytest.raises(TesseraError) as e:
        f(q, k, v, np.zeros((3, 8), np.float32))
    assert e.value.code == "ATTENTION_MASK"


def test_scratch_is_o_of_the_block_not_of_the_sequence(rng):
    sizes = []
    for seq in (64, 1025):
        q, k, v = qkv(rng, 1, 1, 1, seq, seq, 64)
        c = ATT.compile(q, k, v).compiled
        prog = c.executable.program
        assert len(prog.steps) == 1  # one kernel; no score matrix between kernels
        sizes.append(prog.steps[0].workspace)
    assert sizes[0] == sizes[1], "the per-thread workspace does not grow with the sequence"
    assert sizes[0] < 2 * 1024 * 1024
    assert sizes[0] < 1025 * 1025 * 4


def test_dropping_the_rescale_fails_the_gate(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q, k, v = qkv(rng, 1, 2, 2, 200, 200, 32)
    good = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))(q, k, v)
    O.assert_close(good, ref(q, k, v), 1e-5)
    monkeypatch.setattr(attention_kernel, "rescale", lambda b, o_tile, alpha: o_tile)
    bad = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v))(q, k, v)
    assert not O.gate(bad, ref(q, k, v), 1e-5)


def test_a_causal_edge_that_ignores_the_diagonal_fails_the_gate(rng, monkeypatch):
    """The transposed kernel masks keys past each query with tile.mask {side = "ge"}; a
    lowering that drops that edge must fail the oracle."""
    from tessera.passes.target.x86 import lower_tile_to_x86 as lx
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q, k, v = qkv(rng, 1, 1, 1, 100, 100, 32)
    f = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True))
    O.assert_close(f(q, k, v), ref(q, k, v, causal=True), 1e-5)
    orig = lx._Lowerer.op_tile_mask

    def no_edge(self, op, b):  # the same op without its diagonal
        return orig(self, SimpleNamespace(input=op.input, cols=op.cols, diag=None, pad=op.pad,
                                          keep_side=op.keep_side, result=op.result), b)
    monkeypatch.setattr(lx._Lowerer, "op_tile_mask", no_edge)
    bad = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True))(q, k, v)
    assert not O.gate(bad, ref(q, k, v, causal=True), 1e-5)


# NR*W query columns per strip: four 16-lane vectors on AVX-512 (32 registers), two 8-lane ones on AVX2
# (16 registers: a 6x4 tile would not fit); a strip is 64 or 16 queries, and MR = 6 divides neither
_NR = 4 if get_isa("x86", None).register_budget >= 32 else 2
CAUSAL_PINS = [{"register_tile": (6, _NR), "tile_m": 192, "tile_n": 48},    # MR does not divide a strip
               {"register_tile": (4, _NR), "tile_m": 64, "tile_n": 256},    # key blocks longer than query blocks
               {"register_tile": (4, _NR), "tile_m": 256, "tile_n": 36}]    # many key blocks per query block


def _pin_id(p) -> str:
    return "x".join(map(str, p["register_tile"])) + f"_{p['tile_m']}_{p['tile_n']}"


@pytest.mark.parametrize("pins", CAUSAL_PINS, ids=_pin_id)
@pytest.mark.parametrize("sq,sk", [(1, 1), (7, 7), (385, 385), (300, 517), (517, 300)])
def test_causal_tiles_past_the_diagonal_are_skipped_not_wrong(rng, pins, sq, sk):
    """Causal blocks compute only the score tiles that hold a visible key, the softmax strips and
    O's k loops stop at the last visible key: every block shape agrees with the oracle."""
    q, k, v = qkv(rng, 1, 2, 2, sq, sk, 64)
    f = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True), schedule=pins)
    O.assert_close(f(q, k, v), ref(q, k, v, causal=True), 1e-5)


def test_softmax_strips_that_stop_short_of_straddling_tiles_fail_the_gate(rng, monkeypatch):
    """With MR = 6 an O row tile can straddle two 64-query strips and read P rows of the first
    strip past its last query; the strip covers them (as zeros).  Without that margin the tile
    reads stale scratch and the oracle catches it."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q, k, v = qkv(rng, 1, 4, 4, 500, 500, 64)
    pins = CAUSAL_PINS[0]
    f = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True), schedule=pins)
    O.assert_close(f(q, k, v), ref(q, k, v, causal=True), 1e-5)
    monkeypatch.setattr(attention_kernel, "straddle", lambda mr: 0)
    bad = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True), schedule=pins)(q, k, v)
    assert not O.gate(bad, ref(q, k, v, causal=True), 1e-5)


def _same_values(rng, hk, sk, dv=64):
    """Values nearly equal across keys: the output is about their common row whatever the weights,
    so scores of large magnitude (whose float32 rounding moves the weights) still meet the gate,
    and a kernel whose probabilities all underflow (output 0) fails it."""
    w = rng.standard_normal((1, hk, 1, dv))
    return (w + 1e-3 * rng.standard_normal((1, hk, sk, dv))).astype(np.float32)


@pytest.mark.parametrize("arch", ["avx2", None])
def test_block_maxima_leave_out_the_rows_past_the_keys(rng, monkeypatch, arch):
    """Without a mask, S^T's register tiles fold their column maxima into the block's maximum;
    a partial tile (1001 keys: the last block's last tile holds 5 of 6 keys with AVX2's 6x2
    tiles, 1 of 4 with AVX-512's 4x4) is left to the max pass.  Scores are all about -300:
    folding the partial tile too takes the zero scores of its padded rows, every probability
    falls below 2^-126 and the oracle catches it."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q = (-5.0 - 0.1 * rng.standard_normal((1, 2, 100, 64))).astype(np.float32)
    k = (7.5 + 0.1 * rng.standard_normal((1, 2, 1001, 64))).astype(np.float32)
    v = _same_values(rng, 2, 1001)
    f = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v), arch=arch)
    O.assert_close(f(q, k, v), ref(q, k, v), 1e-5)
    monkeypatch.setattr(attention_kernel, "whole_keys", lambda b, ir, mr, nk: b.cmp("sle", 0, 0))
    bad = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v), arch=arch)(q, k, v)
    assert not O.gate(bad, ref(q, k, v), 1e-5)


def test_causal_strips_on_the_diagonal_do_not_take_unmasked_maxima(rng, monkeypatch):
    """Keys' scores grow with their position (by about 100 a key): a key past a query outscores
    every key it sees by far more than float32's range of probabilities, so a strip that the
    diagonal crosses must compute its masked maximum, not take the block's unmasked one."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    n = 300
    q = (1.0 + 0.1 * rng.standard_normal((1, 2, n, 64))).astype(np.float32)
    k = ((1.0 + 0.1 * rng.standard_normal((1, 2, n, 64))) * np.arange(n)[None, None, :, None] * 12.5
         ).astype(np.float32)
    v = _same_values(rng, 2, n)
    f = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True))
    O.assert_close(f(q, k, v), ref(q, k, v, causal=True), 1e-5)
    monkeypatch.setattr(attention_kernel, "sees_block", lambda b, q0, c0, j0, nk: b.cmp("sle", 0, 0))
    bad = ts.jit(lambda q, k, v: ts.ops.attention(q, k, v, causal=True))(q, k, v)
    assert not O.gate(bad, ref(q, k, v, causal=True), 1e-5)


def _masked_attention(cmp):
    def f(q, k, v):
        s = q.shape[-2]
        pos = ts.ops.arange(s)
        scores = (q @ k.swapaxes(-1, -2)) * (1.0 / np.sqrt(q.shape[-1]))
        return ts.ops.softmax(ts.ops.where(cmp(pos[:, None], pos[None, :]), scores, -np.inf)) @ v
    return f


def _masked_oracle(q, k, v, keep):
    s = O.f64(q) @ np.swapaxes(O.f64(k), -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore"):   # a row with no key: NaN, as the composed form
        p = np.exp(s - s.max(-1, keepdims=True))
        return p / p.sum(-1, keepdims=True) @ O.f64(v)


@pytest.mark.parametrize("form", ["ge", "le_swapped", "band", "strict"])
def test_a_where_mask_built_from_iotas_is_attention(rng, form):
    """softmax(where(mask, scores, -inf)) @ v is recognised as attention: "row >= column" (either
    spelling) as causal (its blocks skipped), any other mask as the kernel's bool mask; a strict
    ">" is not causal (its first row has no key: NaN, as the composed form)."""
    cmp = {"ge": lambda i, j: i >= j, "le_swapped": lambda i, j: j <= i,
           "band": lambda i, j: (i >= j) & (i - j < 4), "strict": lambda i, j: i > j}[form]
    q, k, v = (rng.standard_normal((2, 3, 37, 16)).astype(np.float32) for _ in range(3))
    i, j = np.arange(37)[:, None], np.arange(37)[None, :]
    keep = {"ge": i >= j, "le_swapped": i >= j, "band": (i >= j) & (i - j < 4), "strict": i > j}[form]
    f = ts.jit(_masked_attention(cmp))
    got = f(q, k, v)
    want = _masked_oracle(q, k, v, keep)
    fin = np.isfinite(want)
    O.assert_close(np.where(fin, got, 0), np.where(fin, want, 0), 1e-5)
    assert np.array_equal(np.isnan(got), ~fin)
    art = ts.compile(f, q, k, v)
    assert [k_["kind"] for k_ in art.report().kernels].count("attention") == 1
    fused = art.ir("graph-fused")
    assert ("causal = true" in fused) == (form in ("ge", "le_swapped")), fused


def test_teeth_calling_a_strict_comparison_causal_fails(rng, monkeypatch):
    """A recogniser that took "row > column" for causal (the diagonal kept) misses the float64
    check of the graph-built mask: the first query sees no key (NaN), every other one fewer."""
    from tessera.passes.graph import fuse_attention
    monkeypatch.setattr(fuse_attention, "_row_ge_col", lambda cond: True)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q, k, v = (rng.standard_normal((1, 2, 29, 16)).astype(np.float32) for _ in range(3))
    keep = np.arange(29)[:, None] > np.arange(29)[None, :]
    got = ts.jit(_masked_attention(lambda i, j: i > j))(q, k, v)
    want = _masked_oracle(q, k, v, keep)
    fin = np.isfinite(want)
    with pytest.raises(AssertionError):
        O.assert_close(np.where(fin, got, 0), np.where(fin, want, 0), 1e-5)
        assert np.array_equal(np.isnan(got), ~fin)
