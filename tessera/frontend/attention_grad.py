"""``attention_backward``: dQ, dK, dV of ``attention`` from one flash-attention backward kernel.

``attention_backward(q, k, v, out, dout, causal=, scale=, mask=)`` records one
``tessera.attention_grad`` (``ir/graph_attention_grad.py``) whose packed result
``[B, HKV, G + 2, S, D]`` is sliced into dQ [B, H, S, D], dK and dV [B, HKV, S, D].  The kernel
(``passes/tile/kernels/attention_backward.py``) recomputes the probabilities block by block, so
no S x S tensor exists.

The log-sum-exp per query row, which the probabilities need, comes by one rule: where the
forward's ``attention`` is in the same program (``attention``'s vjp rule), that op also writes it
as its second result (``saved_lse``: a trace node ``attention_lse``) and the backward reads it;
where it is not (``attention_backward`` called on its own, the forward's output passed in), the
kernel recomputes it in a first pass over the keys.  It takes self-attention shapes (seq_q == seq_k, head dim == value dim)
in float32 / float64; bf16 / f16 inputs are computed in float32 and the gradients cast back (on the
GPU lanes the kernel reads bf16 / f16 as they are; its packed result is float32 either way).
Other shapes are refused here (ATTENTION_SEQ / ATTENTION_HEAD_DIM): ``attention``'s vjp rule
takes its composed form for them (``frontend/vjp_rules_nn.py``)."""
from __future__ import annotations

from tessera import dtypes as dt
from tessera.errors import AttentionHeadDimError, AttentionSeqError
from tessera.frontend import ops
from tessera.frontend.trace import Tensor, _err, _graph, add_node, current_lane


def fits(q_shape, k_shape, v_shape) -> bool:
    """Whether the kernel's packed result can hold these shapes' gradients."""
    return q_shape[2] == k_shape[2] and q_shape[3] == v_shape[3]


def saved_lse(n) -> Tensor:
    """The log-sum-exp per query row ([B, H, S], f32; f64 for float64) that the trace's forward
    ``attention`` node ``n`` writes as its second result (one node per forward, made on first use).
    Its inputs after ``n`` are n's own, for the reference lane's oracle."""
    for m in _graph().nodes:
        if m.op == "attention_lse" and m.inputs[0] is n:
            return Tensor(m)
    wide = n.dtype if n.dtype == dt.float64 else dt.float32
    return add_node("attention_lse", [n] + list(n.inputs), {}, n.shape[:3], wide)


def attention_backward(q, k, v, out, dout, *, causal: bool = False, scale: float | None = None,
                       mask=None, lse=None) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ``attention(q, k, v, causal=, scale=, mask=)`` for the cotangent ``dout``,
    given its output ``out``.  A fully-masked query row contributes nothing.  The mask (bool or
    additive float) gets no gradient here.  ``lse``: the forward's log-sum-exp (``saved_lse``),
    read instead of recomputed; None recomputes it."""
    q, k, v = ops._t(q, "attention_backward"), ops._t(k, "attention_backward"), ops._t(v, "attention_backward")
    out, dout = ops._t(out, "attention_backward: out"), ops._t(dout, "attention_backward: dout")
    ref = ops.attention(q, k, v, causal=causal, scale=scale, mask=mask)   # checks q, k, v and the mask
    if not fits(q.shape, k.shape, v.shape):
        raise _err(AttentionSeqError if q.shape[2] != k.shape[2] else AttentionHeadDimError,
                   f"attention_backward: one kernel packs dQ, dK and dV, so it needs seq_q == seq_k and head dim == "
                   f"value dim; got q {q.shape}, k {k.shape}, v {v.shape}")
    for name, x in (("out", out), ("dout", dout)):
        if x.shape != ref.shape or x.dtype != ref.dtype:
            raise _err(AttentionSeqError, f"attention_backward: {name} is {x.shape} {dt.name(x.dtype)}, the forward's "
                                          f"output is {ref.shape} {dt.name(ref.dtype)}")
    mnode = ref._node.inputs[3] if mask is not None else None
    _graph().nodes.remove(ref._node)   # recorded only for its checks
    wide = q.dtype if q.dtype in (dt.float32, dt.float64) else dt.float32
    lane = current_lane()
    # the GPU lanes' kernel reads f16 / bf16 as they are (matrix-instruction operands, f32 accumulation);
    # the CPU kernel computes in f32 from f32 copies
    narrow = lane is not None and lane[0] in ("nvidia", "rocm") and q.dtype in (dt.float16, dt.bfloat16)
    xs = [x if x.dtype == (q.dtype if narrow else wide) else ops.cast(x, wide) for x in (q, k, v, out, dout)]
    b, h, s, d = q.shape
    hk = k.shape[1]
    grp = h // hk
    if mnode is not None and mnode.dtype != dt.bool_ and mnode.dtype != wide:   # an additive bf16 / f16 mask
        mnode = ops.cast(Tensor(mnode), wide)._node
    if lse is not None:
        lse = ops._t(lse, "attention_backward: lse")
        if lse.shape != (b, h, s) or lse.dtype != (wide if wide == dt.float64 else dt.float32):
            raise _err(AttentionSeqError, f"attention_backward: lse is {lse.shape} {dt.name(lse.dtype)}, expected "
                                          f"{(b, h, s)} {dt.name(wide)} (one value per query row)")
    inputs = [x._node for x in xs] + ([mnode] if mnode is not None else []) + ([lse._node] if lse is not None else [])
    packed = add_node("attention_grad", inputs, {"causal": bool(causal), "scale": None if scale is None else
                                                 float(scale), "mask": mask is not None, "lse": lse is not None,
                                                 "present": (mnode is not None, lse is not None)},
                      (b, hk, grp + 2, s, d), wide)
    dq = ops.reshape(packed[:, :, :grp], (b, h, s, d))
    dk, dv = packed[:, :, grp], packed[:, :, grp + 1]
    return tuple(x if x.dtype == q.dtype else ops.cast(x, q.dtype) for x in (dq, dk, dv))


__all__ = ["attention_backward", "fits", "saved_lse"]
