"""The main job: a small transformer block through all four layers on the CPU lane.

layer_norm -> attention written as batched matmul + softmax -> residual -> MLP with
gelu -> residual, compiled with ``@tessera.jit``, checked against a float64 numpy
oracle, then timed against the same block written in numpy (float32).
"""
from __future__ import annotations

import math
import time

import numpy as np

import tessera as ts


def make_block(seq: int, dim: int, heads: int):
    dh = dim // heads
    scale = 1.0 / math.sqrt(dh)

    def block(x, g1, b1, wq, wk, wv, wo, g2, b2, w1, c1, w2, c2):
        h = ts.ops.layer_norm(x, g1, b1)
        q = (h @ wq).reshape(seq, heads, dh).transpose(1, 0, 2)
        k = (h @ wk).reshape(seq, heads, dh).transpose(1, 2, 0)
        v = (h @ wv).reshape(seq, heads, dh).transpose(1, 0, 2)
        p = ts.ops.softmax((q @ k) * scale)
        a = (p @ v).transpose(1, 0, 2).reshape(seq, dim)
        x = x + a @ wo
        h = ts.ops.layer_norm(x, g2, b2)
        return x + ts.ops.gelu(h @ w1 + c1) @ w2 + c2

    def numpy_block(x, g1, b1, wq, wk, wv, wo, g2, b2, w1, c1, w2, c2):
        def ln(t, g, b):
            mu = t.mean(-1, keepdims=True)
            return (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

        h = ln(x, g1, b1)
        q = (h @ wq).reshape(seq, heads, dh).transpose(1, 0, 2)
        k = (h @ wk).reshape(seq, heads, dh).transpose(1, 2, 0)
        v = (h @ wv).reshape(seq, heads, dh).transpose(1, 0, 2)
        s = (q @ k) * scale
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        a = (p @ v).transpose(1, 0, 2).reshape(seq, dim)
        x = x + a @ wo
        h = ln(x, g2, b2)
        u = h @ w1 + c1
        u = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
        return x + u @ w2 + c2

    return block, numpy_block


def make_inputs(rng, seq: int, dim: int):
    f = np.float32
    s = 1 / math.sqrt(dim)
    shapes = [(seq, dim), (dim,), (dim,), (dim, dim), (dim, dim), (dim, dim), (dim, dim), (dim,), (dim,),
              (dim, 4 * dim), (4 * dim,), (4 * dim, dim), (dim,)]
    out = []
    for i, sh in enumerate(shapes):
        a = rng.standard_normal(sh)
        if len(sh) == 2 and i:
            a = a * s
        if i in (1, 7):
            a = 1 + 0.1 * a
        out.append(a.astype(f))
    return out


def _median_ms(fn, args, reps: int = 9) -> float:
    fn(*args)
    ts_ = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        ts_.append(time.perf_counter() - t0)
    return float(np.median(ts_) * 1e3)


def main(args) -> int:
    seq, dim, heads = args.seq, args.dim, 4
    rng = np.random.default_rng()
    block, numpy_block = make_block(seq, dim, heads)
    inputs = make_inputs(rng, seq, dim)
    jf = ts.jit(block)
    t0 = time.perf_counter()
    y = jf(*inputs)
    first = time.perf_counter() - t0
    ref = numpy_block(*[a.astype(np.float64) for a in inputs])
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    report = ts.explain(jf, *inputs)
    print(report)
    print()
    print(f"transformer block: seq={seq} dim={dim} heads={heads} mlp={4 * dim}")
    print(f"  first call (trace + compile + run): {first * 1e3:.0f} ms   cache: {report.cache}")
    print(f"  layers traversed: {' -> '.join(report.layers)}   lane: {report.lane}")
    print(f"  vs float64 numpy oracle: relative error {err:.2e}  ({'OK' if err < 1e-5 else 'FAIL'})")
    t_ts = _median_ms(jf, inputs)
    t_np = _median_ms(numpy_block, inputs)
    print(f"  time (median of 9): tessera {t_ts:.2f} ms, numpy {t_np:.2f} ms  -> {t_np / t_ts:.2f}x numpy")
    return 0 if err < 1e-5 and report.layers == ["graph", "schedule", "tile", "target"] else 1
