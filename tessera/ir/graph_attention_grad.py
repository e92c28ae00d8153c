"""Graph IR's attention backward, ``tessera.attention_grad`` (imported by :mod:`tessera.ir.graph`).

``%g = tessera.attention_grad %q, %k, %v, %o, %do [mask %m] {scale, causal}`` is the vjp of
``tessera.attention`` with respect to q, k and v, given the forward's output o and its cotangent
do.  Its one result packs the three gradients per (batch, kv head), so one kernel writes them all:
``[B, HKV, G + 2, S, D]`` (G = H / HKV query heads per kv head): slots 0..G-1 are dQ of the
group's query heads, slot G is dK, slot G+1 is dV (a reshape of slots 0..G-1 is dQ
[B, H, S, D]); the CPU kernel writes the three as separate buffers when the program only slices
them out (``outline-kernels``).  So the packed form needs seq_q == seq_k and head dim == value dim (self-attention;
``ops.attention_backward`` says which other shapes take the composed backward instead).
Computed in the inputs' float type (f32 or f64).

``lse`` (optional, ``[B, H, S]``) is the forward's saved log-sum-exp per query row (the second
result of ``tessera.attention``, present when the forward is in the same program): the kernel
reads it instead of recomputing it over the keys.  Absent (``ops.attention_backward`` called on
its own), the kernel recomputes it."""
from __future__ import annotations

from xdsl.dialects.builtin import BoolAttr, FloatAttr, f32, f64
from xdsl.irdl import (
    AttrSizedOperandSegments,
    attr_def,
    irdl_op_definition,
    opt_attr_def,
    opt_operand_def,
    operand_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure

from tessera.errors import GraphDtypeError, GraphShapeError
from tessera.ir.graph import GraphOp
from tessera.ir.graph_attention import infer_attention, lse_type
from tessera.ir.graph_types import TensorType, _operand_tensor


@irdl_op_definition
class AttentionGradOp(GraphOp):
    """dQ, dK, dV of ``softmax(q k^T * scale [+ mask]) v`` packed as ``[B, HKV, G + 2, S, D]``."""

    name = "tessera.attention_grad"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    o = operand_def(TensorType)
    do = operand_def(TensorType)
    mask = opt_operand_def(TensorType)
    lse = opt_operand_def(TensorType)
    scale = opt_attr_def(FloatAttr)  # absent: 1/sqrt(head dim)
    causal = attr_def(BoolAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = ("$q `,` $k `,` $v `,` $o `,` $do (`mask` $mask^ `:` type($mask))? (`lse` $lse^ `:` type($lse))? attr-dict `:` type($q) `,` "
                       "type($k) `,` type($v) `,` type($o) `,` type($do) `->` type($result)")

    def infer_result_type(self) -> TensorType:
        q, k, v, o, do = (_operand_tensor(self.name, x) for x in (self.q, self.k, self.v, self.o, self.do))
        m = _operand_tensor(self.name, self.mask) if self.mask is not None else None
        return infer_attention_grad(q, k, v, o, do, m)

    def verify_(self) -> None:
        super().verify_()
        if self.lse is not None:
            want = lse_type(self.o.type, self.q.type.element_type)
            if self.lse.type != want:
                raise GraphShapeError(f"{self.name}: lse is {self.lse.type}, expected {want} (one value per query "
                                      f"row of the forward)", op=self)


def attention_groups(hq, hk) -> int:
    """Query heads per kv head (heads may be symbolic only when equal)."""
    if hq == hk:
        return 1
    if not (isinstance(hq, int) and isinstance(hk, int)):
        raise GraphShapeError(f"tessera.attention_grad: grouped heads {hq} / {hk} must be static")
    return hq // hk


def infer_attention_grad(q, k, v, o, do, mask) -> TensorType:
    fwd = infer_attention(q, k, v, mask)
    (b, hq, sq, d), (_, hk, sk, _), dv = q.dims, k.dims, v.dims[3]
    if sq != sk or d != dv:
        raise GraphShapeError(f"tessera.attention_grad: packs dQ, dK and dV, so it needs seq_q == seq_k and "
                              f"head dim == value dim; got q {list(q.dims)}, v {list(v.dims)}")
    for name, t in (("o", o), ("do", do)):
        if t.element_type != q.element_type:
            raise GraphDtypeError(f"tessera.attention_grad: {name} is {t.element_type}, q is {q.element_type}")
        if tuple(t.dims) != tuple(fwd.dims):
            raise GraphShapeError(f"tessera.attention_grad: {name} is {list(t.dims)}, the forward's output is "
                                  f"{list(fwd.dims)}")
    # f16 / bf16 inputs (the GPU lanes' kernel reads them as they are): gradients accumulate in f32
    wide = q.element_type if q.element_type in (f32, f64) else f32
    return TensorType.of((b, hk, attention_groups(hq, hk) + 2, sq, d), wide)


__all__ = ["AttentionGradOp", "attention_groups", "infer_attention_grad"]
