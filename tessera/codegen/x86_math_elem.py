"""Elementary functions for the x86 lane's vector math: log, log1p, exp2, expm1, sin, cos.

``Elementary64`` is mixed into ``x86_math64.VectorMath64`` (it uses that class's ``_round``,
``_scale``, ``_expm_poly`` and ``_exp_parts``).  The f32 library computes these functions in
f64 lanes and rounds once at the end (``widened``): every f32 result is within 0.5 ULP plus the
f64 function's error scaled by 2^-29, so the f32 functions have one implementation and one
polynomial each.  Coefficients are exact Taylor terms (no fitted constants):

  log    x = 2^k m, m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^54 first), f = m - 1 (exact),
         s = f / (2 + f), log m = f - f^2/2 + s (f^2/2 + R(s^2)), R Taylor's 2 z / 3 + 2 z^2 / 5 + ...
         (11 terms, truncation below 2^-70 for s^2 <= 0.0295), k ln2 added as HI + LO with HI's low
         21 bits zero (k HI exact); log(0) = -inf, log(x < 0) = NaN, log(inf) = inf
  log1p  u = 1 + x, log(u) + (x - (u - 1)) / u (the rounding of u corrected to first order);
         +-0 returned as given
  exp2   n = round(x), f = x - n exact, 2^f = exp(r) with r = f ln2 as a double-double (r + dr),
         exp(r) (1 + dr), scaled by 2^n with two exact exponent steps (subnormal results rounded
         once; x clamped to [-1100, 1100], NaN kept)
  expm1  n = round(x log2 e), r = x - n ln2 (two FMA steps), e = expm1(r) = r + r^2 Q(r) (Taylor to
         r^16 / 16!), result 2^n ((1 - 2^-n) + e): 1 - 2^-n is exact, so |x| < ln2/2 (n = 0) has no
         cancellation; +-0 returned as given; x clamped to [-60, 712]
  sin    n = round(x 2/pi), r + dr = x - n pi/2 as a double-double (pi/2 = P1 + P2 + P3, P1 and P2
  cos    with 33 significant bits, so n P1 and n P2 are exact for |n| < 2^20: |x| < 1.6e6; the
         rounding of r0 - n P2 is kept by TwoSum); sin r and cos r by Taylor polynomials on
         |r| <= pi/4 (to r^21 and r^20) with dr entering to first order (sin: dr (1 - r^2/2), cos:
         -r dr, and 1 - r^2/2's rounding kept), chosen and signed by n mod 4 (cos as sin at n + 1).
         Beyond 2^20 pi/2 the reduction is not exact (see docs/numerics.md)
"""
from __future__ import annotations

import math

from llvmlite import ir

LN2_HI, LN2_LO = 0.6931471803691238, 1.9082149292705877e-10     # HI: low 21 mantissa bits zero
LN2_TAIL = 2.3190468138462996e-17                                  # ln2 - fl(ln2)
PIO2 = (1.5707963267341256, 6.077100506303966e-11, 2.0222662487959506e-21)  # pi/2, P1, P2: 33 bits
TWO_OVER_PI = 2.0 / math.pi
SQRT2 = math.sqrt(2.0)
LOG_R = tuple(2.0 / (2 * k + 1) for k in range(1, 12))                # 2/3, 2/5, ..., 2/23
EXPM1_Q = tuple(1.0 / math.factorial(k) for k in range(2, 17))        # 1/2!, ..., 1/16!
SIN_S = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(1, 11))   # -1/3!, 1/5!, ..., 1/21!
COS_C = tuple((-1) ** k / math.factorial(2 * k) for k in range(2, 11))       # 1/4!, -1/6!, ..., 1/20!
ELEMENTARY = ("log", "log1p", "exp2", "expm1", "sin", "cos")


