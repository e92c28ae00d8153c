"""Graph IR's fused attention op, ``tessera.attention`` (imported by :mod:`tessera.ir.graph`)."""
from __future__ import annotations

from xdsl.dialects.builtin import (
    BoolAttr,
    FloatAttr,
    IntegerType,
    StringAttr,
    f32,
    f64,
)
from xdsl.irdl import (
    AttrSizedOperandSegments,
    attr_def,
    irdl_op_definition,
    opt_attr_def,
    opt_operand_def,
    opt_result_def,
    operand_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure

from tessera.errors import (
    GraphAttributeError,
    GraphDtypeError,
    GraphRankError,
    GraphResultTypeError,
    GraphShapeError,
)
from tessera.ir.graph import GraphOp
from tessera.ir.graph_types import TensorType, _operand_tensor, _require_float, broadcast_dims


MASKED_ROWS = ("zero", "nan")


@irdl_op_definition
class AttentionOp(GraphOp):
    """``softmax(q @ k^T * scale [+ mask]) @ v`` over [batch, heads, seq, dim] tensors.

    Grouped-query: k and v may have fewer heads; query head h reads kv head
    h // (heads_q / heads_kv).  ``mask`` is boolean (i1: true = attend) or additive (the
    inputs' float type), broadcast to [batch, heads_q, seq_q, seq_k].  ``causal`` masks key j
    for query i when j > i (top-left alignment, as torch's scaled_dot_product_attention with
    is_causal=True).  A query row with every key masked gives 0 (``masked_rows = "zero"``)
    or NaN (``"nan"``: what the composed softmax form gives, used when the op stands in for it).

    An optional second result ``lse`` [batch, heads_q, seq_q] holds each query row's log-sum-exp of
    its scaled, masked scores (natural log; +inf for a row with every key masked, so that
    ``exp(s - lse)`` is 0 there), in f32 (f64 for float64 inputs).  It is present only in programs
    whose gradient reads it (``attention``'s vjp rule asks for it): ``tessera.attention_grad``
    then takes it instead of recomputing it."""

    name = "tessera.attention"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    mask = opt_operand_def(TensorType)
    scale = opt_attr_def(FloatAttr)  # absent: 1/sqrt(head dim)
    causal = attr_def(BoolAttr)
    masked_rows = attr_def(StringAttr)
    result = result_def(TensorType)
    lse = opt_result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = ("$q `,` $k `,` $v (`mask` $mask^ `:` type($mask))? attr-dict `:` type($q) `,` type($k) `,` "
                       "type($v) `->` type($result) (`,` type($lse)^)?")

    def infer_result_type(self) -> TensorType:
        q, k, v = (_operand_tensor(self.name, x) for x in (self.q, self.k, self.v))
        m = _operand_tensor(self.name, self.mask) if self.mask is not None else None
        if self.masked_rows.data not in MASKED_ROWS:
            raise GraphAttributeError(f"tessera.attention masked_rows={self.masked_rows.data!r}; legal: zero, nan")
        return infer_attention(q, k, v, m)

    def verify_(self) -> None:
        super().verify_()
        if self.lse is not None:
            want = lse_type(self.result.type, self.q.type.element_type)
            if self.lse.type != want:
                raise GraphResultTypeError(f"{self.name}: lse type {self.lse.type}, expected {want}", op=self)


def lse_type(out: TensorType, elem) -> TensorType:
    """The log-sum-exp result of an attention whose output is ``out`` and inputs ``elem``: one value per
    query row, f64 for float64 inputs, else f32."""
    return TensorType.of(tuple(out.dims[:3]), f64 if elem == f64 else f32)


def infer_attention(q: TensorType, k: TensorType, v: TensorType, mask: TensorType | None) -> TensorType:
    from tessera.errors import AttentionHeadDimError, AttentionHeadsError, AttentionMaskError, AttentionSeqError
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank != 4:
            raise GraphRankError(f"tessera.attention: {name} must be [batch, heads, seq, dim], got rank {t.rank}")
    if not (q.element_type == k.element_type == v.element_type):
        raise GraphDtypeError("tessera.attention: q, k and v must share one dtype")
    _require_float("tessera.attention", q.element_type)
    (bq, hq, sq, dq), (bk, hk, sk, dk), (bv, hv, sv, dv) = q.dims, k.dims, v.dims
    if dq != dk:
        raise AttentionHeadDimError(f"tessera.attention: q head dim {dq} differs from k head dim {dk}")
    if (bk, hk, sk) != (bv, hv, sv):
        raise AttentionSeqError(f"tessera.attention: k is {list(k.dims)} but v is {list(v.dims)} (batch, heads and "
                                "sequence must match)")
    if bq != bk:
        raise AttentionSeqError(f"tessera.attention: batch of q ({bq}) and k ({bk}) differ")
    if hq != hk and not (isinstance(hq, int) and isinstance(hk, int) and hk > 0 and hq % hk == 0) and hk != 1:
        raise AttentionHeadsError(f"tessera.attention: {hq} query heads are not a multiple of {hk} key/value heads")
    if mask is not None:
        if not (isinstance(mask.element_type, IntegerType) and mask.element_type.width.data == 1) and \
                mask.element_type != q.element_type:
            raise AttentionMaskError(f"tessera.attention: mask dtype {mask.element_type}; use bool or {q.element_type}")
        try:
            shape = broadcast_dims(mask.dims, (bq, hq, sq, sk), "tessera.attention mask")
        except GraphShapeError as e:
            raise AttentionMaskError(e.message) from None
        if mask.rank > 4 or shape != (bq, hq, sq, sk):
            raise AttentionMaskError(f"tessera.attention: mask {list(mask.dims)} does not broadcast to "
                                     f"[{bq}, {hq}, {sq}, {sk}]")
    return TensorType.of((bq, hq, sq, dv), q.element_type)
