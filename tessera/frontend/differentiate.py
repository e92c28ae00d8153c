"""The ``differentiate`` transformation: reverse mode over the traced graph.

``tessera.grad`` / ``vjp`` (``frontend/autodiff.py``) trace the function into the graph being
built (each argument differentiated with respect to is first given a node of its own), then call
:func:`differentiate` on the nodes that tracing recorded: one sweep from the last node to the
first applies each node's vjp rule (``vjp_rules.py``, ``vjp_rules_nn.py``) to its output's
cotangent, and the rules record the backward nodes through the ordinary ``tessera.ops``
functions into the same graph.  The forward and backward are therefore ONE traced program: the
Graph IR built from it goes through the same fusion, scheduling, tiling and lane as any other
(``tessera.explain`` lists the backward kernels), and a gradient of a gradient is one more sweep.

It runs on the trace graph rather than on Graph IR (a departure from DESIGN.md's plan of a pass
in ``passes/graph/``): the rules are written with ``tessera.ops`` (shape checks, dtype promotion,
weak scalars) which live in the frontend, and the passes may not import the frontend.

Only nodes that depend on a differentiated argument (through float values) are visited; a
cotangent reaching an op without a rule raises ``GRAD_NO_RULE`` naming it, and one reaching an op
declared non-differentiable (``ir/opset_grad.py``) stops there.  ``stop_gradient`` records an
identity reshape (kept in ``vjp_rules.STOPPED``) that passes no cotangent.
"""
from __future__ import annotations

from tessera import dtypes as dt
from tessera.errors import GradNoRuleError, InternalError
from tessera.frontend import ops
from tessera.frontend import remat
from tessera.frontend import trace as tr
from tessera.frontend import vjp_rules, vjp_rules_nn  # noqa: F401 - registers the rules
from tessera.frontend.trace import Node, Tensor, user_location
from tessera.ir import opset_grad

RULES = vjp_rules.RULES


def _float(n: Node) -> bool:
    return dt.kind(n.dtype) == "f"


def depends(nodes: list[Node], wrt: list[Node]) -> set[int]:
    """ids of the nodes (of ``nodes``, in trace order, and ``wrt``) whose float value depends on a
    ``wrt`` node through float values."""
    live = {id(w) for w in wrt if _float(w)}
    for n in nodes:
        if _float(n) and n not in vjp_rules.STOPPED and any(id(i) in live for i in n.inputs):
            live.add(id(n))
    return live


def rule_for(op: str):
    """The vjp rule of ``op``; None where it is declared non-differentiable; GRAD_NO_RULE else."""
    if op in RULES:
        return RULES[op]
    if op in opset_grad.NON_DIFFERENTIABLE:
        return None
    raise GradNoRuleError(f"grad: the gradient flows through tessera.{op}, which has no vjp rule yet "
                          f"(ops without one are refused, never given a zero gradient)", location=user_location())


def _fit(ct: Tensor, n: Node) -> Tensor:
    """A cotangent in its node's shape and dtype (a rule may return a broadcastable one)."""
    if ct._node.shape != n.shape:
        try:
            ct = vjp_rules.unbroadcast(ct, n.shape, Tensor(n))
        except Exception as e:   # noqa: BLE001 - a rule's bug, named
            raise InternalError(f"grad: the vjp rule of {n.op} gave a cotangent of shape {ct._node.shape} for an "
                                f"input of shape {n.shape}") from e
        if ct._node.shape != n.shape:
            raise InternalError(f"grad: the vjp rule of {n.op} gave a cotangent of shape {ct._node.shape} for an "
                                f"input of shape {n.shape}")
    if ct.dtype != n.dtype:
        ct = ops.cast(ct, n.dtype)
    return ct


def differentiate(nodes: list[Node], seeds: list[tuple[Node, Tensor]], wrt: list[Node]) -> list[Tensor | None]:
    """Cotangents of the ``wrt`` nodes, given ``seeds`` (output node, its cotangent), sweeping
    ``nodes`` (the nodes tracing the function recorded, in order) backwards.  None for a ``wrt``
    node that no seed depends on (the caller gives zeros there)."""
    live = depends(nodes, wrt)
    cts: dict[int, Tensor] = {}
    start = len(tr._graph().nodes)

    def accumulate(n: Node, ct: Tensor) -> None:
        ct = _fit(ct, n)
        prev = cts.get(id(n))
        cts[id(n)] = ct if prev is None else ops.add(prev, ct)

    for n, ct in seeds:
        if id(n) in live:
            accumulate(n, ct)
    wrt_ids = {id(w) for w in wrt}
    for n in reversed(nodes):
        g = cts.pop(id(n), None) if id(n) not in wrt_ids else None
        if g is None:
            continue
        rule = rule_for(n.op)
        if rule is None:
            continue
        need = [id(i) in live for i in n.inputs]
        if not any(need):
            continue
        outs = rule(n, g, need)
        if len(outs) != len(n.inputs):
            raise InternalError(f"grad: the vjp rule of {n.op} gave {len(outs)} cotangents for {len(n.inputs)} inputs")
        for i, (x, ct) in enumerate(zip(n.inputs, outs)):
            if need[i] and ct is not None:
                accumulate(x, ct)
    out = [cts.get(id(w)) for w in wrt]
    remat.rematerialize(tr._graph(), nodes, start)   # saved or recomputed (frontend/remat.py)
    return out


__all__ = ["RULES", "depends", "differentiate", "rule_for"]
