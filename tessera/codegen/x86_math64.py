"""Float64 vector math for the x86 lane, emitted as LLVM IR (llvmlite) functions.

Each function takes and returns ``<W x double>`` (W = 4 with AVX2, 8 with AVX-512) and is
marked ``alwaysinline``: no calls, no libm, the same code on every vector ISA.  No fast-math
flags: NaN and infinities propagate as numpy's do.  Coefficients are exact Taylor terms or
come from ``tools/fit_math64.py`` (70-digit arithmetic, each rounded once); the maximum ULP
error of each function is measured against 50-digit references by ``tests/test_f64.py`` and
recorded in ``docs/numerics.md``.

  exp   n = round(x log2 e) (a magic-constant rounding whose bits also give n as an integer),
        r = x - n ln2 in two FMA steps, exp(r) = 1 + (r + r^2 Q(r)) with Q Taylor's terms up
        to r^11 / 13! (truncation below 2^-57 on |r| <= ln2 / 2), then two exact exponent
        steps 2^(n - n/2) 2^(n/2): one rounding into a subnormal result, inf past 709.78, 0
        below -745.13 (x clamped to [-800, 712] first; NaN kept)
  exp2_bounded  2^x for x <= 1023 (attention's probabilities in log2 units): n = round(x),
        the same polynomial at r = (x - n) ln2; 0 below -1022
  tanh  x + x^3 P(x^2) (Taylor, 18 terms) for |x| < 0.55, else sign(x) (1 - 2 / (exp(2|x|) + 1))
  erf   z P(z^2) (Taylor, 14 terms) for |z| < 0.5, else sign(z) (1 - erfc(|z|))
  erfc  for a >= 0.5: exp(-a^2) H(a) / a, H(a) = a erfc(a) exp(a^2) a power series in
        s = (alpha a - beta) / (a + 3) (degree 22 on [0.5, 30]); a^2 = hi + lo exactly (FMA),
        exp(-hi) (1 - lo); an input known to more bits (gelu's x / sqrt 2 as z + dz) is
        corrected to first order, erfc(a + d) = erfc(a) - d 2/sqrt(pi) exp(-a^2)
  silu  x sigmoid(x) = x / (1 + e) or x e / (1 + e), e = exp(-|x|) = p 2^n (no overflow), x e
        as (x p) 2^n: one rounding where the result is subnormal
  gelu_tanh  x sigmoid(2y), 2y = x (K0 + K1 x^2) in double-double arithmetic (a rounded 2y would
        cost |2y| ULPs), its low part applied to first order; as silu's form
  gelu_erf  0.5 x erfc(-z) for z = x / sqrt 2 <= -0.5 (z carried as z + dz), else
        0.5 x (1 + erf(z))
"""
from __future__ import annotations

import math

from llvmlite import ir

from tessera.codegen.x86_math import VectorLibrary
from tessera.codegen.x86_math_elem import Elementary64

F64 = ir.DoubleType()
I64 = ir.IntType(64)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
LN2_HI, LN2_LO = 0.6931471805599453, 2.3190468138462996e-17   # ln 2 = HI + LO to 106 bits (fit_math64)
MAGIC = 1.5 * 2.0 ** 52          # x + MAGIC rounds x to an integer held in the low mantissa bits
MAGIC_BITS = 0x4338000000000000  # the bit pattern of MAGIC
EXP_Q = tuple(1.0 / math.factorial(k) for k in range(2, 14))   # 1/2!, ..., 1/13!: exp(r) = 1 + r + r^2 Q(r)
TWO_OVER_SQRT_PI = 1.1283791670955126
RSQRT2_HI, RSQRT2_LO = 0.7071067811865476, -4.833646656726457e-17   # 1/sqrt(2) = HI + LO (fit_math64)
# 2 sqrt(2/pi) and 2 sqrt(2/pi) 0.044715 as (high, low) pairs, to 106 bits (tools/fit_math64.py)
GELU_K0 = (1.5957691216057308, -9.96930880911092e-17)
GELU_K1 = (0.07135481627260025, -6.175149918155315e-19)
TANH_SMALL, ERF_SMALL, ERFC_CLAMP = 0.55, 0.5, 28.0

# tools/fit_math64.py
TANH64_P = (-0.3333333333333333, 0.13333333333333333, -0.05396825396825397, 0.021869488536155203,
            -0.008863235529902197, 0.003592128036572481, -0.0014558343870513183, 0.000590027440945586,
            -0.00023912911424355248, 9.691537956929451e-05, -3.927832388331683e-05, 1.5918905069328964e-05,
            -6.451689215655431e-06, 2.6147711512907546e-06, -1.0597268320104654e-06, 4.294911078273806e-07,
            -1.7406618963571648e-07, 7.054636946400968e-08)
