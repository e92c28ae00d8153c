"""Target IR for NVIDIA: the ``tessera_nvidia`` dialect (with ``tessera_gpu`` per-thread ops).

``tessera_nvidia.mma_sync`` is one warp-wide ``mma.sync.aligned`` instruction: each
of the 32 lanes passes its registers of A, B and C and receives its registers of D.
Which element each lane register holds is fixed by the PTX ISA fragment layout of
``shape``/``atype``; the lowering that produces this op owns that mapping.
"""
from __future__ import annotations

import re

from xdsl.dialects.builtin import IndexType, IntegerAttr, IntegerType, StringAttr, UnitAttr, VectorType
from xdsl.ir import Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    opt_attr_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import Pure

from tessera.errors import TargetVerifyError
from tessera.ir.attrs import ival
from tessera.ir.tile import BufferType

_SHAPE = re.compile(r"m(\d+)n(\d+)k(\d+)\Z")


@irdl_op_definition
class MmaSyncOp(IRDLOperation):
    name = "tessera_nvidia.mma_sync"
    shape = attr_def(StringAttr)
    atype = attr_def(StringAttr)
    btype = opt_attr_def(StringAttr)      # B's dtype where it differs from A's (fp8 e4m3 x e5m2)
    ctype = attr_def(StringAttr)
    a = var_operand_def()
    b = var_operand_def()
    c = var_operand_def()
    d = var_result_def()
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(Pure())
    assembly_format = ("$shape `a` `(` $a `:` type($a) `)` `b` `(` $b `:` type($b) `)` "
                       "`c` `(` $c `:` type($c) `)` attr-dict `->` type($d)")

    def verify_(self) -> None:
        if not _SHAPE.match(self.shape.data):
            raise TargetVerifyError(f"mma_sync shape {self.shape.data!r} is not mMnNkK", op=self)
        if len(self.c) != len(self.d) or [v.type for v in self.c] != [r.type for r in self.d]:
            raise TargetVerifyError("mma_sync D registers must match C registers", op=self)
        fp8 = {"f8E4M3FN": "f8e4m3fn", "f8E5M2": "f8e5m2"}     # xDSL's spelling -> the records'
        btype = self.btype.data if self.btype is not None else self.atype.data
        for regs, want in ((self.a, self.atype.data), (self.b, btype)):
            elems = {fp8.get(e, e) for e in (str(getattr(v.type, "element_type", v.type)) for v in regs)}
            if elems != {want}:
                which = "btype" if self.btype is not None and regs is self.b else "atype"
                raise TargetVerifyError(f"mma_sync {which} {want!r} does not match its A/B registers "
                                        f"({', '.join(sorted(elems))})", op=self)
        if btype != self.atype.data and {btype, self.atype.data} != {"f8e4m3fn", "f8e5m2"}:
            raise TargetVerifyError(f"mma_sync mixes {self.atype.data} and {btype}: only fp8 formats mix", op=self)


@irdl_op_definition
class CpAsyncOp(IRDLOperation):
    """``cp.async.cg.shared.global`` of ``bytes`` (16) bytes from ``src[src_index]`` to
    ``dst[dst_index]``; only the first ``src_bytes`` are read, the rest are zero-filled."""

    name = "tessera_nvidia.cp_async"
    dst = operand_def(BufferType)
    dst_index = operand_def(IndexType)
    src = operand_def(BufferType)
    src_index = operand_def(IndexType)
    src_bytes = operand_def(IndexType)
    bytes = attr_def(IntegerAttr)
    assembly_format = ("$dst `[` $dst_index `]` `,` $src `[` $src_index `]` `,` $src_bytes attr-dict `:` "
                       "type($dst) `,` type($src)")

    def verify_(self) -> None:
        d, s_ = self.dst.type, self.src.type
        if ival(self.bytes) not in (4, 8, 16):
            raise TargetVerifyError("cp_async copies 4, 8 or 16 bytes", op=self)
        if isinstance(d, BufferType) and isinstance(s_, BufferType) and (
                d.space.data != "smem" or s_.space.data != "global" or d.element_type != s_.element_type):
            raise TargetVerifyError("cp_async copies global -> smem of one element type", op=self)


