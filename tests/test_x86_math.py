"""ULP error of the compiled transcendentals over the whole float32 input range."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.tools import numerics as N

# The whole range (every 997th bit pattern: all exponents, subnormals, inf, nan).
WHOLE_RANGE_BOUND = {"exp": 1.0, "tanh": 2.0, "erf": 3.0}
# Composites evaluate their inner argument in float32; for x << 0 its rounding is amplified by exp
# (documented in docs/numerics.md).  On [-4, 4] these bounds hold (regression guard).
COMPOSITE_BOUND = {"gelu_tanh": 24.0, "gelu_erf": 24.0, "silu": 4.0}


@pytest.fixture(scope="module")
def measured():
    return N.measure()


@pytest.mark.parametrize("name", sorted(WHOLE_RANGE_BOUND))
def test_transcendental_ulp_over_whole_range(measured, name):
    assert measured[name]["max_ulp"] <= WHOLE_RANGE_BOUND[name], measured[name]


@pytest.mark.parametrize("name", sorted(COMPOSITE_BOUND))
def test_composite_ulp_where_well_conditioned(name):
    import tessera as ts
    fn, ref = N.references()[name]
    x = np.linspace(-4, 4, 200_003, dtype=np.float32)
    e = N.ulp_errors(ts.jit(fn)(x), ref(x.astype(np.float64)))
    assert e.max() <= COMPOSITE_BOUND[name]


def test_special_values(measured):
    import tessera as ts
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0, -200.0], np.float32)
    with np.errstate(all="ignore"):
        for fn, ref in [(ts.ops.exp, np.exp), (ts.ops.tanh, np.tanh), (ts.ops.erf, N._erf)]:
            got = ts.jit(fn)(x)
            want = ref(x.astype(np.float64)).astype(np.float32)
            np.testing.assert_array_equal(got, want)


def test_ulp_measure_has_teeth():
    ref = np.array([1.0, 2.0, np.nan, np.inf])
    got = np.array([1.0, 2.0 + 2 * np.spacing(np.float32(2.0)), np.nan, np.inf], np.float32)
    e = N.ulp_errors(got, ref)
    assert e[0] == 0 and 1.5 < e[1] < 2.5 and e[2] == 0 and e[3] == 0
    assert np.isinf(N.ulp_errors(np.array([np.nan], np.float32), np.array([1.0])))[0]


def test_silu_far_tail_is_accurate_without_subnormal_intermediates():
    # past |x| = 64 silu scales exp(-|x|) by 2^100 and back in its last step: the far tail stays
    # within 2 ULP (a shifted argument, rounded in float32, once cost 36 ULP here)
    import tessera as ts
    fn, ref = N.references()["silu"]
    x = np.linspace(-200, -60, 100_003, dtype=np.float32)
    assert N.ulp_errors(ts.jit(fn)(x), ref(x.astype(np.float64))).max() <= 2.0


def test_subnormal_silu_results_are_rounded_not_truncated(monkeypatch):
    """silu's subnormal results (x in (-104, -87)) come from an integer shift with round to
    nearest even (a floating-point scale there costs a microcode assist); a shift that
    truncates instead fails the half-ULP bound."""
    import tessera as ts
    from tessera.codegen import x86_math
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    fn, ref = N.references()["silu"]
    x = np.linspace(-104, -87, 100_003, dtype=np.float32)
    want = ref(x.astype(np.float64))
    # deep subnormal results (an ULP is 2^-149 there, and the input's own error is a small part of it)
    sub = np.abs(want) < np.finfo(np.float32).tiny / 2**8
    assert np.count_nonzero(sub) > 20_000
    got = ts.jit(fn)(x)
    assert N.ulp_errors(got[sub], want[sub]).max() <= 0.55   # rounded: half an ULP and the input's error

    def truncating(self, b, v, s):
        bits = b.bitcast(v, self.vi)
        mag = b.and_(bits, self.isplat(0x7FFFFFFF))
        eb = b.lshr(mag, self.isplat(23))
        m = b.or_(b.and_(mag, self.isplat(0x7FFFFF)), self.isplat(0x800000))
        sh = b.sub(self.isplat(s + 1), eb)
        sh = b.select(b.icmp_signed(">", sh, self.isplat(31)), self.isplat(31), sh)
        sub = b.or_(b.lshr(m, sh), b.and_(bits, self.isplat(-0x80000000)))
        normal = b.icmp_signed(">", eb, self.isplat(s))
        return b.bitcast(b.select(normal, b.sub(bits, self.isplat(s << 23)), sub), self.vt)
    monkeypatch.setattr(x86_math.VectorMath, "_scale_down_exact", truncating)
    bad = ts.jit(fn)(x)
    assert N.ulp_errors(bad[sub], want[sub]).max() > 0.9


def test_sigmoid_tail_branch_has_teeth(monkeypatch):
    """silu/gelu take a short path on every lane and branch to an exact one only when some lane's
    result is x exp(y) with y in (-110, -87) (tiny or subnormal); never taking that branch
    returns a wrong (normal-sized) value there."""
    import tessera as ts
    from tessera.codegen import x86_math
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    fn, ref = N.references()["silu"]
    x = np.linspace(-109, -88, 10_007, dtype=np.float32)
    want = ref(x.astype(np.float64))
    assert N.ulp_errors(ts.jit(fn)(x), want).max() <= 2.0
    monkeypatch.setattr(x86_math.VectorMath, "_any", lambda self, b, mask: x86_math.ir.Constant(x86_math.I1, 0))
    assert N.ulp_errors(ts.jit(fn)(x), want).max() > 1e3


@pytest.mark.parametrize("name", ["silu", "gelu_tanh"])
def test_sigmoid_lanes_are_independent(name):
    """A vector mixing short-path, tail and underflowing lanes gives each lane the value it gets
    alone (the tail branch merges per lane)."""
    import tessera as ts
    fn, _ = N.references()[name]
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-150, 30, 4000), rng.uniform(-12, -9, 4000),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0]]).astype(np.float32)
    f = ts.jit(fn)
    perm = rng.permutation(len(x))
    with np.errstate(all="ignore"):
        mixed = f(x[perm])[:300]
        alone = np.array([f(np.full(16, v, np.float32))[0] for v in x[perm[:300]]], np.float32)
    np.testing.assert_array_equal(mixed.view(np.uint32), alone.view(np.uint32))


def test_exp_subnormal_window_branch_has_teeth(monkeypatch):
    """Without vscalefps (AVX2) exp takes a short path on every lane (one exponent shift) and
    branches to the exact two-step scale only when some lane's result is subnormal or near it
    (x in [-104, -86.5)); never taking that branch returns garbage there."""
    import tessera as ts
    from tessera.codegen import x86_math
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = np.linspace(-104, -86, 10_007, dtype=np.float32)
    want = np.exp(x.astype(np.float64))
    assert N.ulp_errors(ts.jit(ts.ops.exp, arch="avx2")(x), want).max() <= 1.0
    monkeypatch.setattr(x86_math.VectorMath, "_any", lambda self, b, mask: x86_math.ir.Constant(x86_math.I1, 0))
    assert N.ulp_errors(ts.jit(ts.ops.exp, arch="avx2")(x), want).max() > 1e3


def test_exp_lanes_are_independent():
    """A vector mixing short-path lanes, subnormal-window lanes, the overflow edge, infinities
    and NaN gives each lane the value it gets alone, within an ULP of numpy's."""
    import tessera as ts
    rng = np.random.default_rng(11)
    edge = [88.72, 88.7228, 88.73, 88.75, 88.76, 89.0, -86.4, -86.6, -87.4, -103.9, -103.98, -104.0, -104.1]
    x = np.concatenate([rng.uniform(-120, 90, 3000), rng.uniform(-104, -86, 1000), edge,
                        [np.nan, np.inf, -np.inf, 0.0, -0.0]]).astype(np.float32)
    f = ts.jit(ts.ops.exp, arch="avx2")
    perm = rng.permutation(len(x))
    with np.errstate(all="ignore"):
        mixed = f(x[perm])
        alone = np.array([f(np.full(8, v, np.float32))[0] for v in x[perm[:400]]], np.float32)
        want = np.exp(x[perm].astype(np.float64))
    np.testing.assert_array_equal(mixed[:400].view(np.uint32), alone.view(np.uint32))
    assert N.ulp_errors(mixed, want).max() <= 1.0


