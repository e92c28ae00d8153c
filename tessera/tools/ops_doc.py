"""``docs/ops.md``: every op of the registry (``tessera/ir/opset.py``) with the dtypes the tracer
takes, its kernel family and fusion, and what each lane does with it.

Nothing in the table is typed by hand.  The family, the GPU mode and the ``tessera.ops`` names
come from the registry; the dtype column comes from tracing each op's example program
(:data:`EXAMPLES`) with its data operands in every dtype and keeping those that record the op
without an error.  ``tests/test_opset.py`` runs the examples through the CPU lane against the
float64 reference lane and through the GPU lanes' compilers (slow), so the registry's
declarations are checked against the code.
"""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.ir import opset

DTYPES = (np.float64, np.float32, np.float16, dt.bfloat16, np.int8, np.uint8, np.int32, np.int64, np.bool_)


def data(dtype, *shape, seed: int = 0, positive: bool = False) -> np.ndarray:
    """Random values of ``shape`` in ``dtype`` (never all zeros)."""
    r = np.random.default_rng(seed)
    d = np.dtype(dtype)
    if d == np.bool_:
        return r.random(shape) > 0.5
    if d.kind in "iu":
        lo = 1 if positive else -5
        return r.integers(lo, 6, shape).astype(d)
    v = r.standard_normal(shape)
    return (np.abs(v) + 0.5 if positive else v).astype(d)


def _idx(n: int, *shape, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, shape).astype(np.int64)


def _unary(name: str):
    def make(d):
        return (lambda x: getattr(ops, name)(x)), (data(d, 4, 8, positive=name in ("log", "sqrt", "rsqrt")),)
    return make


def _binary(name: str):
    def make(d):
        pos = name in ("pow", "floor_divide", "mod", "left_shift", "right_shift", "div")
        return (lambda a, b: getattr(ops, name)(a, b)), (data(d, 4, 8), data(d, 4, 8, seed=2, positive=pos))
    return make


def _call(fn, *shapes_or_arrays):
    """An example of ``fn`` on data operands of the given shapes (in the dtype under test; the
    k-th with seed k) and fixed extra arrays (integer indices)."""
    def make(d):
        return fn, tuple(data(d, *s, seed=i) if isinstance(s, tuple) else s for i, s in enumerate(shapes_or_arrays))
    return make


def _attention_bwd(q, k, v, g):
    from tessera.frontend.attention_grad import saved_lse
    o = ops.attention(q, k, v, causal=True)
    return ops.attention_backward(q, k, v, o, g, causal=True, lse=saved_lse(o._node))


EXAMPLES = {}
for _n in ("neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "tanh", "erf", "sigmoid", "relu", "silu", "gelu",
           "sqrt", "rsqrt", "reciprocal", "square", "sin", "cos", "sign", "floor", "ceil", "round", "isnan", "isinf",
           "isfinite", "bitwise_not", "softmax", "log_softmax", "layer_norm", "rms_norm"):
    EXAMPLES[_n] = _unary(_n)
for _n in ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "floor_divide", "mod", "equal", "not_equal",
           "less", "less_equal", "greater", "greater_equal", "bitwise_and", "bitwise_or", "bitwise_xor",
           "left_shift", "right_shift"):
    EXAMPLES[_n] = _binary(_n)
