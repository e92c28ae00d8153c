"""Vector math for the x86 lane, emitted as LLVM IR (llvmlite) functions.

Each function takes and returns ``<W x float>`` and is marked ``alwaysinline``.
No fast-math flags: NaN and infinities propagate as numpy's do.  Coefficients
come from ``tools/fit_math.py``; the maximum ULP error of each function over its
whole input range is measured by ``tests/test_x86_math.py`` and recorded in
``docs/numerics.md``.

  exp   Cody-Waite reduction x = n ln2 + r, degree-7 Taylor polynomial, scaling by
        2^n with vscalefps on AVX-512; on AVX2 a short-latency form on every lane (n from a
        magic-constant rounding whose bits shift into 2^n, the polynomial's inner part in r^2)
        and two exponent steps only in a rarely taken branch for subnormal results; exact for
        subnormal results; 0 below -104 and inf above 89 (no underflowing or overflowing scale)
  exp2_bounded  2^x for x <= 127 (attention's probabilities, in log2 units): the exp polynomial
        composed with r = f ln2 (f = x - round(x), exact), so no Cody-Waite steps; results below
        2^-126 (x < -126) are 0: beside the row maximum's weight of 1, such a probability moves an
        output by less than 2^-126 times the values it weighs
  tanh  x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (exp(2|x|) + 1))
  erf   x P(x^2) for |x| < 1, else sign(x) (1 - erfc(|x|))
  erfc  exp(-a^2) R(1/a) with a^2 split exactly by an FMA (a >= 1)
  gelu  tanh form as x * sigmoid(2 y) (no cancellation for x << 0), computed as x / (1 + 2^z)
        with z = -2 y log2 e formed by the polynomial in x itself (no Cody-Waite steps); erf form via
        erfc for x < -sqrt(2)
  silu  x * sigmoid(x) as x / (1 + exp(-x)), the argument clamped (no overflow for x << 0);
        gelu and silu take the same form on every vector ISA
  sigmoid  1 / (1 + exp(-x)) in silu's form
  log, log1p, exp2, expm1, sin, cos  computed in f64 lanes and rounded once (x86_math_elem)
"""
from __future__ import annotations

import math

from llvmlite import ir

from tessera.codegen.x86_math_elem import ELEMENTARY, widened

F32 = ir.FloatType()
I32 = ir.IntType(32)
I1 = ir.IntType(1)

LOG2E = 1.4426950408889634
LN2_HI = 0.693145751953125
LN2_LO = 1.428606765330187e-06
# exp(r) = 1 + r + r^2 Q(r) on |r| <= ln2/2, near-minimax (tools/fit_math.py): degree 6 in all
EXP_Q = (0.4999999403953552, 0.1666652113199234, 0.04166839271783829, 0.008368746377527714, 0.00138145312666893)
# 2^f = 1 + f (ln2 + f Q2(f)) on |f| <= 1/2: EXP_Q composed with r = f ln2 (exact in float64, then
# rounded), i.e. the same polynomial as exp's in the variable whose reduction is exact
EXP2_LN2 = math.log(2.0)
EXP2_Q = tuple(q * EXP2_LN2 ** (i + 2) for i, q in enumerate(EXP_Q))
# gelu_tanh on AVX2 in the exponent's base: z = -2 y log2 e = x (GELU_Z[0] + GELU_Z[1] x^2),
# y = sqrt(2/pi) (x + 0.044715 x^3)
GELU_Z = (-2.0 * math.sqrt(2.0 / math.pi) * LOG2E, -2.0 * math.sqrt(2.0 / math.pi) * 0.044715 * LOG2E)
TANH_P = (-0.3333333432674408, 0.13333310186862946, -0.053960226476192474, 0.021774930879473686,
          -0.008359912782907486, 0.002307977993041277)
ERF_P = (1.128379225730896, -0.37612637877464294, 0.11283783614635468, -0.02686547487974167,
         0.005221138242632151, -0.0008485434227623045, 0.00011274706776021048, -9.689661965239793e-06)
ERFC_R1_CENTER, ERFC_R1 = 0.7, (0.3336736559867859, 0.3571956753730774, -0.1619383692741394,
                                0.04845910891890526, 0.008971983566880226, -0.03039189986884594,
                                0.031133446842432022, -0.021838560700416565, 0.0061324224807322025,
                                0.0070611946284770966)
