"""Which ops the verifier may skip: those equal, for their verifier, to one already verified.

Lowering emits thousands of ops that differ only in their SSA operands (``arith.addi`` on
indices, ``tessera_x86.vfma`` on ``vector<8xf32>``); the verifier of such an op reads its class,
its operand and result types, its properties and attributes, and nothing around it.  One
verification per distinct :func:`key` is enough: the Llama example's Target IR (18 k ops) has
about 700 distinct keys, and ``verify`` drops from 0.66 to about 0.1 CPU s.

An op gets a key only when nothing outside that tuple can change its verdict: no regions (their
contents are verified op by op, but a region-holding op's own verifier may read them), no block
successors, not the last op of its block (the terminator rules read the parent), and none of the
traits below that read the op's surroundings.  An operand that is an erased value fails
verification whatever its type, so it is checked on every op.
"""
from __future__ import annotations

from xdsl.ir import ErasedSSAValue, Operation
from xdsl.traits import (HasAncestor, HasParent, IsolatedFromAbove, IsTerminator, NoTerminator,
                         SingleBlockImplicitTerminator, SymbolOpInterface, SymbolTable)

# traits whose verify() reads more than the op itself (its parent, ancestors, region, symbols)
CONTEXT_TRAITS = (HasAncestor, HasParent, IsolatedFromAbove, IsTerminator, NoTerminator,
                  SingleBlockImplicitTerminator, SymbolOpInterface, SymbolTable)

_eligible: dict[type, bool] = {}


def _class_eligible(cls: type, op: Operation) -> bool:
    ok = _eligible.get(cls)
    if ok is None:
        traits = getattr(op, "traits", None)
        try:
            ok = not any(isinstance(t, CONTEXT_TRAITS) for t in traits)
        except TypeError:
            ok = False
        _eligible[cls] = ok
    return ok


def key(op: Operation):
    """A hashable summary of everything ``op``'s verifier reads, with types and attributes by
    identity (``id``: cheap; the lowering shares one object per distinct type), or None where
    ``op`` must be verified in full."""
    if op.regions or op.successors or op.next_op is None:
        return None
    cls = type(op)
    if not _class_eligible(cls, op):
        return None
    return (cls, *[id(v.type) for v in op._operands], None, *[id(r.type) for r in op.results],
            None, *[(n, id(a)) for n, a in op.properties.items()],
            None, *[(n, id(a)) for n, a in op.attributes.items()])


def value_key(op: Operation):
    """The same summary by value (equal types that are distinct objects match), or None."""
    k = (type(op), tuple(v.type for v in op._operands), tuple(r.type for r in op.results),
         tuple(op.properties.items()), tuple(op.attributes.items()))
    try:
        hash(k)
    except TypeError:   # an unhashable attribute: verified every time
        return None
    return k


class Memo:
    """The keys of the ops that passed, within one walk of one module (ids stay valid while the
    module holding the objects is alive and unchanged)."""

    def __init__(self):
        self.ids: set = set()
        self.values: set = set()

    def passed_before(self, op: Operation, k) -> bool:
        """Whether an op equal to ``op`` (key ``k``, not None) passed already."""
        if k in self.ids:
            return not erased_operand(op)
        v = value_key(op)
        if v is not None and v in self.values and not erased_operand(op):
            self.ids.add(k)
            return True
        return False

    def passed(self, op: Operation, k) -> None:
        self.ids.add(k)
        v = value_key(op)
        if v is not None:
            self.values.add(v)


def erased_operand(op: Operation) -> bool:
    return any(isinstance(v, ErasedSSAValue) for v in op._operands)