ERF64_P = (1.1283791670955126, -0.37612638903183754, 0.11283791670955126, -0.026866170645131252,
           0.005223977625442188, -0.0008548327023450853, 0.00012055332981789664, -1.492565035840625e-05,
           1.6462114365889248e-06, -1.6365844691234924e-07, 1.4807192815879218e-08, -1.2290555301717928e-09,
           9.422759064650411e-11, -6.7113668551641105e-12)
ERFC64_MAP = (1.2372881355932204, 4.11864406779661)
ERFC64_H = (0.5415777887890556, 0.062185529456290224, -0.07413246378275118, 0.05454833431477811,
            -0.02895269520608486, 0.011104115488062052, -0.0027523040223902183, 0.00021492889436555083,
            0.00012373191977758943, -4.061629307787193e-05, -3.103689186690195e-06, 3.775890979329935e-06,
            -4.7499779293063964e-08, -3.540127510125773e-07, 1.2962008063610765e-08, 3.684814919764963e-08,
            -3.0376966316624246e-10, -4.1147588432377935e-09, -2.556486715524736e-10, 4.3088401615791137e-10,
            6.517124878657891e-11, -2.9900922111279416e-11, -6.919156519843254e-12)


class VectorMath64(Elementary64, VectorLibrary):
    """Declares the f64 math functions in one module on first use (the f32 library's interface)."""
    ELEM = F64
    IELEM = I64
    SUFFIX = "f64"
    FN_SUFFIX = "f64"

    def _abs(self, b, x):
        return b.call(self._intr("fabs"), [x])

    def _copysign(self, b, mag, sign):
        return b.call(self._intr("copysign", 2), [mag, sign])

    def _lt(self, b, x, v: float):
        return b.fcmp_ordered("<", x, self.splat(v))

    def _gt(self, b, x, v: float):
        return b.fcmp_ordered(">", x, self.splat(v))

    # ------------------------------------------------------------------ exp
    def _round(self, b, y):
        """(n, t): n = y rounded to the nearest integer (ties to even) for |y| < 2^51, and
        t = n + MAGIC, whose bit pattern is MAGIC_BITS + n."""
        t = b.fadd(y, self.splat(MAGIC))
        return b.fsub(t, self.splat(MAGIC)), t

    def _expm_poly(self, b, r) -> ir.Value:
        """exp(r) for |r| <= ln2 / 2 + a little: 1 + (r + r^2 Q(r)), below 0.6 ULP."""
        return b.fadd(self.splat(1.0), self.fma(b, b.fmul(r, r), self.poly(b, r, EXP_Q), r))

    def _pow2(self, b, t) -> ir.Value:
        """2^n for t = n + MAGIC, n an integer in [-1022, 1023]: n + 1023 in the exponent field."""
        e = b.add(b.bitcast(t, self.vi), self.isplat(1023 - MAGIC_BITS))
        return b.bitcast(b.shl(e, self.isplat(52)), self.vt)

    def _scale(self, b, p, n) -> ir.Value:
        """p 2^n for p in [0.5, 2] and integral n in [-1100, 1100]: 2^(n - h) 2^h, h = floor(n / 2):
        the first product is exact, the second rounds once (a subnormal result, or inf)."""
        h = b.call(self._intr("floor"), [b.fmul(n, self.splat(0.5))])
        _, t1 = self._round(b, b.fsub(n, h))
        _, t2 = self._round(b, h)
        return b.fmul(b.fmul(p, self._pow2(b, t1)), self._pow2(b, t2))

    def _exp_parts(self, b: ir.IRBuilder, x) -> tuple[ir.Value, ir.Value]:
        """(p, n) with exp(x) = p 2^n, p in [0.7, 1.42] (0.6 ULP), n integral; x clamped to
        [-800, 712] first (NaN kept), so 2^n is inf or 0 past exp's range (and x 2^n too for the
        |x| <= 800 of silu's tail: 800 exp(-800) is far below the smallest subnormal)."""
        xs = b.select(self._lt(b, x, -800.0), self.splat(-800.0), x)     # NaN kept (compares false)
        xs = b.select(self._gt(b, xs, 712.0), self.splat(712.0), xs)
        n, _ = self._round(b, b.fmul(xs, self.splat(LOG2E)))
        r = self.fma(b, n, self.splat(-LN2_HI), xs)
        r = self.fma(b, n, self.splat(-LN2_LO), r)
        return self._expm_poly(b, r), n

    def _exp(self, b: ir.IRBuilder, x) -> ir.Value:
        return self._scale(b, *self._exp_parts(b, x))

    def _exp_bounded(self, b: ir.IRBuilder, x) -> ir.Value:
        return self._exp(b, x)

    def _exp2_bounded(self, b: ir.IRBuilder, x) -> ir.Value:
        """2^x for x <= 1023 or NaN (larger: unspecified); 0 below -1022 and for -inf."""
        tiny = self._lt(b, x, -1022.0)
        xs = b.select(tiny, self.splat(0.0), x)
        n, _ = self._round(b, xs)
        r = b.fmul(b.fsub(xs, n), self.splat(LN2))      # x - n is exact
        return b.select(tiny, self.splat(0.0), self._scale(b, self._expm_poly(b, r), n))

    # ------------------------------------------------------------------ tanh
    def _tanh(self, b: ir.IRBuilder, x) -> ir.Value:
        a = self._abs(b, x)
        x2 = b.fmul(x, x)
        small = self.fma(b, b.fmul(x, x2), self.poly(b, x2, TANH64_P), x)
        e = self._exp(b, b.fmul(a, self.splat(2.0)))
        big = b.fsub(self.splat(1.0), b.fdiv(self.splat(2.0), b.fadd(e, self.splat(1.0))))
        # tanh is odd: the sign of x (also -0 for -0, which x + x^3 P would give as +0)
        return self._copysign(b, b.select(self._lt(b, a, TANH_SMALL), small, big), x)

    # ------------------------------------------------------------------ erf, erfc
    def _erfc_big(self, b: ir.IRBuilder, a, da=None, factor=None) -> ir.Value:
        """erfc(a + da) (times ``factor``) for a >= 0.5 (NaN kept), da a small correction (or none):
        exp(-a^2) H(a) / a with a^2 = hi + lo (exact), exp(-(hi + lo)) = exp(-hi) (1 - lo), and
        da's first-order term; exp(-hi) = p 2^n is scaled last, so a subnormal result (gelu's tail)
        rounds once.  0 past a = 28 (erfc(27.3) is below the smallest subnormal)."""
        big = self._gt(b, a, ERFC_CLAMP)
        ac = b.select(big, self.splat(ERFC_CLAMP), a)          # NaN kept
        alpha, beta = ERFC64_MAP
        s = b.fdiv(self.fma(b, ac, self.splat(alpha), self.splat(-beta)), b.fadd(ac, self.splat(3.0)))
        q = b.fdiv(self.poly(b, s, ERFC64_H), ac)               # erfc(a) exp(a^2)
        hi = b.fmul(ac, ac)
        lo = self.fma(b, ac, ac, b.fsub(self.splat(0.0), hi))
        q = self.fma(b, b.fsub(self.splat(0.0), q), lo, q)      # q (1 - lo)
        if da is not None:
            q = self.fma(b, da, self.splat(-TWO_OVER_SQRT_PI), q)
        zero = self.splat(0.0)
        if factor is not None:
            q = b.fmul(q, factor)
            zero = b.fmul(factor, zero)                          # the signed zero of factor * 0
        p, n = self._exp_parts(b, b.fsub(self.splat(0.0), hi))
        return b.select(big, zero, self._scale(b, b.fmul(p, q), n))

    def _erf_small(self, b: ir.IRBuilder, z) -> ir.Value:
        return b.fmul(z, self.poly(b, b.fmul(z, z), ERF64_P))

    def _erf(self, b: ir.IRBuilder, x) -> ir.Value:
        a = self._abs(b, x)
        big = self._copysign(b, b.fsub(self.splat(1.0), self._erfc_big(b, a)), x)
        return b.select(self._lt(b, a, ERF_SMALL), self._erf_small(b, x), big)   # NaN: the big path

    # ------------------------------------------------------------------ sigmoid forms
    def _sigmoid_times(self, b: ir.IRBuilder, x, u, ul=None) -> ir.Value:
        """x sigmoid(u + ul) as x / (1 + e) for u >= 0 and x e / (1 + e) for u < 0, e = exp(-|u|)
        <= 1 = p 2^n; x e is formed as (x p) 2^n (one rounding where it is subnormal), and is the
        signed zero past u = -800 (where exp's argument is clamped).  ``ul``: the low part of a
        double-double argument, applied to first order: sigmoid(u + d) = sigmoid(u) (1 + d (1 - sigmoid(u)))."""
        na = b.fsub(self.splat(0.0), self._abs(b, u))
        p, n = self._exp_parts(b, na)
        e = self._scale(b, p, n)
        tiny = b.select(self._lt(b, na, -800.0), b.fmul(x, self.splat(0.0)), self._scale(b, b.fmul(x, p), n))
        neg = self._lt(b, u, 0.0)
        den = b.fadd(self.splat(1.0), e)
        res = b.fdiv(b.select(neg, tiny, x), den)
        if ul is None:
            return res
        one_minus = b.fdiv(b.select(neg, self.splat(1.0), e), den)     # 1 - sigmoid(u)
        corr = b.fmul(ul, one_minus)
        # no correction is no change (an infinite result times a zero one would be NaN; a zero result
        # keeps its sign, which res + res corr could flip)
        keep = b.or_(b.fcmp_ordered("==", corr, self.splat(0.0)), b.fcmp_ordered("==", res, self.splat(0.0)))
        return b.select(keep, res, self.fma(b, res, corr, res))

    def _silu(self, b: ir.IRBuilder, x) -> ir.Value:
        return self._sigmoid_times(b, x, x)

    def _sigmoid(self, b: ir.IRBuilder, x) -> ir.Value:
        return self._sigmoid_times(b, self.splat(1.0), x)

    def _gelu_tanh(self, b: ir.IRBuilder, x) -> ir.Value:
        """x sigmoid(2y), 2y = x (K0 + K1 x^2) = u + ul in double-double arithmetic (error-free
        products and sums, K0 and K1 to 106 bits): a rounded 2y costs |2y| ULPs in the tail."""
        def two_prod(p, q):
            h = b.fmul(p, q)
            return h, self.fma(b, p, q, b.fsub(self.splat(0.0), h))
        # past |x| = 1e50 the result is x or -0 whatever the low part is: a plain 2y there (and no
        # infinities inside the error-free transformations, whose low parts would be NaN)
        small = self._lt(b, self._abs(b, x), 1e50)
        xs = b.select(small, x, self.splat(0.0))
        x2h, x2l = two_prod(xs, xs)
        ph, pl = two_prod(self.splat(GELU_K1[0]), x2h)
        sh = b.fadd(ph, self.splat(GELU_K0[0]))                     # two-sum of ph and K0
        bb = b.fsub(sh, ph)
        sl = b.fadd(b.fsub(ph, b.fsub(sh, bb)), b.fsub(self.splat(GELU_K0[0]), bb))
        vl = b.fadd(sl, b.fadd(pl, self.fma(b, self.splat(GELU_K1[0]), x2l,
                                            self.fma(b, self.splat(GELU_K1[1]), x2h, self.splat(GELU_K0[1])))))
        vh = b.fadd(sh, vl)                                         # renormalise (fast two-sum)
        vl = b.fsub(vl, b.fsub(vh, sh))
        uh, ul = two_prod(xs, vh)
        ul = self.fma(b, xs, vl, ul)
        plain = b.fmul(x, self.fma(b, self.splat(GELU_K1[0]), b.fmul(x, x), self.splat(GELU_K0[0])))
        uh = b.select(small, uh, plain)
        return self._sigmoid_times(b, x, uh, ul)

    def _gelu_erf(self, b: ir.IRBuilder, x) -> ir.Value:
        # 0.5 x (1 + erf(z)), z = x / sqrt 2 = zh + zl (two products: a rounded z would cost up to
        # 2 z^2 ULPs in erfc's tail); for z <= -0.5 as 0.5 x erfc(-z) (no cancellation)
        zh = b.fmul(x, self.splat(RSQRT2_HI))
        zl = self.fma(b, x, self.splat(RSQRT2_HI), b.fsub(self.splat(0.0), zh))
        zl = self.fma(b, x, self.splat(RSQRT2_LO), zl)
        neg_zh = b.fsub(self.splat(0.0), zh)
        half_x = b.fmul(self.splat(0.5), x)
        tail = self._erfc_big(b, b.select(self._lt(b, zh, -ERF_SMALL), neg_zh, self.splat(1.0)),
                              b.fsub(self.splat(0.0), zl), half_x)      # 0.5 x erfc(-z), scaled last
        upper = b.fsub(self.splat(2.0), self._erfc_big(b, b.select(self._lt(b, zh, ERF_SMALL),
                                                                    self.splat(1.0), zh)))
        mid = b.fadd(self.splat(1.0), self._erf_small(b, zh))
        f = b.fmul(half_x, b.select(self._lt(b, zh, ERF_SMALL), mid, upper))
        return b.select(self._lt(b, zh, -ERF_SMALL), tail, f)
