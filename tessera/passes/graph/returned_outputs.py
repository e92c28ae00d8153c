"""Elementwise groups with more than one output: a value the function returns that also feeds one
op of an elementwise tree joins that tree, the group writing it as a second output (one pass over
the inputs).  An optimizer step returns ``m' = b1 m + (1 - b1) g`` and reads it again for the
parameter update: one kernel writes ``p'``, ``m'`` and ``v'``.

Only uses by the block's terminator (``func.return``) may be outside the group: the group sits at
its last op, and the terminator comes after every op, so no reader is left before its producer.
"""
from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import SSAValue


def returned_besides_one(v: SSAValue) -> bool:
    """``v`` has exactly one use that is not the function's return (and at least one that is)."""
    uses = list(v.uses)
    others = [u for u in uses if not isinstance(u.operation, func.ReturnOp)]
    return len(others) == 1 and len(uses) > 1


__all__ = ["returned_besides_one"]
