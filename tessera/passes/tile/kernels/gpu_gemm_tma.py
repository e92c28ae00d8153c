"""The wgmma GEMM's blocks staged by the tensor copy engine (``copy_engine = "tma"``, sm_90a).

Instead of every thread copying its share (``tile.async_copy``), one elected thread asks the
copy engine for whole boxes (``tile.bulk_copy``) described by the kernel's tensor maps:

  A (M x K, k contiguous)      map 0: dims [K, M], row stride sAm, box [64 k, BM rows]
  B row-major (K x N, n contig.) map 1: dims [N, K], row stride sBk, box [64 n, BK rows],
                               one copy per 64-column panel (the 128-byte swizzle spans
                               64 16-bit elements; panel p lands at element p * BK * 64)
  B given transposed (N x K)   map 1: dims [K, N], row stride sBn, box [64 k, BN rows]

so the staged blocks are laid out exactly as the thread copies laid them (``wgmma.py``: the
128-byte swizzle, 1024-byte atoms) and the wgmma descriptors are unchanged.  Edge blocks
need no masking: the engine reads elements past the tensor as zero and still completes the
whole box's bytes.

A ring of S stages has one barrier per stage (``tile.bulk_init``, one arrival per phase: the
elected thread's ``tile.bulk_expect`` of the stage's exact bytes, A's box plus B's).  Block
kb lands in stage kb % S; every thread waits for that stage's phase of parity (kb / S) % 2
(``tile.bulk_wait``: the parity flips each lap of the ring).

Releasing a stage: a single CTA-wide design, not a second "empty" barrier per stage.  The
warpgroups leave one wgmma group in flight (``wgmma.inflight`` = 1: each iteration ends with
``wait_group 1``), so when every thread has passed the workgroup barrier at the top of
iteration kb, the groups of block kb - 2 are complete in every warpgroup; the refill issued
then is for block kb + S - 2, whose stage is (kb - 2) % S.  Every warpgroup consumes every
stage, so an empty barrier would need all of them to arrive anyway — exactly what the
workgroup barrier already says — and with no producer warpgroup (warp specialisation is
a later schedule choice) the issuing thread is itself a consumer.
"""
from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, StringAttr, i64

from tessera.ir import dims as D
from tessera.ir import tensor_map as TM
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, int_array
from tessera.ir.builder import Builder
from tessera.passes.tile.kernels.common import KernelSig, illegal

PANEL = 64      # 16-bit elements in one 128-byte swizzled row (fp8: 128)


def _ref(sig: KernelSig, expr):
    e = D.canon(expr)
    return e if isinstance(e, int) else f"s{sig._dim_index[e]}"


def _static_stride(name: str, stride, esize: int, what: str) -> None:
    s = D.canon(stride)
    if isinstance(s, int) and (s * esize) % 16:
        raise TM.TensorMapError(f"kernel {name}: {what}'s rows are {s * esize} bytes apart; a tensor map needs a "
                                "multiple of 16 (pad the row, or pin schedule={'copy_engine': 'threads'})")