EXAMPLES.update({
    "cast": lambda d: ((lambda x: x.astype(np.float32 if np.dtype(d) != np.float32 else np.float64)),
                       (data(d, 4, 8),)),
    "where": lambda d: ((lambda c, a, b: ops.where(c, a, b)),
                        (data(np.bool_, 4, 8), data(d, 4, 8, seed=1), data(d, 4, 8, seed=2))),
    "iota": lambda d: ((lambda x: x + ops.iota((4, 8), axis=1, dtype=d)), (data(d, 4, 8),)),
    "constant": lambda d: ((lambda x: x * 3), (data(d, 4, 8),)),
    "transpose": _call(lambda x: ops.transpose(x) * 1, (4, 8)),
    "reshape": _call(lambda x: ops.reshape(x, (8, 4)) * 1, (4, 8)),
    "slice": _call(lambda x: x[:, 1:7:2] * 1, (4, 8)),
    "concat": _call(lambda a, b: ops.concatenate([a, b], axis=-1), (4, 8), (4, 3)),
    "pad": _call(lambda x: ops.pad(x, ((1, 1), (2, 0))), (4, 8)),
    "take": _call(lambda t, i: ops.take(t, i, axis=0), (10, 8), _idx(10, 3)),
    "take_along_axis": _call(lambda x, i: ops.take_along_axis(x, i, axis=-1), (4, 8), _idx(8, 4, 3)),
    "scatter_add": _call(lambda u, i: ops.scatter_add((6, 8), i, u, axis=0), (5, 8), _idx(6, 5)),
    # the forward's output and saved log-sum-exp, as attention's vjp rule passes them
    "attention_grad": _call(lambda q, k, v, g: _attention_bwd(q, k, v, g),
                            (1, 2, 16, 16), (1, 2, 16, 16), (1, 2, 16, 16), (1, 2, 16, 16)),
    "one_hot": lambda d: ((lambda i: ops.one_hot(i, 6)), (data(d, 5, positive=True) % 6,)),
    "matmul": _call(lambda a, b: a @ b, (16, 24), (24, 8)),
    "conv_patches": _call(lambda x, w: ops.conv2d(x, w), (1, 4, 6, 6), (8, 4, 3, 3)),
    "attention": _call(lambda q, k, v: ops.attention(q, k, v, causal=True), (1, 2, 16, 16), (1, 2, 16, 16),
                       (1, 2, 16, 16)),
    "logsumexp": _call(lambda x: ops.logsumexp(x, axis=-1), (4, 8)),
    "argmax": _call(lambda x: ops.argmax(x, axis=-1), (4, 8)),
    "argmin": _call(lambda x: ops.argmin(x, axis=-1), (4, 8)),
    "top_k": _call(lambda x: ops.top_k(x, 3), (4, 8)),
    "cross_entropy": _call(lambda x, lab: ops.cross_entropy(x, lab), (4, 8), _idx(8, 4)),
    "reduce_sum": _call(lambda x: ops.reduce_sum(x, axis=-1), (4, 8)),
    "reduce_mean": _call(lambda x: ops.reduce_mean(x, axis=-1), (4, 8)),
    "reduce_max": _call(lambda x: ops.reduce_max(x, axis=-1), (4, 8)),
    "reduce_prod": _call(lambda x: ops.prod(x, axis=-1), (4, 8)),
    "reduce_any": _call(lambda x: ops.any(x, axis=-1), (4, 8)),
    "reduce_all": _call(lambda x: ops.all(x, axis=-1), (4, 8)),
    "cumsum": _call(lambda x: ops.cumsum(x, axis=-1), (4, 8)),
    "cumprod": _call(lambda x: ops.cumprod(x, axis=-1), (4, 8)),
})


def example(name: str, dtype=np.float32):
    """(fn, args) of the op's example with its data operands in ``dtype``."""
    return EXAMPLES[name](dtype)


def records(name: str, dtype) -> bool:
    """Whether tracing the op's example with ``dtype`` data records the op, on operands of that
    dtype (not on a conversion the function put first), without an error."""
    from tessera.errors import TesseraError
    from tessera.frontend.trace import ARRAY, trace
    fn, args = example(name, dtype)
    try:
        graph = trace(fn, list(args), [ARRAY] * len(args))
    except TesseraError:
        return False
    want = dt.as_dtype(dtype)
    return any(n.op == name and want in ([i.dtype for i in n.inputs] or [n.dtype]) for n in graph.nodes)


def traced_dtypes(name: str) -> list:
    return [d for d in DTYPES if records(name, d)]


def kinds_of(dtypes) -> str:
    return "".join(sorted({dt.kind(dt.as_dtype(d)) for d in dtypes}, key="fib".index))


def render() -> str:
    kernels = [d for d in opset.OPS.values() if d.family != "structure"]
    lines = ["# Ops", "",
             "From the op registry (`tessera/ir/opset.py`) and from tracing each op's example with every dtype",
             "(`tessera/tools/ops_doc.py`): *dtypes* are those the op's operands may have in Graph IR (a function",
             "may convert first: `x / y` of ints divides in float32, `isnan` of an int is all false).",
             "",
             f"{len(kernels)} Graph IR ops, recorded by {len(_api_names())} `tessera.ops` functions and Tensor "
             f"operators ({len(opset.COMPOSITES)} of the functions are made of other ops: see the end).",
             "", "Every op runs on the CPU lane (`target=\"cpu\"`, x86-64 through LLVM) in every dtype listed.",
             "GPU lanes (`nvidia`, `rocm`):", ""]
    lines += [f"- **{k}**: {v}" for k, v in opset.GPU_MODES.items()]
    for fam, fusion in opset.FAMILIES.items():
        rows = [d for d in kernels if d.family == fam]
        if not rows:
            continue
        lines += ["", f"## {fam} ({len(rows)})", "", f"Fusion: {fusion}.", "",
                  "| op | tessera.ops / operators | dtypes | GPU lanes | meaning |", "|---|---|---|---|---|"]
        for d in rows:
            dts = ", ".join(dt.name(dt.as_dtype(x)) for x in traced_dtypes(d.name))
            api = ", ".join(f"`{_cell(a)}`" for a in d.api)
            lines.append(f"| `{d.name}` | {api} | {dts} | {d.gpu} | {_cell(d.summary)} |")
    lines += ["", "## Functions made of other ops", "", "| tessera.ops | records |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in sorted(opset.COMPOSITES.items())]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _api_names() -> set:
    return {a for d in opset.OPS.values() for a in d.api}


__all__ = ["DTYPES", "EXAMPLES", "data", "example", "kinds_of", "records", "render", "traced_dtypes"]
