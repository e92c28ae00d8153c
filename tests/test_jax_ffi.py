"""tessera.jax without Python on the hot path: ``jax.ffi.ffi_call`` on a generated C++ XLA FFI handler
that calls the function's exported library (``tessera/aotlib/xla_ffi.py``; issue 29).

Against float64 numpy oracles: ``op(fn, via="ffi")`` inside ``jax.jit``, ``jax.vmap`` and
``jax.grad`` (the backward program exported and called the same way); the lowered program holds a
custom call to the handler and no host callback; once compiled, the calls run with every Tessera
Python entry point disabled.  ``ffi_op(library)`` on a library from ``tessera.export``.  Bad
input: a shape or dtype that does not match the exported signature is a coded error while JAX
traces; the handler itself refuses wrong buffers (a direct ``ffi_call``) with XLA's error, and a
library error code (a CPU without the library's features) comes back as an error, never a crash.
Teeth: a handler built with its inputs swapped fails the oracle.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tessera as ts  # noqa: E402
import tessera.jax as tsj  # noqa: E402
from tessera.aotlib import xla_ffi  # noqa: E402
from tessera.errors import ArgumentError, ShapeMismatchError  # noqa: E402
from tessera.frontend.jit import JitFunction  # noqa: E402
from tessera.mma import x86 as X  # noqa: E402

pytestmark = pytest.mark.skipif(xla_ffi.cxx_command() is None, reason="no C++ compiler (nor the ziglang wheel)")


def _layer(x, w, b):
    return ts.ops.tanh(x @ w + b)


def _ref(x, w, b):
    return np.tanh(x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64))


def _args(rng, m=5, k=3, n=4):
    return [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,))]


def _close(got, want, tol=1e-5):
    return np.allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def layer():
    return tsj.op(_layer, via="ffi", threads=1)


def test_jit_vmap_grad_through_the_ffi_handler(layer, rng):
    x, w, b = _args(rng)
    fn = jax.jit(lambda x, w, b: layer(x, w, b) * 2.0)
    hlo = fn.lower(x, w, b).as_text()
    assert "stablehlo.custom_call @tessera_" in hlo and "callback" not in hlo
    assert _close(fn(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b)), 2 * _ref(x, w, b))
    xs = rng.standard_normal((3, 5, 3)).astype(np.float32)
    yb = jax.jit(jax.vmap(layer, in_axes=(0, None, None)))(xs, w, b)
    assert _close(yb, np.stack([_ref(v, w, b) for v in xs]))
    loss = jax.jit(jax.grad(lambda x, w, b: jnp.sum(layer(x, w, b) ** 2), argnums=(0, 1, 2)))
    assert "callback" not in loss.lower(x, w, b).as_text()
    gx, gw, gb = loss(x, w, b)
    t = _ref(x, w, b)
    dz = 2 * t * (1 - t ** 2)
    assert _close(gx, dz @ w.T.astype(np.float64), 1e-4)
    assert _close(gw, x.T.astype(np.float64) @ dz, 1e-4)
    assert _close(gb, dz.sum(axis=0), 1e-4)


def test_no_tessera_python_on_the_hot_path(monkeypatch, rng):
    """Compiled once, the jitted function keeps computing right with every Tessera Python entry point
    raising; the pure_callback path under the same patch fails (so the patch bites)."""
    x, w, b = _args(rng, 8, 6, 5)
    via_ffi = jax.jit(tsj.op(_layer, via="ffi", threads=1))
    via_cb = jax.jit(tsj.op(_layer))
    via_ffi(x, w, b), via_cb(x, w, b)          # compile both

    def boom(*a, **k):
        raise RuntimeError("Tessera Python ran on the hot path")
    monkeypatch.setattr(JitFunction, "__call__", boom)
    monkeypatch.setattr(tsj, "_ffi_target", boom)
    monkeypatch.setattr(tsj, "_export", boom)
    for _ in range(3):
        x, w, b = _args(rng, 8, 6, 5)
        assert _close(via_ffi(x, w, b), _ref(x, w, b))
    with pytest.raises(Exception, match="hot path"):
        np.asarray(via_cb(x, w, b))


def test_ffi_op_on_an_exported_library(tmp_path, rng):
    x, w, b = _args(rng, 16, 8, 12)
    lib = ts.export(_layer, x, w, b, path=str(tmp_path), name="ffi_layer", threads=2)
    f = jax.jit(tsj.ffi_op(lib))
    for _ in range(2):
        x, w, b = _args(rng, 16, 8, 12)
        assert _close(f(x, w, b), _ref(x, w, b))
    assert os.path.exists(tmp_path / "libffi_layer_xla_ffi.so") and os.path.exists(tmp_path / "ffi_layer_xla_ffi.cc")


def test_arguments_that_do_not_match_the_exported_signature_are_coded_errors(tmp_path, rng):
    x, w, b = _args(rng, 4, 3, 2)
    g = tsj.ffi_op(ts.export(_layer, x, w, b, path=str(tmp_path), name="ffi_sig"))
    with pytest.raises(ShapeMismatchError) as e:
        jax.jit(g)(np.ones((5, 3), np.float32), w, b)
    assert e.value.code == "SHAPE_MISMATCH" and "(4, 3)" in str(e.value)
    with pytest.raises(ArgumentError) as e:
        jax.jit(g)(x.astype(np.int32), w, b)
    assert e.value.code == "BAD_ARGUMENT" and "int32" in str(e.value)
    with pytest.raises(ArgumentError):
        g(x, w)
    with pytest.raises(ArgumentError):
        tsj.op(_layer, via="ffi", vmap_method="expand_dims")
    with pytest.raises(ArgumentError):
        tsj.op(_layer, via="pipe")


def test_the_handler_itself_refuses_wrong_buffers(tmp_path, rng):
    """A direct ffi_call on the registered target with buffers of the wrong size: the handler returns
    XLA's InvalidArgument naming the buffer (no call into the library, no crash)."""
    x, w, b = _args(rng, 4, 3, 2)
    lib = ts.export(_layer, x, w, b, path=str(tmp_path), name="ffi_raw")
    target = tsj._ffi_target(lib)
    bad = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((4, 2), np.float32))
    with pytest.raises(Exception, match="the library was exported for") as e:
        np.asarray(bad(np.ones((7, 3), np.float32), w, b))
    assert "x is [7, 3]" in str(e.value)
    with pytest.raises(Exception, match="takes 3 input"):
        np.asarray(bad(x, w))
    good = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((4, 2), np.float32))
    assert _close(good(x, w, b), _ref(x, w, b))       # the process is fine after both


