"""A canonicalize rule (canonicalize.py calls it): windows of a transposed GEMM result are taken
before the transpose, so pooling runs in the GEMM's own layout and only its (smaller) result is
transposed.

An NCHW convolution is an NHWC GEMM transposed back; ``max_pool2d`` on it takes kh*kw strided
windows (slices stepping along W, the last axis) and combines them.  Sliced after the transpose,
every window is a copy kernel (a step along the last axis is no vector read) and the transpose
copies the whole output first.  Sliced before it, the windows step along H and W with the
channels (the GEMM's last axis) contiguous: the elementwise kernel reads them in place.

- ``slice(transpose(y, p))`` -> ``transpose(slice'(y), p)`` when y is on a GEMM chain and every
  use of the transpose is a slice (all of them move, the full-size transpose goes away);
- ``b(transpose(u, p), transpose(v, p))`` -> ``transpose(b(u, v), p)`` for a binary elementwise
  op whose operands (same shape, one use each) are such moved windows or combinations of them.
"""
from __future__ import annotations

from tessera.ir import graph as g
from tessera.ir.attrs import int_array, ints
from tessera.passes.graph.sink_transpose import _on_gemm_chain
from tessera.passes.util import insert_before, replace_op


def _windows_only(t) -> bool:
    uses = [u.operation for u in t.result.uses]
    return bool(uses) and all(isinstance(u, g.SliceOp) for u in uses)


def _window_tree(v, depth: int = 0) -> bool:
    """``v`` is a slice of a GEMM chain, or a binary elementwise op of two such trees."""
    o = v.owner
    if depth > 64:
        return False
    if isinstance(o, g.SliceOp):
        return _on_gemm_chain(o.input)
    if isinstance(o, g.ELEMENTWISE_BINARY) and o.lhs.type.dims == o.rhs.type.dims == o.result.type.dims:
        return _window_tree(o.lhs, depth + 1) and _window_tree(o.rhs, depth + 1)
    return False


def _moved(v, perm) -> bool:
    t = v.owner
    return (isinstance(t, g.TransposeOp) and t.permutation == perm and len(list(v.uses)) == 1
            and _window_tree(t.input))


def _source_window(op, perm) -> tuple[list, list, list]:
    """The slice ``op`` of ``transpose(y, perm)`` as (starts, steps, sizes) on y's axes: result
    axis i is y's axis perm[i]."""
    y = op.input.owner.input
    r = len(perm)
    starts, steps, dims = [0] * r, [1] * r, list(y.type.dims)
    for i, (a, st, m) in enumerate(zip(ints(op.starts), ints(op.steps), op.result.type.dims)):
        starts[perm[i]], steps[perm[i]], dims[perm[i]] = a, st, m
    return starts, steps, dims


def sink_transpose_pool(op) -> bool:
    """Apply a rule at ``op`` if it matches; return whether it changed the IR."""
    if isinstance(op, g.SliceOp):
        t = op.input.owner
        if not (isinstance(t, g.TransposeOp) and _on_gemm_chain(t.input) and _windows_only(t)):
            return False
        perm = t.permutation
        y = t.input
        starts, steps, dims = _source_window(op, perm)
        sl = g.SliceOp.create(operands=[y], attributes={"starts": int_array(starts), "steps": int_array(steps)},
                              result_types=[g.TensorType.of(dims, y.type.element_type)])
        tr = g.TransposeOp.create(operands=[sl.result], result_types=[op.result.type],
                                  attributes={"perm": int_array(perm)})
        sl.location = tr.location = op.location
        insert_before(op, sl, tr)
        replace_op(op, [tr.result])
        return True
    if isinstance(op, g.ELEMENTWISE_BINARY) and op.lhs != op.rhs:
        lt = op.lhs.owner
        if not isinstance(lt, g.TransposeOp):
            return False
        perm = lt.permutation
        if not (_moved(op.lhs, perm) and _moved(op.rhs, perm)
                and op.lhs.type.dims == op.rhs.type.dims == op.result.type.dims):
            return False
        u, v = lt.input, op.rhs.owner.input
        new = type(op).create(operands=[u, v], attributes=dict(op.attributes),
                              result_types=[g.TensorType.of(list(u.type.dims), op.result.type.element_type)])
        tr = g.TransposeOp.create(operands=[new.results[0]], result_types=[op.result.type],
                                  attributes={"perm": int_array(perm)})
        new.location = tr.location = op.location
        insert_before(op, new, tr)
        replace_op(op, [tr.result])
        return True
    return False


__all__ = ["sink_transpose_pool"]
