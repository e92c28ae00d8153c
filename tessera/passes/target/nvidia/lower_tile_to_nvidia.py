"""``lower-tile-to-nvidia{arch=...}``: Tile IR -> ``tessera_gpu`` + ``tessera_nvidia`` Target IR.

``arch`` is mandatory; the selector's ISA for it decides which fragments are legal
(bf16 on sm_75 is refused here).  Lane mappings of ``mma.sync`` per the PTX ISA
fragment layouts ("Matrix Fragments for mma.m16n8k16 / m16n8k8"), with
``g = lane / 4`` (the group) and ``t = lane % 4`` (the thread in the group):

  m16n8k16  A a0..a7: row g + 8*((i/2)%2), col 2t + i%2 + 8*(i/4)  (4 registers of 2)
            B b0..b3: k 2t + i%2 + 8*(i/2), col g                 (2 registers of 2)
            C c0..c3: row g + 8*(i/2), col 2t + i%2               (4 f32 registers)
  m16n8k8   A a0..a3: row g + 8*(i/2), col 2t + i%2;  B b0,b1: k 2t + i, col g;  C as above
  tf32 (f32 inputs, one element per register, rounded to tf32 by the codegen's cvt.rna.tf32.f32):
  m16n8k8   A a0..a3: row g + 8*(i%2), col t + 4*(i/2);  B b0,b1: k t + 4i, col g;  C as above
  m16n8k4   A a0,a1:  row g + 8i, col t;                 B b0: k t, col g;         C as above

From shared memory the A and B registers are loaded with ``ldmatrix`` (x4 / x2 for A,
``.trans`` x2 / x1 for a row-major B) when the view is 16-byte aligned row by row;
otherwise element by element.  Staging copies use ``cp.async`` (sm_80+): 16 bytes
per thread per step, zero-filling what lies past the view's valid extent, one commit
group per ``tile.async_copy``, and ``tile.wait {outstanding = n}`` becomes
``cp.async.wait_group n`` — only the oldest stage of the pipeline is waited for.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, UnitAttr
from xdsl.ir import SSAValue

from tessera.errors import CodegenError, MmaSelectorError, PassFailedError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ival
from tessera.ir.builder import Builder
from tessera.ir.target import nvidia as NV
from tessera.mma.selector import get_isa
from tessera.passes.base import TesseraPass, option, register
from tessera.passes.target.nvidia.tma import TMA_CONSUMES, TMA_PRODUCES, TmaLowering
from tessera.passes.target.nvidia.wgmma import ATOM_BYTES, WgmmaLowering, WgmmaMap
from tessera.passes.target.gpu.simt_rows import RowsLowerer, is_row_kernel
from tessera.passes.target.gpu.simt import (
    GPU_CONSUMES,
    GPU_PRODUCES,
    Item,
    LaneMap,
    OperandMap,
    SimtLowerer,
    View,
    const_int,
    elem_bytes,
    lower_for_arch,
    vec,
)

NAME = "lower-tile-to-nvidia"
CP_ASYNC_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120")


class MmaSyncMap(LaneMap):
    lanes = 32

    def __init__(self, rec, ptx_type: str):
        self.rec = rec
        self.ptx_type = ptx_type
        self.k = rec.shape[2]

    def build(self, b: Builder, lane: SSAValue) -> None:
        g, tig = b.div(lane, 4), b.rem(lane, 4)
        t2 = b.mul(tig, 2)
        if self.ptx_type == "f32":      # tf32: one element per 32-bit register
            na, nb = self.k // 2, self.k // 4
            self.a = OperandMap([Item(g, 8 * (i % 2), tig, 4 * (i // 2)) for i in range(na)], [1] * na)
            self.b = OperandMap([Item(tig, 4 * i, g, 0) for i in range(nb)], [1] * nb)
        elif self.k == 32:               # fp8 m16n8k32: four 8-bit elements per 32-bit register
            t4 = b.mul(tig, 4)
            self.a = OperandMap([Item(g, 8 * ((i // 4) % 2), t4, i % 4 + 16 * (i // 8), 4) for i in range(16)],
                                [4, 4, 4, 4])
            self.b = OperandMap([Item(t4, i % 4 + 16 * (i // 4), g, 0, 1, 4) for i in range(8)], [4, 4])
        elif self.k == 16:
            self.a = OperandMap([Item(g, 8 * ((i // 2) % 2), t2, i % 2 + 8 * (i // 4), 2) for i in range(8)],
                                [2, 2, 2, 2])
            self.b = OperandMap([Item(t2, i % 2 + 8 * (i // 2), g, 0, 1, 2) for i in range(4)], [2, 2])
        else:
            self.a = OperandMap([Item(g, 8 * (i // 2), t2, i % 2, 2) for i in range(4)], [2, 2])
            self.b = OperandMap([Item(t2, i, g, 0, 1, 2) for i in range(2)], [2])
        self.c = OperandMap([Item(g, 8 * (i // 2), t2, i % 2, 2) for i in range(4)], [1, 1, 1, 1])

    def emit_mma(self, b: Builder, ft: t.FragmentType, a, bb, c):
        m, n, k = ft.mnk
        attrs = {"shape": StringAttr(f"m{m}n{n}k{k}"), "atype": StringAttr(self.ptx_type), "ctype": StringAttr("f32")}
        btype = FP8_NAMES.get(str(getattr(bb[0].type, "element_type", bb[0].type)))
        if btype is not None and btype != self.ptx_type:     # e4m3 x e5m2: B's own format
            attrs["btype"] = StringAttr(btype)
        op = NV.MmaSyncOp.create(operands=[*a, *bb, *c], result_types=[x.type for x in c],
                                 attributes=attrs,
                                 properties={"operandSegmentSizes": _segments(len(a), len(bb), len(c))})
        b.op(op)
        return list(op.results)


def _segments(*sizes):
    from xdsl.dialects.builtin import DenseArrayBase, i32
    return DenseArrayBase.from_list(i32, list(sizes))


FP8_NAMES = {"f8E4M3FN": "f8e4m3fn", "f8E5M2": "f8e5m2"}     # xDSL's spelling -> the records'


def lane_map_for(arch: str, ft: t.FragmentType) -> LaneMap:
    isa = get_isa("nvidia", arch)
    fam = ft.family.data
    if fam not in ("mma_sync", "wgmma"):
        raise MmaSelectorError(f"nvidia:{arch}: {NAME} lowers mma_sync and wgmma fragments, not {fam}")
    shape = ft.mnk
    dtype = FP8_NAMES.get(str(ft.elem), str(ft.elem)) if ft.role.data != "acc" else None
    side = "b_dtype" if ft.role.data == "b" else "a_dtype"     # the operand's own dtype (fp8 mixes)
    cands = [r for r in isa.records if r.family == fam and r.shape == shape and
             (dtype is None or getattr(r, side) == dtype) and r.lowered_by == NAME]
    if not cands:
        legal = sorted({f"{r.family} m{r.m}n{r.n}k{r.k} {r.a_dtype}" for r in isa.records if r.lowered_by == NAME})
        legal = legal[:12] + (["..."] if len(legal) > 12 else [])
        raise MmaSelectorError(f"nvidia:{arch} has no lowered {fam} {'x'.join(map(str, shape))}"
                               f"{' for ' + dtype if dtype else ''}; legal there: {', '.join(legal) or 'none'}")
    rec = cands[0]
    return WgmmaMap(rec, rec.a_dtype) if fam == "wgmma" else MmaSyncMap(rec, rec.a_dtype)


@dataclass
class NvidiaLowerer(TmaLowering, WgmmaLowering, SimtLowerer):
    arch: str = ""
    swizzled: dict = field(default_factory=dict)
    mn_major: set = field(default_factory=set)
    wg_open: bool = False
    wg_inflight: int = 0

    @property
    def cp_async(self) -> bool:
        return self.arch in CP_ASYNC_ARCHS and not self.wgmma_kernel()

    # ------------------------------------------------------------------ wgmma (wgmma.py)
    WG_INSIDE = ("tile.mma", "tile.fragment_pack", "tile.view")

    def lower_op(self, op, b: Builder) -> None:
        """A run of wgmma ``tile.mma`` (with the views and descriptors between them) is one
        group: it is committed and waited for before any other op (at the end of a k-loop body,
        ``wg_inflight`` groups may stay in flight until the loop ends: wgmma.py)."""
        inflight = self.lower_wgmma_boundary(op, b)
        super().lower_op(op, b)
        if inflight:
            self.wg_drain = True
        if op.name == "scf.for" and getattr(self, "wg_drain", False):
            self.drain_after_loop(b, op)
            self.wg_drain = False

    def op_tile_mma(self, op: t.MmaOp, b: Builder) -> None:
        if op.c.type.family.data == "wgmma" and not self.wg_open:
            b.op(NV.WgmmaFenceOp.create())
            self.wg_open = True
        super().op_tile_mma(op, b)

    def op_tile_alloc(self, op: t.AllocOp, b: Builder) -> None:
        if self.wgmma_kernel():      # swizzle atoms: every staged block 1024-byte aligned
            self.shared_bytes = -(-self.shared_bytes // ATOM_BYTES) * ATOM_BYTES
        super().op_tile_alloc(op, b)

    # ------------------------------------------------------------------ ldmatrix
    def pack_operand(self, b: Builder, vv: View, omap: OperandMap, ft: t.FragmentType) -> list[SSAValue]:
        if ft.family.data == "wgmma":
            return [self.descriptor_of(b, vv, ft)]
        if vv.base in self.swizzled:    # its elements are permuted: only a wgmma descriptor reads them right
            raise CodegenError(f"a {ft.family.data} fragment packed from a swizzle128-staged buffer; only wgmma "
                               "descriptors read that layout")
        role = ft.role.data
        m, n, k = ft.mnk
        in_smem = vv.base.type.space.data == "smem" and vv.full and vv.align % 8 == 0 and elem_bytes(vv.elem) == 2
        transposed = role == "b" and const_int(vv.rs) == 1 and (const_int(vv.cs) or 1) % 8 == 0
        if not in_smem or not (const_int(vv.cs) == 1 or transposed):
            return super().pack_operand(b, vv, omap, ft)
        lane = b.c(self.lane)
        r8 = b.rem(lane, 8)
        if transposed:        # B = K^T with K's rows in shared memory: B's columns are rows there, so
            num = 2 if k == 16 else 1    # ldmatrix without .trans gives B's fragment (k 0-7 | 8-15)
            n_row = r8
            k_col = b.mul(b.rem(b.div(lane, 8), 2), 8) if k == 16 else 0
            idx = b.add(vv.off, b.add(b.mul(n_row, vv.cs), k_col))
            op = NV.LdmatrixOp.create(operands=[vv.base, b.c(idx)], result_types=[vec(vv.elem, 2)] * num)
            b.op(op)
            return list(op.results)
        if role == "a":       # 16 x k row-major: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15)
            num = 4 if k == 16 else 2
            row = b.add(r8, b.mul(b.rem(b.div(lane, 8), 2), 8))
            col = b.mul(b.div(lane, 16), 8) if k == 16 else 0
            trans = False
        else:                 # k x 8 row-major B: matrices k 0-7 | 8-15, transposed on load
            num = 2 if k == 16 else 1
            row = b.add(r8, b.mul(b.rem(b.div(lane, 8), 2), 8)) if k == 16 else r8
            col = 0
            trans = True
        idx = b.add(vv.off, b.add(b.mul(row, vv.rs), col))
        op = NV.LdmatrixOp.create(operands=[vv.base, b.c(idx)], result_types=[vec(vv.elem, 2)] * num,
                                  attributes={"trans": UnitAttr()} if trans else {})
        b.op(op)
        return list(op.results)

    # ------------------------------------------------------------------ cp.async
    def op_tile_async_copy(self, op: t.AsyncCopyOp, b: Builder) -> None:
        if op.layout.data == "swizzle128":
            if self.arch != "sm_90a":
                raise CodegenError(f"a swizzle128 staging copy feeds wgmma, which {self.arch} lacks")
            self.copy_swizzled(b, self.vmap[op.source], self.scalar(op.dest), self.scalar(op.dest_offset))
            self.vmap[op.token] = None
            return
        super().op_tile_async_copy(op, b)
        if self.cp_async:
            b.op(NV.CpAsyncCommitOp.create())   # one group per copy: tile.wait counts copies

    def op_tile_wait(self, op: t.WaitOp, b: Builder) -> None:
        if self.wgmma_kernel():   # the swizzled copies' cp.async groups, then their writes to the async proxy
            pending = ival(op.outstanding) if op.outstanding is not None else 0
            b.op(NV.CpAsyncWaitOp.create(attributes={"pending": i64_attr(pending)}))
            b.op(NV.FenceProxyAsyncOp.create())
            return
        if self.cp_async:
            pending = ival(op.outstanding) if op.outstanding is not None else 0
            b.op(NV.CpAsyncWaitOp.create(attributes={"pending": i64_attr(pending)}))

    def copy_vector(self, b: Builder, src: View, dst, doff, pitch: int, r, c0, v: int) -> None:
        if not self.cp_async:
            return super().copy_vector(b, src, dst, doff, pitch, r, c0, v)
        esize = elem_bytes(src.elem)
        in_row = b.cmp("slt", r, src.rows)
        avail = b.mul(b.max(b.min(b.sub(src.cols, c0), v), 0), esize)
        nbytes = b.select(in_row, b.c(avail), b.c(0))
        has = b.cmp("sgt", nbytes, 0)
        sidx = b.select(has, b.c(b.add(src.off, b.add(b.mul(r, src.rs), c0))), b.c(0))
        daddr = b.add(doff, b.add(b.mul(r, pitch), c0))
        b.op(NV.CpAsyncOp.create(operands=[dst, b.c(daddr), src.base, sidx, nbytes],
                                 attributes={"bytes": i64_attr(v * esize)}))


@register
@dataclass(frozen=True)
class LowerTileToNvidia(TesseraPass):
    """Tile IR -> tessera_gpu/tessera_nvidia Target IR (mma.sync lane mapping, ldmatrix, cp.async)."""

    name = NAME
    kind = "target-lowering"
    consumes = GPU_CONSUMES + TMA_CONSUMES
    produces = GPU_PRODUCES + TMA_PRODUCES + ("tessera_nvidia.mma_sync", "tessera_nvidia.ldmatrix", "tessera_nvidia.cp_async",
                                "tessera_nvidia.cp_async_commit", "tessera_nvidia.cp_async_wait",
                                "tessera_nvidia.wgmma", "tessera_nvidia.shared_address", "tessera_nvidia.wgmma_fence",
                                "tessera_nvidia.wgmma_commit", "tessera_nvidia.wgmma_wait",
                                "tessera_nvidia.wgmma_fence_operand", "tessera_nvidia.fence_proxy_async")
    arch: str = option(doc="NVIDIA arch (sm_75, sm_80, sm_86, sm_89, sm_90, sm_90a, sm_120); required")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        def make_lowerer(fn):
            wave = ival(fn.attributes["vector"]) if "vector" in fn.attributes else 32
            if wave == 128 and self.arch == "sm_90a":     # warpgroup kernels (wgmma.py)
                inflight = ival(fn.attributes["wgmma.inflight"]) if "wgmma.inflight" in fn.attributes else 0
                return NvidiaLowerer({}, 128, ival(fn.attributes["gpu.block"]), "smem", arch=self.arch,
                                     wg_inflight=inflight)
            if wave != 32:
                raise PassFailedError(f"{NAME}: kernel @{fn.sym_name.data} is laid out for {wave}-lane waves; "
                                      "NVIDIA warps have 32")
            if is_row_kernel(fn):     # memory-bound kernels (passes/target/gpu/simt_rows.py)
                return RowsLowerer({}, 32, ival(fn.attributes["gpu.block"]), "smem")
            return NvidiaLowerer({}, 32, ival(fn.attributes["gpu.block"]), "smem", arch=self.arch)

        lower_for_arch(module, NAME, "nvidia", self.arch, make_lowerer, lambda ft: lane_map_for(self.arch, ft))


__all__ = ["LowerTileToNvidia", "lane_map_for"]
