"""LLVM IR for the typed lanes of ``tessera_gpu.math`` (int32 / int64 / bool values on the GPU
lanes): comparisons, select, logic, shifts, int arithmetic, floor division and modulo, float ``pow``,
NaN / inf tests and conversions between int, float and bool.

The semantics are the CPU lane's, written once in :mod:`tessera.codegen.x86_int_elem` (numpy's,
with its undefined corners defined: a zero divisor gives 0, INT_MIN // -1 wraps, a shift count
>= the width gives 0 / -1, float -> int saturates with NaN -> 0) and :mod:`tessera.codegen.x86_pow`
(float floor division and modulo; ``pow``: |x|^y = exp(y log|x|) in f64 lanes from the shared
vector math library, rounded once to f32, then numpy's sign / zero / NaN / inf cases -- within an
ulp or two of numpy's float64 result, no approximate ex2 / lg2 instructions).  That translation works on LLVM vectors; a GPU value may be a
scalar (one item per thread), so a scalar is carried as a one-lane vector through it and
extracted after.  Bools are ``i1`` in registers; in memory one byte each (``load_bool`` /
``store_bool``: a vector of i1 would be bit-packed by LLVM).
"""
from __future__ import annotations

from types import SimpleNamespace

from llvmlite import ir
from xdsl.dialects.builtin import VectorType

from tessera.codegen import x86_int_elem as X
from tessera.codegen.llvm_common import I8, I32
from tessera.ir.target import gpu as G


def _as_vec(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    if isinstance(v.type, ir.VectorType):
        return v
    return b.insert_element(ir.Constant(ir.VectorType(v.type, 1), ir.Undefined), v, ir.Constant(I32, 0))


def emit(fcg, op: G.MathOp) -> ir.Value:
    """The value of one typed ``tessera_gpu.math`` op (``fcg``: the GPU function codegen)."""
    b = fcg.b
    scalar = not isinstance(op.result.type, VectorType)
    args = [_as_vec(b, fcg.v(a)) for a in op.inputs]
    keys = [object() for _ in args]
    vals = dict(zip(keys, args))
    rt = op.result.type if not scalar else VectorType(op.result.type, [1])
    shim_op = SimpleNamespace(fn=op.fn, inputs=keys, result=SimpleNamespace(type=rt))
    shim_cg = SimpleNamespace(b=b, gen=fcg.gen, v=lambda k: vals[k])
    fn = op.fn.data
    if fn in ("floordiv", "mod") and not isinstance(args[0].type.element, ir.IntType):
        from tessera.codegen.x86_pow import emit_float_divmod
        r = emit_float_divmod(shim_cg, args[0], args[1], fn)
    else:
        r = X.emit(shim_cg, shim_op)
    return b.extract_element(r, ir.Constant(I32, 0)) if scalar else r


def is_bool(ty: ir.Type) -> bool:
    e = ty.element if isinstance(ty, ir.VectorType) else ty
    return isinstance(e, ir.IntType) and e.width == 1


def byte_type(ty: ir.Type) -> ir.Type:
    """The memory type of a bool value: one byte per element."""
    return ir.VectorType(I8, ty.count) if isinstance(ty, ir.VectorType) else I8


def load_bool(b: ir.IRBuilder, raw: ir.Value) -> ir.Value:
    """Bytes read from memory -> i1 (nonzero is true)."""
    return b.icmp_unsigned("!=", raw, ir.Constant(raw.type, [0] * raw.type.count) if isinstance(
        raw.type, ir.VectorType) else ir.Constant(raw.type, 0))


def store_bool(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """i1 -> the bytes stored (0 / 1)."""
    return b.zext(v, byte_type(v.type))


__all__ = ["emit", "is_bool", "byte_type", "load_bool", "store_bool"]