ERFC_R2_CENTER, ERFC_R2 = 0.25, (0.1369994580745697, 0.5181360840797424, -0.16139350831508636,
                                 -0.11290739476680756, 0.21250073611736298, -0.09637019038200378,
                                 -0.17122098803520203, 0.3929065763950348, -0.20918630063533783,
                                 -0.5095713138580322)


class VectorLibrary:
    """The plumbing both vector math libraries share (this f32 one and ``x86_math64``'s f64 one):
    vectors of ``w`` lanes of ``ELEM``, LLVM intrinsics, constants, Horner polynomials in FMAs,
    and each function declared in the module on its first use."""
    ELEM: ir.Type = F32
    IELEM: ir.Type = I32
    SUFFIX = "f32"      # the intrinsics' element suffix
    FN_SUFFIX = ""      # appended to the library functions' names

    def __init__(self, module: ir.Module, w: int, avx512: bool = True):
        self.m = module
        self.w = w
        self.avx512 = avx512
        self.vt = ir.VectorType(self.ELEM, w)
        self.vi = ir.VectorType(self.IELEM, w)
        self.fns: dict[str, ir.Function] = {}

    def _intr(self, name: str, n: int = 1) -> ir.Function:
        full = f"llvm.{name}.v{self.w}{self.SUFFIX}"
        if full in self.m.globals:
            return self.m.globals[full]
        return ir.Function(self.m, ir.FunctionType(self.vt, [self.vt] * n), full)

    def splat(self, v: float) -> ir.Constant:
        return ir.Constant(self.vt, [ir.Constant(self.ELEM, float(v))] * self.w)

    def isplat(self, v: int) -> ir.Constant:
        return ir.Constant(self.vi, [ir.Constant(self.IELEM, int(v))] * self.w)

    def fma(self, b: ir.IRBuilder, x, y, z):
        return b.call(self._intr("fma", 3), [x, y, z])

    def poly(self, b: ir.IRBuilder, z, coef) -> ir.Value:
        """coef[0] + z coef[1] + ... by Horner's rule in FMAs."""
        acc = self.splat(coef[-1])
        for c in coef[-2::-1]:
            acc = self.fma(b, acc, z, self.splat(c))
        return acc

    def _define(self, name: str, body) -> ir.Function:
        if name in self.fns:
            return self.fns[name]
        fn = ir.Function(self.m, ir.FunctionType(self.vt, [self.vt]), f"tsr.{name}.v{self.w}{self.FN_SUFFIX}")
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(body(b, fn.args[0]))
        self.fns[name] = fn
        return fn

    def call(self, b: ir.IRBuilder, name: str, x) -> ir.Value:
        fn = getattr(self, "_" + name)
        return b.call(self._define(name, fn), [x])


