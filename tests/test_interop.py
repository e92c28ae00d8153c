"""JAX / DLPack / __array_interface__ arrays in and out of tessera.jit (issue 29); no torch needed.

The torch side is tests/test_interop_torch.py.  Every numeric check compares with a float64
numpy oracle on fresh random inputs; each check that guards a property (no copy, read-only, no
negative strides, the right framework, bf16 read from its dtype code, the fast path taken) is
shown to fail on a planted bug.  JAX is in the ``test`` extra; the JAX tests skip without it.
"""
from __future__ import annotations

import contextlib
import gc
import sys

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from interop_common import DTYPES, Legacy, check, fma, inputs, spy
from tessera.errors import ArgumentError, DeviceArrayError, DtypeError
from tessera.frontend import dlpack, fastread, interop


@pytest.fixture
def jnp():
    pytest.importorskip("jax")
    import jax.numpy
    return jax.numpy


@pytest.mark.parametrize("name", DTYPES)
def test_jax_in_jax_out(rng, jnp, name):
    import jax
    x, y = inputs(rng, name)
    # JAX holds float64 only with x64 enabled (else it makes float32 of it)
    with jax.enable_x64(True) if name == "float64" else contextlib.nullcontext():
        r = fma(jnp.asarray(x), jnp.asarray(y))
        assert isinstance(r, jax.Array), type(r)
        check(r, x, y, name)


@pytest.mark.parametrize("name", DTYPES)
def test_numpy_in_numpy_out(rng, name):
    x, y = inputs(rng, name)
    r = fma(x, y)
    assert type(r) is np.ndarray
    check(r, x, y, name)


def test_jax_and_numpy_mixed_give_numpy(rng, jnp):
    x, y = inputs(rng, "float32")
    r = fma(x, jnp.asarray(y))
    assert type(r) is np.ndarray
    check(r, x, y, "float32")


def test_oracle_has_teeth(rng, jnp, monkeypatch):
    """bf16 read as f16 bits (the wrong dtype code) gives wrong values, and the check says so."""
    x, y = inputs(rng, "bfloat16")
    a, b = Legacy(jnp.asarray(x)), Legacy(jnp.asarray(y))   # through the capsule, not the fast path
    check(fma(a, b), x, y, "bfloat16")
    real = dlpack.dtype_of
    monkeypatch.setattr(dlpack, "dtype_of", lambda c, bits, n: np.dtype(np.float16) if c == dlpack.BFLOAT
                        else real(c, bits, n))
    with pytest.raises(AssertionError):
        check(fma(a, b), x, y, "bfloat16")


def test_bf16_from_dtype_code():
    assert dlpack.dtype_of(dlpack.BFLOAT, 16, 1) == ml_dtypes.bfloat16
    assert dlpack.dtype_of(dlpack.FLOAT, 16, 1) == np.float16
    with pytest.raises(DtypeError):
        dlpack.dtype_of(dlpack.FLOAT, 32, 4)   # a vector-lane dtype


def test_jax_read_in_place_without_a_capsule(rng, jnp, monkeypatch):
    """The fast path: the kernel reads the JAX buffers themselves, and no DLPack capsule is read."""
    x, y = inputs(rng, "float32")
    j, k = jnp.asarray(x), jnp.asarray(y)
    seen = spy(monkeypatch)

    def no_capsule(c):
        raise AssertionError("the fast path read a DLPack capsule")
    monkeypatch.setattr(dlpack, "from_capsule", no_capsule)
    check(fma(j, k), x, y, "float32")
    assert seen[-1] == [j.unsafe_buffer_pointer(), k.unsafe_buffer_pointer()]
    # teeth: a reader that copies is caught
    monkeypatch.setitem(fastread._READERS, type(j), lambda a: np.array(a))
    fma(j, k)
    assert seen[-1] != [j.unsafe_buffer_pointer(), k.unsafe_buffer_pointer()]


def test_jax_input_is_never_written(rng, jnp):
    x, y = inputs(rng, "float32")
    j = jnp.asarray(x)
    before = np.array(j)
    check(fma(j, jnp.asarray(y)), x, y, "float32")
    for view in (interop.as_host(j, 0, fma), fastread.reader(j)(j)):   # the capsule's and the fast path's
        assert not view.flags.writeable
        with pytest.raises(ValueError):
            view[0, 0] = 1.0
    np.testing.assert_array_equal(np.array(j), before)
    # teeth: a view made writable and written is seen by the comparison above
    view = interop.as_host(j, 0, fma)
    view.flags.writeable = True
    view[0, 0] += 1.0
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(np.array(j), before)


def test_jax_strided_result_and_complex(rng, jnp):
    x, y = inputs(rng, "float32", (6, 4))
    r = fma(jnp.asarray(x).T, jnp.asarray(y).T)   # JAX materialises the transpose: a dense array
    check(r, x.T, y.T, "float32")
    with pytest.raises(DtypeError) as e:
        fma(jnp.ones(3, jnp.complex64), jnp.ones(3, jnp.complex64))
    assert e.value.code == "DTYPE_UNSUPPORTED"


