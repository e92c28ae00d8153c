"""``tessera.jax``: a jitted Tessera function usable inside ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

    import jax, jax.numpy as jnp, tessera as ts
    mlp = ts.jax.op(lambda x, w: ts.ops.tanh(x @ w))
    y = jax.jit(lambda x, w: jnp.sum(mlp(x, w) ** 2))(x, w)
    gx = jax.grad(lambda x: jnp.sum(mlp(x, w)))(x)

The call goes through ``jax.pure_callback`` by default (the kernels run on the host CPU from
Python; ``via="ffi"`` below avoids Python).  Result shapes and dtypes come from
Graph IR shape inference: the function is traced on zero-stride placeholders of the arguments'
shapes, never run, once per argument signature.  ``jax.vmap`` calls it once per batch element
(``vmap_method="sequential"``; pass ``"expand_dims"`` for a function that takes a leading batch
axis).  ``jax.grad`` uses a ``jax.custom_vjp`` whose backward is ``tessera.vjp`` of the same
function (one compiled program, the forward recomputed), also through a callback; integer and
bool arguments get zero (float0) cotangents.

``op(fn, via="ffi")`` takes Python off the hot path: for each argument signature the function
(and, for ``jax.grad``, its ``tessera.vjp`` backward program) is exported as a C library
(``tessera.export``, ``aotlib/``) with a C++ XLA FFI handler around it (``aotlib/xla_ffi.py``,
built against ``jax.ffi.include_dir()``), registered with ``jax.ffi.register_ffi_target`` and
called through ``jax.ffi.ffi_call``: XLA calls the handler, the handler calls the library.
``ffi_op(library)`` does the same for a library exported beforehand (its sizes fixed: arguments of
other shapes or dtypes are refused with ``SHAPE_MISMATCH`` / ``BAD_ARGUMENT`` while JAX traces).
"""
from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import re
import shutil
import tempfile

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError, ShapeMismatchError
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


_TARGETS: dict[str, tuple[str, object]] = {}   # library path -> (FFI target name, the handler's CDLL)
_COUNT = itertools.count()
_FOLDERS: list[str] = []   # the folders op(via="ffi") exported into


def _np_dtype(s: str) -> np.dtype:
    from tessera.aotlib import _np_dtype as conv
    return conv(s)


def _ffi_target(lib) -> str:
    """The FFI target of ``lib``'s handler, built and registered with XLA on first use."""
    import jax

    from tessera.aotlib import xla_ffi
    got = _TARGETS.get(lib.so_path)
    if got is None:
        h = xla_ffi.build_handler(lib, jax.ffi.include_dir())
        dll = ctypes.CDLL(h.so_path)
        target = f"tessera_{lib.name}_{next(_COUNT)}"
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(dll, h.symbol)), platform="cpu")
        got = _TARGETS[lib.so_path] = (target, dll)   # the CDLL kept: XLA holds a pointer into it
    return got[0]


def _check_signature(lib, args) -> None:
    plan = lib.plan
    if len(args) != len(plan.inputs):
        raise ArgumentError(f"lib{lib.name}.so takes {len(plan.inputs)} arrays ("
                            f"{', '.join(t.name for t in plan.inputs)}); got {len(args)}")
    for i, (t, a) in enumerate(zip(plan.inputs, args)):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise ArgumentError(f"lib{lib.name}.so: argument {i} ({t.name}) is a {type(a).__name__}; pass an array")
        if np.dtype(a.dtype) != _np_dtype(t.dtype):
            raise ArgumentError(f"lib{lib.name}.so: {t.name} has dtype {np.dtype(a.dtype)}; the library was "
                                f"exported for {_np_dtype(t.dtype)}")
        if tuple(a.shape) != tuple(t.shape):
            raise ShapeMismatchError(f"lib{lib.name}.so: {t.name} has shape {tuple(a.shape)}; the library was "
                                     f"exported for {tuple(t.shape)} (every size is fixed at export time)")


