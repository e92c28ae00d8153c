"""torch / JAX / DLPack / __array_interface__ arrays in and out of tessera.jit (issue 29).

Every numeric check compares with a float64 numpy oracle on fresh random inputs; each check
that guards a property (no copy, read-only, no negative strides, the right framework, bf16
read from its dtype code) is shown to fail on a planted bug.
"""
from __future__ import annotations

import gc
import sys

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.errors import DeviceArrayError, DtypeError, RequiresGradError
from tessera.frontend import dlpack, interop
from tessera.runtime.cpu import CpuExecutable

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


@ts.jit
def fma(x, y):
    return x * y + x


@ts.jit
def pair(x, y):
    return x + y, x * y


TOL = {"float32": 1e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2, "int32": 0}
DTYPES = list(TOL)


def _np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _inputs(rng, name, shape=(5, 7)):
    if name == "int32":
        return [rng.integers(-50, 50, shape).astype(np.int32) for _ in range(2)]
    return [rng.standard_normal(shape).astype(_np_dtype(name)) for _ in range(2)]


def _to(fw, a: np.ndarray):
    """``a`` as a ``fw`` array (bf16 through its bits, since numpy does not export bf16)."""
    if fw == "numpy":
        return a
    if fw == "torch":
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())
    return jnp.asarray(a)


def _host(r) -> np.ndarray:
    if isinstance(r, torch.Tensor):
        if r.dtype == torch.bfloat16:
            return r.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return r.numpy()
    return np.asarray(r)


def _check(r, x, y, name):
    want = x.astype(np.float64) * y.astype(np.float64) + x.astype(np.float64)
    got = _host(r)
    assert got.dtype == _np_dtype(name) and got.shape == want.shape
    err = np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max())
    assert err <= TOL[name], f"{name}: relative error {err}"


FRAMEWORK_TYPE = {"torch": lambda: torch.Tensor, "jax": lambda: jax.Array, "numpy": lambda: np.ndarray}


@pytest.mark.parametrize("fw", ["torch", "jax", "numpy"])
@pytest.mark.parametrize("name", DTYPES)
def test_framework_in_framework_out(rng, fw, name):
    x, y = _inputs(rng, name)
    import contextlib
    # JAX holds float64 only with x64 enabled (else it makes float32 of it)
    with jax.enable_x64(True) if fw == "jax" and name == "float64" else contextlib.nullcontext():
        r = fma(_to(fw, x), _to(fw, y))
        assert isinstance(r, FRAMEWORK_TYPE[fw]()), type(r)
        _check(r, x, y, name)


def test_oracle_has_teeth(rng, monkeypatch):
    """bf16 read as f16 bits (the wrong dtype code) gives wrong values, and the check says so."""
    x, y = _inputs(rng, "bfloat16")
    real = dlpack.dtype_of
    monkeypatch.setattr(dlpack, "dtype_of", lambda c, b, n: np.dtype(np.float16) if c == dlpack.BFLOAT
                        else real(c, b, n))
    r = fma(_to("torch", x), _to("torch", y))
    with pytest.raises(AssertionError):
        _check(r, x, y, "bfloat16")


def test_bf16_from_dtype_code():
    assert dlpack.dtype_of(dlpack.BFLOAT, 16, 1) == ml_dtypes.bfloat16
    assert dlpack.dtype_of(dlpack.FLOAT, 16, 1) == np.float16
    with pytest.raises(DtypeError):
        dlpack.dtype_of(dlpack.FLOAT, 32, 4)   # a vector-lane dtype


def test_tuple_results_and_mixed_frameworks(rng):
    x, y = _inputs(rng, "float32")
    s, p = pair(_to("torch", x), _to("torch", y))
    assert isinstance(s, torch.Tensor) and isinstance(p, torch.Tensor)
    np.testing.assert_allclose(s.numpy(), x.astype(np.float64) + y, rtol=1e-6)
    np.testing.assert_allclose(p.numpy(), x.astype(np.float64) * y, rtol=1e-6)
    for a, b in [(_to("torch", x), _to("jax", y)), (_to("torch", x), y), (x, _to("jax", y))]:
        r = fma(a, b)   # more than one framework: numpy, as documented
        assert type(r) is np.ndarray
        _check(r, x, y, "float32")


def _spy(monkeypatch) -> list:
    """The data pointers of the arrays each kernel launch reads."""
    seen = []
    real = CpuExecutable._execute

    def spy(self, plan, arrays):
        seen.append([a.ctypes.data for a in arrays])
        return real(self, plan, arrays)
    monkeypatch.setattr(CpuExecutable, "_execute", spy)
    return seen


def _read_in_place(monkeypatch, t, u):
    seen = _spy(monkeypatch)
    fma(t, u)
    assert seen[-1] == [t.data_ptr(), u.data_ptr()]


