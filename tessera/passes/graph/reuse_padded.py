"""A canonicalize rule (canonicalize.py calls it): a transpose whose same transpose is padded
elsewhere reads the padded copy's interior instead of being copied again.

An NCHW convolution transposes its input to NHWC inside the pad kernel (the implicit GEMM reads
NHWC).  The residual ``conv(...) + x`` of a ResNet block needs x in NHWC too (the add rides
the second GEMM's epilogue in its layout), which was a second full transpose copy of x.  The
padded copy already holds it: ``transpose(x, p)`` -> ``slice(pad(transpose(x, p)), interior)``
when that pad is computed earlier in the block; the slice is a strided view the consumer reads
in place (whatever the pad's mode, its interior is the input).
"""
from __future__ import annotations

from tessera.ir import graph as g
from tessera.ir.attrs import int_array, ints
from tessera.passes.util import insert_before, replace_op


def _padded_twin(op):
    """An earlier ``pad(transpose(x, p))`` for ``op`` = ``transpose(x, p)``, or None."""
    block = op.parent
    for u in op.input.uses:
        t2 = u.operation
        if t2 is op or not isinstance(t2, g.TransposeOp) or t2.parent is not block:
            continue
        if t2.permutation != op.permutation or t2.result.type != op.result.type:
            continue
        for u2 in t2.result.uses:
            p = u2.operation
            if isinstance(p, g.PadOp) and p.parent is block and block.get_operation_index(p) < \
                    block.get_operation_index(op):
                return p
    return None


def _interior_starts(p) -> list[int]:
    """Where the input starts in ``p``'s result: each axis's low pad."""
    pads = ints(p.pads)
    return [pads[2 * i] for i in range(len(pads) // 2)]


def reuse_padded(op) -> bool:
    """Apply the rule at ``op`` if it matches; return whether it changed the IR."""
    if not isinstance(op, g.TransposeOp) or op.parent is None:
        return False
    p = _padded_twin(op)
    if p is None:
        return False
    starts = _interior_starts(p)
    sl = g.SliceOp.create(operands=[p.result], attributes={"starts": int_array(starts),
                                                           "steps": int_array([1] * len(starts))},
                          result_types=[op.result.type])
    sl.location = op.location
    insert_before(op, sl)
    replace_op(op, [sl.result])
    return True


__all__ = ["reuse_padded"]
