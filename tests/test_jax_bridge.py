"""tessera.jax.op: a jitted Tessera function inside jax.jit, jax.vmap and jax.grad (pure_callback,
custom_vjp from tessera.vjp), against float64 numpy oracles."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tessera as ts  # noqa: E402
import tessera.jax as tsj  # noqa: E402


def _layer(x, w):
    return ts.ops.tanh(x @ w)


LAYER = tsj.op(_layer)


def _ref(x, w):
    return np.tanh(x.astype(np.float64) @ w.astype(np.float64))


def test_result_types_from_graph_ir():
    jf = ts.jit(lambda x, w: (ts.ops.tanh(x @ w), ts.ops.reduce_sum(x, axis=1)))
    assert tsj.result_types(jf, [((5, 3), np.float32), ((3, 7), np.float32)]) == [((5, 7), np.float32),
                                                                                    ((5,), np.float32)]


def test_jit_vmap_grad(rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    y = jax.jit(lambda x, w: LAYER(x, w) * 2.0)(jnp.asarray(x), jnp.asarray(w))
    assert np.allclose(np.asarray(y), 2 * _ref(x, w), rtol=1e-5, atol=1e-5)
    xs = rng.standard_normal((3, 5, 3)).astype(np.float32)
    yb = jax.vmap(LAYER, in_axes=(0, None))(jnp.asarray(xs), jnp.asarray(w))
    assert np.allclose(np.asarray(yb), np.stack([_ref(v, w) for v in xs]), rtol=1e-5, atol=1e-5)
    gx, gw = jax.grad(lambda x, w: jnp.sum(LAYER(x, w) ** 2), argnums=(0, 1))(jnp.asarray(x), jnp.asarray(w))
    t = _ref(x, w)
    dz = 2 * t * (1 - t ** 2)
    assert np.allclose(np.asarray(gx), dz @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert np.allclose(np.asarray(gw), x.T.astype(np.float64) @ dz, rtol=1e-4, atol=1e-4)


def test_planted_wrong_backward_is_caught(monkeypatch, rng):
    """Teeth: a backward that returns the cotangent of the wrong function fails the oracle."""
    real = tsj._ts_vjp
    monkeypatch.setattr(tsj, "_ts_vjp", lambda f, *p: real(ts.jit(lambda x, w: x @ w), *p))
    layer = tsj.op(_layer)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    gx = jax.grad(lambda x: jnp.sum(layer(x, jnp.asarray(w))))(jnp.asarray(x))
    t = _ref(x, w)
    assert not np.allclose(np.asarray(gx), (1 - t ** 2) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_bad_shapes_refused_while_jax_traces():
    """Shape inference runs when JAX traces: a mismatch is Tessera's coded error, before any call."""
    with pytest.raises(ts.TesseraError) as e:
        jax.jit(lambda x: LAYER(x, jnp.ones((4, 2))))(jnp.ones((2, 3)))
    assert e.value.code in ("SHAPE_MISMATCH", "RANK_MISMATCH")