def test_contiguous_torch_read_in_place(rng, monkeypatch):
    x, y = _inputs(rng, "float32")
    t, u = _to("torch", x), _to("torch", y)
    _read_in_place(monkeypatch, t, u)
    rep = str(fma.explain(t, u))
    assert "argument 0 (torch.Tensor" in rep and "read in place through DLPack 1." in rep
    # teeth: an importer that copies is caught
    monkeypatch.setattr(interop, "as_host", lambda a, i, fn, notes=None: np.array(a.numpy()))
    with pytest.raises(AssertionError):
        _read_in_place(monkeypatch, t, u)


@pytest.mark.parametrize("view", ["transpose", "step", "offset"])
def test_strided_torch_views(rng, view):
    base = [torch.from_numpy(a) for a in _inputs(rng, "float32", (8, 10))]
    pick = {"transpose": lambda b: b.T, "step": lambda b: b[:, ::3], "offset": lambda b: b[2:6, 1:8]}[view]
    t, u = pick(base[0]), pick(base[1])
    r = fma(t, u)
    assert isinstance(r, torch.Tensor) and r.is_contiguous()
    _check(r, t.numpy(), u.numpy(), "float32")
    rep = str(fma.explain(t, u))
    assert "not C-contiguous" in rep and "argument 0 copied to C-contiguous layout" in rep


def test_jax_input_is_never_written(rng):
    x, y = _inputs(rng, "float32")
    j = jnp.asarray(x)
    before = np.array(j)
    _check(fma(j, jnp.asarray(y)), x, y, "float32")
    view = interop.as_host(j, 0, fma)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    np.testing.assert_array_equal(np.array(j), before)
    # teeth: a view made writable and written is seen by the comparison above
    view.flags.writeable = True
    view[0, 0] += 1.0
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(np.array(j), before)


def test_requires_grad_refused(rng):
    x, y = _inputs(rng, "float32")
    t = torch.from_numpy(x).requires_grad_()
    with pytest.raises(RequiresGradError) as e:
        fma(t, torch.from_numpy(y))
    assert e.value.code == "REQUIRES_GRAD" and "argument 0 of fma" in str(e.value)
    _check(fma(t.detach(), torch.from_numpy(y)), x, y, "float32")


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
    gpu = ts.jit(lambda x: x + x, target="nvidia", arch="sm_90")
    with pytest.raises(DeviceArrayError) as e:
        gpu(_FakeDevice(kind))
    assert dev in str(e.value) and "nvidia-sm_90" in str(e.value)


def test_complex_refused_with_a_code():
    with pytest.raises(DtypeError) as e:
        fma(torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.complex64))
    assert e.value.code == "DTYPE_UNSUPPORTED"


class _Legacy:
    """A producer of the pre-1.0 protocol only (``__dlpack__`` takes no max_version)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class _Interface:
    def __init__(self, a):
        self.a = a
        self.__array_interface__ = a.__array_interface__


def test_legacy_protocol_and_array_interface(rng, monkeypatch):
    x, y = _inputs(rng, "float32")
    seen = _spy(monkeypatch)
    r = fma(_Legacy(x), _Interface(y))
    assert type(r) is np.ndarray
    _check(r, x, y, "float32")
    assert seen[-1] == [x.ctypes.data, y.ctypes.data]
    rep = str(fma.explain(_Legacy(x), _Interface(y)))
    assert "read in place through legacy DLPack" in rep and "__array_interface__" in rep


def test_producer_memory_released():
    a = np.ones((3, 4), np.float32)
    base = sys.getrefcount(a)
    view = interop.as_host(_Legacy(a), 0, fma)
    assert sys.getrefcount(a) > base   # the capsule's owner holds the producer's array
    del view
    gc.collect()
    assert sys.getrefcount(a) == base


def test_exported_results_have_no_negative_strides(monkeypatch):
    flipped = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, ::-1]
    for kind in ["torch", "jax", "numpy"]:
        out = interop.export(flipped, kind)
        np.testing.assert_array_equal(_host(out), flipped)
        if kind != "jax":
            assert all(s >= 0 for s in (out.stride() if kind == "torch" else out.strides))
    monkeypatch.setattr(interop, "_positive", lambda o: o)   # teeth: torch refuses the raw view
    with pytest.raises(ValueError):
        interop.export(flipped, "torch")
    assert any(s < 0 for s in interop.export(flipped, "numpy").strides)


def test_dynamic_buckets_take_torch_tensors(rng):
    """jit(dynamic=) with torch tensors: read as numpy, padded to the bucket, the result torch."""
    torch = pytest.importorskip("torch")
    f = ts.jit(lambda x: ts.ops.softmax(x) * 2.0, dynamic={"x": 1})
    for n in (37, 45):   # one bucket (64)
        x = torch.from_numpy(rng.standard_normal((3, n)).astype(np.float32))
        y = f(x)
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == (3, n)
        ref = np.exp(x.double().numpy() - x.double().numpy().max(-1, keepdims=True))
        np.testing.assert_allclose(y.numpy(), 2 * ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert len(f.compiles) == 1