def _bounded_as_exp(monkeypatch):
    """Compile ts.ops.exp with the bounded form (what softmax and attention use for x - max)."""
    from tessera.codegen import x86_math
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")   # the substituted kernel must not reach the cache
    monkeypatch.setattr(x86_math.VectorMath, "_exp", x86_math.VectorMath._exp_bounded)
    return x86_math


def test_bounded_exp_ulp_over_its_domain(monkeypatch):
    """exp_bounded (no overflow clamp) is exp for every x <= 88.7: within 1 ULP there, special
    values and the subnormal window included, each lane as it gets alone."""
    import tessera as ts
    _bounded_as_exp(monkeypatch)
    x = N.sweep()
    x = x[~(x > 88.7)]                                        # NaN kept
    rng = np.random.default_rng(5)
    x = np.concatenate([x, rng.uniform(-104, -86, 2000).astype(np.float32),
                        np.array([-np.inf, np.nan, 0.0, -0.0, 88.7, -86.5, -104.0], np.float32)])
    f = ts.jit(ts.ops.exp, arch="avx2")
    with np.errstate(all="ignore"):
        got = f(x)
        assert N.ulp_errors(got, np.exp(x.astype(np.float64))).max() <= 1.0
        perm = rng.permutation(len(x))[:300]
        alone = np.array([f(np.full(8, v, np.float32))[0] for v in x[perm]], np.float32)
    np.testing.assert_array_equal(got[perm].view(np.uint32), alone.view(np.uint32))


