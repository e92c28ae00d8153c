"""``tessera.torch.op``: a jitted function as a ``torch.library.custom_op``.

The op's real implementation calls the jitted function on the tensors (read in place through
DLPack, ``interop.py``); its fake (meta) implementation never runs a kernel: it traces the
function, builds Graph IR (``graphgen.build``), and evaluates the result types' symbolic sizes
(``d<arg>_<axis>`` products) on the fake inputs' sizes, so under ``torch.compile`` a size that is
a SymInt stays one.  Results never alias inputs (custom ops forbid it; a result sharing memory
with an input is copied).  Parameters annotated ``float`` / ``int`` / ``bool`` are Python
numbers in the schema; every other parameter is a Tensor.

The autograd formula comes from ``tessera.vjp`` of the jitted function (``torch_op_grad.py``:
the backward is a custom op ``<name>_vjp`` of its own, with a fake implementation, so it traces
under ``torch.compile`` / AOTAutograd too); a function with an op that has no vjp rule raises
``GRAD_NO_RULE`` when its gradient is asked for.
"""
from __future__ import annotations

import inspect

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError
from tessera.frontend import graphgen
from tessera.frontend.trace import ARRAY, STATIC, trace
from tessera.ir import dims as D

_SCALARS = {float: "float", int: "int", bool: "bool", "float": "float", "int": "int", "bool": "bool"}


def _torch_dtypes():
    import ml_dtypes
    import torch
    return {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
            torch.bfloat16: ml_dtypes.bfloat16, torch.int8: np.int8, torch.uint8: np.uint8, torch.int32: np.int32,
            torch.int64: np.int64, torch.bool: np.bool_}


def _hint(s) -> int:
    """A size as an int without guarding on it (a SymInt's hint)."""
    node = getattr(s, "node", None)
    if node is not None and getattr(node, "hint", None) is not None:
        return int(node.hint)
    return int(s)


def _placeholder(t, np_dtype) -> np.ndarray:
    """An array of ``t``'s shape and dtype that takes no memory (every stride 0): trace reads shapes only."""
    shape = tuple(_hint(s) for s in t.shape)
    return np.lib.stride_tricks.as_strided(np.zeros(1, np_dtype), shape, (0,) * len(shape))


def result_types(jitfn, args) -> list[tuple[tuple, np.dtype]]:
    """Each result's (sizes, numpy dtype), sizes evaluated from Graph IR's symbolic result types on
    ``args``' own sizes (SymInts stay symbolic)."""
    import torch
    to_np = _torch_dtypes()
    prepared, kinds, sizes = [], [], {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.dtype not in to_np:
                raise ArgumentError(f"argument {i} of {jitfn.name}: dtype {a.dtype} is not supported")
            prepared.append(_placeholder(a, to_np[a.dtype]))
            kinds.append(ARRAY)
            sizes.update({f"d{i}_{ax}": s for ax, s in enumerate(a.shape)})
        else:
            prepared.append(a)
            kinds.append(STATIC)
    graph = trace(jitfn._call_fn, prepared, kinds, lane=(jitfn.target, jitfn.arch, jitfn.schedule))
    gir = graphgen.build(graph)
    main = next(op for op in gir.module.body.block.ops if getattr(op, "sym_name", None) is not None)
    out = []
    for t in main.function_type.outputs.data:
        dims = tuple(D.evaluate(d, sizes) if not isinstance(d, int) else d for d in t.dims)
        out.append((dims, dt.from_ir(t.element_type)))
    return out


def _schema(fn, outputs: int) -> str:
    params = _params(fn)
    ret = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
    return f"({', '.join(params)}) -> {ret}"


def _params(fn) -> list[str]:
    """Each parameter's schema entry (``"Tensor x"``, ``"float s"``)."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise ArgumentError(f"tessera.torch.op: parameter {p.name!r} of {fn.__name__} is not positional; "
                                "a custom op takes positional tensors and numbers")
        params.append(f"{_SCALARS.get(p.annotation, 'Tensor')} {p.name}")
    return params


def op(fn, name: str | None = None, *, outputs: int = 1):
    """Register ``fn`` (a ``tessera.jit`` function, or a plain one to jit) as the torch custom op
    ``name`` (``"namespace::op"``; default ``"tessera::<function name>"``), returning ``outputs``
    tensors.  Returns the op (callable as ``torch.ops.<namespace>.<op>`` too)."""
    import torch

    from tessera.frontend.jit import JitFunction, jit
    jitfn = fn if isinstance(fn, JitFunction) else jit(fn)
    if jitfn.target != "cpu":
        raise ArgumentError(f"tessera.torch.op: {jitfn.name} is compiled for the {jitfn.lane} lane; only the "
                            "CPU lane takes torch tensors today")
    if not isinstance(outputs, int) or outputs < 1:
        raise ArgumentError(f"tessera.torch.op: outputs={outputs!r}: give the number of result tensors (>= 1)")
    name = name or f"tessera::{jitfn.name}"
    if "::" not in name:
        raise ArgumentError(f"tessera.torch.op: name {name!r} must be 'namespace::op'")
    schema = _schema(jitfn.fn, outputs)

    def impl(*args):
        ins = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]   # autograd is above this op
        out = jitfn(*ins)
        outs = list(out) if isinstance(out, tuple) else [out]
        if len(outs) != outputs:
            raise ArgumentError(f"{name}: {jitfn.name} returned {len(outs)} results; the op was registered with "
                                f"outputs={outputs}")
        for k, o in enumerate(outs):
            if any(isinstance(a, torch.Tensor) and _overlaps(o, a) for a in ins):
                outs[k] = o.clone()   # a custom op's result never aliases an input
        return outs[0] if outputs == 1 else tuple(outs)

    custom = torch.library.custom_op(name, impl, mutates_args=(), device_types="cpu", schema=schema)

    @custom.register_fake
    def _fake(*args):
        like = next(a for a in args if isinstance(a, torch.Tensor))
        to_torch = {np.dtype(v): k for k, v in _torch_dtypes().items()}
        outs = [like.new_empty(shape, dtype=to_torch[np.dtype(d)]) for shape, d in result_types(jitfn, args)]
        return outs[0] if outputs == 1 else tuple(outs)

    custom.tessera_function = jitfn
    from tessera.frontend import torch_aten, torch_op_grad
    torch_op_grad.register(custom, jitfn, name, _params(jitfn.fn), outputs, _overlaps)
    # under torch.compile(backend="tessera") the op is traced inline into the subgraph around it
    torch_aten.TABLE[str(custom._opoverload)] = lambda node, *args: jitfn(*args)
    return custom


def _overlaps(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    sa = a.untyped_storage()
    sb = b.untyped_storage()
    return sa.data_ptr() == sb.data_ptr()