def _missing_arch():
    host = X.host_cpu()[1]
    for arch in ("x86-64-v4", "avx512_bf16", "cooperlake", "sapphirerapids"):
        if X.resolve(arch)[2] - host:
            return arch
    return None


def test_a_library_error_code_is_an_error_not_a_crash(tmp_path, rng):
    arch = _missing_arch()
    if arch is None:
        pytest.skip("this CPU has every feature of the candidate archs")
    x, w, b = _args(rng, 4, 3, 2)
    g = tsj.ffi_op(ts.export(_layer, x, w, b, path=str(tmp_path), name="ffi_elsewhere", arch=arch))
    with pytest.raises(Exception, match=r"libffi_elsewhere.so returned 1: .*lacks a feature"):
        np.asarray(jax.jit(g)(x, w, b))


def test_planted_swapped_inputs_fail_the_oracle(monkeypatch, rng):
    """Teeth: a handler that passes the library its first two inputs swapped gives wrong numbers."""
    real = xla_ffi.handler_source

    def swapped(lib):
        src = real(lib)
        return (src.replace("(in[0])", "(in[@])").replace("(in[1])", "(in[0])").replace("(in[@])", "(in[1])"))
    monkeypatch.setattr(xla_ffi, "handler_source", swapped)
    f = tsj.op(lambda x, y: x * 2.0 + y, via="ffi", threads=1)
    x, y = (rng.standard_normal((6, 5)).astype(np.float32) for _ in range(2))
    got = np.asarray(jax.jit(f)(x, y))
    assert not _close(got, 2.0 * x.astype(np.float64) + y)
    assert _close(got, 2.0 * y.astype(np.float64) + x)


@pytest.mark.slow
def test_handler_builds_with_zig_cxx_when_there_is_no_system_compiler(tmp_path):
    """TESSERA_TOOLCHAIN=bundled: the ziglang wheel's ``zig c++`` builds the handler (its first run
    builds libc++: about a minute here)."""
    code = ("import numpy as np, jax, tessera as ts, tessera.jax as tsj\n"
            "from tessera.aotlib import xla_ffi\n"
            "assert xla_ffi.cxx_command()[-1] == 'c++' and 'zig' in xla_ffi.cxx_command()[0]\n"
            "rng = np.random.default_rng(1)\n"
            "x, w = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)\n"
            "f = tsj.op(lambda x, w: ts.ops.tanh(x @ w), via='ffi', threads=1)\n"
            "y = np.asarray(jax.jit(f)(x, w))\n"
            "assert np.allclose(y, np.tanh(x.astype(np.float64) @ w), rtol=1e-5, atol=1e-5), y\n"
            "print('ok')\n")
    env = dict(os.environ, TESSERA_TOOLCHAIN="bundled")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
