"""Dynamic-shape buckets (``tessera.jit(dynamic=...)``, frontend/dynamic.py): lengths of one
power-of-two bucket share one compile, padded and masked, each result against a float64 oracle;
with the masks planted off the results go wrong; ops that cannot be masked are refused."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera.frontend import dynamic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from models import gpt2_block  # noqa: E402

GPT2 = dict(batch=2, seq=24, dim=64, heads=4)
gpt2_dyn = ts.jit(static_argnames="n_head", dynamic={"x": 1})(gpt2_block.forward.fn)


def test_gpt2_block_one_compile_per_bucket_and_still_attention(rng):
    base, kw = gpt2_block.make(rng, **GPT2)
    for seq in (20, 31, 25):   # one bucket: 17..32
        args = [rng.standard_normal((2, seq, 64)).astype(np.float32)] + base[1:]
        got = gpt2_dyn(*args, **kw)
        want = gpt2_block.reference(*args, xp_dtype=np.float64, **kw)
        assert got.shape == want.shape
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5, seq
        assert not np.shares_memory(got, args[0])
    assert len(gpt2_dyn.compiles) == 1, gpt2_dyn.compiles
    assert gpt2_dyn.compiles[0].startswith("dynamic bucket 32 (lengths 17..32"), gpt2_dyn.compiles
    rep = ts.explain(gpt2_dyn, *args, **kw)
    kinds = [k["kind"] for k in rep.kernels]
    # the key-length mask rides into the attention kernel beside the causal flag (fuse-attention)
    assert kinds.count("attention") == 1 and "rowwise" in kinds, kinds
    assert any("bucket 32" in n and "length 25" in n for n in rep.notes), rep.notes
    assert len(gpt2_dyn.compiles) == 1   # explain of a compiled bucket compiles nothing


def attn(q, k, v):
    """Bidirectional attention over a dynamic sequence: padded keys would take weight unmasked."""
    return ts.ops.softmax((q @ k.swapaxes(-1, -2)) * 0.25) @ v


def attn_oracle(q, k, v):
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * 0.25
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v.astype(np.float64)


attn_dyn = ts.jit(dynamic={"q": 2, "k": 2, "v": 2})(attn)


def explicit_attn(q, k, v, bias):
    return ts.ops.attention(q, k, v, mask=bias, scale=0.25)


def explicit_oracle(q, k, v, bias):
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * 0.25 + bias
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v.astype(np.float64)


ATTN_DYN = {"q": 2, "k": 2, "v": 2, "bias": 3}
explicit_dyn = ts.jit(dynamic=ATTN_DYN)(explicit_attn)


def _bias(rng, seq):   # an additive mask: its zero padding alone would let padded keys in
    return rng.standard_normal((2, 1, 1, seq)).astype(np.float32)


def _qkv(rng, seq):
    return [rng.standard_normal((2, 3, seq, 16)).astype(np.float32) for _ in range(3)]


def test_attention_key_length_mask_is_fused_and_exact(rng):
    for seq in (19, 29):
        q, k, v = _qkv(rng, seq)
        want = attn_oracle(q, k, v)
        assert np.abs(attn_dyn(q, k, v) - want).max() / np.abs(want).max() < 1e-5, seq
    assert len(attn_dyn.compiles) == 1
    kinds = [k_["kind"] for k_ in ts.explain(attn_dyn, q, k, v).kernels]
    assert "attention" in kinds and "rowwise" not in kinds and "gemm" not in kinds, kinds
    # an explicit ops.attention: the key-length mask is -inf in its additive mask
    for seq in (19, 29):
        q, k, v = _qkv(rng, seq)
        bias = _bias(rng, seq)
        want = explicit_oracle(q, k, v, bias)
        assert np.abs(explicit_dyn(q, k, v, bias) - want).max() / np.abs(want).max() < 1e-5, seq
    assert len(explicit_dyn.compiles) == 1


def composed_bias_attn(q, k, v, bias):
    """BERT's form: an additive padding bias inside the softmax, written out."""
    return ts.ops.softmax((q @ k.swapaxes(-1, -2)) * 0.25 + bias) @ v


composed_bias_dyn = ts.jit(dynamic=ATTN_DYN)(composed_bias_attn)


