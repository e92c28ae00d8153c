"""fp8 matmul and ``scaled_matmul``: OCP fp8 (e4m3 = ``ml_dtypes.float8_e4m3fn``, e5m2 =
``ml_dtypes.float8_e5m2``) GEMM with per-tensor scales applied in the epilogue.

``scaled_matmul(a, b, scale_a, scale_b, out_dtype=f32, bias=None)`` is
``cast((a_f32 @ b_f32) * scale_a * scale_b [+ bias], out_dtype)``: the records it traces are a
``tessera.matmul`` of the fp8 operands (f32 accumulation, fp8 x fp8 -> f32 only) followed by
elementwise multiplies by the scales, the bias add and the final cast, which the
``fuse-matmul-epilogue`` pass folds into the GEMM's epilogue (scales before bias before any
activation the caller adds).  A scale is a Python number (compiled in) or a 0-d float32 array
(a runtime argument: one compiled kernel serves every scale).  e4m3 x e5m2 mixes are allowed
(the PTX ISA's ``mma.sync`` .kind f8 and ``wgmma`` take either format on each side).
"""
from __future__ import annotations

import numbers

from tessera import dtypes as dt
from tessera.errors import Fp8OperandError, ScaleError, ShapeMismatchError
from tessera.frontend.trace import Tensor, _err, as_tensor, broadcast_shapes

OUT_DTYPES = (dt.float32, dt.bfloat16, dt.float16)


def _out(out_dtype, what: str):
    out = dt.float32 if out_dtype is None else dt.as_dtype(out_dtype)
    if out not in OUT_DTYPES:
        raise _err(Fp8OperandError, f"{what}: out_dtype {dt.name(out)} is not produced from fp8 inputs "
                                    "(f32 accumulation; out_dtype f32, bf16 or f16)")
    return out


def fp8_matmul(a: Tensor, b: Tensor, out_dtype, what: str) -> Tensor:
    """``a @ b`` of two fp8 tensors: f32 accumulation, the result in ``out_dtype`` (f32 default)."""
    from tessera.frontend.ops import cast, matmul_node
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, Tensor) or x.dtype not in dt.FP8:
            got = dt.name(x.dtype) if isinstance(x, Tensor) else type(x).__name__
            raise _err(Fp8OperandError, f"{what}: fp8 on both sides ({name} is {got}); cast the other operand "
                                        "to float8_e4m3fn / float8_e5m2, or both to float32")
    out = _out(out_dtype, what)
    y = matmul_node(a, b, dt.float32, what)
    return y if out == dt.float32 else cast(y, out)


def _scale(s, like: Tensor, name: str) -> Tensor:
    if isinstance(s, bool) or not isinstance(s, (numbers.Real, Tensor)):
        raise _err(ScaleError, f"scaled_matmul: {name} must be a Python number or a 0-d float32 array, "
                               f"got {type(s).__name__}")
    if isinstance(s, Tensor):
        if s.ndim != 0:
            raise _err(ScaleError, f"scaled_matmul: {name} must be a scalar (per-tensor scale), got shape "
                                   f"{s.shape}")
        if s.dtype != dt.float32 and not s._node.weak:
            raise _err(ScaleError, f"scaled_matmul: {name} must be float32, got {dt.name(s.dtype)}")
        return s
    return as_tensor(float(s), like, "scaled_matmul")


def scaled_matmul(a, b, scale_a, scale_b, out_dtype=None, bias=None) -> Tensor:
    """``(scale_a * scale_b) * (a_f32 @ b_f32) [+ bias]`` in ``out_dtype`` (f32 default, bf16, f16)
    for fp8 ``a`` and ``b`` (e4m3 / e5m2, mixes allowed); the scales and bias ride in the GEMM's
    epilogue."""
    from tessera.frontend.ops import add, cast, mul
    y = fp8_matmul(a, b, None, "scaled_matmul")
    out = _out(out_dtype, "scaled_matmul")
    sa, sb = _scale(scale_a, y, "scale_a"), _scale(scale_b, y, "scale_b")
    y = mul(mul(y, sa), sb)
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.dtype != dt.float32:
            raise _err(Fp8OperandError, "scaled_matmul: bias must be a float32 array")
        if broadcast_shapes(y.shape, bias.shape, "scaled_matmul bias") != y.shape:
            raise _err(ShapeMismatchError, f"scaled_matmul: bias {bias.shape} does not broadcast to {y.shape}")
        y = add(y, bias)
    return y if out == dt.float32 else cast(y, out)


def reference(a, b, scale_a, scale_b, out_dtype=None, bias=None):
    """The float64 numpy oracle: the dequantised inputs' product, scaled, biased, then rounded
    once to ``out_dtype``."""
    import numpy as np
    y = (float(np.asarray(scale_a, np.float64)) * float(np.asarray(scale_b, np.float64))
         * (np.asarray(a).astype(np.float64) @ np.asarray(b).astype(np.float64)))
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return y.astype(dt.float32 if out_dtype is None else dt.as_dtype(out_dtype))


__all__ = ["fp8_matmul", "scaled_matmul", "reference"]
