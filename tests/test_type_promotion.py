"""Float type promotion between arrays (issue 27, "Dtypes"): operands of different float dtypes
compute in their join, as JAX promotes (f16/bf16 < f32 < f64; bf16 with f16 is f32), instead of
being refused.  Python numbers are weak (tests/test_runtime_scalars.py)."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.errors import DtypeError

import oracle as O

BF16 = dt.bfloat16


def arr(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("da,db,want", [(np.float16, np.float32, np.float32), (BF16, np.float32, np.float32),
                                        (BF16, np.float16, np.float32), (np.float32, np.float64, np.float64),
                                        (np.float16, np.float64, np.float64)])
def test_binary_ops_compute_in_the_join(rng, da, db, want):
    a, b = arr(rng, (7, 33), da), arr(rng, (33,), db)
    got = ts.jit(lambda p, q: p * q + p)(a, b)
    assert got.dtype == np.dtype(want) and dt.promote(da, db) == np.dtype(want)
    exp = O.f64(a) * O.f64(b) + O.f64(a)
    tol = 1e-12 if want == np.float64 else 1e-6
    O.assert_close(got, exp, tol)


def test_a_bf16_gemm_plus_an_f32_bias_promotes(rng):
    """The issue's case, ``a_f16 @ b_f16 + c_f32``, gives f32 (the GEMM result is cast, then added);
    in bf16 here: the CPU lane has no f16 GEMM yet (MMA_SELECTOR)."""
    a, b, c = arr(rng, (40, 64), BF16), arr(rng, (64, 24), BF16), arr(rng, (24,), np.float32)
    f = ts.jit(lambda p, q, r: p @ q + r)
    got = f(a, b, c)
    assert got.dtype == np.float32
    want = O.f64(a) @ O.f64(b) + O.f64(c)
    O.assert_close(got, want, 8e-3)   # the GEMM result is rounded to bf16 (2^-8) before the f32 add
    assert ts.explain(f, a, b, c).lane == "cpu-x86"


def test_mixed_matmul_operands_promote(rng):
    a, b = arr(rng, (9, 20), BF16), arr(rng, (20, 11), np.float32)
    got = ts.jit(lambda p, q: p @ q)(a, b)
    assert got.dtype == np.float32
    O.assert_close(got, O.f64(a) @ O.f64(b), 1e-6)


def test_bool_operand_promotes_to_the_float(rng):
    """JAX's lattice puts bool below every number (tests/test_int_dtypes.py has the whole table)."""
    x = arr(rng, (4, 4), np.float32)
    m = rng.standard_normal((4, 4)) > 0
    got = ts.jit(lambda p, q: p * q)(x, m)
    assert got.dtype == np.float32 and np.array_equal(got, x * m)
    assert dt.promote(np.float32, np.bool_) == np.float32
    assert dt.promote(np.float32, np.uint16) is None
    with pytest.raises(DtypeError):
        ts.jit(lambda p, q: p * q)(m, m)


def test_plant_a_narrow_join_is_caught(rng, monkeypatch):
    """Planted: the join is the first operand's dtype (f16 wins over f32): the dtype and accuracy
    check fails."""
    monkeypatch.setattr(dt, "promote", lambda a, b: np.dtype(a))
    with pytest.raises(AssertionError):
        test_binary_ops_compute_in_the_join(rng, np.float16, np.float32, np.float32)