class _FakeDevice:
    """An array that says it lives on a GPU (no GPU here): only its protocol is exercised."""
    shape, dtype = (4,), "float32"

    def __init__(self, kind):
        self.kind = kind

    def __dlpack_device__(self):
        return (self.kind, 1)

    def __dlpack__(self, **kw):   # pragma: no cover - must never be asked for
        raise AssertionError("device memory must not be exported to the CPU lane")


@pytest.mark.parametrize("kind,dev", [(dlpack.CUDA, "cuda:1"), (dlpack.ROCM, "rocm:1")])
def test_device_array_refused(kind, dev):
    with pytest.raises(DeviceArrayError) as e:
        fma(_FakeDevice(kind), np.ones(4, np.float32))
    assert e.value.code == "DEVICE_ARRAY" and dev in str(e.value) and "cpu-x86" in str(e.value)
    if kind == dlpack.CUDA:
        return   # the nvidia lane takes CUDA arrays where they are (tests/test_device_resident.py)
    gpu = ts.jit(lambda x: x + x, target="nvidia", arch="sm_90")
    with pytest.raises(DeviceArrayError) as e:
        gpu(_FakeDevice(kind))
    assert dev in str(e.value) and "nvidia-sm_90" in str(e.value)


class _Interface:
    def __init__(self, a):
        self.a = a
        self.__array_interface__ = a.__array_interface__


def test_legacy_protocol_and_array_interface(rng, monkeypatch):
    x, y = inputs(rng, "float32")
    seen = spy(monkeypatch)
    r = fma(Legacy(x), _Interface(y))
    assert type(r) is np.ndarray
    check(r, x, y, "float32")
    assert seen[-1] == [x.ctypes.data, y.ctypes.data]
    rep = str(fma.explain(Legacy(x), _Interface(y)))
    assert "read in place through legacy DLPack" in rep and "__array_interface__" in rep


def test_producer_memory_released():
    a = np.ones((3, 4), np.float32)
    base = sys.getrefcount(a)
    view = interop.as_host(Legacy(a), 0, fma)
    assert sys.getrefcount(a) > base   # the capsule's owner holds the producer's array
    del view
    gc.collect()
    assert sys.getrefcount(a) == base


def test_exported_results_have_no_negative_strides(monkeypatch):
    flipped = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, ::-1]
    out = interop.export(flipped, "numpy")
    np.testing.assert_array_equal(out, flipped)
    assert all(s >= 0 for s in out.strides)
    monkeypatch.setattr(interop, "_positive", lambda o: o)   # teeth
    assert any(s < 0 for s in interop.export(flipped, "numpy").strides)


def test_jax_export_matches_jnp_asarray(jnp):
    """The fast export makes what jnp.asarray would: same values, dtype, device, uncommitted."""
    import jax
    flipped = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, ::-1]
    for o in (flipped, flipped.astype(ml_dtypes.bfloat16), (flipped > 4), flipped.astype(np.int32)):
        got, want = interop.export(o, "jax"), jnp.asarray(o)
        assert isinstance(got, jax.Array) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.devices() == want.devices() and got.committed == want.committed


def test_non_array_argument_names_what_is_accepted():
    with pytest.raises(ArgumentError) as e:
        fma("not an array", np.ones(3, np.float32))
    msg = str(e.value)
    for word in ("numpy", "torch", "JAX", "__dlpack__", "__array_interface__", "Python number"):
        assert word in msg, (word, msg)


def test_lane_log_notes_how_inputs_were_read(rng, jnp, monkeypatch):
    """With lane_log.inputs on, an ordinary call's entry says which argument was read in place and
    which copied; off (the default), entries carry no notes."""
    x, y = inputs(rng, "float32", (8, 6))
    yt = y.T.copy().T   # the same values, a transposed (not C-contiguous) view
    j, strided = jnp.asarray(x), Legacy(yt)
    check(fma(j, strided), x, y, "float32")
    assert ts.lane_log.entries[-1].function == "fma" and ts.lane_log.entries[-1].inputs == ()
    monkeypatch.setattr(ts.lane_log, "inputs", True)
    check(fma(j, strided), x, y, "float32")
    notes = ts.lane_log.entries[-1].inputs
    assert ts.lane_log.entries[-1].function == "fma" and len(notes) == 2, notes
    assert notes[0].startswith("argument 0 (jaxlib.ArrayImpl") and notes[0].endswith("read in place"), notes
    assert notes[1].startswith("argument 1 (") and notes[1].endswith("copied to C-contiguous layout"), notes
    check(fma(x, yt), x, y, "float32")
    assert ts.lane_log.entries[-1].inputs == ()   # numpy arguments only: no foreign array to note