def ffi_op(lib, *, vmap_method: str = "sequential"):
    """A JAX function calling ``lib`` (a library from ``tessera.export``) through XLA's FFI: a C++
    handler calls the library, no Python per call.  Arguments must match the exported signature
    (checked while JAX traces).  No gradient: ``op(fn, via="ffi")`` has one."""
    import jax

    outs = [jax.ShapeDtypeStruct(tuple(t.shape), _np_dtype(t.dtype)) for t in lib.plan.outputs]

    def f(*args):
        _check_signature(lib, args)
        res = jax.ffi.ffi_call(_ffi_target(lib), outs, vmap_method=vmap_method)(*args)
        return res[0] if len(outs) == 1 else tuple(res)
    f.__name__ = f"tessera_ffi_{lib.name}"
    f.library = lib
    return f


def _export(jf, key, threads):
    """``jf`` exported for the signature ``key`` ((shape, dtype) pairs) into a fresh folder."""
    from tessera.aotlib import export
    base = re.sub(r"\W", "_", jf.name).strip("_") or "fn"
    name = f"{base[:40]}_{next(_COUNT)}" if base[0].isalpha() else f"fn_{base[:40]}_{next(_COUNT)}"
    examples = [np.zeros(shape, d) for shape, d in key]
    if not _FOLDERS:
        atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _FOLDERS])
    _FOLDERS.append(tempfile.mkdtemp(prefix="tessera-jax-ffi-"))   # removed at exit (loaded copies stay mapped)
    return export(jf, *examples, path=_FOLDERS[-1], name=name, threads=threads)


def op(fn, *, vmap_method: str = "sequential", via: str = "callback", threads: int | None = None):
    """``fn`` (a function over ``tessera.ops`` or a ``tessera.jit`` function) as a JAX-traceable
    function of JAX arrays; see the module docstring.  ``via``: ``"callback"`` (``jax.pure_callback``)
    or ``"ffi"`` (an exported library per signature behind an XLA FFI handler; ``threads``: its
    thread count, default ``tessera.get_num_threads()`` or every usable CPU)."""
    import jax

    if via not in ("callback", "ffi"):
        raise ArgumentError(f"tessera.jax.op: via={via!r}; expected 'callback' or 'ffi'")
    if via == "ffi" and vmap_method != "sequential":
        raise ArgumentError("tessera.jax.op(via='ffi'): the library has fixed sizes, so jax.vmap calls it once per "
                            "batch element: vmap_method='sequential' only")
    jf = fn if isinstance(fn, JitFunction) else JitFunction(fn)
    if via == "ffi" and jf.target != "cpu":
        raise ArgumentError(f"tessera.jax.op(via='ffi'): {jf.name} is compiled for the {jf.target} lane; the FFI "
                            "path calls an exported CPU library")
    if threads is None:
        from tessera.runtime.threads import get_num_threads
        threads = min(256, get_num_threads() or len(os.sched_getaffinity(0)))
    types: dict[tuple, list] = {}
    libs: dict[tuple, object] = {}   # (program, signature) -> exported library (via="ffi")
    back: list = []                  # the backward program, once made

    def library(program, key):
        if (program, key) not in libs:
            libs[program, key] = _export(program, key, threads)
        return libs[program, key]

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
        if via == "ffi":
            key = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in args)
            return ffi_op(library(jf, key))(*args)
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
        if via == "ffi" and diff:
            from tessera.frontend.torch_op_grad import _vjp_program
            if not back:
                back.append(_vjp_program(jf, n, tuple(range(n))))   # the float arguments' gradients
            key = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in (*args, *cts))
            got = ffi_op(library(back[0], key))(*args, *cts)
            got = got if isinstance(got, tuple) else (got,)
        out = [np.zeros(a.shape, jax.dtypes.float0) for a in args]
        if via == "ffi":
            for i, g in zip(diff, got if diff else ()):
                out[i] = g
            return tuple(out)

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


__all__ = ["op", "ffi_op", "result_types"]
