"""Optimizer steps as traced, fused programs: ``tessera.optim.adamw``.

``adamw(params, grads, m, v, step, lr, b1, b2, eps, weight_decay)`` is one step of AdamW with
torch.optim.AdamW's formula (decoupled weight decay, bias-corrected moments):

    p  <- p * (1 - lr * wd)
    m' =  b1 m + (1 - b1) g            v' = b2 v + (1 - b2) g^2
    p' =  p - (lr / (1 - b1^t)) * m' / (sqrt(v') / sqrt(1 - b2^t) + eps)

over matching pytrees (lists, tuples, dicts) of float arrays; it returns ``(params', m', v')`` in
the same structure -- new arrays, never an argument changed behind the caller's back.  ``t`` is the
step count after this step (1 for the first).  Inside a traced function (``tessera.jit``, e.g. a
whole training step after ``value_and_grad``) it records the ops into that program; on arrays it
runs a jitted program kept per (structure, shapes, dtypes).  ``step``, ``lr``, ``b1``, ``b2``,
``eps`` and ``weight_decay`` are runtime scalars there: one compile serves every learning rate
and every step (``b^t`` is computed as ``exp(t log b)``, so ``t`` is never read as a Python value).
Each parameter's update is one elementwise group reading p, g, m, v and writing p', m', v' (the
returned moments are second outputs of that group: ``passes/graph/returned_outputs.py``), and on
the CPU lane every parameter's group runs in ONE launch (``passes/graph/fuse_multi_tensor.py``: one
kernel over the list of buffers); the scalar coefficients are one more 0-d launch shared by all
parameters: two launches a step, whatever the number of parameters.  With ``donate=True`` each
group reads p, m and v only at the element it writes, so p', m' and v' go into the donated
buffers (``runtime/donation.py``): a step allocates nothing the size of the parameters.
"""
from __future__ import annotations

import math

import numpy as np

from tessera.errors import ArgumentError
from tessera.frontend import ops
from tessera.frontend.trace import Tensor, tracing


def _flatten(tree, leaves: list):
    if isinstance(tree, dict):
        keys = sorted(tree)
        return ("dict", keys, [_flatten(tree[k], leaves) for k in keys])
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, None, [_flatten(t, leaves) for t in tree])
    leaves.append(tree)
    return None


def _unflatten(spec, it):
    if spec is None:
        return next(it)
    kind, keys, items = spec
    vals = [_unflatten(s, it) for s in items]
    if kind == "dict":
        return dict(zip(keys, vals))
    return tuple(vals) if kind == "tuple" else list(vals)


def _leaves(tree, what: str = ""):
    leaves: list = []
    spec = _flatten(tree, leaves)
    return leaves, spec


def _shape(x) -> tuple:
    return tuple(x._node.shape) if isinstance(x, Tensor) else tuple(np.shape(x))


def _coefficients(step, lr, b1, b2, eps, wd):
    """The scalars of the update, from runtime values (never read as Python numbers)."""
    bc1 = 1 - _f("exp", step * _f("log", b1))
    bc2 = 1 - _f("exp", step * _f("log", b2))
    return 1 - lr * wd, lr / bc1, _f("sqrt", bc2), b1, 1 - b1, b2, 1 - b2, eps


def _f(name: str, x):
    """``math.<name>`` of a Python number (a literal given inside a trace), else the traced op."""
    return getattr(math, name)(x) if isinstance(x, (int, float)) else getattr(ops, name)(x)


def _update(p, g, m, v, co):
    decay, step_size, sqrt_bc2, b1, c1, b2, c2, eps = co
    m2 = m * b1 + g * c1
    v2 = v * b2 + (g * g) * c2
    p2 = p * decay - step_size * m2 / (ops.sqrt(v2) / sqrt_bc2 + eps)
    return p2, m2, v2


def _traced(P, G, M, V, scalars):
    co = _coefficients(*scalars)
    out = [_update(p, g, m, v, co) for p, g, m, v in zip(P, G, M, V)]
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


_JITTED: dict = {}


def _jitted(n: int, donate: bool = False):
    """The jitted step over ``n`` parameters, its arguments flat: p..., g..., m..., v..., then the
    six scalars (one compile per shapes and dtypes, whatever the scalars' values); ``donate``: p, m
    and v donated (their buffers take p', m', v')."""
    jf = _JITTED.get((n, donate))
    if jf is None:
        from tessera.frontend.jit import JitFunction

        def adamw_step(*flat):
            P, G, M, V = (list(flat[k * n:(k + 1) * n]) for k in range(4))
            p2, m2, v2 = _traced(P, G, M, V, flat[4 * n:])
            return tuple(p2 + m2 + v2)
        adamw_step.__name__ = f"adamw_{n}"
        donated = (*range(n), *range(2 * n, 4 * n)) if donate else ()
        jf = _JITTED[(n, donate)] = JitFunction(adamw_step, donate_argnums=donated)
    return jf


def adamw(params, grads, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2, donate=False):
    """One AdamW step (torch.optim.AdamW's formula; ``step`` counts from 1): ``(params', m', v')``.
    ``params``, ``grads``, ``m`` and ``v`` are pytrees (lists, tuples, dicts) of one structure whose
    leaves have matching shapes and float dtypes; ``m`` and ``v`` start as zeros.

    ``donate=True`` (on arrays): ``params``, ``m`` and ``v`` are donated (``tessera.jit``'s
    ``donate_argnums``): ``params'``, ``m'`` and ``v'`` are written into their buffers, and the
    arrays passed in are read-only afterwards (keep the results: ``p, m, v = adamw(p, g, m, v, t,
    donate=True)``).  Without it, new arrays; no argument is changed.  Inside a traced function
    the caller's own ``donate_argnums`` decides."""
    P, spec = _leaves(params, "params")
    trees = [_leaves(t, name) for t, name in ((grads, "grads"), (m, "m"), (v, "v"))]
    for (leaves, s), name in zip(trees, ("grads", "m", "v")):
        if s != spec or len(leaves) != len(P):
            raise ArgumentError(f"adamw: {name} does not have the structure of params")
    G, M, V = (t[0] for t in trees)
    for k, leaf in enumerate(zip(P, G, M, V)):
        shapes = [_shape(x) for x in leaf]
        if len(set(shapes)) != 1:
            raise ArgumentError(f"adamw: leaf {k}: params, grads, m and v shapes differ: {shapes}")
    scalars = (step, lr, b1, b2, eps, weight_decay)
    if not P:
        return params, m, v
    if tracing() or any(isinstance(a, Tensor) for a in (*P, *G, *M, *V, *scalars)):
        p2, m2, v2 = _traced(P, G, M, V, scalars)
    else:
        n = len(P)
        out = _jitted(n, bool(donate))(*P, *G, *M, *V, *(float(s) for s in scalars))
        out = out if isinstance(out, tuple) else (out,)
        p2, m2, v2 = list(out[:n]), list(out[n:2 * n]), list(out[2 * n:])
    return tuple(_unflatten(spec, iter(x)) for x in (p2, m2, v2))


__all__ = ["adamw"]
