"""``tessera.grad``, ``value_and_grad``, ``vjp`` and ``stop_gradient``.

Inside a traced function (``jit(grad(f))``, or ``grad`` called in a jitted function) they trace
``f`` into the caller's graph and run the ``differentiate`` transformation (``differentiate.py``)
on what it recorded, so forward and backward are one program.  Called on arrays (``grad(f)(x)``,
``grad(jit(f))(x)``) they compile that same traced program with ``tessera.jit`` (the settings of
a jitted ``f``: target, arch, schedule) and run it; ``.explain(*args)`` / ``.compile(*args)``
give its lane report / artifact, backward kernels included.

As JAX: ``argnums`` an int (one gradient) or a tuple (a tuple of gradients); the differentiated
output must be a float scalar (``GRAD_NON_SCALAR``; ``vjp`` takes any output with a cotangent
of its shape); integer and bool arguments have no gradient (``GRAD_DTYPE``); ``has_aux``: ``f``
returns ``(output, aux)`` and aux is passed through.  A Python float argument differentiated with
respect to is taken as a float32 0-d array.  Keyword arguments pass through to ``f`` inside a
trace; a call on arrays takes positional arguments only.
"""
from __future__ import annotations

import numbers

import numpy as np

from tessera import dtypes as dt
from tessera.errors import GradArgnumsError, GradDtypeError, GradNonScalarError, ShapeMismatchError
from tessera.frontend import ops
from tessera.frontend import trace as tr
from tessera.frontend.differentiate import differentiate
from tessera.frontend.trace import Tensor, add_node, tracing, user_location


def stop_gradient(x):
    """``x`` unchanged; no gradient flows back through it (an identity view marked so).  On an
    array outside a trace: the array."""
    if not isinstance(x, Tensor):
        return x
    from tessera.frontend.vjp_rules import STOPPED
    y = add_node("reshape", [x._node], {}, x._node.shape, x.dtype)
    STOPPED.add(y._node)
    return y


def _err(cls, msg):
    return cls(msg, location=user_location())


def _argnums(argnums, nargs: int, what: str) -> tuple[tuple[int, ...], bool]:
    """(positions, whether one int was given)."""
    single = isinstance(argnums, numbers.Integral) and not isinstance(argnums, bool)
    nums = (argnums,) if single else argnums
    if not isinstance(nums, (tuple, list)) or not nums:
        raise _err(GradArgnumsError, f"{what}: argnums={argnums!r}; give an argument position or a tuple of them")
    out = []
    for a in nums:
        if isinstance(a, bool) or not isinstance(a, numbers.Integral):
            raise _err(GradArgnumsError, f"{what}: argnums={argnums!r} holds {a!r}, not an argument position")
        if not -nargs <= a < nargs:
            raise _err(GradArgnumsError, f"{what}: argnums {a} is out of range for {nargs} positional argument(s)")
        out.append(int(a) % nargs)
    return tuple(out), single


def _wrt(args: list, nums, what: str, strict: bool = True) -> list:
    """The node of each differentiated argument (None: not differentiable).  One value passed for
    two differentiated arguments is given a node of its own for each (an identity view), so each
    gradient counts only the uses through its argument.  (A closure of ``f`` that captures the very
    tensor passed as a differentiated argument is differentiated through too.)"""
    nodes = []
    for i in nums:
        a = args[i]
        ok = isinstance(a, Tensor) and dt.kind(a.dtype) == "f"
        if not ok:
            if strict:
                got = dt.name(a.dtype) if isinstance(a, Tensor) else type(a).__name__
                raise _err(GradDtypeError, f"{what}: argument {i} is {got}; only float arrays have a gradient "
                                           "(an integer, bool or static argument has none)")
            nodes.append(None)
            continue
        if any(n is a._node for n in nodes) or any(args[j] is a for j in nums if j != i):
            a = add_node("reshape", [a._node], {}, a._node.shape, a.dtype)   # one node per argument
            args[i] = a
        nodes.append(a._node)
    return nodes


def _zeros_like(t: Tensor) -> Tensor:
    return ops.cast(ops.where(ops.isnan(t), 0.0, 0.0), t.dtype)


def _trace_call(f, args: list, kwargs: dict):
    g = tr._graph()
    start = len(g.nodes)
    out = f(*args, **kwargs)
    return out, g.nodes[start:]