def test_additive_bias_and_key_length_mask_are_one_attention_kernel(rng):
    """where(key < L, s + bias, -inf) becomes one float mask where(key < L, bias, -inf) of the
    attention kernel (fuse-attention); a general condition with a bias is left composed."""
    for seq in (19, 29):
        q, k, v = _qkv(rng, seq)
        bias = _bias(rng, seq)
        want = explicit_oracle(q, k, v, bias)
        assert np.abs(composed_bias_dyn(q, k, v, bias) - want).max() / np.abs(want).max() < 1e-5, seq
    assert len(composed_bias_dyn.compiles) == 1
    kinds = [k_["kind"] for k_ in ts.explain(composed_bias_dyn, q, k, v, bias).kernels]
    assert kinds.count("attention") == 1 and "rowwise" not in kinds and "gemm" not in kinds, kinds

    def user_where(q, k, v, bias, keep):   # a user's condition: not a key length, stays composed
        s = (q @ k.swapaxes(-1, -2)) * 0.25 + bias
        return ts.ops.softmax(ts.ops.where(keep, s, -np.inf)) @ v
    keep = rng.random((2, 1, 1, 29)) < 0.8
    keep[..., 0] = True
    got = ts.jit(user_where)(q, k, v, bias, keep)
    want = explicit_oracle(q, k, v, np.where(keep, bias, -np.inf))
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    kinds = [k_["kind"] for k_ in ts.explain(ts.jit(user_where), q, k, v, bias, keep).kernels]
    assert "attention" not in kinds, kinds


def test_planted_combined_mask_without_the_key_length_fails(monkeypatch, rng):
    from tessera.passes.graph import fuse_attention
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(fuse_attention, "combined_mask", lambda cond, bias, neg_inf, new_ops: bias)
    q, k, v = _qkv(rng, 21)
    bias = _bias(rng, 21)
    got = ts.jit(dynamic=ATTN_DYN)(composed_bias_attn)(q, k, v, bias)
    want = explicit_oracle(q, k, v, bias)
    assert np.abs(got - want).max() / np.abs(want).max() > 1e-3   # padded keys took weight


def reductions(x, w):
    """x [B, S, D], w [S, N]; S dynamic.  Inputs chosen so zero padding would change each result."""
    neg = -(x * x) - 1.0                  # every real value < -1: a padded 0 - 1 = -1 would win max/argmax
    return ((x - 1.0).sum(1), x.mean(1), x.var(1), neg.max(1), ts.ops.argmax(neg, axis=1),
            ts.ops.softmax(x, axis=1), ts.ops.logsumexp(x, axis=1), ts.ops.cumsum(x, axis=1),
            (x + 1.0).swapaxes(1, 2) @ (w + 1.0)) + ts.ops.top_k(neg.swapaxes(1, 2), 3)


def reductions_oracle(x, w):
    x, w = x.astype(np.float64), w.astype(np.float64)
    neg = -(x * x) - 1.0
    e = np.exp(x - x.max(1, keepdims=True))
    return ((x - 1.0).sum(1), x.mean(1), x.var(1), neg.max(1), neg.argmax(1), e / e.sum(1, keepdims=True),
            np.log(np.exp(x).sum(1)), np.cumsum(x, 1), (x + 1.0).swapaxes(1, 2) @ (w + 1.0),
            -np.sort(-neg.swapaxes(1, 2), -1)[..., :3], np.argsort(-neg.swapaxes(1, 2), -1, kind="stable")[..., :3])


NAMES = ("sum", "mean", "var", "max", "argmax", "softmax", "logsumexp", "cumsum", "matmul", "top_k", "top_k_indices")
red_dyn = ts.jit(dynamic={"x": 1, "w": 0})(reductions)


def _errors(fn, x, w) -> dict:
    out = {}
    for name, g_, w_ in zip(NAMES, fn(x, w), reductions_oracle(x, w)):
        assert g_.shape == w_.shape, name
        out[name] = np.abs(g_ - w_).max() / max(np.abs(w_).max(), 1.0)
    return out


def test_reductions_over_the_dynamic_axis_match_float64(rng):
    for seq in (23, 17, 32):
        x = rng.standard_normal((2, seq, 5)).astype(np.float32)
        w = rng.standard_normal((seq, 3)).astype(np.float32)
        errs = _errors(red_dyn, x, w)
        assert all(e < 1e-5 for e in errs.values()), (seq, errs)
    assert len(red_dyn.compiles) == 1, red_dyn.compiles
    # a new bucket compiles once more, and is then a hit too
    for seq in (40, 61):
        x = rng.standard_normal((2, seq, 5)).astype(np.float32)
        w = rng.standard_normal((seq, 3)).astype(np.float32)
        assert all(e < 1e-5 for e in _errors(red_dyn, x, w).values()), seq
    assert len(red_dyn.compiles) == 2 and red_dyn.compiles[1].startswith("dynamic bucket 64 (lengths 33..64"), \
        red_dyn.compiles


