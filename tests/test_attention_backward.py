"""The flash-attention backward (``tessera.attention_grad``, kernels/attention_backward.py): what
``tessera.grad`` of an attention program runs.

Every check compares dQ, dK, dV with a float64 numpy oracle written here (the softmax Jacobian
form, dS = P * (dP - rowsum(dP * P)), not the kernel's Delta = rowsum(dO * O)) on fresh random
inputs: causal and not, grouped-query heads, a bool and an additive mask, lengths that are not
multiples of the blocks, float32 and float64, and the issue's sizes 16 x 1024 x 64 and
2 x 4096 x 64.  The workspace test shows no buffer of the backward grows with S^2; planted bugs
(Delta not subtracted, the causal diagonal block skipped) fail; the bits do not depend on the
thread count; the lane report names the kernel."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import host
from tessera.ir import dims as D
from tessera.passes.tile.kernels import attention_backward as AB
from tessera.runtime import workers
from tessera.tools import numerics as N

O = ts.ops


def oracle(q, k, v, w, mask=None, causal=False, scale=None):
    """float64 gradients of sum(attention(q, k, v) * w) w.r.t. q, k, v (per (batch, head) so the
    large shapes stay small in memory)."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
    b, h, s, d = q.shape
    hk = k.shape[1]
    g = h // hk
    sc = scale if scale is not None else 1 / np.sqrt(d)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for bi in range(b):
        for hi in range(h):
            kk, vv = k[bi, hi // g], v[bi, hi // g]
            z = q[bi, hi] @ kk.T * sc
            ok = np.ones(z.shape, bool)
            if causal:
                ok &= np.tril(np.ones(z.shape, bool))
            if mask is not None:
                mb = np.broadcast_to(mask, (b, h) + z.shape)[bi, hi]
                if mb.dtype == np.bool_:
                    ok &= mb
                else:
                    z = z + mb
            z = np.where(ok, z, -np.inf)
            mx = z.max(-1, keepdims=True)
            e = np.exp(z - np.where(np.isfinite(mx), mx, 0))
            with np.errstate(invalid="ignore"):
                p = np.nan_to_num(e / e.sum(-1, keepdims=True))
            dp = w[bi, hi] @ vv.T
            ds = p * (dp - (dp * p).sum(-1, keepdims=True))
            dq[bi, hi] = ds @ kk * sc
            dk[bi, hi // g] += ds.T @ q[bi, hi] * sc
            dv[bi, hi // g] += p.T @ w[bi, hi]
    return dq, dk, dv


def _grad_fn(causal=False, masked=False, threads=None):
    if masked:
        def loss(q, k, v, w, m):
            return O.reduce_sum(O.attention(q, k, v, causal=causal, mask=m) * w)
    else:
        def loss(q, k, v, w):
            return O.reduce_sum(O.attention(q, k, v, causal=causal) * w)
    return ts.jit(ts.grad(loss, argnums=(0, 1, 2)), **({"schedule": {"threads": threads}} if threads else {}))


def _inputs(rng, b, h, hk, s, d, dtype):
    mk = lambda *shape: rng.standard_normal(shape).astype(dtype)   # noqa: E731
    return mk(b, h, s, d), mk(b, hk, s, d), mk(b, hk, s, d), mk(b, h, s, d)


def _steps(fn, args):
    return ts.compile(fn, *args).compiled.executable.program.steps


def _kernels(fn, args) -> list[str]:
    return [st.kernel for st in _steps(fn, args)]


def _check(got, want, dtype, tol=None):
    tol = tol or (2e-4 if dtype == np.float32 else 1e-10)
    for name, a, w in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == w.shape and a.dtype == dtype, name
        err = np.abs(np.asarray(a, np.float64) - w).max() / max(np.abs(w).max(), 1e-30)
        assert err < tol, f"{name}: relative error {err:.3g}"


CASES = [   # (b, h, hk, s, d, causal, mask, dtype)
    (1, 2, 2, 37, 16, False, None, np.float32),
    (1, 2, 2, 37, 16, True, None, np.float64),
    (2, 4, 2, 150, 64, True, None, np.float32),     # grouped-query heads, two query blocks
    (1, 3, 1, 129, 32, False, None, np.float64),    # three query heads on one kv head
    (1, 2, 2, 70, 32, False, "bool", np.float32),
    (2, 2, 1, 131, 64, True, "bool", np.float64),   # bool mask and causal, some rows fully masked
    (1, 2, 2, 45, 24, False, "add", np.float32),    # additive mask (its own gradient not asked)
]


@pytest.mark.parametrize("b,h,hk,s,d,causal,mask,dtype", CASES)
def test_matches_float64_oracle(rng, b, h, hk, s, d, causal, mask, dtype):
    q, k, v, w = _inputs(rng, b, h, hk, s, d, dtype)
    args = [q, k, v, w]
    m = None
    if mask == "bool":
        m = rng.random((b, 1, s, s)) > 0.4
        m[0, 0, 3] = False   # one query row with every key masked: it contributes nothing
    elif mask == "add":
        m = (rng.standard_normal((1, 1, s, s)) * 2).astype(dtype)
    if m is not None:
        args.append(m)
    f = _grad_fn(causal, m is not None)
    assert any("attention_bwd" in n for n in _kernels(f, args))
    _check(f(*args), oracle(q, k, v, w, m, causal), dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(16, 1024, 64), (2, 4096, 64)], ids=["16x1024x64", "2x4096x64"])
def test_issue_sizes(rng, shape, causal):
    bh, s, d = shape
    q, k, v, w = _inputs(rng, 1, bh, bh, s, d, np.float32)
    f = _grad_fn(causal)
    _check(f(q, k, v, w), oracle(q, k, v, w, causal=causal), np.float32, tol=1e-4)


def _bwd_memory(s: int, mask_grad: bool = False):
    """(the attention backward kernel's workspace per thread, the largest tensor any kernel of the
    gradient program writes) at sequence length s, in bytes."""
    rng = np.random.default_rng(s)
    q, k, v, w = _inputs(rng, 1, 2, 2, s, 64, np.float32)
    if mask_grad:   # d(additive mask) asked: the composed backward, dS is S x S by definition
        f = ts.jit(ts.grad(lambda q, k, v, m: O.reduce_sum(O.attention(q, k, v, mask=m)), argnums=(0, 3)))
        args = [q, k, v, rng.standard_normal((1, 1, s, s)).astype(np.float32)]
    else:
        f, args = _grad_fn(), [q, k, v, w]
    env = {f"d{i}_{a}": n for i, x in enumerate(args) for a, n in enumerate(x.shape)}
    steps = _steps(f, args)
    ws = [st.workspace for st in steps if "attention_bwd" in st.kernel]
    big = max(int(np.prod([D.evaluate(x, env) for x in t.dims])) * np.dtype(t.dtype).itemsize
              for st in steps for t in st.out_types)
    return (ws[0] if ws else None), big


def test_workspace_does_not_grow_with_s_squared():
    (ws1, big1), (ws4, big4) = _bwd_memory(256), _bwd_memory(1024)
    assert ws1 == ws4 and ws1 < 2 * 2**20, (ws1, ws4)   # O(block^2) per thread, the same at any length
    assert big4 <= 4 * big1 + 4096   # outputs grow with S (dQ, dK, dV), not S^2
    assert big4 < 1024 * 1024 * 4    # nothing of S x S floats
    # teeth: the composed backward (an additive mask's own gradient) has an S x S tensor, which this sees
    ws_c, big_c = _bwd_memory(256, mask_grad=True)
    assert ws_c is None and big_c >= 256 * 256 * 4


def _planted(monkeypatch, name, fn, causal):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(AB, name, fn)
    rng = np.random.default_rng(7)
    q, k, v, w = _inputs(rng, 1, 2, 2, 200, 32, np.float32)
    got = _grad_fn(causal)(q, k, v, w)
    want = oracle(q, k, v, w, causal=causal)
    return max(np.abs(a - x).max() / np.abs(x).max() for a, x in zip(got, want))


def test_planted_bugs_fail(monkeypatch):
    """Teeth: dS without the Delta subtraction, and a causal query block that skips its diagonal
    key block, both give errors far above the tolerance the oracle tests use."""
    real_ds = AB.dscores
    assert _planted(monkeypatch, "dscores", real_ds, False) < 2e-4   # the seam itself is sound
    no_delta = lambda b, p, dpt, delta, sc: real_ds(b, p, dpt, AB.tile_const(b, 0.0, p.type.element_type), sc)  # noqa
    assert _planted(monkeypatch, "dscores", no_delta, False) > 1e-2
    monkeypatch.setattr(AB, "dscores", real_ds)
    short = lambda b, n, q0, bq, causal: b.min(n, q0) if causal else n   # noqa: E731
    assert _planted(monkeypatch, "keys_end", short, True) > 1e-2


@pytest.fixture
def three_threads(monkeypatch):
    real = host.usable_cpus()
    monkeypatch.setattr(host, "usable_cpus", lambda: max(3, real))
    monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: wanted)


def test_same_bits_for_any_thread_count(rng, three_threads):
    q, k, v, w = _inputs(rng, 2, 4, 2, 100, 32, np.float32)   # 4 items: (batch, kv head)
    seen = {}
    for n in (1, 2, 3):
        f = _grad_fn(True, threads=n)
        seen[n] = (N.threads_used(f, [q, k, v, w]), b"".join(N.bits(x) for x in f(q, k, v, w)))
    assert [seen[n][0] for n in (1, 2, 3)] == [1, 2, 3], "the launches must really split the work"
    assert len({b for _, b in seen.values()}) == 1


@pytest.mark.parametrize("hk", [2, 1], ids=["mha", "gqa"])
def test_gradients_are_written_to_their_own_buffers(rng, monkeypatch, hk):
    """dQ, dK and dV come out of the backward kernel as three buffers (its group holds the
    slices of the packed result): no copy kernel runs after it.  Teeth: without the grouping
    (the packed tensor, sliced by copies) the kernel list shows the copies."""
    from tessera.passes.graph import outline_kernels as OK
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    q, k, v, w = _inputs(rng, 2, 4, hk, 40, 16, np.float32)
    f = _grad_fn(True)
    kernels = _kernels(f, [q, k, v, w])
    assert kernels[-1].endswith("attention_bwd") and not any("transpose" in n for n in kernels), kernels
    _check(f(q, k, v, w), oracle(q, k, v, w, causal=True), np.float32)
    monkeypatch.setattr(OK, "slot_slices", lambda op, block: None)
    planted = _kernels(_grad_fn(True), [q, k, v, w])
    assert sum("transpose" in n for n in planted) == 3, planted


def test_one_gradient_keeps_the_packed_result(rng):
    """Only dQ asked for: the dK and dV slots still need memory (the kernel sums them in place),
    so the packed result stays and dQ is copied out of it, with the right values."""
    q, k, v, w = _inputs(rng, 1, 4, 2, 33, 16, np.float64)
    f = ts.jit(ts.grad(lambda q, k, v, w: O.reduce_sum(O.attention(q, k, v, causal=True) * w), argnums=0))
    assert sum("transpose" in n for n in _kernels(f, [q, k, v, w])) == 1
    got = f(q, k, v, w)
    want = oracle(q, k, v, w, causal=True)[0]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-10


def test_lane_report_names_the_kernel(rng):
    q, k, v, w = _inputs(rng, 1, 2, 2, 64, 32, np.float32)
    text = str(ts.explain(_grad_fn(True), q, k, v, w))
    assert "attention_bwd" in text and "tessera.attention_grad" in text


def test_composed_backward_for_a_mask_gradient(rng):
    """d(additive mask) asked for: the composed backward (named in vjp_attention's docstring: that
    gradient is dS, S x S by definition), still exact."""
    q, k, v, w = _inputs(rng, 1, 2, 2, 40, 16, np.float64)
    m = rng.standard_normal((1, 1, 40, 40))
    f = ts.jit(ts.grad(lambda q, k, v, w, m: O.reduce_sum(O.attention(q, k, v, mask=m) * w), argnums=(0, 1, 2, 4)))
    got = f(q, k, v, w, m)
    assert not any("attention_bwd" in n for n in _kernels(f, [q, k, v, w, m]))
    _check(got[:3], oracle(q, k, v, w, m), np.float64)


def test_composed_backward_for_cross_attention_lengths(rng):
    q, _, _, w = _inputs(rng, 1, 2, 2, 40, 16, np.float64)
    kx, vx = (rng.standard_normal((1, 2, 23, 16)) for _ in range(2))   # 40 queries, 23 keys
    f = _grad_fn()
    assert not any("attention_bwd" in n for n in _kernels(f, [q, kx, vx, w]))
    got = f(q, kx, vx, w)
    assert got[0].shape == q.shape and got[1].shape == kx.shape


def test_heads_split_from_one_projection_and_a_scale(rng):
    """q, k, v as transposed views of one [B, S, H*D] tensor (a GPT block's split heads), an
    explicit scale, causal: read in place through their strides."""
    b, s, h, d = 2, 77, 4, 32
    x = rng.standard_normal((b, s, h * d)).astype(np.float32)
    w = rng.standard_normal((b, h, s, d)).astype(np.float32)

    def loss(x, w):
        q = O.transpose(O.reshape(x, (b, s, h, d)), (0, 2, 1, 3))
        return O.reduce_sum(O.attention(q, q * 0.5, q, causal=True, scale=0.3) * w)
    f = ts.jit(ts.grad(loss))
    got = f(x, w)
    assert any("attention_bwd" in n for n in _kernels(f, [x, w]))
    q = x.reshape(b, s, h, d).transpose(0, 2, 1, 3)
    dq, dk, dv = oracle(q, q * 0.5, q, w, causal=True, scale=0.3)
    want = (dq + 0.5 * dk + dv).transpose(0, 2, 1, 3).reshape(b, s, h * d)
    assert np.abs(got - want).max() / np.abs(want).max() < 2e-4


def test_bf16_inputs_compute_in_float32(rng):
    import ml_dtypes
    q, k, v, w = (x.astype(ml_dtypes.bfloat16) for x in _inputs(rng, 1, 2, 2, 50, 16, np.float32))
    f = _grad_fn()
    got = f(q, k, v, w)
    assert any("attention_bwd" in n for n in _kernels(f, [q, k, v, w]))
    for a, want in zip(got, oracle(q, k, v, w)):
        assert a.dtype == q.dtype
        assert np.abs(a.astype(np.float64) - want).max() / np.abs(want).max() < 1e-2


def test_attention_backward_op_refuses_cross_shapes(rng):
    from tessera.errors import AttentionSeqError
    q, k, v, w = _inputs(rng, 1, 2, 2, 8, 16, np.float32)
    k2 = np.concatenate([k, k], axis=2)
    f = ts.jit(lambda q, k, v, o, g: O.attention_backward(q, k, v, o, g))
    with pytest.raises(AttentionSeqError, match="seq_q == seq_k"):
        f(q, k2, k2, w, w)


def test_gpu_lanes_refuse_it_by_name_without_the_saved_lse(rng):
    """The GPU kernel (tests/test_gpu_attention_backward.py) reads the forward's log-sum-exp."""
    from tessera.errors import ScheduleIllegalError
    q, k, v, w = _inputs(rng, 1, 2, 2, 64, 64, np.float16)
    f = ts.jit(lambda q, k, v, o, g: O.attention_backward(q, k, v, o, g), target="nvidia", arch="sm_90")
    with pytest.raises(ScheduleIllegalError, match="attention_grad.*nvidia"):
        ts.compile(f, q, k, v, w, w)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_16x4096x64(rng, causal):
    q, k, v, w = _inputs(rng, 1, 16, 16, 4096, 64, np.float32)
    _check(_grad_fn(causal)(q, k, v, w), oracle(q, k, v, w, causal=causal), np.float32, tol=1e-4)
