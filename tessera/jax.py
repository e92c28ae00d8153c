"""``tessera.jax``: a jitted Tessera function usable inside ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

    import jax, jax.numpy as jnp, tessera as ts
    mlp = ts.jax.op(lambda x, w: ts.ops.tanh(x @ w))
    y = jax.jit(lambda x, w: jnp.sum(mlp(x, w) ** 2))(x, w)
    gx = jax.grad(lambda x: jnp.sum(mlp(x, w)))(x)

The call goes through ``jax.pure_callback`` (the kernels run on the host CPU from Python; the
XLA-FFI handler without Python on the hot path is not built).  Result shapes and dtypes come from
Graph IR shape inference: the function is traced on zero-stride placeholders of the arguments'
shapes, never run, once per argument signature.  ``jax.vmap`` calls it once per batch element
(``vmap_method="sequential"``; pass ``"expand_dims"`` for a function that takes a leading batch
axis).  ``jax.grad`` uses a ``jax.custom_vjp`` whose backward is ``tessera.vjp`` of the same
function (one compiled program, the forward recomputed), also through a callback; integer and
bool arguments get zero (float0) cotangents.
"""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError
from tessera.frontend import graphgen
from tessera.frontend.autodiff import vjp as _ts_vjp
from tessera.frontend.jit import JitFunction
from tessera.frontend.trace import ARRAY, trace
from tessera.ir import dims as D


def result_types(jitfn: JitFunction, shapes) -> list[tuple[tuple, np.dtype]]:
    """Each result's (shape, dtype) for arguments of ``shapes`` ((shape, dtype) pairs), from the
    Graph IR built by tracing on zero-stride placeholders (no kernel runs)."""
    prepared, sizes = [], {}
    for i, (shape, d) in enumerate(shapes):
        prepared.append(np.lib.stride_tricks.as_strided(np.zeros(1, d), shape, (0,) * len(shape)))
        sizes.update({f"d{i}_{ax}": s for ax, s in enumerate(shape)})
    graph = trace(jitfn._call_fn, prepared, [ARRAY] * len(prepared), lane=(jitfn.target, jitfn.arch, jitfn.schedule))
    gir = graphgen.build(graph)
    main = next(o for o in gir.module.body.block.ops if getattr(o, "sym_name", None) is not None)
    return [(tuple(D.evaluate(d, sizes) if not isinstance(d, int) else d for d in t.dims), dt.from_ir(t.element_type))
            for t in main.function_type.outputs.data]


def _outputs(res) -> tuple:
    return tuple(np.asarray(r) for r in (res if isinstance(res, tuple) else (res,)))


def op(fn, *, vmap_method: str = "sequential"):
    """``fn`` (a function over ``tessera.ops`` or a ``tessera.jit`` function) as a JAX-traceable
    function of JAX arrays; see the module docstring."""
    import jax

    jf = fn if isinstance(fn, JitFunction) else JitFunction(fn)
    types: dict[tuple, list] = {}

    def signature(args):
        for i, a in enumerate(args):
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise ArgumentError(f"tessera.jax.op({jf.name}): argument {i} is a {type(a).__name__}; pass arrays "
                                    "(close over Python numbers)")
        key = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in args)
        if key not in types:
            types[key] = result_types(jf, key)
        return types[key]

    def call(args):
        outs = signature(args)
        res = jax.pure_callback(lambda *xs: _outputs(jf(*[np.asarray(x) for x in xs])),
                                tuple(jax.ShapeDtypeStruct(s, d) for s, d in outs), *args, vmap_method=vmap_method)
        return res[0] if len(outs) == 1 else tuple(res)

    @jax.custom_vjp
    def f(*args):
        return call(args)

    def fwd(*args):
        return call(args), args

    def bwd(args, ct):
        cts = ct if isinstance(ct, tuple) else (ct,)
        n = len(args)
        diff = [i for i, a in enumerate(args) if np.dtype(a.dtype).kind == "f" or a.dtype == jax.numpy.bfloat16]

        def host(*xs):
            prim = [np.asarray(x) for x in xs[:n]]
            grads = _ts_vjp(jf, *prim)[1](*[np.asarray(c) for c in xs[n:]])
            return tuple(np.zeros_like(prim[i]) if grads[i] is None else np.asarray(grads[i], prim[i].dtype)
                         for i in diff)
        got = jax.pure_callback(host, tuple(jax.ShapeDtypeStruct(args[i].shape, args[i].dtype) for i in diff),
                                *args, *cts, vmap_method=vmap_method) if diff else ()
        out = [np.zeros(a.shape, jax.dtypes.float0) for a in args]
        for i, g in zip(diff, got):
            out[i] = g
        return tuple(out)

    f.defvjp(fwd, bwd)
    f.__name__ = f"tessera_{jf.name}"
    return f


__all__ = ["op", "result_types"]