def maps(name: str, sig: KernelSig, plan, b_mn: bool, eb: int, elem: str, BM: int, BN: int, BK: int) -> list[str]:
    """The kernel's two map records (A, B), after refusing what a tensor map cannot describe."""
    if plan.batch:
        raise illegal(name, "copy_engine=tma stages unbatched GEMMs (2-D tensor maps); this one is batched")
    for v, what in ((plan.a, "A"), (plan.b, "B")):
        if any(D.canon(o) != 0 for o in v.offset) or v.taps:
            raise illegal(name, f"copy_engine=tma maps whole tensors; {what} is a window into its buffer")
    if D.canon(plan.a.strides[-1]) != 1:
        raise illegal(name, "copy_engine=tma needs A's k contiguous (a transposed A: stage with threads)")
    if not b_mn and D.canon(plan.b.strides[-2]) != 1:
        raise illegal(name, "copy_engine=tma needs B's n contiguous (16-bit) or its k contiguous (B given "
                      "transposed); this B is neither")
    panel = 128 // eb
    _static_stride(name, plan.a.strides[-2], eb, "A")
    a = TM.record(plan.a.arg, elem, (_ref(sig, plan.k), _ref(sig, plan.m)), _ref(sig, plan.a.strides[-2]),
                  (panel, BM))
    if b_mn:
        _static_stride(name, plan.b.strides[-2], eb, "B")
        b = TM.record(plan.b.arg, elem, (_ref(sig, plan.n), _ref(sig, plan.k)), _ref(sig, plan.b.strides[-2]),
                      (panel, BK))
    else:
        _static_stride(name, plan.b.strides[-1], eb, "B^T")
        b = TM.record(plan.b.arg, elem, (_ref(sig, plan.k), _ref(sig, plan.n)), _ref(sig, plan.b.strides[-1]),
                      (panel, BN))
    return [a, b]


def map_attr(records: list[str]) -> ArrayAttr:
    return ArrayAttr([StringAttr(r) for r in records])


class TmaStaging:
    """The ring: ``init`` once, ``fill(kb, stage)`` by the elected thread, ``wait`` by all."""

    def __init__(self, b: Builder, kf, S: int, smem_a, smem_b, m0, n0, nk, BM: int, BN: int, BK: int, eb: int,
                 b_mn: bool):
        self.S, self.smem_a, self.smem_b, self.m0, self.n0, self.nk = S, smem_a, smem_b, m0, n0, nk
        self.BM, self.BN, self.BK, self.b_mn = BM, BN, BK, b_mn
        self.panel = 128 // eb
        self.bytes = (BM + BN) * BK * eb           # A's box + B's box(es): what the stage's phase expects
        self.bars = kf.alloc(b, S, i64, "smem")
        b.op(t.BulkInitOp.create(operands=[self.bars], attributes={"count": i64_attr(1)}))

    def _copy(self, bb: Builder, dst, off, stage, row, col, rows: int, cols: int, m: int) -> None:
        bb.op(t.BulkCopyOp.create(operands=[dst, bb.c(off), self.bars, bb.c(stage), bb.c(row), bb.c(col)],
                                  attributes={"map": i64_attr(m), "box": int_array([rows, cols])}))

    def fill(self, bb: Builder, kb, stage) -> None:
        """Block ``kb`` (when it exists) into ``stage``: one expect_tx of the stage's bytes, then the copies."""
        BM, BN, BK = self.BM, self.BN, self.BK

        def issue(b2: Builder):
            k0 = b2.mul(kb, BK)
            b2.op(t.BulkExpectOp.create(operands=[self.bars, b2.c(stage)], attributes={"bytes": i64_attr(self.bytes)}))
            self._copy(b2, self.smem_a, b2.mul(stage, BM * BK), stage, self.m0, k0, BM, self.panel, 0)
            if self.b_mn:       # BK rows of n, one 64-column panel per copy
                for p in range(BN // self.panel):
                    self._copy(b2, self.smem_b, b2.add(b2.mul(stage, BN * BK), p * BK * self.panel), stage, k0,
                               b2.add(self.n0, p * self.panel), BK, self.panel, 1)
            else:               # B^T: BN rows of k
                self._copy(b2, self.smem_b, b2.mul(stage, BN * BK), stage, self.n0, k0, BN, self.panel, 1)
            return []
        bb.if_(bb.cmp("slt", kb, self.nk), issue)

    def wait(self, bb: Builder, kb) -> None:
        stage = bb.rem(kb, self.S)
        parity = bb.rem(bb.div(kb, self.S), 2)
        bb.op(t.BulkWaitOp.create(operands=[self.bars, bb.c(stage), bb.c(parity)]))


__all__ = ["maps", "map_attr", "TmaStaging", "PANEL"]