@irdl_op_definition
class CpAsyncCommitOp(IRDLOperation):
    """``cp.async.commit_group``: the copies issued since the last commit form one group."""

    name = "tessera_nvidia.cp_async_commit"
    assembly_format = "attr-dict"


@irdl_op_definition
class CpAsyncWaitOp(IRDLOperation):
    """``cp.async.wait_group pending``: wait until at most ``pending`` of this thread's
    committed groups are still in flight."""

    name = "tessera_nvidia.cp_async_wait"
    pending = attr_def(IntegerAttr)
    assembly_format = "attr-dict"


@irdl_op_definition
class LdmatrixOp(IRDLOperation):
    """``ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16``: lane l supplies the address
    of row l % 8 of matrix l / 8 (``buf[index]``, 16-byte aligned); each lane receives one
    32-bit register (two 16-bit elements) per matrix."""

    name = "tessera_nvidia.ldmatrix"
    buf = operand_def(BufferType)
    index = operand_def(IndexType)
    trans = opt_attr_def(UnitAttr)
    regs = var_result_def(VectorType)
    assembly_format = "$buf `[` $index `]` attr-dict `:` type($buf) `->` type($regs)"

    def verify_(self) -> None:
        if len(self.regs) not in (1, 2, 4):
            raise TargetVerifyError("ldmatrix loads 1, 2 or 4 matrices", op=self)
        b = self.buf.type
        for r in self.regs:
            if r.type.get_shape() != (2,) or (isinstance(b, BufferType) and r.type.element_type != b.element_type):
                raise TargetVerifyError("ldmatrix results are vector<2 x 16-bit element> of the buffer's type",
                                        op=self)
        if isinstance(b, BufferType) and b.space.data != "smem":
            raise TargetVerifyError("ldmatrix reads shared memory (smem)", op=self)


@irdl_op_definition
class SharedAddressOp(IRDLOperation):
    """The shared-window byte address of ``buf[index]`` (``cvta.to.shared``): what a wgmma
    matrix descriptor's start-address field encodes."""

    name = "tessera_nvidia.shared_address"
    buf = operand_def(BufferType)
    index = operand_def(IndexType)
    result = result_def(IntegerType)
    traits = traits_def(Pure())
    assembly_format = "$buf `[` $index `]` attr-dict `:` type($buf) `->` type($result)"

    def verify_(self) -> None:
        b = self.buf.type
        if isinstance(b, BufferType) and b.space.data != "smem":
            raise TargetVerifyError("shared_address takes a shared-memory (smem) buffer", op=self)


@irdl_op_definition
class WgmmaOp(IRDLOperation):
    """``wgmma.mma_async.sync.aligned.<shape>.f32.<atype>.<atype>``: one warpgroup (128 threads)
    multiplies A (64 x k) and B (k x n), both in shared memory named by 64-bit matrix
    descriptors (``desc_a``, ``desc_b``), into the f32 accumulator whose n/2 registers per
    thread are ``c`` (tied: ``d`` are the same registers after the instruction completes,
    i.e. after a ``wgmma_wait``).  ``trans_b`` (``imm-trans-b`` = 1): B is MN-major (n
    contiguous) rather than K-major."""

    name = "tessera_nvidia.wgmma"
    shape = attr_def(StringAttr)
    atype = attr_def(StringAttr)
    btype = opt_attr_def(StringAttr)      # B's dtype where it differs from A's (fp8 e4m3 x e5m2)
    trans_b = opt_attr_def(UnitAttr)
    desc_a = operand_def(IntegerType)
    desc_b = operand_def(IntegerType)
    c = var_operand_def()
    d = var_result_def()
    assembly_format = ("$shape $desc_a `,` $desc_b `c` `(` $c `:` type($c) `)` attr-dict `:` type($desc_a) `,` "
                       "type($desc_b) `->` type($d)")

    def verify_(self) -> None:
        m = _SHAPE.match(self.shape.data)
        if not m or int(m.group(1)) != 64:
            raise TargetVerifyError(f"wgmma shape {self.shape.data!r} is not m64nNkK", op=self)
        n = int(m.group(2))
        if len(self.c) != n // 2 or len(self.d) != n // 2:
            raise TargetVerifyError(f"wgmma {self.shape.data} takes {n // 2} f32 accumulator registers per thread, "
                                    f"got {len(self.c)} in / {len(self.d)} out", op=self)
        if [v.type for v in self.c] != [r.type for r in self.d]:
            raise TargetVerifyError("wgmma D registers must match C registers", op=self)
        k = int(m.group(3))
        fp8 = self.atype.data in ("f8e4m3fn", "f8e5m2")
        if self.atype.data not in ("f16", "bf16") and not fp8:
            raise TargetVerifyError(f"wgmma atype {self.atype.data!r}: f16, bf16, f8e4m3fn or f8e5m2", op=self)
        if k != (32 if fp8 else 16):
            raise TargetVerifyError(f"wgmma {self.shape.data} on {self.atype.data}: K is {32 if fp8 else 16}", op=self)
        if fp8 and self.trans_b is not None:
            raise TargetVerifyError("fp8 wgmma reads B K-major only (no imm-trans-b)", op=self)
        if self.btype is not None and not (fp8 and self.btype.data in ("f8e4m3fn", "f8e5m2")):
            raise TargetVerifyError(f"wgmma mixes {self.atype.data} and {self.btype.data}: only fp8 formats mix",
                                    op=self)


