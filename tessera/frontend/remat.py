"""Rematerialisation: which forward values the backward reads (saved) and which it recomputes.

After ``differentiate``'s sweep (``differentiate.py`` calls :func:`rematerialize`), every forward
value a backward node reads is looked at once, by one rule:

* **elementwise and view ops are recomputed**: the backward reads a clone of the op (and of its
  elementwise / view inputs, recursively), recorded among the backward nodes, so the fusion passes
  compute it inside the backward kernel that reads it (a register value, no buffer kept from the
  forward);
* **everything else is saved**: a GEMM / attention / conv output, a row op's (softmax, norms),
  a reduction's, a gather's -- their buffer is kept from the forward and read by the backward;
* a second result the backward reads (attention's log-sum-exp, ``attention_lse``) is saved with
  its op (and recomputed with it inside a checkpoint region);
* constants and iota are computed where they are read (neither saved nor recomputed);
* inside a ``tessera.checkpoint(f)`` region nothing is saved but the region's inputs (and its
  outputs, which the forward keeps anyway): the backward recomputes the region's ops from them,
  GEMMs included.

What is saved is recorded on the trace graph (``graph.saved``: node, bytes) and shown by
``tessera.explain`` (``LaneReport.saved``).  Arguments are not listed (the caller holds them).
"""
from __future__ import annotations

import copy
import math

import numpy as np

from tessera.frontend import trace as tr
from tessera.frontend.trace import Node, Tensor
from tessera.ir import opset

RECOMPUTED_FAMILIES = ("elementwise", "view")
FREE_OPS = ("constant", "iota")


class _Region:
    def __init__(self, nodes: list[Node], outputs: list[Node]):
        self.ids = {id(n) for n in nodes}
        self.outputs = {id(n) for n in outputs}


def _regions(graph) -> list[_Region]:
    regs = getattr(graph, "checkpoints", None)
    if regs is None:
        regs = []
        graph.checkpoints = regs
    return regs


def _leaves(tree, out: list) -> list:
    if isinstance(tree, (tuple, list)):
        for t in tree:
            _leaves(t, out)
    elif isinstance(tree, dict):
        for t in tree.values():
            _leaves(t, out)
    elif isinstance(tree, Tensor):
        out.append(tree._node)
    return out


def checkpoint(f):
    """``f`` marked as a region whose intermediates the backward recomputes instead of saving
    (as ``jax.checkpoint`` / ``torch.utils.checkpoint``): under ``grad`` the backward re-runs the
    region's ops from its inputs, GEMMs included, and keeps only the region's inputs and outputs
    from the forward.  Values are unchanged; outside a gradient it is ``f``."""
    def run(*args, **kwargs):
        if not tr.tracing():
            return f(*args, **kwargs)
        graph = tr._graph()
        start = len(graph.nodes)
        out = f(*args, **kwargs)
        _regions(graph).append(_Region(graph.nodes[start:], _leaves(out, [])))
        return out
    run.__name__ = f"checkpoint_{getattr(f, '__name__', 'fn')}"
    run.__wrapped__ = f
    return run


def _family(n: Node) -> str:
    d = opset.OPS.get(n.op)
    return d.family if d is not None else ""


def _clone(n: Node) -> Node:
    return copy.copy(n)


def nbytes(n: Node) -> int:
    return math.prod(n.shape) * np.dtype(n.dtype).itemsize


def rematerialize(graph, forward: list[Node], start: int) -> None:
    """Apply the rule to the backward nodes ``graph.nodes[start:]``, which read the ``forward``
    nodes: recomputed values become clones inserted before the first backward node; the saved
    ones are appended to ``graph.saved``."""
    from tessera.frontend.vjp_rules import STOPPED
    fwd = {id(n) for n in forward}
    regions = [r for r in _regions(graph) if r.ids & fwd]
    backward = graph.nodes[start:]
    clones: list[Node] = []
    memo: dict[int, Node] = {}
    saved: dict[int, Node] = {}

    def in_region(n: Node) -> bool:
        return any(id(n) in r.ids and id(n) not in r.outputs for r in regions)

    def read(n: Node) -> Node:
        """What a backward node reads for ``n``.  An elementwise value is cloned per use (each
        clone single-use, so fuse-elementwise computes it inside the kernel that reads it); a
        checkpointed GEMM / row op once (memo: it has a buffer of its own anyway)."""
        if id(n) not in fwd or n.op in FREE_OPS:
            return n
        cheap = _family(n) in RECOMPUTED_FAMILIES
        if not cheap and not in_region(n):
            saved.setdefault(id(n), n)
            return n
        if not cheap and id(n) in memo:
            return memo[id(n)]
        c = _clone(n)
        c.inputs = [read(i) for i in n.inputs]
        c.observed = set(n.observed)
        if n in STOPPED:
            STOPPED.add(c)
        if not cheap:
            memo[id(n)] = c
        clones.append(c)
        return c

    extra: list[Node] = []
    for b in backward:
        if b.op == "attention_lse":   # the forward attention's second result: saved with it (its other
            b.inputs = [read(b.inputs[0])] + b.inputs[1:]   # inputs are the op's own, for the oracle)
            if id(b.inputs[0]) in saved:
                extra.append(b)
            continue
        b.inputs = [read(i) for i in b.inputs]
    graph.nodes[start:start] = clones
    record = getattr(graph, "saved", None)
    if record is None:
        record = graph.saved = []
    record += [(n, nbytes(n)) for n in list(saved.values()) + extra]


def saved_lines(graph) -> list[str]:
    """The explain lines: each saved forward value (op, shape, dtype, bytes) and the total."""
    items = getattr(graph, "saved", None) or []
    if not items:
        return []
    rows = [f"{n.op} {list(n.shape)} {np.dtype(n.dtype).name}: {b} B" for n, b in items]
    return [f"{len(items)} forward values kept for the backward, {sum(b for _, b in items)} bytes: "
            + "; ".join(rows)]


def saved_bytes(graph) -> int:
    return sum(b for _, b in (getattr(graph, "saved", None) or []))


__all__ = ["checkpoint", "rematerialize", "saved_bytes", "saved_lines"]
