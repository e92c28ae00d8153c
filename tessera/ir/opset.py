"""The op registry: one entry per Graph IR op, read by every layer that needs to know about ops.

An entry (:class:`OpDef`) holds what is true of an op everywhere: its kernel family (which
kernel generator it becomes, and so how it fuses), the element kinds its operands may have,
the ``tessera.ops`` functions and Tensor operators that record it, what the GPU lanes do with
it, and a one-line meaning.  Readers:

* the tracer (``frontend/ops.py``, ``frontend/ops_typed.py``) checks operand kinds against
  :func:`kinds` and records only registered ops (``frontend/trace.add_node``);
* the Graph IR verifier (``ir/graph.py``) takes the kinds its generic check allows from here;
* ``docs/ops.md`` (``tools/ops_doc.py``) is rendered from these entries plus what tracing each
  op's example with every dtype shows, and drift-tested;
* ``tests/test_opset.py`` checks the entries against the dialect, ``tessera.ops.__all__``, the
  tracer and (slow) real GPU compiles, so a declaration cannot drift from the code.

A new op is one entry here, its Graph IR class, its frontend function and its kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

# kernel families: what the op becomes, and how it fuses
FAMILIES = {
    "elementwise": "one loop nest with its elementwise neighbours; fused into GEMM/conv epilogues and prologues "
                   "and into row kernels",
    "view": "a strided view its consumer reads in place; a copy kernel only where no stride expresses it",
    "source": "computed inside the kernel that reads it (no buffer)",
    "gemm": "GEMM kernel family (packed panels, register tiles, the MMA selector); an elementwise epilogue DAG "
            "and a gathered or strided A are fused",
    "attention": "flash attention (the score matrix never exists); masks built with where/iota are recognised",
    "row": "a row kernel (one pass per row, statistics in registers); elementwise producers fused into it",
    "reduction": "reduction kernel (vector accumulators, deterministic order)",
    "scan": "scan kernel along the axis",
    "gather": "read in place by its consumer where it feeds an elementwise chain or a GEMM's A; else a gather kernel",
    "pad": "its own copy kernel",
    "structure": "structure of fused programs (no kernel of its own)",
    "scatter": "a scatter kernel: each worker owns column blocks of the result and adds the updates in index "
               "order (the same bits for any thread count)",
}

# what the GPU lanes (nvidia, rocm) do with an op
GPU_MODES = {
    "kernel": "a GPU kernel of its own (GEMM / attention: f16/bf16, f32 with math_mode tf32; memory-bound "
              "kernels: f16/bf16/f32), and fused where its family fuses",
    "epilogue": "fused into a GEMM or attention epilogue; refused as a kernel of its own (SCHEDULE_ILLEGAL)",
    "refused": "refused with a coded error naming the op and the lane",
}

# element kinds, as dtypes.kind spells them
KIND_NAMES = {"f": "float", "i": "int", "b": "bool"}


@dataclass(frozen=True)
class OpDef:
    name: str                   # tessera.<name> in Graph IR; the trace node's op
    family: str                 # a FAMILIES key
    kinds: str                  # element kinds its (data) operands may have: letters of KIND_NAMES
    api: tuple[str, ...]        # tessera.ops functions, Tensor operators and methods that record it
    gpu: str                    # a GPU_MODES key
    summary: str


OPS: dict[str, OpDef] = {}


def _op(name: str, family: str, kinds: str, api: str, gpu: str, summary: str) -> None:
    assert family in FAMILIES and gpu in GPU_MODES and set(kinds) <= set(KIND_NAMES), name
    assert name not in OPS, name
    OPS[name] = OpDef(name, family, kinds, tuple(a.strip() for a in api.split(",") if a.strip()), gpu, summary)


E, EPI, NO = "elementwise", "kernel", "refused"   # EPI: fused into epilogues, and a GPU kernel of its own
# ---- elementwise, one operand
_op("neg", E, "fi", "neg, unary -", EPI, "-x")
_op("abs", E, "fi", "abs, abs()", EPI, "|x|")
_op("exp", E, "f", "exp", EPI, "e ** x")
_op("exp2", E, "f", "exp2", NO, "2 ** x")
_op("expm1", E, "f", "expm1", NO, "e ** x - 1, accurate near 0")
_op("log", E, "f", "log", "kernel", "natural logarithm (NaN below 0, -inf at 0)")
_op("log1p", E, "f", "log1p", NO, "log(1 + x), accurate near 0")
_op("tanh", E, "f", "tanh", EPI, "hyperbolic tangent")
_op("erf", E, "f", "erf", EPI, "the error function")
_op("sigmoid", E, "f", "sigmoid", EPI, "1 / (1 + e ** -x), no overflow")
_op("relu", E, "f", "relu", EPI, "max(x, 0)")
_op("silu", E, "f", "silu", EPI, "x * sigmoid(x)")
_op("gelu", E, "f", "gelu", EPI, "x * Phi(x), approximate='tanh' or 'erf'")
_op("sqrt", E, "f", "sqrt, ** 0.5", EPI, "square root")
_op("rsqrt", E, "f", "rsqrt", EPI, "1 / sqrt(x)")
_op("reciprocal", E, "f", "reciprocal", EPI, "1 / x")
_op("square", E, "f", "square", EPI, "x * x")
_op("sin", E, "f", "sin", EPI, "sine (radians)")
_op("cos", E, "f", "cos", EPI, "cosine (radians)")
_op("sign", E, "f", "sign", EPI, "-1, 0 or 1 (signed zero and NaN kept)")
_op("floor", E, "f", "floor", EPI, "largest integer <= x")
_op("ceil", E, "f", "ceil", EPI, "smallest integer >= x")
_op("round", E, "f", "round", EPI, "nearest integer, ties to even")
_op("isnan", E, "f", "isnan", EPI, "x is NaN -> bool (an int is never NaN)")
_op("isinf", E, "f", "isinf", EPI, "x is +-inf -> bool")
_op("isfinite", E, "f", "isfinite", EPI, "x is neither NaN nor +-inf -> bool")
_op("bitwise_not", E, "ib", "bitwise_not, logical_not, ~", EPI, "bitwise not on ints, not on bool")
_op("cast", E, "fib", "cast, .astype()", EPI, "dtype conversion; float -> int truncates and saturates, NaN -> 0")
# ---- elementwise, two operands (numpy broadcasting, JAX promotion)
_op("add", E, "fi", "add, +", EPI, "a + b")
_op("sub", E, "fi", "sub, -", EPI, "a - b")
_op("mul", E, "fi", "mul, *", EPI, "a * b")
_op("div", E, "f", "div, /", EPI, "a / b (int / int is float, as JAX's true division)")
_op("maximum", E, "fi", "maximum, clip", EPI, "elementwise max (NaN wins)")
_op("minimum", E, "fi", "minimum, clip", EPI, "elementwise min (NaN wins)")
_op("pow", E, "f", "pow, **", EPI, "a ** b (small integer exponents traced as multiplies)")
_op("floor_divide", E, "fi", "floor_divide, //", EPI, "floor(a / b); int division by 0 gives 0")
_op("mod", E, "fi", "mod, remainder, %", EPI, "a - floor(a / b) * b (the sign of b)")
_op("equal", E, "fib", "equal, ==", EPI, "a == b -> bool")
_op("not_equal", E, "fib", "not_equal, !=", EPI, "a != b -> bool")
_op("less", E, "fib", "less, <", EPI, "a < b -> bool")
_op("less_equal", E, "fib", "less_equal, <=", EPI, "a <= b -> bool")
_op("greater", E, "fib", "greater, >", EPI, "a > b -> bool")
_op("greater_equal", E, "fib", "greater_equal, >=", EPI, "a >= b -> bool")
_op("bitwise_and", E, "ib", "bitwise_and, logical_and, &", EPI, "and (bitwise on ints)")
_op("bitwise_or", E, "ib", "bitwise_or, logical_or, |", EPI, "or (bitwise on ints)")
_op("bitwise_xor", E, "ib", "bitwise_xor, logical_xor, ^", EPI, "exclusive or (bitwise on ints)")
_op("left_shift", E, "i", "left_shift, <<", EPI, "a << b (0 from shifts of the width or more)")
_op("right_shift", E, "i", "right_shift, >>", EPI, "arithmetic a >> b")
_op("where", E, "fib", "where, tril, triu", EPI, "cond ? a : b, broadcasting all three")
# ---- values computed where they are read
_op("iota", "source", "fi", "iota, arange, tril, triu", EPI, "index along an axis (arange: start + step * i)")
_op("constant", "source", "fi", "Python numbers", EPI, "a scalar (a weak type: x_f16 * 2.0 stays f16)")
# ---- layout
_op("transpose", "view", "fib", "transpose, swapaxes, moveaxis, .T", "kernel", "permute axes")
_op("reshape", "view", "fib", "reshape, expand_dims, squeeze, x[None], matmul of 1-D", "kernel",
    "same elements, new shape")
_op("slice", "view", "fib", "x[a:b:c], x[i], split, chunk", "kernel", "basic slicing, steps and negative steps")
_op("concat", "view", "fib", "concatenate, stack", EPI, "join along an axis")
_op("pad", "pad", "f", "pad", NO, "constant, reflect or edge padding")
# ---- gathers
_op("take", "gather", "fi", "take, x[idx]", EPI, "gather along an axis (indices clamped)")
_op("take_along_axis", "gather", "fi", "take_along_axis", "kernel", "gather per position (indices clamped)")
_op("one_hot", "gather", "i", "one_hot", EPI, "labels -> one-hot rows (out-of-range labels give zeros)")
_op("scatter_add", "scatter", "f", "scatter_add, index_add", NO,
    "x.at[idx].add(u) along an axis: take's adjoint (indices clamped, duplicates summed in order)")
# ---- matrix products
_op("matmul", "gemm", "f", "matmul, @", "kernel",
    "a @ b with numpy's batch rules; bf16/f16 and fp8 (e4m3/e5m2) accumulate in f32")
_op("conv_patches", "gemm", "f", "conv2d", NO, "conv2d's implicit-GEMM A operand (no im2col buffer)")
_op("attention", "attention", "f", "attention", "kernel",
    "softmax(q k^T * scale + mask) v; causal, grouped-query heads")
_op("attention_grad", "attention", "f", "attention_backward", EPI,
    "dQ, dK, dV of attention, packed [B, HKV, G+2, S, D]: the flash backward (no S x S buffer)")
# ---- row kernels
_op("softmax", "row", "f", "softmax", "kernel", "exp(x - max) / sum along an axis")
_op("log_softmax", "row", "f", "log_softmax", "kernel", "x - logsumexp(x) along an axis")
_op("logsumexp", "row", "f", "logsumexp", NO, "log(sum(exp(x))) along an axis, overflow-free")
_op("layer_norm", "row", "f", "layer_norm", "kernel", "(x - mean) / sqrt(var + eps) * scale + bias, last axis")
_op("rms_norm", "row", "f", "rms_norm", "kernel", "x / sqrt(mean(x^2) + eps) * scale, last axis")
_op("argmax", "row", "f", "argmax", EPI, "index of the first maximum (NaN first, as numpy)")
_op("argmin", "row", "f", "argmin", EPI, "index of the first minimum (NaN first, as numpy)")
_op("top_k", "row", "f", "top_k", EPI, "k largest values and their indices, sorted, ties by index (GPU: k <= 128)")
_op("cross_entropy", "row", "f", "cross_entropy", EPI,
    "-log softmax(logits)[label] from integer labels; mean/sum/none, ignore_index")
# ---- reductions and scans
_op("reduce_sum", "reduction", "f", "reduce_sum, .sum()", "kernel", "sum over axes")
_op("reduce_mean", "reduction", "f", "reduce_mean, .mean(), var, std", "kernel", "mean over axes")
_op("reduce_max", "reduction", "f", "reduce_max, .max()", "kernel", "max over axes")
_op("reduce_prod", "reduction", "f", "prod", NO, "product over axes")
_op("reduce_any", "reduction", "fib", "any", NO, "logical or over axes")
_op("reduce_all", "reduction", "fib", "all", NO, "logical and over axes")
_op("cumsum", "scan", "f", "cumsum", "kernel", "running sum along an axis")
_op("cumprod", "scan", "f", "cumprod", "kernel", "running product along an axis")
# ---- structure of fused programs
_op("fusion", "structure", "fib", "", NO, "a region of ops fused into one kernel (made by the fusion passes)")
_op("yield", "structure", "fib", "", NO, "a fusion region's results")

# trace nodes that stand for a second result of their first input's op (not ops of their own)
SECOND_RESULTS = {"top_k_indices": "top_k", "cross_entropy_valid": "cross_entropy", "attention_lse": "attention"}

# tessera.ops functions made of other ops (no Graph IR op of their own): what they record
COMPOSITES = {
    "clip": "maximum, minimum", "var": "reduce_mean, sub, mul", "std": "var, sqrt",
    "expand_dims": "reshape", "squeeze": "reshape", "swapaxes": "transpose", "moveaxis": "transpose",
    "stack": "reshape, concat", "split": "slice", "chunk": "slice",
    "logical_and": "not_equal, bitwise_and", "logical_or": "not_equal, bitwise_or",
    "logical_xor": "not_equal, bitwise_xor", "logical_not": "not_equal, bitwise_not", "remainder": "mod",
    "arange": "iota, mul, add, cast", "tril": "iota, greater_equal, where", "triu": "iota, less_equal, where",
    "conv2d": "conv_patches, matmul (or an elementwise chain for depthwise), transpose, concat",
    "max_pool2d": "slice, maximum, pad", "avg_pool2d": "slice, add, pad",
    "scaled_matmul": "matmul (fp8 x fp8 -> f32), mul, add, cast: per-tensor scales in the GEMM epilogue",
}


def kinds(name: str) -> str:
    """The element kinds the op's operands may have (``dtypes.kind`` letters)."""
    return OPS[name].kinds


def takes_int(name: str) -> bool:
    return "i" in OPS[name].kinds


__all__ = ["COMPOSITES", "SECOND_RESULTS", "FAMILIES", "GPU_MODES", "KIND_NAMES", "OPS", "OpDef", "kinds", "takes_int"]
