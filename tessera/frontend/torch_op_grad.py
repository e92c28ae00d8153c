"""The autograd formula of a ``tessera.torch.op`` (``torch_op.py``), from ``tessera.vjp``.

The backward is a second custom op, ``<namespace>::<op>_vjp(<the op's parameters>, Tensor[]
cotangents) -> Tensor[]``: its real implementation runs one jitted program, ``tessera.vjp`` of
the op's function traced together with its backward (the forward recomputed there, one compile
per shape), and returns the gradient of every float tensor parameter (an empty tensor for an
integer or bool one, which has none); its fake implementation is each parameter's
``empty_like``, so AOTAutograd traces the backward too (``torch.compile``, ``opcheck``'s
``test_aot_dispatch_*``).  A function whose backward would flow through an op without a vjp rule
raises ``GradNoRuleError`` (``GRAD_NO_RULE``, naming the op) when the gradient is asked for:
never a silent zero.  Cotangents torch leaves undefined (an output not used by the loss) are
zeros.  No double backward: the ``_vjp`` op has no formula of its own (torch says so).
"""
from __future__ import annotations

from tessera import dtypes as dt


def _vjp_program(jitfn, nparams: int, tensor_pos: tuple[int, ...]):
    """A jitted function of (params..., cotangents...) giving the float tensor params' gradients."""
    from tessera.frontend.autodiff import vjp
    from tessera.frontend.jit import jit
    from tessera.frontend.trace import Tensor

    def backward(*args):
        prim, cts = list(args[:nparams]), args[nparams:]
        wrt = [i for i in tensor_pos if isinstance(prim[i], Tensor) and dt.kind(prim[i].dtype) == "f"]

        def f(*xs):
            a = list(prim)
            for i, x in zip(wrt, xs):
                a[i] = x
            return jitfn(*a)
        _, back = vjp(f, *[prim[i] for i in wrt])
        grads = back(*cts)
        return grads[0] if len(grads) == 1 else tuple(grads)
    backward.__name__ = backward.__qualname__ = f"{jitfn.name}_vjp"
    return jit(backward)


def register(custom, jitfn, name: str, params: list[str], outputs: int, overlaps) -> None:
    """Give ``custom`` (the op ``name`` with ``params`` schema entries) its autograd formula."""
    import torch
    tensor_pos = tuple(i for i, p in enumerate(params) if p.startswith("Tensor "))
    program = _vjp_program(jitfn, len(params), tensor_pos)
    bname = f"{name}_vjp"
    schema = f"({', '.join(params)}, Tensor[] cotangents) -> Tensor[]"

    def floats(args):
        return [i for i in tensor_pos if args[i].dtype.is_floating_point]

    def impl(*args):
        args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        prim, cts = args[:-1], list(args[-1])
        wrt = floats(prim)
        if not wrt:
            return [prim[i].new_empty(0) for i in tensor_pos]
        got = program(*prim, *cts)
        got = list(got) if isinstance(got, tuple) else [got]
        by_pos = dict(zip(wrt, got))
        out = []
        for i in tensor_pos:
            g = by_pos.get(i)
            if g is None:
                out.append(prim[i].new_empty(0))
                continue
            if any(isinstance(a, torch.Tensor) and overlaps(g, a) for a in (*prim, *cts)):
                g = g.clone()   # a custom op's result never aliases an input
            out.append(g)
        return out

    back_op = torch.library.custom_op(bname, impl, mutates_args=(), device_types="cpu", schema=schema)

    @back_op.register_fake
    def _fake(*args):
        prim = args[:-1]
        wrt = set(floats(prim))
        return [torch.empty_like(prim[i]) if i in wrt else prim[i].new_empty(0) for i in tensor_pos]

    def setup_context(ctx, inputs, output):
        outs = output if isinstance(output, tuple) else (output,)
        ctx.inputs = tuple(inputs)
        ctx.out_meta = [(o.shape, o.dtype) for o in outs]

    def backward(ctx, *grads):
        cts = [g if g is not None else torch.zeros(s, dtype=d) for g, (s, d) in zip(grads, ctx.out_meta)]
        got = back_op(*ctx.inputs, cts)
        res = [None] * len(ctx.inputs)
        for i, g in zip(tensor_pos, got):
            if ctx.inputs[i].dtype.is_floating_point:
                res[i] = g
        return tuple(res)

    custom.register_autograd(backward, setup_context=setup_context)
    custom.tessera_vjp = back_op
    # under torch.compile(backend="tessera"): the backward program traced inline (float params only:
    # an integer one's empty placeholder gradient has no Tessera counterpart)
    from tessera.frontend import torch_aten

    def inline(node, *args):
        got = program(*args[:-1], *args[-1])
        return list(got) if isinstance(got, tuple) else [got]

    def all_float(node):
        vals = [node.args[i].meta["val"] for i in tensor_pos]
        return None if all(v.dtype.is_floating_point for v in vals) else "an integer or bool tensor parameter"
    key = str(back_op._opoverload)
    torch_aten.TABLE[key] = inline
    torch_aten.CHECKS[key] = all_float