def test_teeth_without_masks_the_results_go_wrong(rng, monkeypatch):
    """Planted: no masks inserted and no mean rescaled; every op over the padded axis except the
    scan then misses the oracle (padding alone is wrong)."""
    monkeypatch.setattr(dynamic._Masker, "mask", lambda self, x, *a, **k: x)
    monkeypatch.setattr(dynamic._Masker, "_rescale", lambda self, n, k: n)
    planted = ts.jit(dynamic={"x": 1, "w": 0})(reductions)
    x = rng.standard_normal((2, 23, 5)).astype(np.float32)
    w = rng.standard_normal((23, 3)).astype(np.float32)
    errs = _errors(planted, x, w)
    assert errs.pop("cumsum") < 1e-5   # a scan along the axis needs no mask: the padded tail is sliced off
    assert all(e > 1e-3 for e in errs.values()), errs
    q, k, v = _qkv(rng, 19)
    want = attn_oracle(q, k, v)
    assert np.abs(ts.jit(dynamic={"q": 2, "k": 2, "v": 2})(attn)(q, k, v) - want).max() / np.abs(want).max() > 1e-3
    monkeypatch.setattr(dynamic._Masker, "_attention", lambda self, n, ins: None)
    bias = _bias(rng, 19)
    want = explicit_oracle(q, k, v, bias)
    assert np.abs(ts.jit(dynamic=ATTN_DYN)(explicit_attn)(q, k, v, bias) - want).max() / np.abs(want).max() > 1e-3


def test_recompile_warning_points_at_dynamic_and_a_bucket_stays_quiet(rng, monkeypatch):
    import warnings

    from tessera.frontend import jit as J
    monkeypatch.setattr(J, "RECOMPILE_WARNING_AFTER", 2)

    def scale(x):
        return x * (1.0 / x.shape[0])   # the length is read: compiled in
    sized = ts.jit(scale)
    with pytest.warns(ts.RecompileWarning, match=r"compiled 3 times[\s\S]*dynamic="):
        for n in (5, 6, 7):
            sized(rng.standard_normal((n, 3)).astype(np.float32))
    with warnings.catch_warnings():   # the contrast: marked dynamic, the same lengths share one compile
        warnings.simplefilter("error", ts.RecompileWarning)
        f = ts.jit(lambda x: x * 2.0, dynamic={"x": 0})
        for n in (5, 6, 7, 9):
            x = rng.standard_normal((n, 3)).astype(np.float32)
            assert np.array_equal(f(x), x * 2.0)
    assert len(f.compiles) == 1


def two_lengths(x, w):
    """x [batch, seq, D], w [seq, N]: batch and seq are independent dynamic lengths."""
    return x.sum(1), ts.ops.softmax(x, axis=1), x.mean((0, 1)), (x - 1.0).swapaxes(1, 2) @ w


def two_lengths_oracle(x, w):
    x, w = x.astype(np.float64), w.astype(np.float64)
    e = np.exp(x - x.max(1, keepdims=True))
    return x.sum(1), e / e.sum(1, keepdims=True), x.mean((0, 1)), (x - 1.0).swapaxes(1, 2) @ w


def test_two_independent_lengths_one_compile_per_pair_of_buckets(rng):
    f = ts.jit(two_lengths, dynamic={"x": {0: "batch", 1: "seq"}, "w": {0: "seq"}})
    for b, seq in ((3, 20), (7, 31), (20, 18)):   # batch buckets 16, 16, 32; seq bucket 32
        x = rng.standard_normal((b, seq, 4)).astype(np.float32)
        w = rng.standard_normal((seq, 3)).astype(np.float32)
        for got, want in zip(f(x, w), two_lengths_oracle(x, w)):
            assert got.shape == want.shape and np.abs(got - want).max() / np.abs(want).max() < 1e-5, (b, seq)
    assert len(f.compiles) == 2, f.compiles
    assert f.compiles[1].startswith("dynamic buckets batch 32 (lengths 17..32, first at length 20), seq 32"), \
        f.compiles
    with pytest.raises(ts.errors.ArgumentError, match="following one length \\('seq'\\)"):
        f(x, w[:5])


