"""``pow`` (``**``) on the GPU lanes: a float tensor or scalar exponent is a typed ``tessera_gpu.math
pow`` whose LLVM translation is the CPU lane's (``codegen/x86_pow.py`` through ``codegen/gpu_typed.py``:
|x|^y = exp(y log|x|) in f64 lanes of the shared vector math library, rounded once to f32, then numpy's
special cases); small integer exponents are traced as multiplies, as on every lane.

Proved three ways: the translation JIT-compiled on the host (scalar and 4-lane vector, as the GPU lanes
use it) against numpy's float64 ``power`` rounded to f32 (within one f32 ulp; NaN / inf / signed zero
exact); programs compiled for nvidia (sm_80, sm_90: ptxas) and rocm (gfx942, gfx1100: linked code
objects), standalone and in a GEMM epilogue, run in the warp emulator against float64 numpy; planted
bugs (the translation without the negative base's sign, the emulator's pow without C99's special
cases) fail.
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.toolchain import find_llvm_tool, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
LANES = [("nvidia", "sm_80"), ("nvidia", "sm_90"), ("rocm", "gfx942"), ("rocm", "gfx1100")]


def _specials(rng, n):
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    y = (rng.standard_normal(n) * 2).astype(np.float32)
    sx = [0, -0.0, 0, -0.0, np.nan, np.nan, np.inf, -np.inf, -np.inf, -1, -1, 1, -2, -2, -2, 0.5, 3, -8, 1e30, 1e-30]
    sy = [-1, -3, 2, 3, 0, 2, -1, 3, 2, np.inf, np.nan, np.nan, 3, 0.5, -2, np.inf, 100, 1 / 3, 2, -2]
    x[:len(sx)], y[:len(sy)] = sx, sy
    y[40:60] = np.round(y[40:60] * 3)          # negative bases with integer exponents: signs by parity
    x[40:60] = -np.abs(x[40:60])
    return x, y


def _want(x, y):
    with np.errstate(all="ignore"):
        return np.power(x.astype(np.float64), y.astype(np.float64))


def _close(got, want64, ulps=1):
    """Each f32 result within ``ulps`` f32 ulps of the float64 value (NaN where it is NaN, inf and
    signed zeros exact)."""
    with np.errstate(all="ignore"):
        want = want64.astype(np.float32)
    got = np.asarray(got, np.float32)
    same = ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
    fin = np.isfinite(want) & np.isfinite(got) & (want != 0)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    with np.errstate(all="ignore"):
        near = fin & (np.abs(got.astype(np.float64) - want64) <= ulps * ulp + 0.5 * ulp)
    return same | near


def _host_pow(x, y, lanes):
    from test_gpu_int import _jit_typed
    f, _ee = _jit_typed("pow", (np.float32, np.float32), np.float32, lanes)
    got = np.zeros_like(x)
    for s in range(0, x.size, lanes):
        a, b = np.ascontiguousarray(x[s:s + lanes]), np.ascontiguousarray(y[s:s + lanes])
        r = np.zeros(lanes, np.float32)
        f(a.ctypes.data, b.ctypes.data, None, r.ctypes.data)
        got[s:s + lanes] = r
    return got


@pytest.mark.parametrize("lanes", [1, 4])
def test_pow_translation_runs_on_the_host_like_numpy(rng, lanes):
    x, y = _specials(rng, 128)
    ok = _close(_host_pow(x, y, lanes), _want(x, y))
    assert ok.all(), (x[~ok][:6], y[~ok][:6])


def test_planted_pow_without_the_sign_fails_on_the_host(rng, monkeypatch):
    from tessera.codegen import x86_pow
    real = x86_pow.emit_pow

    def unsigned(cg, x0, y0):       # |x| ** y: the odd-integer sign dropped
        fabs = cg.gen.intrinsic(f"llvm.fabs.v{x0.type.count}f32", x0.type, [x0.type])
        return real(cg, cg.b.call(fabs, [x0]), y0)
    monkeypatch.setattr(x86_pow, "emit_pow", unsigned)
    x, y = _specials(rng, 64)
    assert not _close(_host_pow(x, y, 4), _want(x, y)).all()


def _prog(a, b, w):
    return a ** b, a ** 3, ts.ops.pow(b, 2.5), (a @ w) ** b[:, :16]


@needs_ptxas
@pytest.mark.parametrize("target,arch", LANES)
def test_pow_on_the_gpu_lanes_matches_float64(rng, target, arch):
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")
    x, y = _specials(rng, 8 * 77)
    a, b = x.reshape(8, 77), y.reshape(8, 77)
    a16 = a.astype(np.float16)
    w = (rng.standard_normal((77, 16)) * 0.1).astype(np.float16)
    args = (a16, b.astype(np.float16), w)
    art = ts.compile(_prog, *args, target=target, arch=arch)
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and not rep.reason
    kinds = [k["kind"] for k in rep.kernels]
    assert "gemm" in kinds and all(k["registers" if target == "nvidia" else "vgprs"] > 0 for k in rep.kernels)
    gemm = next(k for k in rep.kernels if k["kind"] == "gemm")
    assert "tessera.pow" in gemm["ops"], gemm["ops"]                   # fused into the GEMM's epilogue
    got = art.emulate(*args)
    a64, b64, w64 = (v.astype(np.float64) for v in args)
    wants = (_want(a64, b64), a64 ** 3, _want(b64, np.float64(2.5)), None)
    for g, wv in zip(got[:3], wants[:3]):
        ok = _close(np.asarray(g, np.float32), wv, ulps=2)
        # f16 results: compare the f16 rounding of the float64 value
        ok |= np.asarray(g, np.float64) == wv.astype(np.float16).astype(np.float64)
        ok |= np.isnan(np.asarray(g, np.float64)) & np.isnan(wv)
        assert ok.all(), (g[~ok][:5], wv[~ok][:5])
    with np.errstate(all="ignore"):
        ref = np.power(a64 @ w64, b64[:, :16])
    g = np.asarray(got[3], np.float64)
    fin = np.isfinite(ref) & (np.abs(ref) < 1e4)
    assert np.array_equal(np.isnan(g), np.isnan(ref))
    assert (np.abs(g - ref)[fin] <= 2e-2 * np.maximum(1.0, np.abs(ref[fin]))).all()


@needs_ptxas
def test_planted_emulator_pow_without_special_cases_fails(rng, monkeypatch):
    from tessera.emulate import typed
    real = typed.run

    def naive(fn, args, out):
        if fn == "pow":
            with np.errstate(all="ignore"):
                a, c = (v.astype(np.float64) for v in args)
                return np.exp(c * np.log(np.abs(a))).astype(out)
        return real(fn, args, out)
    monkeypatch.setattr(typed, "run", naive)
    from tessera.emulate import simt
    monkeypatch.setattr(simt, "typed_run", naive)
    x, y = _specials(rng, 4 * 40)
    a, b = x.reshape(4, 40), y.reshape(4, 40)
    art = ts.compile(lambda p, q: p ** q, a, b, target="nvidia", arch="sm_80")
    assert not _close(art.emulate(a, b), _want(a, b)).all()
