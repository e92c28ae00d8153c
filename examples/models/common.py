"""What every model example shares: random parameters, the float64 check, and the script's
lane report and timing next to torch and jax (when installed).

A model module defines ``SIZES`` (name -> dict of sizes), ``make(rng, **sizes)`` -> (args,
kwargs) of float32 arrays and static settings, ``forward`` (written with ``tessera.ops`` and
numpy-style operators), ``reference(*args, xp_dtype, **kwargs)`` in numpy (float64 for the
oracle, float32 as the numpy peer), and optionally ``torch_forward`` / ``jax_forward`` (the
same model written for those frameworks, taking the same arguments).
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time

import numpy as np


def param(rng, *shape, scale: float | None = None) -> np.ndarray:
    """A weight of ``shape`` with fan-in scaling (random, never zeros)."""
    s = scale if scale is not None else 1.0 / math.sqrt(shape[0])
    return (rng.standard_normal(shape) * s).astype(np.float32)


def gain(rng, n: int) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def bias(rng, n: int) -> np.ndarray:
    return (0.1 * rng.standard_normal(n)).astype(np.float32)


# ---------------------------------------------------------------------------- numpy helpers
def layer_norm(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def rms_norm(x, g, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    from scipy.special import erf
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def silu(x):
    return x / (1 + np.exp(-x))


def cast_all(args, dtype):
    return [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]


# ---------------------------------------------------------------------------- the script
def peers(model, args, kwargs) -> dict:
    """name -> zero-argument callable, for every framework installed (same inputs)."""
    out = {}
    f32 = cast_all(args, np.float32)
    out["numpy"] = lambda: model.reference(*f32, xp_dtype=np.float32, **kwargs)
    try:
        import torch
        if hasattr(model, "torch_forward"):
            targs = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]

            def eager():
                with torch.no_grad():
                    return model.torch_forward(*targs, **kwargs)
            out["torch"] = eager
            compiled = torch.compile(lambda *a: model.torch_forward(*a, **kwargs))

            def comp():
                with torch.no_grad():
                    return compiled(*targs)
            out["torch.compile"] = comp
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp
        if hasattr(model, "jax_forward"):
            jargs = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            jf = jax.jit(lambda *a: model.jax_forward(*a, **kwargs))
            out["jax.jit"] = lambda: jax.block_until_ready(jf(*jargs))   # (a tuple for several outputs)
    except ImportError:
        pass
    return out


def interleaved(cands: dict, rounds: int = 9, warmup: int = 2) -> dict:
    """Median seconds of each candidate, called in interleaved rounds after warm-up."""
    for f in cands.values():
        for _ in range(warmup):
            f()
    times = {k: [] for k in cands}
    for _ in range(rounds):
        for k, f in cands.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main(model, size: str | None = None) -> None:
    """Run ``model`` as a script: check it against float64, print its lane report and its time
    next to the peers installed."""
    import tessera as ts
    size = size or (sys.argv[1] if len(sys.argv) > 1 else next(iter(model.SIZES)))
    rng = np.random.default_rng(0)
    args, kwargs = model.make(rng, **model.SIZES[size])
    t0 = time.perf_counter()
    got = model.forward(*args, **kwargs)
    compile_s = time.perf_counter() - t0
    want = model.reference(*args, xp_dtype=np.float64, **kwargs)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    err = max(float(np.abs(np.asarray(g, np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
              for g, w in zip(got, want))
    print(ts.explain(model.forward, *args, **kwargs))
    name = os.path.splitext(os.path.basename(model.__file__))[0]
    print(f"\n{name} [{size}]: first call {compile_s:.2f} s, max error relative to "
          f"float64 {err:.2e}")
    cands = {"tessera": lambda: model.forward(*args, **kwargs), **peers(model, args, kwargs)}
    med = interleaved(cands)
    best = min((v, k) for k, v in med.items() if k != "tessera")
    for k, v in med.items():
        print(f"  {k:14s} {v * 1e3:9.3f} ms")
    print(f"  tessera / fastest peer ({best[1]}): {best[0] / med['tessera']:.2f}x")