def test_bucket_sizes():
    assert [dynamic.bucket(n) for n in (1, 16, 17, 64, 65, 128, 129)] == [16, 16, 32, 64, 128, 128, 256]
    assert dynamic.MIN_BUCKET == 16


@pytest.mark.parametrize("body, what", [
    (lambda x: ts.ops.layer_norm(x.swapaxes(1, 2)), "layer_norm"),
    (lambda x: x.reshape(x.shape[0] * x.shape[1], x.shape[2]), "reshape"),
    (lambda x: x[:, -1], "slice"),
    (lambda x: x[:, ::-1], "slice"),
    (lambda x: ts.ops.pad(x, ((0, 0), (0, 2), (0, 0))), "pad"),
    (lambda x: ts.ops.concatenate([x, x], axis=1), "concat"),
    (lambda x: x.sum(1) / x.shape[1], "constant"),
    (lambda x: ts.ops.top_k(x.swapaxes(1, 2), x.shape[1])[0], "top_k"),
    (lambda x: ts.ops.take(x, ts.ops.arange(3), axis=1), "take"),
])
def test_ops_that_cannot_be_masked_are_refused(body, what, rng):
    f = ts.jit(dynamic={"x": 1})(body)
    with pytest.raises(ts.errors.DynamicShapeError) as e:
        f(rng.standard_normal((2, 9, 4)).astype(np.float32))
    assert e.value.code == "DYNAMIC_SHAPE" and "dynamic=" in e.value.message and what in e.value.message, \
        e.value.message


def test_conv_over_a_dynamic_spatial_axis_is_refused(rng):
    f = ts.jit(dynamic={"x": 2})(lambda x, w: ts.ops.conv2d(x, w))
    with pytest.raises(ts.errors.DynamicShapeError, match=r"conv2d .* dynamic="):
        f(rng.standard_normal((1, 2, 9, 8)).astype(np.float32), rng.standard_normal((3, 2, 3, 3)).astype(np.float32))


def test_bad_dynamic_arguments(rng):
    x = rng.standard_normal((2, 9, 4)).astype(np.float32)
    with pytest.raises(ts.errors.ArgumentError, match="no parameter 'y'"):
        ts.jit(dynamic={"y": 1})(lambda x: x + 1.0)
    with pytest.raises(ts.errors.ArgumentError, match="axis 3 of argument 0 .* out of range for its rank 3"):
        ts.jit(dynamic={"x": 3})(lambda x: x + 1.0)(x)
    with pytest.raises(ts.errors.ArgumentError, match="share one length"):
        ts.jit(dynamic={0: 1, 1: 0})(lambda x, w: x + 1.0)(x, x[0, :5])
    with pytest.raises(ts.errors.ArgumentError, match="axes of 'x' must be an int"):
        ts.jit(dynamic={"x": "seq"})(lambda x: x + 1.0)


@pytest.mark.slow
def test_gpu_lane_bucket_emulated(rng):
    """A dynamic GEMM compiled for the NVIDIA lane, run in the warp emulator at a length inside its
    bucket: padded and sliced as on the CPU."""
    f = ts.jit(lambda x, w: x @ w, dynamic={"x": 0}, target="nvidia", arch="sm_90")
    x = rng.standard_normal((50, 64)).astype(np.float16)
    w = rng.standard_normal((64, 32)).astype(np.float16)
    art = ts.compile(f, x, w)
    assert any("bucket 64" in n for n in art.report().notes)
    got = art.emulate(x, w)
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert got.shape == want.shape and np.abs(got - want).max() / np.abs(want).max() < 2e-3


@pytest.mark.parametrize("mode", ["edge", "reflect", "constant"])
@pytest.mark.parametrize("pads", [((0, 0), (0, 0), (1, 2), (0, 0)), ((0, 0), (2, 1), (0, 0), (1, 3))])
def test_pad_with_a_dynamic_batch_and_symbolic_edges(rng, mode, pads):
    """edge / reflect padding on symbolic sizes: the pad kernel used the axis' name as a number
    (PASS_FAILED: int + str) when the last axis was left unpadded (found by the ONNX importer)."""
    from tessera import ops
    f = ts.jit(lambda x: ops.pad(x, pads, mode=mode), dynamic={0: {0: "N"}})
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 16, 5)).astype(np.float32)
        np.testing.assert_array_equal(f(x), np.pad(x, pads, mode=mode))