@irdl_op_definition
class WgmmaFenceOp(IRDLOperation):
    """``wgmma.fence.sync.aligned``: orders earlier register and shared-memory accesses of the
    warpgroup before the wgmma instructions that follow."""

    name = "tessera_nvidia.wgmma_fence"
    assembly_format = "attr-dict"


@irdl_op_definition
class WgmmaCommitOp(IRDLOperation):
    """``wgmma.commit_group.sync.aligned``: the wgmma instructions issued since the last commit
    form one group."""

    name = "tessera_nvidia.wgmma_commit"
    assembly_format = "attr-dict"


@irdl_op_definition
class WgmmaWaitOp(IRDLOperation):
    """``wgmma.wait_group.sync.aligned pending``: wait until at most ``pending`` committed wgmma
    groups are in flight; only then may their accumulators be read."""

    name = "tessera_nvidia.wgmma_wait"
    pending = attr_def(IntegerAttr)
    assembly_format = "attr-dict"


@irdl_op_definition
class WgmmaFenceOperandOp(IRDLOperation):
    """The accumulator registers ``c`` as they are after a ``wgmma_wait`` (``d``: the same
    registers).  No instruction: it ties the wait to the values, so no read of an accumulator
    is scheduled above the wait that completes it (LLVM sees the asynchronous wgmma results as
    ordinary values; an empty inline asm with the registers tied orders them)."""

    name = "tessera_nvidia.wgmma_fence_operand"
    c = var_operand_def()
    d = var_result_def()
    assembly_format = "`(` $c `:` type($c) `)` attr-dict `->` type($d)"

    def verify_(self) -> None:
        if [v.type for v in self.c] != [r.type for r in self.d]:
            raise TargetVerifyError("wgmma_fence_operand results must match its operands", op=self)


@irdl_op_definition
class FenceProxyAsyncOp(IRDLOperation):
    """``fence.proxy.async.shared::cta``: this thread's generic-proxy writes to shared memory
    become visible to async-proxy reads (wgmma operands) issued after the next barrier."""

    name = "tessera_nvidia.fence_proxy_async"
    assembly_format = "attr-dict"


from tessera.ir.target.nvidia_tma import (TMA_OPS, FenceMbarrierInitOp, MbarrierExpectTxOp,  # noqa: E402,F401
                                          MbarrierInitOp, MbarrierWaitOp, TmaLoadOp)

NVIDIA = Dialect("tessera_nvidia", [*TMA_OPS, MmaSyncOp, CpAsyncOp, CpAsyncCommitOp, CpAsyncWaitOp, LdmatrixOp, SharedAddressOp,
                                    WgmmaOp, WgmmaFenceOp, WgmmaCommitOp, WgmmaWaitOp, WgmmaFenceOperandOp,
                                    FenceProxyAsyncOp], [])