def test_bounded_exp_window_branch_has_teeth(monkeypatch):
    import tessera as ts
    x86_math = _bounded_as_exp(monkeypatch)
    x = np.linspace(-104, -86, 10_007, dtype=np.float32)
    want = np.exp(x.astype(np.float64))
    assert N.ulp_errors(ts.jit(ts.ops.exp, arch="avx2")(x), want).max() <= 1.0
    monkeypatch.setattr(x86_math.VectorMath, "_any", lambda self, b, mask: x86_math.ir.Constant(x86_math.I1, 0))
    assert N.ulp_errors(ts.jit(ts.ops.exp, arch="avx2")(x), want).max() > 1e3


@pytest.mark.parametrize("arch", ["avx2", None])
@pytest.mark.parametrize("name", ["silu", "gelu_tanh"])
def test_sigmoid_edges_of_the_short_form(name, arch):
    """The sigmoid's form (every ISA) clamps -y to [-80, 89.5] and lets exp overflow to inf past
    88.72 (x / inf is the signed zero y <= -110 needs); its branch covers y in (-110, -88.5).
    Inputs on both sides of every edge, against float64, and activations of large magnitude
    (mostly past the edges), on AVX2 and on the host's widest vectors."""
    import tessera as ts
    fn, ref = N.references()[name]
    f = ts.jit(fn, arch=arch)
    edges_y = np.array([-110.0, -89.5, -88.72, -88.5, -80.0, 80.0, 88.5, 89.5])
    if name == "silu":
        x = np.concatenate([np.linspace(e - 0.05, e + 0.05, 2001) for e in edges_y])
    else:   # the x whose y = 2 sqrt(2/pi) (x + 0.044715 x^3) is at an edge (y is monotonic in x)
        grid = np.linspace(-14, 14, 2_000_001)
        yy = 2 * np.sqrt(2 / np.pi) * (grid + 0.044715 * grid ** 3)
        x = np.concatenate([np.linspace(grid[np.argmin(abs(yy - e))] - 0.01, grid[np.argmin(abs(yy - e))] + 0.01,
                                        2001) for e in edges_y])
    x = np.concatenate([x, np.random.default_rng(9).standard_normal(100_000) * 32]).astype(np.float32)
    with np.errstate(all="ignore"):
        err = N.ulp_errors(f(x), ref(x.astype(np.float64)))
    bound = 3.0 if name == "silu" else 200.0   # gelu: the argument's float32 rounding (docs/numerics.md)
    assert err.max() <= bound, (err.max(), x[np.argmax(err)])


def _exp2_as_exp(monkeypatch):
    """Compile ts.ops.exp with exp2_bounded in exp's place (attention's 2^x, in log2 units)."""
    from tessera.codegen import x86_math
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")   # the substituted kernel must not reach the cache
    monkeypatch.setattr(x86_math.VectorMath, "_exp", x86_math.VectorMath._exp2_bounded)
    return x86_math


def _exp2_reference(x):
    """2^x in float64, and the documented 0 below 2^-126 (x < -126, -inf)."""
    return np.where(x < -126, 0.0, np.exp2(x.astype(np.float64)))


@pytest.mark.parametrize("arch", ["avx2", None])
def test_exp2_bounded_ulp_over_its_domain(monkeypatch, arch):
    """exp2_bounded is 2^x within 1 ULP for every swept x <= 127 whose result is normal, exactly 0
    below 2^-126, NaN for NaN; each lane gets the value it gets alone."""
    import tessera as ts
    _exp2_as_exp(monkeypatch)
    x = N.sweep()
    x = x[~(x > 127)]                                         # NaN kept
    rng = np.random.default_rng(6)
    x = np.concatenate([x, rng.uniform(-127, -125, 2000).astype(np.float32),
                        rng.uniform(-2, 2, 2000).astype(np.float32),
                        np.array([-np.inf, np.nan, 0.0, -0.0, 127.0, -126.0, np.nextafter(np.float32(-126), 0),
                                  np.nextafter(np.float32(-126), -np.inf), 0.5, -0.5], np.float32)])
    f = ts.jit(ts.ops.exp, arch=arch)
    with np.errstate(all="ignore"):
        got = f(x)
        want = _exp2_reference(x)
        assert N.ulp_errors(got, want).max() <= 1.0
        assert np.all(got[x < -126] == 0) and np.isnan(got[np.isnan(x)]).all()
        perm = rng.permutation(len(x))[:300]
        alone = np.array([f(np.full(8, v, np.float32))[0] for v in x[perm]], np.float32)
    np.testing.assert_array_equal(got[perm].view(np.uint32), alone.view(np.uint32))


def test_exp2_bounded_has_teeth(monkeypatch):
    """A planted slip in the composed polynomial (its first coefficient off by 2^-20) fails the bound."""
    import tessera as ts
    x86_math = _exp2_as_exp(monkeypatch)
    x = np.linspace(-3, 3, 10_007, dtype=np.float32)
    monkeypatch.setattr(x86_math, "EXP2_Q", (x86_math.EXP2_Q[0] * (1 + 2.0 ** -20),) + x86_math.EXP2_Q[1:])
    assert N.ulp_errors(ts.jit(ts.ops.exp, arch="avx2")(x), _exp2_reference(x)).max() > 1.0
