"""Float ``pow``, floor division and modulo on vector lanes (``tessera_x86.velem``).

pow(x, y): |x|^y = exp(y log|x|) in f64 lanes (an f32 kernel widens, so its result is rounded
once from an f64 value; in an f64 kernel the relative error grows with |y log x|: about
|y log x| * 2^-52), then C99 / numpy's special cases: y == 0 or x == 1 -> 1 (NaN too); x == -1
with y = +-inf -> 1; a negative base (or -0, -inf) with an odd integer y keeps its sign; a
finite negative base with a non-integer y -> NaN; 0 ** negative -> inf.

floor division and modulo (numpy's ``npy_divmod``): mod = fmod(a, b) (computed as a - trunc(a/b) b
with one FMA in f64 lanes: exact while a / b does not round across an integer, which holds for f32
operands with |a / b| < 2^24), the remainder moved to the divisor's sign and the quotient floored;
b == 0 gives a / b (+-inf, NaN) and a NaN remainder, as numpy's.
"""
from __future__ import annotations

from llvmlite import ir

from tessera.codegen.llvm_common import F64, I64


def _splat(t, v):
    return ir.Constant(t, [ir.Constant(t.element, v)] * t.count)


def _wide(cg, a):
    """``a`` in f64 lanes (and how to narrow back)."""
    t = a.type
    if t.element == F64:
        return a, lambda r: r
    wt = ir.VectorType(F64, t.count)
    return cg.b.fpext(a, wt), lambda r: cg.b.fptrunc(r, t)


def _intr(cg, name, t):
    return cg.gen.intrinsic(f"llvm.{name}.v{t.count}f64", t, [t])


def emit_pow(cg, x0, y0):
    b = cg.b
    x, back = _wide(cg, x0)
    y, _ = _wide(cg, y0)
    t = x.type
    lib = cg.gen.math(t.count, F64)
    ax = b.call(_intr(cg, "fabs", t), [x])
    mag = lib.call(b, "exp", b.fmul(y, lib.call(b, "log", ax)))
    one, zero = _splat(t, 1.0), _splat(t, 0.0)
    fl = b.call(_intr(cg, "floor", t), [y])
    yint = b.fcmp_ordered("==", fl, y)
    half_fl = b.call(_intr(cg, "floor", t), [b.fmul(y, _splat(t, 0.5))])
    odd = b.and_(yint, b.fcmp_ordered("==", b.fsub(y, b.fmul(half_fl, _splat(t, 2.0))), one))
    neg = b.icmp_signed("<", b.bitcast(x, ir.VectorType(I64, t.count)), ir.Constant(ir.VectorType(I64, t.count),
                                                                                  [0] * t.count))   # sign bit
    r = b.select(b.and_(neg, odd), b.fneg(mag), mag)
    finite_neg = b.and_(b.fcmp_ordered("<", x, zero), b.fcmp_ordered(">", x, _splat(t, float("-inf"))))
    yfinite = b.fcmp_ordered("<", b.call(_intr(cg, "fabs", t), [y]), _splat(t, float("inf")))
    r = b.select(b.and_(finite_neg, b.and_(yfinite, b.not_(yint))), _splat(t, float("nan")), r)
    r = b.select(b.and_(b.fcmp_ordered("==", x, _splat(t, -1.0)), b.not_(yfinite)), b.select(
        b.fcmp_unordered("uno", y, y), r, one), r)
    r = b.select(b.or_(b.fcmp_ordered("==", x, one), b.fcmp_ordered("==", y, zero)), one, r)
    return back(r)


def emit_float_divmod(cg, a0, c0, fn: str):
    b = cg.b
    a, back = _wide(cg, a0)
    c, _ = _wide(cg, c0)
    t = a.type
    zero, one = _splat(t, 0.0), _splat(t, 1.0)
    q0 = b.call(_intr(cg, "trunc", t), [b.fdiv(a, c)])
    fma = cg.gen.intrinsic(f"llvm.fma.v{t.count}f64", t, [t, t, t])
    mod = b.call(fma, [b.fsub(zero, q0), c, a])                      # fmod(a, c)
    mod = b.select(b.fcmp_unordered("uno", q0, q0), _splat(t, float("nan")), mod)   # c == 0, inf a
    inf_c = b.fcmp_ordered("==", b.call(_intr(cg, "fabs", t), [c]), _splat(t, float("inf")))
    finite_a = b.fcmp_ordered("<", b.call(_intr(cg, "fabs", t), [a]), _splat(t, float("inf")))
    mod = b.select(b.and_(inf_c, finite_a), a, mod)                  # fmod(a, +-inf) = a
    div = b.fdiv(b.fsub(a, mod), c)
    nz = b.fcmp_unordered("!=", mod, zero)
    flip = b.and_(nz, b.xor(b.fcmp_ordered("<", c, zero), b.fcmp_ordered("<", mod, zero)))
    mod2 = b.select(flip, b.fadd(mod, c), mod)
    div = b.select(flip, b.fsub(div, one), div)
    copysign = cg.gen.intrinsic(f"llvm.copysign.v{t.count}f64", t, [t, t])
    mod2 = b.select(nz, mod2, b.call(copysign, [zero, c]))
    fdiv = b.call(_intr(cg, "floor", t), [div])
    fdiv = b.select(b.fcmp_ordered(">", b.fsub(div, fdiv), _splat(t, 0.5)), b.fadd(fdiv, one), fdiv)
    fdiv = b.select(b.fcmp_unordered("!=", div, zero), fdiv, b.call(copysign, [zero, b.fdiv(a, c)]))
    czero = b.fcmp_ordered("==", c, zero)
    if fn == "floordiv":
        return back(b.select(czero, b.fdiv(a, c), fdiv))
    return back(b.select(czero, _splat(t, float("nan")), mod2))
