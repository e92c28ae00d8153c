"""Mixed precision as users train: float32 master weights cast to bf16 for the forward, the
backward's GEMMs on bf16 operands with float32 accumulation, gradients back in float32 for the
float32 AdamW update -- one jitted step, checked against a float64 numpy oracle (forward, backward
and update written out by hand) at a bf16 tolerance; every GEMM of the step is a bf16 one; a
planted wrong gelu derivative fails the same check."""
from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

import tessera as ts
from tessera import dtypes as dt
from tessera.frontend import vjp_rules
from tessera.mma.selector import record_by_id

import oracle as O

OPS = ts.ops
BF16 = dt.bfloat16
LR, B1, B2, EPS, WD = 1e-2, 0.9, 0.999, 1e-8, 0.01


def loss(w1, w2, x, y):
    h = OPS.gelu(OPS.cast(x, BF16) @ OPS.cast(w1, BF16), approximate="erf")
    d = OPS.cast(h @ OPS.cast(w2, BF16), np.float32) - y
    return (d * d).mean()


def step(w1, w2, m1, m2, v1, v2, x, y, t):
    val, (g1, g2) = ts.value_and_grad(loss, argnums=(0, 1))(w1, w2, x, y)
    (n1, n2), (m1, m2), (v1, v2) = ts.optim.adamw([w1, w2], [g1, g2], [m1, m2], [v1, v2], t, lr=LR, b1=B1,
                                                  b2=B2, eps=EPS, weight_decay=WD)
    return val, n1, n2, m1, m2, v1, v2


def oracle(w1, w2, m1, m2, v1, v2, x, y, t):
    """float64 of the same step, on the bf16-rounded operands the program multiplies."""
    rb = lambda a: a.astype(BF16).astype(np.float64)   # noqa: E731
    xb, w1b, w2b = rb(x), rb(w1), rb(w2)
    u = xb @ w1b
    h = 0.5 * u * (1 + erf(u / math.sqrt(2)))
    d = h @ w2b - y
    val = (d * d).mean()
    dd = 2 * d / d.size
    g2 = h.T @ dd
    dh = dd @ w2b.T
    du = dh * (0.5 * (1 + erf(u / math.sqrt(2))) + u * np.exp(-u * u / 2) / math.sqrt(2 * math.pi))
    g1 = xb.T @ du
    out = [val]
    news, ms, vs = [], [], []
    for p, g, m, v in ((w1, g1, m1, v1), (w2, g2, m2, v2)):
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        p = p * (1 - LR * WD) - LR / (1 - B1 ** t) * m / (np.sqrt(v) / math.sqrt(1 - B2 ** t) + EPS)
        news.append(p)
        ms.append(m)
        vs.append(v)
    return out + news + ms + vs


def _inputs(rng):
    x = rng.standard_normal((64, 96)).astype(np.float32)
    y = rng.standard_normal((64, 80)).astype(np.float32)
    w1 = (rng.standard_normal((96, 128)) / 10).astype(np.float32)
    w2 = (rng.standard_normal((128, 80)) / 11).astype(np.float32)
    m1, m2 = (rng.standard_normal(s).astype(np.float32) * 1e-3 for s in ((96, 128), (128, 80)))
    v1, v2 = (rng.uniform(1e-7, 1e-6, s).astype(np.float32) for s in ((96, 128), (128, 80)))
    return [w1, w2, m1, m2, v1, v2, x, y, 3.0]


def _check(got, want) -> list[float]:
    """Errors: the loss, then each moment m (gradient-scaled, the part of the update that carries
    the gradient), relative to its size."""
    val, _n1, _n2, m1, m2 = got[:5]
    return [abs(float(val) - want[0]) / abs(want[0]), O.rel_err(m1, want[3]), O.rel_err(m2, want[4])]


def test_bf16_forward_backward_with_float32_master_weights(rng):
    args = _inputs(rng)
    jf = ts.jit(step)
    got = jf(*args)
    want = oracle(*[a if isinstance(a, float) else a.astype(np.float64) for a in args])
    assert all(o.dtype == np.float32 for o in got[1:]), [o.dtype for o in got]
    errs = _check(got, want)
    assert max(errs) < 1e-2, errs
    for new, ref in zip(got[1:3], want[1:3]):        # master weights: an update of ~1e-2 per element
        assert np.abs(new - ref).max() < 5e-4
    gemms = [k for k in ts.explain(jf, *args).kernels if k["kind"] == "gemm"]
    assert len(gemms) == 5                           # two forward, three backward
    assert all(record_by_id(k["mma"]["record"]).a_dtype == "bf16" for k in gemms), [k["mma"] for k in gemms]


def test_planted_wrong_gelu_derivative_fails_the_check(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")

    def phi_only(n, g, need):   # the derivative without its x * pdf(x) term
        x = vjp_rules.T(n.inputs[0])
        return [OPS.mul(g, (OPS.erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5)]

    monkeypatch.setitem(vjp_rules.RULES, "gelu", phi_only)
    args = _inputs(rng)
    got = ts.jit(lambda *a: step(*a))(*args)
    want = oracle(*[a if isinstance(a, float) else a.astype(np.float64) for a in args])
    assert max(_check(got, want)) > 5e-2
