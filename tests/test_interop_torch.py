"""torch tensors in and out of tessera.jit (issue 29); JAX / DLPack without torch: tests/test_interop.py.

torch is in the ``bench`` extra (its PyPI wheel pulls CUDA packages), not ``test``: this file
skips where torch is missing.  Numeric checks against float64 numpy oracles; each property check
is shown to fail on a planted bug.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from interop_common import DTYPES, check, fma, inputs, pair, spy
from tessera.errors import ArgumentError, DtypeError, RequiresGradError
from tessera.frontend import dlpack, fastread, interop

torch = pytest.importorskip("torch")


def _to(a: np.ndarray):
    """``a`` as a torch tensor (bf16 through its bits, since numpy does not export bf16)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


@pytest.mark.parametrize("name", DTYPES)
def test_torch_in_torch_out(rng, name):
    x, y = inputs(rng, name)
    r = fma(_to(x), _to(y))
    assert isinstance(r, torch.Tensor), type(r)
    check(r, x, y, name)


def test_oracle_has_teeth(rng, monkeypatch):
    """bf16 (read through DLPack: numpy has no bf16 for tensor.numpy()) read as f16 bits is caught."""
    x, y = inputs(rng, "bfloat16")
    real = dlpack.dtype_of
    monkeypatch.setattr(dlpack, "dtype_of", lambda c, b, n: np.dtype(np.float16) if c == dlpack.BFLOAT
                        else real(c, b, n))
    r = fma(_to(x), _to(y))
    with pytest.raises(AssertionError):
        check(r, x, y, "bfloat16")


def test_tuple_results_and_mixed_frameworks(rng):
    jnp = pytest.importorskip("jax.numpy")
    x, y = inputs(rng, "float32")
    s, p = pair(_to(x), _to(y))
    assert isinstance(s, torch.Tensor) and isinstance(p, torch.Tensor)
    np.testing.assert_allclose(s.numpy(), x.astype(np.float64) + y, rtol=1e-6)
    np.testing.assert_allclose(p.numpy(), x.astype(np.float64) * y, rtol=1e-6)
    for a, b in [(_to(x), jnp.asarray(y)), (_to(x), y)]:
        r = fma(a, b)   # more than one framework: numpy, as documented
        assert type(r) is np.ndarray
        check(r, x, y, "float32")


def _read_in_place(monkeypatch, t, u):
    seen = spy(monkeypatch)
    fma(t, u)
    assert seen[-1] == [t.data_ptr(), u.data_ptr()]


def test_contiguous_torch_read_in_place(rng, monkeypatch):
    x, y = inputs(rng, "float32")
    t, u = _to(x), _to(y)
    _read_in_place(monkeypatch, t, u)   # the fast path (tensor.numpy())
    for view, src in ((interop.as_host(t, 0, fma), t), (fastread.reader(t)(t), t)):
        assert view.ctypes.data == src.data_ptr() and not view.flags.writeable
    rep = str(fma.explain(t, u))
    assert "argument 0 (torch.Tensor" in rep and "read in place through DLPack 1." in rep
    # teeth: a fast reader that copies is caught
    monkeypatch.setitem(fastread._READERS, torch.Tensor, lambda a: np.array(a.numpy()))
    with pytest.raises(AssertionError):
        _read_in_place(monkeypatch, t, u)


def test_fast_path_reads_no_capsule(rng, monkeypatch):
    x, y = inputs(rng, "float32")

    def no_capsule(c):
        raise AssertionError("the fast path read a DLPack capsule")
    monkeypatch.setattr(dlpack, "from_capsule", no_capsule)
    check(fma(_to(x), _to(y)), x, y, "float32")
    monkeypatch.setitem(fastread._READERS, torch.Tensor, None)   # teeth: the general way reads one
    with pytest.raises(AssertionError, match="capsule"):
        fma(_to(x), _to(y))


@pytest.mark.parametrize("view", ["transpose", "step", "offset"])
def test_strided_torch_views(rng, view):
    base = [torch.from_numpy(a) for a in inputs(rng, "float32", (8, 10))]
    pick = {"transpose": lambda b: b.T, "step": lambda b: b[:, ::3], "offset": lambda b: b[2:6, 1:8]}[view]
    t, u = pick(base[0]), pick(base[1])
    r = fma(t, u)
    assert isinstance(r, torch.Tensor) and r.is_contiguous()
    check(r, t.numpy(), u.numpy(), "float32")
    rep = str(fma.explain(t, u))
    assert "not C-contiguous" in rep and "argument 0 copied to C-contiguous layout" in rep


def test_requires_grad_refused(rng):
    x, y = inputs(rng, "float32")
    t = torch.from_numpy(x).requires_grad_()
    with pytest.raises(RequiresGradError) as e:
        fma(t, torch.from_numpy(y))
    assert e.value.code == "REQUIRES_GRAD" and "argument 0 of fma" in str(e.value)
    check(fma(t.detach(), torch.from_numpy(y)), x, y, "float32")


def test_conjugated_and_complex_refused_with_a_code():
    c = torch.ones(3, dtype=torch.complex64)
    with pytest.raises(DtypeError) as e:
        fma(c, c)
    assert e.value.code == "DTYPE_UNSUPPORTED"
    with pytest.raises(ArgumentError) as e:   # torch will not export a lazily conjugated view
        fma(c.conj(), c.conj())
    assert e.value.code == "BAD_ARGUMENT"


def test_exported_results_have_no_negative_strides(monkeypatch):
    flipped = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, ::-1]
    out = interop.export(flipped, "torch")
    np.testing.assert_array_equal(out.numpy(), flipped)
    assert all(s >= 0 for s in out.stride())
    monkeypatch.setattr(interop, "_positive", lambda o: o)   # teeth: torch refuses the raw view
    with pytest.raises(ValueError):
        interop.export(flipped, "torch")


def test_dynamic_buckets_take_torch_tensors(rng):
    """jit(dynamic=) with torch tensors: read as numpy, padded to the bucket, the result torch."""
    import tessera as ts
    f = ts.jit(lambda x: ts.ops.softmax(x) * 2.0, dynamic={"x": 1})
    for n in (37, 45):   # one bucket (64)
        x = torch.from_numpy(rng.standard_normal((3, n)).astype(np.float32))
        y = f(x)
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == (3, n)
        ref = np.exp(x.double().numpy() - x.double().numpy().max(-1, keepdims=True))
        np.testing.assert_allclose(y.numpy(), 2 * ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert len(f.compiles) == 1