def _split_aux(out, has_aux: bool, what: str):
    if not has_aux:
        return out, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise _err(GradNonScalarError, f"{what}(has_aux=True): the function must return (output, aux), got "
                                       f"{type(out).__name__}")
    return out[0], out[1]


def _value_and_grads(f, args, kwargs, argnums, has_aux, what):
    """Inside a trace: (value, aux, grads, single)."""
    args = list(args)
    nums, single = _argnums(argnums, len(args), what)
    wrt = _wrt(args, nums, what)
    out, nodes = _trace_call(f, args, kwargs)
    out, aux = _split_aux(out, has_aux, what)
    if not isinstance(out, Tensor) or out._node.shape != () or dt.kind(out.dtype) != "f":
        got = f"shape {out._node.shape}, {dt.name(out.dtype)}" if isinstance(out, Tensor) else type(out).__name__
        raise _err(GradNonScalarError, f"{what}: the differentiated output must be a float scalar, got {got} "
                                       "(reduce it first, or use tessera.vjp with a cotangent)")
    seed = tr.constant(1.0, out.dtype)
    cts = differentiate(nodes, [(out._node, seed)], wrt)
    grads = [ct if ct is not None else _zeros_like(Tensor(w)) for ct, w in zip(cts, wrt)]
    return out, aux, grads, single


def _flatten(tree, leaves: list):
    if isinstance(tree, (tuple, list)):
        return (type(tree), [_flatten(t, leaves) for t in tree])
    if tree is None:
        return None
    leaves.append(tree)
    return len(leaves) - 1


def _unflatten(spec, leaves):
    if spec is None:
        return None
    if isinstance(spec, int):
        return leaves[spec]
    kind, items = spec
    return kind(_unflatten(s, leaves) for s in items)


class _Transformed:
    """A transformed function: traced inline inside a trace, else compiled with tessera.jit."""

    def __init__(self, f, what: str):
        self.f, self.what = f, what
        self.__name__ = f"{what}_{getattr(f, '__name__', getattr(f, 'name', 'fn'))}"
        self._jit = None
        self._spec = None

    def _inline(self, args, kwargs):
        raise NotImplementedError

    def _flat(self, *args):
        leaves: list = []
        self._spec = _flatten(self._inline(args, {}), leaves)
        return tuple(leaves)

    def jitted(self):
        """The tessera.jit function computing this one's results (flattened)."""
        if self._jit is None:
            from tessera.frontend.jit import JitFunction
            flat = self._flat
            kw = {}
            if isinstance(self.f, JitFunction):
                kw = dict(target=self.f.requested["target"], arch=self.f.arch, strict=self.f.strict,
                          schedule=self.f.requested["schedule"])

            def run(*args):
                return flat(*args)
            run.__name__ = self.__name__
            self._jit = JitFunction(run, **kw)
        return self._jit

    @staticmethod
    def _arrays(args, nums):
        return tuple(np.asarray(a, np.float32) if i in nums and isinstance(a, float) else a
                     for i, a in enumerate(args))

    def _eager(self, args, nums):
        outs = self.jitted()(*self._arrays(args, nums))
        outs = outs if isinstance(outs, tuple) else (outs,)
        return _unflatten(self._spec, list(outs))

    def explain(self, *args):
        return self.jitted().explain(*args)

    def compile(self, *args):
        return self.jitted().compile(*args)


class ValueAndGrad(_Transformed):
    def __init__(self, f, argnums=0, has_aux=False, with_value=True):
        super().__init__(f, "value_and_grad" if with_value else "grad")
        self.argnums, self.has_aux, self.with_value = argnums, has_aux, with_value
        _argnums(argnums, max(_max_pos(argnums) + 1, 1), self.what)   # a malformed argnums fails here

    def _inline(self, args, kwargs):
        out, aux, grads, single = _value_and_grads(self.f, args, kwargs, self.argnums, self.has_aux, self.what)
        g = grads[0] if single else tuple(grads)
        if self.with_value:
            return ((out, aux), g) if self.has_aux else (out, g)
        return (g, aux) if self.has_aux else g

    def __call__(self, *args, **kwargs):
        if tracing() or any(isinstance(a, Tensor) for a in args):
            return self._inline(args, kwargs)
        if kwargs:
            raise _err(GradArgnumsError, f"{self.what}: called on arrays, it takes positional arguments only "
                                         f"(got {', '.join(kwargs)})")
        nums, _ = _argnums(self.argnums, len(args), self.what)
        return self._eager(args, nums)