class Elementary64:
    """log, log1p, exp2, expm1, sin, cos on ``<w x double>`` (a mixin of ``VectorMath64``)."""

    def _sel_eq(self, b, x, v: float):
        return b.fcmp_ordered("==", x, self.splat(v))

    def _log_core(self, b: ir.IRBuilder, x) -> ir.Value:
        """log(x) for finite x > 0 (normal or subnormal)."""
        sub = self._lt(b, x, 2.0 ** -1022)
        xs = b.select(sub, b.fmul(x, self.splat(2.0 ** 54)), x)
        bits = b.bitcast(xs, self.vi)
        e = b.sub(b.lshr(bits, self.isplat(52)), self.isplat(1023))
        m = b.bitcast(b.or_(b.and_(bits, self.isplat((1 << 52) - 1)), self.isplat(1023 << 52)), self.vt)  # [1, 2)
        big = self._gt(b, m, SQRT2)
        m = b.select(big, b.fmul(m, self.splat(0.5)), m)
        k = b.sitofp(b.add(e, b.zext(big, self.vi)), self.vt)
        k = b.select(sub, b.fsub(k, self.splat(54.0)), k)
        f = b.fsub(m, self.splat(1.0))                       # exact: m in [0.707, 1.415)
        s = b.fdiv(f, b.fadd(self.splat(2.0), f))
        z = b.fmul(s, s)
        R = b.fmul(z, self.poly(b, z, LOG_R))
        hfsq = b.fmul(self.splat(0.5), b.fmul(f, f))
        # k HI - ((hfsq - (s (hfsq + R) + k LO)) - f)
        inner = b.fadd(b.fmul(s, b.fadd(hfsq, R)), b.fmul(k, self.splat(LN2_LO)))
        return b.fsub(b.fmul(k, self.splat(LN2_HI)), b.fsub(b.fsub(hfsq, inner), f))

    def _log(self, b: ir.IRBuilder, x) -> ir.Value:
        r = self._log_core(b, x)
        r = b.select(self._sel_eq(b, x, float("inf")), x, r)
        r = b.select(self._sel_eq(b, x, 0.0), self.splat(float("-inf")), r)
        r = b.select(self._lt(b, x, 0.0), self.splat(float("nan")), r)
        return b.select(b.fcmp_unordered("uno", x, x), x, r)

    def _log1p(self, b: ir.IRBuilder, x) -> ir.Value:
        u = b.fadd(self.splat(1.0), x)
        c = b.fdiv(b.fsub(x, b.fsub(u, self.splat(1.0))), u)
        usable = b.and_(self._gt(b, u, 0.0), self._lt(b, u, float("inf")))
        r = b.fadd(self.call(b, "log", u), b.select(usable, c, self.splat(0.0)))
        return b.select(self._sel_eq(b, x, 0.0), x, r)

    def _exp2(self, b: ir.IRBuilder, x) -> ir.Value:
        xs = b.select(self._lt(b, x, -1100.0), self.splat(-1100.0), x)   # NaN kept (compares false)
        xs = b.select(self._gt(b, xs, 1100.0), self.splat(1100.0), xs)
        n, _ = self._round(b, xs)
        f = b.fsub(xs, n)                                                # exact
        r = b.fmul(f, self.splat(math.log(2.0)))
        dr = self.fma(b, f, self.splat(math.log(2.0)), b.fneg(r))       # f ln2 - r exactly
        dr = self.fma(b, f, self.splat(LN2_TAIL), dr)                    # + f (ln2 - fl(ln2))
        p = self._expm_poly(b, r)
        p = self.fma(b, p, dr, p)
        return self._scale(b, p, n)

    def _expm1(self, b: ir.IRBuilder, x) -> ir.Value:
        xs = b.select(self._lt(b, x, -60.0), self.splat(-60.0), x)     # expm1(-60) rounds to -1
        xs = b.select(self._gt(b, xs, 712.0), self.splat(712.0), xs)
        n, _ = self._round(b, b.fmul(xs, self.splat(1.4426950408889634)))
        r = self.fma(b, n, self.splat(-0.6931471805599453), xs)
        r = self.fma(b, n, self.splat(-2.3190468138462996e-17), r)
        e = self.fma(b, b.fmul(r, r), self.poly(b, r, EXPM1_Q), r)
        one_minus = b.fsub(self.splat(1.0), self._scale(b, self.splat(1.0), b.fneg(n)))   # exact
        res = self._scale(b, b.fadd(one_minus, e), n)
        return b.select(self._sel_eq(b, x, 0.0), x, res)

    def _sincos(self, b: ir.IRBuilder, x, shift: int) -> ir.Value:
        n, t = self._round(b, b.fmul(x, self.splat(TWO_OVER_PI)))
        r0 = self.fma(b, n, self.splat(-PIO2[0]), x)                     # exact
        w = b.fmul(n, self.splat(PIO2[1]))                               # exact (33 + 20 bits)
        r1, e1 = self._two_sum(b, r0, b.fneg(w))
        tail = self.fma(b, n, self.splat(-PIO2[2]), e1)
        r = b.fadd(r1, tail)                                             # r + dr = x - n pi/2
        dr = b.fadd(b.fsub(r1, r), tail)
        z = b.fmul(r, r)
        # sin(r + dr) = sin r + dr (1 - r^2 / 2); cos(r + dr) = cos r - dr r
        s_low = self.fma(b, b.fmul(r, z), self.poly(b, z, SIN_S), self.fma(b, b.fmul(dr, z), self.splat(-0.5), dr))
        s = b.fadd(r, s_low)
        h = b.fmul(z, self.splat(0.5))
        one_h = b.fsub(self.splat(1.0), h)                               # 1 - h, and its rounding below
        c_low = b.fsub(b.fsub(b.fsub(self.splat(1.0), one_h), h), b.fmul(r, dr))
        c = b.fadd(one_h, self.fma(b, b.fmul(z, z), self.poly(b, z, COS_C), c_low))
        q = b.add(b.bitcast(t, self.vi), self.isplat(shift))             # n + shift in the low bits
        odd = b.icmp_unsigned("!=", b.and_(q, self.isplat(1)), self.isplat(0))
        neg = b.icmp_unsigned("!=", b.and_(q, self.isplat(2)), self.isplat(0))
        v = b.select(odd, c, s)
        return b.select(neg, b.fneg(v), v)

    def _two_sum(self, b: ir.IRBuilder, a, c):
        """(s, e): s = fl(a + c) and e = a + c - s exactly (Knuth's branch-free TwoSum)."""
        s = b.fadd(a, c)
        cc = b.fsub(s, a)
        return s, b.fadd(b.fsub(a, b.fsub(s, cc)), b.fsub(c, cc))

    def _sin(self, b: ir.IRBuilder, x) -> ir.Value:
        return b.select(self._sel_eq(b, x, 0.0), x, self._sincos(b, x, 0))

    def _cos(self, b: ir.IRBuilder, x) -> ir.Value:
        return self._sincos(b, x, 1)


def widened(name: str):
    """An f32 library method computing ``name`` in f64 lanes (``Elementary64``), rounded once."""
    def method(self, b: ir.IRBuilder, x) -> ir.Value:
        lib = self.wide()
        wide = b.fpext(x, lib.vt)
        return b.fptrunc(lib.call(b, name, wide), self.vt)
    method.__name__ = "_" + name
    method.__doc__ = f"{name} in f64 lanes, rounded once to f32 (x86_math_elem)"
    return method
