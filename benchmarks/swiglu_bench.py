"""SwiGLU before/after fuse-dual-gemm, interleaved in one process (the machine may be shared: the
load average is printed beside each figure).

Run: ./dev python benchmarks/swiglu_bench.py   (from the repository root)

"before" compiles the same function with the CPU pipeline less fuse-dual-gemm (two gemm kernels,
the second reading x @ w1 from memory); "after" is the default (one dual gemm kernel).  Shapes are
the Llama block's MLP (examples/models/llama_block.py): h [1, S, D] @ w1/w3 [D, hidden], then the
full MLP with the down projection @ w2 [hidden, D].
"""
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.getcwd())
import tessera as ts  # noqa: E402
from tessera.passes import pipelines  # noqa: E402
from tessera.tools.bench_cpu import _interleaved  # noqa: E402

SIZES = {"small": (256, 512, 1408), "large": (1024, 1024, 2816)}
PROGRAMS = {"gate": lambda h, w1, w3, w2: ts.ops.silu(h @ w1) * (h @ w3),
            "mlp": lambda h, w1, w3, w2: (ts.ops.silu(h @ w1) * (h @ w3)) @ w2}


def oracle(which, h, w1, w3, w2):
    h = h.astype(np.float64)
    p, q = h @ w1, h @ w3
    g = p / (1 + np.exp(-p)) * q
    return g if which == "gate" else g @ w2


def compiled_without_dual(fn, args):
    saved = pipelines.CPU_GRAPH_PASSES
    pipelines.CPU_GRAPH_PASSES = pipelines.GRAPH_PASSES
    os.environ["TESSERA_NO_CACHE"] = "1"      # the cache key names the pipeline, not its passes
    try:
        fn(*args)
        return len(ts.explain(fn, *args).kernels)
    finally:
        pipelines.CPU_GRAPH_PASSES = saved
        del os.environ["TESSERA_NO_CACHE"]


def main() -> None:
    rng = np.random.default_rng(0)
    for size, (s, d, hidden) in SIZES.items():
        h = rng.standard_normal((1, s, d)).astype(np.float32)
        w1, w3 = ((rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(np.float32) for _ in range(2))
        w2 = (rng.standard_normal((hidden, d)) / np.sqrt(hidden)).astype(np.float32)
        args = (h, w1, w3, w2)
        for which, prog in PROGRAMS.items():
            after, before = ts.jit(prog), ts.jit(lambda *a, _p=prog: _p(*a))
            after(*args)
            nb, na = compiled_without_dual(before, args), len(ts.explain(after, *args).kernels)
            want = oracle(which, *args)
            for f in (after, before):
                got = f(*args)
                assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
            load0 = os.getloadavg()[0]
            res, rounds = _interleaved({"before": (before, args), "after": (after, args)})
            load1 = os.getloadavg()[0]
            med = {k: statistics.median(v["times_s"]) * 1e3 for k, v in res.items()}
            print(f"{size:5s} {which:4s} h[1,{s},{d}] w1/w3[{d},{hidden}]: before {med['before']:8.2f} ms "
                  f"({nb} kernels)  after {med['after']:8.2f} ms ({na} kernels)  before/after "
                  f"{med['before'] / med['after']:.3f}  ({rounds} rounds, load average {load0:.2f} -> {load1:.2f})",
                  flush=True)


def llama() -> None:
    """The whole Llama block (examples/models/llama_block.py) before / after."""
    sys.path.insert(0, os.path.join(os.getcwd(), "examples"))
    from models import llama_block as m
    rng = np.random.default_rng(0)
    for size, dims in m.SIZES.items():
        args, kw = m.make(rng, **dims)
        after = m.forward
        before = ts.jit(m.forward.fn, static_argnames=("n_head", "n_kv"))
        after(*args, **kw)
        saved = pipelines.CPU_GRAPH_PASSES
        pipelines.CPU_GRAPH_PASSES = pipelines.GRAPH_PASSES
        os.environ["TESSERA_NO_CACHE"] = "1"
        try:
            before(*args, **kw)
            nb = len(ts.explain(before, *args, **kw).kernels)
        finally:
            pipelines.CPU_GRAPH_PASSES = saved
            del os.environ["TESSERA_NO_CACHE"]
        na = len(ts.explain(after, *args, **kw).kernels)
        want = m.reference(*args, xp_dtype=np.float64, **kw)
        for f in (after, before):
            got = f(*args, **kw)
            assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
        load0 = os.getloadavg()[0]
        res, rounds = _interleaved({"before": (lambda *a: before(*a, **kw), args),
                                    "after": (lambda *a: after(*a, **kw), args)})
        load1 = os.getloadavg()[0]
        med = {k: statistics.median(v["times_s"]) * 1e3 for k, v in res.items()}
        print(f"{size:5s} llama block: before {med['before']:8.2f} ms ({nb} kernels)  after {med['after']:8.2f} ms "
              f"({na} kernels)  before/after {med['before'] / med['after']:.3f}  ({rounds} rounds, load average "
              f"{load0:.2f} -> {load1:.2f})", flush=True)


if __name__ == "__main__":
    main()
    llama()