def _max_pos(argnums) -> int:
    if isinstance(argnums, numbers.Integral) and not isinstance(argnums, bool):
        return int(argnums) if argnums >= 0 else -int(argnums) - 1
    try:
        return max((int(a) if a >= 0 else -int(a) - 1) for a in argnums
                   if isinstance(a, numbers.Integral) and not isinstance(a, bool))
    except (TypeError, ValueError):
        return 0


def grad(f, argnums=0, has_aux: bool = False) -> ValueAndGrad:
    """The gradient of scalar-valued ``f`` with respect to argument(s) ``argnums``."""
    return ValueAndGrad(f, argnums, has_aux, with_value=False)


def value_and_grad(f, argnums=0, has_aux: bool = False) -> ValueAndGrad:
    """``(f(*args), grad(f)(*args))`` from one program (``((value, aux), grad)`` with has_aux)."""
    return ValueAndGrad(f, argnums, has_aux, with_value=True)


class _VjpBackward(_Transformed):
    """On arrays: the backward of ``vjp(f, *args)`` as one compiled program (forward recomputed)."""

    def __init__(self, f, nargs: int, has_aux: bool):
        super().__init__(f, "vjp")
        self.nargs, self.has_aux = nargs, has_aux

    def _inline(self, args, kwargs):
        primals, cts = args[:self.nargs], args[self.nargs:]
        res = _vjp_traced(self.f, primals, self.has_aux, "vjp")
        return res[1](*cts)


def _vjp_traced(f, primals, has_aux, what):
    args = list(primals)
    wrt = _wrt(args, range(len(args)), what, strict=False)
    out, nodes = _trace_call(f, args, {})
    out, aux = _split_aux(out, has_aux, what)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    for o in outs:
        if not isinstance(o, Tensor):
            raise _err(GradNonScalarError, f"{what}: the function must return tensors, got {type(o).__name__}")

    def vjp_fn(*cts):
        cts = cts[0] if len(cts) == 1 and isinstance(cts[0], (tuple, list)) else cts
        if len(cts) != len(outs):
            raise _err(ShapeMismatchError, f"{what}: {len(cts)} cotangent(s) for {len(outs)} output(s)")
        seeds = []
        for o, c in zip(outs, cts):
            c = c if isinstance(c, Tensor) else tr.as_tensor(c, o, what)
            if c._node.shape != o._node.shape:
                raise _err(ShapeMismatchError, f"{what}: cotangent of shape {c._node.shape} for an output of shape "
                                               f"{o._node.shape}")
            if dt.kind(o.dtype) == "f":
                seeds.append((o._node, c if c.dtype == o.dtype else ops.cast(c, o.dtype)))
        live = [w for w in wrt if w is not None]
        got = iter(differentiate(nodes, seeds, live))
        res = []
        for w in wrt:
            if w is None:
                res.append(None)
            else:
                ct = next(got)
                res.append(ct if ct is not None else _zeros_like(Tensor(w)))
        return tuple(res)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def vjp(f, *primals, has_aux: bool = False):
    """``(f(*primals), vjp_fn)`` (``(out, vjp_fn, aux)`` with has_aux): ``vjp_fn(cotangent)`` gives a
    tuple with the cotangent of every primal (None for an integer, bool or static one).  On arrays,
    ``vjp_fn`` runs one compiled program (the forward recomputed with the backward)."""
    if tracing() or any(isinstance(a, Tensor) for a in primals):
        return _vjp_traced(f, primals, has_aux, "vjp")
    from tessera.frontend.jit import JitFunction
    fwd = f if isinstance(f, JitFunction) else JitFunction(f)
    out = fwd(*primals)
    aux = None
    if has_aux:
        out, aux = out
    back = _VjpBackward(f, len(primals), has_aux)

    def vjp_fn(*cts):
        cts = cts[0] if len(cts) == 1 and isinstance(cts[0], (tuple, list)) else cts
        return back._eager(tuple(primals) + tuple(cts), ())

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


__all__ = ["grad", "stop_gradient", "value_and_grad", "vjp"]
