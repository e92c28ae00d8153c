"""The strided entry point of an exported library (tessera/aotlib/strided.py): ``name_strided``
takes element strides for every buffer, uses contiguous ones in place and copies the others
once.  Called through ctypes on numpy views (transposed, stepped, reversed, broadcast) and
compared with the contiguous call and a float64 oracle."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tessera as ts
from tessera.aotlib import driver, strided
from tessera.toolchain import find_llvm_tool

pytestmark = pytest.mark.skipif(find_llvm_tool("ld.lld", 19) is None, reason="no ld.lld >= 19 (the ziglang wheel)")


def f(x, w, b):
    return ts.ops.gelu(x @ w + b), x * 2.0


def oracle(x, w, b):
    u = x.astype(np.float64) @ w + b
    return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3))), 2.0 * x.astype(np.float64)


def _args(rng, m=24, k=40, n=56):
    return [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,))]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    rng = np.random.default_rng(0)
    return ts.export(f, *_args(rng), path=str(tmp_path_factory.mktemp("strided")), name="fs", threads=2).load()


def _views(rng, x, w, b):
    """The same values as x, w, b in non-contiguous layouts."""
    xt = np.ascontiguousarray(x.T).T                           # column-major
    wb = rng.standard_normal((2 * w.shape[0], w.shape[1])).astype(np.float32)
    wb[::2] = w
    rev = b[::-1].copy()[::-1]                                  # a negative stride
    return xt, wb[::2], rev


def _close(got, want):
    return np.abs(got.astype(np.float64) - want).max() <= 2e-4 * max(1.0, float(np.abs(want).max()))


def test_strided_inputs_and_outputs_match_the_oracle(lib, rng):
    x, w, b = _args(rng)
    want = oracle(x, w, b)
    big = rng.standard_normal((24, 112)).astype(np.float32)
    keep = big[:, 1::2].copy()
    o0, o1 = big[:, ::2], np.zeros((40, 24), np.float32).T
    assert lib.call_strided(*_views(rng, x, w, b), out=[o0, o1]) == driver.OK
    assert _close(o0, want[0]) and _close(o1, want[1])
    np.testing.assert_array_equal(big[:, 1::2], keep)          # the gaps of a strided output untouched
    plain = lib(x, w, b)                                        # the same bits as the contiguous entry
    np.testing.assert_array_equal(o0, plain[0])
    np.testing.assert_array_equal(o1, plain[1])


def test_broadcast_input_and_contiguous_buffers_in_place(lib, rng):
    x, w, b = _args(rng)
    row = rng.standard_normal((1, 40)).astype(np.float32)
    xb = np.broadcast_to(row, (24, 40))                         # zero stride on axis 0: read, never copied back
    o = [np.empty((24, 56), np.float32), np.empty((24, 40), np.float32)]
    assert lib.call_strided(xb, w, b, out=o) == driver.OK
    want = oracle(np.ascontiguousarray(xb), w, b)
    assert _close(o[0], want[0]) and _close(o[1], want[1])


def test_overlapping_output_is_an_error_code(lib, rng):
    x, w, b = _args(rng)
    o0 = np.zeros((24, 56), np.float32)
    o1 = np.broadcast_to(np.zeros((1, 40), np.float32), (24, 40))
    assert lib.call_strided(x, w, b, out=[o0, o1]) == driver.ERR_STRIDE
    assert b"two of its elements in one place" in lib.strerror(driver.ERR_STRIDE)
    assert not o0.any()                                         # refused before anything ran


def test_null_strides_is_the_contiguous_call(lib, rng):
    import ctypes
    x, w, b = _args(rng)
    fn = getattr(lib.dll, "fs_strided")
    fn.restype = ctypes.c_int
    o = [np.empty((24, 56), np.float32), np.empty((24, 40), np.float32)]
    assert fn(*[ctypes.c_void_p(a.ctypes.data) for a in (x, w, b, *o)], None) == driver.OK
    want = oracle(x, w, b)
    assert _close(o[0], want[0]) and _close(o[1], want[1])


def test_dynamic_size_with_strides(tmp_path, rng):
    x, w, b = _args(rng, m=32)
    dl = ts.export(f, x, w, b, path=str(tmp_path), name="fsd", dynamic={"x": {0: "rows"}}).load()
    xs, ws, bs = _views(rng, *_args(rng, m=7))
    o = [np.empty((7, 56), np.float32), np.zeros((40, 7), np.float32).T]
    assert dl.call_strided(xs, ws, bs, out=o) == driver.OK
    want = oracle(np.ascontiguousarray(xs), ws, bs)
    assert _close(o[0], want[0]) and _close(o[1], want[1])


def test_planted_stride_blindness_is_caught(tmp_path, rng, monkeypatch):
    """Teeth: a library that takes every buffer as contiguous gives wrong results on these views."""
    monkeypatch.setattr(strided, "CHECK_STRIDES", False)
    bad = ts.export(f, *_args(rng), path=str(tmp_path), name="fsbad").load()
    x, w, b = _args(rng)
    o = [np.empty((24, 56), np.float32), np.empty((24, 40), np.float32)]
    assert bad.call_strided(*_views(rng, x, w, b), out=o) == driver.OK
    assert not _close(o[0], oracle(x, w, b)[0])