class VectorMath(VectorLibrary):
    """Declares the math functions in one module on first use."""

    # ------------------------------------------------------------------ plumbing
    @property
    def _zmm(self) -> bool:
        """16-lane AVX-512 vectors: vscalefps and vrcp14ps exist (else the AVX2 forms)."""
        return self.w == 16 and self.avx512

    def recip(self, b: ir.IRBuilder, d) -> ir.Value:
        """1/d: vrcp14ps and one Newton step (~2^-27 relative) on AVX-512, else a division.
        Infinity gives 0 and zero gives infinity, as a division would."""
        if not self._zmm:
            return b.fdiv(self.splat(1.0), d)
        r = self._rcp14(b, d)
        nr = self._newton_recip(b, d, r)
        # the Newton step turns rcp(inf) = 0 and rcp(0) = inf into NaN: keep r where it is exact
        exact = b.or_(b.fcmp_ordered("==", r, self.splat(0.0)), b.fcmp_ordered("==", r, self.splat(float("inf"))))
        return b.select(exact, r, nr)

    def _rcp14(self, b: ir.IRBuilder, d) -> ir.Value:
        name = "llvm.x86.avx512.rcp14.ps.512"
        f = self.m.globals.get(name) or ir.Function(
            self.m, ir.FunctionType(self.vt, [self.vt, self.vt, ir.IntType(16)]), name)
        return b.call(f, [d, self.splat(0.0), ir.Constant(ir.IntType(16), -1)])

    def _newton_recip(self, b: ir.IRBuilder, d, r) -> ir.Value:
        """One Newton step r (2 - d r) towards 1/d (vrcp14ps's 2^-14 to about 2^-27)."""
        return b.fmul(r, self.fma(b, b.fsub(self.splat(0.0), d), r, self.splat(2.0)))

    def _any(self, b: ir.IRBuilder, mask) -> ir.Value:
        """True when any lane of an <W x i1> mask is set."""
        return b.icmp_unsigned("!=", b.bitcast(mask, ir.IntType(self.w)), ir.Constant(ir.IntType(self.w), 0))

    def _isnan(self, b, x):
        return b.fcmp_unordered("uno", x, x)

    def _abs(self, b, x):
        return b.call(self._intr("fabs"), [x])

    def _copysign(self, b, mag, sign):
        return b.call(self._intr("copysign", 2), [mag, sign])

    # ------------------------------------------------------------------ functions
    def _exp(self, b: ir.IRBuilder, x) -> ir.Value:
        """exp(x), one rounding at the end.  Lanes whose result rounds to +0 (x < -104) or
        overflows (x > 89) compute exp(0) and take 0 / inf from a select: scaling into an
        underflow or overflow costs a microcode assist on Intel cores (gelu on activations of
        magnitude 30 ran 7x slower)."""
        if not self._zmm:
            return self._exp_short(b, x)
        return self._exp_exact(b, x)

    def _exp_bounded(self, b: ir.IRBuilder, x) -> ir.Value:
        """exp(x) for x <= 88.7 or NaN (a difference from a running maximum: softmax, attention);
        larger x gives an unspecified value.  On AVX2 it is ``_exp_short`` without the overflow
        clamp.  (Also folding the -inf/x < -104 select into the window's compare saved another op
        per vector in softmax, but sent every vector holding a masked lane through a branch: causal
        attention's diagonal blocks, whose mask edge moves by a lane per row, ran 18 % slower on
        the mispredictions.)"""
        if self._zmm:
            return self._exp_exact(b, x)
        return self._exp_short(b, x, clamp=False)

    def _exp2_bounded(self, b: ir.IRBuilder, x) -> ir.Value:
        """2^x for x <= 127 or NaN (larger x: unspecified); 0 for x < -126 and -inf, so every result
        computed is a normal number (no subnormal window, no branch).  Emitted only for attention's
        online softmax, whose scores are scaled by log2 e into the exponent's own base: the
        reduction f = x - round(x) is exact, where exp needs two Cody-Waite FMAs, and a probability
        below 2^-126 beside the row maximum's weight of 1 moves an output by less than 2^-126 times
        the values it weighs (below float32's resolution of any output not itself that small)."""
        tiny = b.fcmp_ordered("<", x, self.splat(-126.0))
        return b.select(tiny, self.splat(0.0), self._exp2_core(b, x))

    def _exp2_core(self, b: ir.IRBuilder, x, double: bool = False) -> ir.Value:
        """2^x for x whose n = round(x) is in [-126, 127], or in [-125, 128] with ``double``
        (2 2^f 2^(n-1): reaches the largest finite results and overflows to inf past them, the
        scale's bits reaching the inf pattern at n = 129), NaN propagated; no range checks.  The
        exp polynomial composed with r = f ln2, f = x - round(x) exact (no Cody-Waite steps), in
        ``_exp_short_core``'s short-latency form."""
        bias = 126 if double else 127
        magic = 1.5 * 2.0 ** 23 + bias
        t = b.fadd(x, self.splat(magic))        # round(x) + bias + 1.5 2^23: its low bits are 2^n's exponent
        f = b.fsub(x, b.fsub(t, self.splat(magic)))   # x - round(x), exact, in [-1/2, 1/2]
        k = 2.0 if double else 1.0    # a power of two: the scaled coefficients are exact
        return self._short_poly_scaled(b, f, t, EXP2_Q, EXP2_LN2, k)   # k 2^f 2^(n + bias - 127)

    def _exp_exact(self, b: ir.IRBuilder, x) -> ir.Value:
        lo = b.fcmp_ordered("<", x, self.splat(-104.0))
        hi = b.fcmp_ordered(">", x, self.splat(89.0))
        res = self._exp_core(b, b.select(b.or_(lo, hi), self.splat(0.0), x))
        # NaN needs no select: both comparisons are false and the arithmetic carries it through
        return b.select(lo, self.splat(0.0), b.select(hi, self.splat(float("inf")), res))

    def _exp_core(self, b: ir.IRBuilder, x, k=None) -> ir.Value:
        """exp(x) * 2^k for x whose result is a normal number (no range checks)."""
        n = b.call(self._intr("roundeven"), [b.fmul(x, self.splat(LOG2E))])
        r = self.fma(b, n, self.splat(-LN2_HI), x)
        r = self.fma(b, n, self.splat(-LN2_LO), r)
        p = self.poly(b, r, [1.0, 1.0, 0.5, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040])
        return self._scale2(b, p, n if k is None else b.fadd(n, k))

    def _exp_short(self, b: ir.IRBuilder, x, clamp: bool = True) -> ir.Value:
        """exp(x) without vscalefps (AVX2): the short-latency form on every lane, the exact
        two-step scale of ``_exp_exact`` only when some lane's result is subnormal or near it
        (x in [-104, -86.5): a branch, rarely taken).  -inf and x < -104 give 0 by a select
        (masked scores stay on the short path), and x > 88.75 is clamped to 88.75, whose result
        overflows to inf (``clamp=False``: for arguments known not to exceed 88.7).  (Compares and blends share the two FMA pipes on Zen 3: each one
        saved is a cycle per two vectors.)"""
        tiny = b.fcmp_ordered("<", x, self.splat(-104.0))
        hi = self.splat(88.75)    # exp(88.75) overflows: clamping there gives inf
        xs = b.select(b.fcmp_ordered("<", hi, x), hi, x) if clamp else x   # one vminps, NaN kept
        short = self._exp_short_core(b, xs, double=True)
        short = b.select(tiny, self.splat(0.0), short)
        window = b.and_(b.fcmp_ordered("<", x, self.splat(-86.5)), b.not_(tiny))
        entry = b.block
        with b.if_then(self._any(b, window), likely=False):
            exact = b.select(window, self._exp_exact(b, b.select(window, x, self.splat(0.0))), short)
            tblock = b.block
        res = b.phi(self.vt)
        res.add_incoming(short, entry)
        res.add_incoming(exact, tblock)
        return res

    def _exp_short_core(self, b: ir.IRBuilder, x, double: bool) -> ir.Value:
        """exp(x) for x whose n = round(x log2 e) is in [-126, 127], or in [-125, 128] with
        ``double`` (2 exp(r) 2^(n-1): reaches the largest finite results, and overflows to inf
        past them).  Shorter dependency chains than ``_exp_core`` (the AVX2 exp was bound by
        latency, not throughput): n by rounding against a magic constant whose low bits are also
        the result's exponent field (one shift gives 2^n), and the polynomial's inner part
        evaluated in r^2 (two chains of half the length) before Horner's last two steps (which
        keep its rounding: 1.01 ULP when the inner part also took the 1 + r terms).  The polynomial
        is a near-minimax one of degree 6 (``EXP_Q``): 0.83 ULP on the sweep against 0.89 for
        Taylor's of degree 7, one FMA fewer (no speed change measured)."""
        bias = 126 if double else 127
        magic = 1.5 * 2.0 ** 23 + bias
        t = self.fma(b, x, self.splat(LOG2E), self.splat(magic))   # n + bias + 1.5 2^23, rounded to an integer
        n = b.fsub(t, self.splat(magic))
        r = self.fma(b, n, self.splat(-LN2_HI), x)
        r = self.fma(b, n, self.splat(-LN2_LO), r)
        k = 2.0 if double else 1.0    # a power of two: the scaled coefficients are exact
        return self._short_poly_scaled(b, r, t, EXP_Q, 1.0, k)   # k exp(r) 2^(n + bias - 127)

    def _short_poly_scaled(self, b: ir.IRBuilder, r, t, inner, lin: float, k: float) -> ir.Value:
        """k (1 + r (lin + r Q(r))) 2^(n + bias - 127), Q's coefficients ``inner`` (five), the
        scale from the exponent bits of ``t`` (n + bias + 1.5 2^23): the inner part in r^2 (two
        chains of half the length), then Horner's last two steps (exp and exp2's shared tail)."""
        r2 = b.fmul(r, r)
        c = [k * q for q in inner]
        q = [self.fma(b, r, self.splat(c[i + 1]), self.splat(c[i])) for i in (0, 2)]
        qq = self.fma(b, self.fma(b, self.splat(c[4]), r2, q[1]), r2, q[0])          # k Q(r)
        p = self.fma(b, r, self.fma(b, r, qq, self.splat(k * lin)), self.splat(k))   # Horner's last two steps
        scale = b.bitcast(b.shl(b.bitcast(t, self.vi), self.isplat(23)), self.vt)   # 2^(n + bias - 127)
        return b.fmul(p, scale)

    def _scale2(self, b: ir.IRBuilder, p, n) -> ir.Value:
        """p * 2^n for integral n in [-150, 128]: vscalefps on AVX-512 (one rounding, exact for
        subnormal and overflowing results), else two exponent steps."""
        if self._zmm:
            name = "llvm.x86.avx512.mask.scalef.ps.512"
            f = self.m.globals.get(name) or ir.Function(self.m, ir.FunctionType(
                self.vt, [self.vt, self.vt, self.vt, ir.IntType(16), I32]), name)
            return b.call(f, [p, n, self.splat(0.0), ir.Constant(ir.IntType(16), -1), ir.Constant(I32, 4)])
        ni = b.fptosi(n, self.vi)
        n1 = b.ashr(ni, self.isplat(1))
        n2 = b.sub(ni, n1)
        s1 = b.bitcast(b.shl(b.add(n1, self.isplat(127)), self.isplat(23)), self.vt)
        s2 = b.bitcast(b.shl(b.add(n2, self.isplat(127)), self.isplat(23)), self.vt)
        return b.fmul(b.fmul(p, s1), s2)

    def _tanh(self, b: ir.IRBuilder, x) -> ir.Value:
        a = self._abs(b, x)
        x2 = b.fmul(x, x)
        small = self.fma(b, b.fmul(x, x2), self.poly(b, x2, TANH_P), x)
        e = self.call(b, "exp", b.fmul(a, self.splat(2.0)))
        big = b.fsub(self.splat(1.0), b.fmul(self.splat(2.0), self.recip(b, b.fadd(e, self.splat(1.0)))))
        big = self._copysign(b, big, x)
        return b.select(b.fcmp_ordered("<", a, self.splat(0.625)), small, big)

    def _erfc_big(self, b: ir.IRBuilder, a) -> ir.Value:
        """erfc(a) for a >= 1 (also fine for a in [0.5, 1))."""
        hi = b.fmul(a, a)
        lo = self.fma(b, a, a, b.fsub(self.splat(0.0), hi))  # a*a - hi exactly
        e = self.call(b, "exp", b.fsub(self.splat(0.0), hi))
        e = b.fmul(e, b.fsub(self.splat(1.0), lo))
        u = b.fdiv(self.splat(1.0), a)
        r1 = self.poly(b, b.fsub(u, self.splat(ERFC_R1_CENTER)), ERFC_R1)
        r2 = self.poly(b, b.fsub(u, self.splat(ERFC_R2_CENTER)), ERFC_R2)
        r = b.select(b.fcmp_ordered("<", a, self.splat(2.5)), r1, r2)
        res = b.fmul(e, r)
        return b.select(b.fcmp_ordered(">", a, self.splat(10.0)), self.splat(0.0), res)

    def _erf(self, b: ir.IRBuilder, x) -> ir.Value:
        a = self._abs(b, x)
        small = b.fmul(x, self.poly(b, b.fmul(x, x), ERF_P))
        big = self._copysign(b, b.fsub(self.splat(1.0), self._erfc_big(b, a)), x)
        return b.select(b.fcmp_unordered("<", a, self.splat(1.0)), small, big)  # NaN takes the small path

    def _sigmoid_times(self, b: ir.IRBuilder, x, y) -> ir.Value:
        """x * sigmoid(y) for |x| <= |y| with y NaN only where x is (gelu, silu), as x / (1 + exp(-y))
        on every lane, -y clamped to [-80, 89.5], without overflow and without subnormal
        intermediates (a subnormal operand costs a microcode assist of ~100 cycles per instruction
        on Intel cores).  Up to 88.5 exp(-y) is finite and normal (past |y| = 17, 1 + exp(-y) is 1;
        down to y = -88.5 the quotient rounds as x exp(y) does); from 88.72 on it overflows to inf
        (the short form's scale reaches the inf pattern exactly at 89.5), so x / inf gives the
        signed zero (NaN for an infinite x, as x * 0) that y <= -110 needs.  Lanes with y in
        (-110, -88.5), whose results are tiny or subnormal, take a branch (``_sigmoid_tail``) that
        computes exp(y) 2^64 and scales the product down in integer arithmetic; it is taken only
        when some lane needs it, so activations of large magnitude (whose negative half mostly has
        y <= -110) stay on the fast path.

        One form for every vector ISA.  AVX-512 had its own until 2026-12-03, (x e) / (1 + e) with
        e = exp(-|y|) from vscalefps, vrcp14ps and a Newton step, sign and range selects: on Zen 4
        this form runs silu in 20.5 cycles per 16-lane vector against 28, gelu_tanh in 22.5
        against 35 (cache resident, one thread); with vrcp14ps + Newton in place of the division
        gelu took 26."""
        ny = b.fneg(y)
        arg = b.select(b.fcmp_ordered("<", ny, self.splat(89.5)), ny, self.splat(89.5))   # vminps; NaN -> 89.5
        arg = b.select(b.fcmp_ordered(">", arg, self.splat(-80.0)), arg, self.splat(-80.0))  # vmaxps
        fast = b.fdiv(x, b.fadd(self.splat(1.0), self._exp_short_core(b, arg, double=True)))
        slow = b.and_(b.fcmp_ordered("<", y, self.splat(-88.5)), b.fcmp_ordered(">", y, self.splat(-110.0)))
        return self._sigmoid_tail(b, x, y, slow, fast)

    def _sigmoid_times_exp2(self, b: ir.IRBuilder, x, z, y_of) -> ir.Value:
        """``_sigmoid_times`` with its argument given in the exponent's base: x / (1 + 2^z),
        z = -y log2 e, so 2^z needs no Cody-Waite steps (and a caller folds log2 e into its own
        constants).  The same edges, in log2 units: z clamped to [-80 log2 e, 129] (2^z is inf from
        128 on: the double form's scale reaches the inf pattern at n = 129); the branch for y in
        (-110, -88.5) computes y = ``y_of()`` there and only there."""
        arg = b.select(b.fcmp_ordered("<", z, self.splat(129.0)), z, self.splat(129.0))            # vminps; NaN -> 129
        arg = b.select(b.fcmp_ordered(">", arg, self.splat(-80.0 * LOG2E)), arg, self.splat(-80.0 * LOG2E))
        fast = b.fdiv(x, b.fadd(self.splat(1.0), self._exp2_core(b, arg, double=True)))
        slow = b.and_(b.fcmp_ordered(">", z, self.splat(88.5 * LOG2E)),
                      b.fcmp_ordered("<", z, self.splat(110.0 * LOG2E)))
        return self._sigmoid_tail(b, x, y_of, slow, fast)

    def _sigmoid_tail(self, b: ir.IRBuilder, x, y, slow, fast) -> ir.Value:
        """``fast``, with the ``slow`` lanes (y in the tail where x exp(y) is tiny or subnormal)
        replaced, in a branch taken only when there is one, by x exp(y) 2^64 (normal) scaled
        down by 2^64 in integer arithmetic with one rounding to nearest even."""
        S = 64
        entry = b.block
        with b.if_then(self._any(b, slow), likely=False):
            y = y() if callable(y) else y    # computed in the branch only (``_sigmoid_times_exp2``)
            scaled = self._exp_core(b, b.select(slow, y, self.splat(0.0)), self.splat(float(S)))  # exp(y) 2^64
            exact = self._scale_down_exact(b, b.fmul(b.select(slow, x, self.splat(0.0)), scaled), S)
            taken = b.select(slow, exact, fast)
            tblock = b.block
        res = b.phi(self.vt)
        res.add_incoming(fast, entry)
        res.add_incoming(taken, tblock)
        return res   # NaN: y is NaN only where x is, and x carries it through

    def _scale_down_exact(self, b: ir.IRBuilder, v, s: int) -> ir.Value:
        """v * 2^-s for a finite normal (or zero) v, rounded to nearest even, in integer
        arithmetic: a floating-point scale whose result is subnormal costs a microcode assist
        on Intel cores (a GEMM + gelu epilogue on activations of magnitude 32 ran 20 % slower
        than the bare GEMM, against 1-5 % on unit-scale ones)."""
        one = self.isplat(1)
        bits = b.bitcast(v, self.vi)
        sign = b.and_(bits, self.isplat(-0x80000000))
        mag = b.and_(bits, self.isplat(0x7FFFFFFF))
        eb = b.lshr(mag, self.isplat(23))                       # biased exponent of v
        normal = b.icmp_signed(">", eb, self.isplat(s))         # the result's exponent is still >= 1
        down = b.sub(bits, self.isplat(s << 23))
        m = b.or_(b.and_(mag, self.isplat(0x7FFFFF)), self.isplat(0x800000))
        sh = b.sub(self.isplat(s + 1), eb)                      # >= 1 where the result is subnormal
        sh = b.select(b.icmp_signed(">", sh, self.isplat(31)), self.isplat(31), sh)
        q = b.lshr(m, sh)
        rem = b.and_(m, b.sub(b.shl(one, sh), one))
        half = b.shl(one, b.sub(sh, one))
        odd = b.icmp_unsigned("!=", b.and_(q, one), self.isplat(0))
        up = b.or_(b.icmp_unsigned(">", rem, half), b.and_(b.icmp_unsigned("==", rem, half), odd))
        q = b.add(q, b.zext(up, self.vi))                       # a carry into bit 23 is the smallest normal
        return b.bitcast(b.select(normal, down, b.or_(q, sign)), self.vt)

    def _silu(self, b: ir.IRBuilder, x) -> ir.Value:
        return self._sigmoid_times(b, x, x)

    def _sigmoid(self, b: ir.IRBuilder, x) -> ir.Value:
        """1 / (1 + exp(-x)): ``_sigmoid_times`` at x = 1 (no overflow; tiny results exact)."""
        r = self._sigmoid_times(b, self.splat(1.0), x)
        return b.select(self._isnan(b, x), x, r)    # the form carries a NaN through x only

    # log, log1p, exp2, expm1, sin, cos: in f64 lanes, rounded once (x86_math_elem)
    wide_lib = None

    def wide(self):
        """The f64 library of this module at the same width (shared with the code generator's)."""
        if self.wide_lib is None:
            from tessera.codegen.x86_math64 import VectorMath64
            self.wide_lib = VectorMath64(self.m, self.w, self.avx512)
        return self.wide_lib

    _log, _log1p, _exp2, _expm1, _sin, _cos = (widened(n) for n in ELEMENTARY)

    def _gelu_tanh(self, b: ir.IRBuilder, x) -> ir.Value:
        # 0.5 x (1 + tanh(y)) == x * sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3)
        c = math.sqrt(2.0 / math.pi)

        def two_y(bb):
            x3 = bb.fmul(bb.fmul(x, x), x)
            # 2y in one product: scaling by 2 is exact, so (2c) t rounds as 2 (c t) does
            return bb.fmul(self.splat(2.0 * c), self.fma(bb, self.splat(0.044715), x3, x))
        # -2y log2 e in three roundings (as 2y takes four), then 2^z without Cody-Waite steps
        z = b.fmul(x, self.fma(b, self.splat(GELU_Z[1]), b.fmul(x, x), self.splat(GELU_Z[0])))
        return self._sigmoid_times_exp2(b, x, z, lambda: two_y(b))

    def _gelu_erf(self, b: ir.IRBuilder, x) -> ir.Value:
        # 0.5 x (1 + erf(x / sqrt2)); for x / sqrt2 <= -1 use 0.5 x erfc(|x| / sqrt2)
        z = b.fmul(x, self.splat(1 / math.sqrt(2.0)))
        a = self._abs(b, z)
        one_plus = b.fadd(self.splat(1.0), self.call(b, "erf", z))
        tail = self._erfc_big(b, a)
        f = b.select(b.fcmp_ordered("<=", z, self.splat(-1.0)), tail, one_plus)
        return b.fmul(b.fmul(self.splat(0.5), x), f)
