"""``schedule-gpu{target=rocm|nvidia arch=...}``: Graph IR fusion groups -> ``schedule.kernel`` (GPU).

The GPU lanes implement GEMM kernels (``[batch] C = epilogue(A @ B [+ C0])``, f16/bf16
inputs, f32 accumulation).  For each one the pass records:

- mma: the selector's record for the input dtype on this arch (wave size from the arch;
  ``mma-shape`` / ``mma-family`` pins go through the selector, which refuses what the
  arch lacks) — and refuses a record that ``lower-tile-to-<target>`` does not implement;
- tiles ``[1, BM, BN, BK]`` over loops ``b, m, n, k``: one workgroup (thread block) per
  BM x BN block of C and batch entry (``parallel = "b*m*n"``: the grid), k in steps of BK;
- register_tile ``[FM, FN]``: instructions per wave (warp) — each wave owns an
  FM*m x FN*n sub-tile; the workgroup has (BM / (FM*m)) x (BN / (FN*n)) waves;
- threads: lanes per workgroup; vector: lanes per wave; staging: how many k-blocks of A
  and B are in flight in shared memory (1 = copy, wait, compute; 2+ = multi-buffered).

Attention kernels (``tessera.attention``, also when fused from the composed form) get the
flash tiling of ``kernels/gpu_attention.py``: tiles ``[1, 4*m, BKV]`` over loops ``bh, q, kv``
(four waves of m query rows per workgroup; ``tile-n`` pins the key block); their backward
(``tessera.attention_grad``) gets ``kernels/gpu_attention_backward.py``'s: tiles ``[1, 4*m, 4*m]``
over loops ``bh, kv, q``, a grid of key-block and query-block workgroups.  Elementwise,
transpose, rowwise and reduce kernels get the memory-bound schedule of
``schedule_gpu_rows.py`` (one workgroup per row, 16-byte vectors).  Any other kernel kind has
no GPU generator and is refused here with a coded error.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerType, ModuleOp, StringAttr

from tessera.dtypes import from_ir
from tessera.errors import MmaSelectorError, ScheduleIllegalError, SpecializeRequest
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir.attrs import i64_attr, int_array, str_array
from tessera.mma.selector import get_isa, require_lowering, select_mma
from tessera.passes.base import TesseraPass, option, register
from tessera.passes.schedule import bounds
from tessera.passes.schedule import schedule_gpu_rows
from tessera.passes.schedule.schedule_cpu import _dtype
from tessera.passes.util import function_blocks, swap_op

GPU_TARGETS = ("rocm", "nvidia")
# shared memory one workgroup may use: LDS on AMD; NVIDIA's opt-in dynamic shared memory per block
# (CUDA programming guide, compute-capability table; the kernels use dynamic shared memory)
SHARED_LIMIT = {"rocm": 64 << 10, "nvidia": 48 << 10}
NVIDIA_SHARED = {"sm_75": 64 << 10, "sm_80": 163 << 10, "sm_86": 99 << 10, "sm_89": 99 << 10, "sm_90": 227 << 10,
                 "sm_90a": 227 << 10, "sm_120": 99 << 10}


def shared_limit(target: str, arch: str) -> int:
    return NVIDIA_SHARED.get(arch, SHARED_LIMIT["nvidia"]) if target == "nvidia" else SHARED_LIMIT[target]
# sm_90a wgmma: 128x128 blocks, two warpgroups of 64x128 (one m64n128k16 each, 64 accumulator
# registers per thread), k-blocks of 64 (one 128-byte swizzled row), four stages (128 KiB): one
# wgmma group stays in flight, so the copies run S - 2 = 2 k-blocks ahead (kernels/gpu_gemm_wgmma.py)
WGMMA_TILE = {"bm": 128, "bn": 128, "bk": 64, "fm": 1, "fn": 1, "staging": 4}
# the register budget (32-bit registers per lane) the accumulators may take at most
ACC_BUDGET = {"rocm": 128, "nvidia": 96}
# wgmma reads A and B from shared memory: no operand registers, so a warpgroup may hold m64n256's 128
WGMMA_ACC_BUDGET = 128


def gemm_shared_bytes(bm: int, bn: int, bk: int, staging: int, family: str = "", elem_size: int = 2) -> int:
    if family == "wgmma":      # unpadded swizzled blocks, each 1024-byte aligned
        return staging * (bm + bn) * bk * elem_size + 1024
    pad = max(8, 16 // elem_size)      # kernels/gpu_gemm.row_pad: at least 16 bytes
    return staging * (bm * (bk + pad) + bk * (bn + pad)) * elem_size


# f32 GEMM and attention on NVIDIA run on tf32 mma.sync (inputs rounded to a 10-bit mantissa, f32
# accumulation) only when asked: schedule={"math_mode": "tf32"} (JAX's default precision and torch's
# allow_tf32 make the same trade; torch's default does not, and a result 1000x less accurate than its
# dtype is not a default here).  Without it the selector refuses f32 with MMA_SELECTOR.
ELEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


def default_tiles(target: str, shape: tuple[int, int, int], arch: str = "", elem_size: int = 2) -> dict:
    """BM, BN, BK, register tile and staging for one instruction shape."""
    m, n, _k = shape
    if target == "nvidia":
        # 128x128 blocks, 8 warps of 64x32 (4x4 m16n8 instructions).  Measured on an H200
        # (docs/gpu.md, f16 4096^3): BK 32 x 2 stages 160 TFLOP/s, BK 64 x 2 220, BK 64 x 3 226.
        # The deepest of those the arch's shared memory holds is the default (f32 inputs: twice the
        # bytes, so BK 32 x 3 on sm_80, BK 32 x 2 where 99 KB is the limit).
        # fp8: one k32 step per block (BK 64 left ptxas 4-92 spilled registers at 128 per thread, 512^3)
        for bk, staging in ((64, 3), (64, 2), (32, 3), (32, 2), (16, 2)) if elem_size != 1 else ((32, 3),):
            if gemm_shared_bytes(128, 128, bk, staging, elem_size=elem_size) <= shared_limit(target, arch):
                break
        # f32 (tf32) fragments are loaded from shared memory element by element (no ldmatrix for 4-byte
        # elements): 4x4 instructions per warp took 255 registers (ptxas, 512^3 on sm_80/sm_90: one
        # 8-warp block per SM); 2x4 take 128 with 16 warps per block (same SM share, twice the warps)
        # fp8 (m16n8k32) the same: its 8-bit fragments are gathered byte by byte (ldmatrix moves 16-bit rows)
        fm = 32 // m if elem_size in (1, 4) else 64 // m
        return {"bm": 128, "bn": 128, "bk": bk, "fm": fm, "fn": 32 // n, "staging": staging}
    # AMD: 64x64 blocks of four waves, each 32x32 (2x2 16x16 or 1x1 32x32 instructions)
    return {"bm": 64, "bn": 64, "bk": 32, "fm": 32 // m, "fn": 32 // n, "staging": 2}


@register
@dataclass(frozen=True)
class ScheduleGpu(TesseraPass):
    """Graph IR fusion groups -> schedule.kernel with workgroup/wave tiling and the selected MMA."""

    name = "schedule-gpu"
    kind = "layer-boundary"
    consumes = ("tessera.fusion",)
    produces = ("schedule.kernel",)
    target: str = option(doc="rocm or nvidia; required")
    arch: str = option(doc="the GPU arch (gfx1151, gfx942, sm_90, ...); required, never defaulted")
    tile_m: int = option(0, doc="rows of C per workgroup (BM); 0: the default for the instruction")
    tile_n: int = option(0, doc="columns of C per workgroup (BN)")
    tile_k: int = option(0, doc="k per staged block (BK)")
    register_tile: tuple[int, ...] = option((), doc="FM,FN instructions per wave")
    staging: int = option(0, doc="k-blocks in flight in shared memory (0: the default)")
    mma_shape: tuple[int, ...] = option((), doc="instruction shape M,N,K to prefer (selector-checked)")
    mma_family: str = option("", doc="instruction family to require (wmma, mfma, mma_sync; selector-checked)")
    math_mode: str = option("", doc="tf32: f32 inputs may run on tf32 instructions (asked for, never defaulted)")
    copy_engine: str = option("", doc="who stages GEMM blocks: threads (default) or tma (sm_90a wgmma GEMMs)")

    def __post_init__(self) -> None:
        """Options out of their legal range are refused when the pipeline is parsed (bounds.py)."""
        bounds.check_static({k: getattr(self, k) for k in ("tile_m", "tile_n", "tile_k", "register_tile", "staging",
                                                           "mma_shape")}, self.target, "schedule-gpu: ")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        if self.target not in GPU_TARGETS:
            raise ScheduleIllegalError(f"schedule-gpu target {self.target!r}; legal: {', '.join(GPU_TARGETS)}")
        isa = get_isa(self.target, self.arch)
        n = 0
        for block in function_blocks(module):
            for op in list(block.ops):
                if isinstance(op, g.FusionOp):
                    self._schedule(op, isa, f"k{n}_{op.kind.data}")
                    n += 1

    def _select(self, isa, name: str, what: str, dtype: str, family: str | None = None, shape=None):
        lowering = f"lower-tile-to-{self.target}"
        try:
            sel = select_mma(isa, dtype, out_dtype="f32", family=self.mma_family or family,
                             math_mode=(self.math_mode or None) if dtype == "f32" else None,
                             prefer_shape=tuple(self.mma_shape) if self.mma_shape else shape, lowering=lowering)
            require_lowering(sel, lowering)
        except MmaSelectorError as e:
            e.message = f"kernel {name} ({what}, {dtype} inputs): {e.message}"
            raise e.with_location(None)
        return sel

    def _kernel(self, fop: g.FusionOp, name: str, attrs: dict) -> None:
        region = fop.detach_region(fop.body)
        kop = s.KernelOp.create(operands=list(fop.inputs), result_types=[r.type for r in fop.outputs],
                                attributes={"sym_name": StringAttr(name), "kind": fop.kind, "unroll": i64_attr(1),
                                            **attrs}, regions=[region])
        swap_op(fop, kop)

    def _attention(self, fop: g.FusionOp, isa, name: str) -> None:
        """Flash attention: a workgroup of 4 waves per block of 4*m query rows, keys in blocks of 64
        (32 when the head dims are large, to fit shared memory)."""
        from tessera.passes.tile.kernels.gpu_attention import shared_bytes
        att = next(o for o in fop.body.block.ops if isinstance(o, g.AttentionOp))
        dtype = _dtype(att.q.type.element_type)
        if self.mma_family == "wgmma":
            raise ScheduleIllegalError(f"kernel {name}: GPU attention has no wgmma generator yet (it runs on mma_sync "
                                       "on sm_90a too)")
        # warp-level instructions only: the attention generator has no warpgroup (wgmma) form
        sel = self._select(isa, name, att.name, dtype, family="mma_sync" if self.target == "nvidia" else None)
        rec = sel.record
        im, in_, ik = rec.shape
        wave = rec.lanes or 32
        waves = 4
        dh, dv = att.q.type.dims[3], att.v.type.dims[3]
        dmax = max(d if isinstance(d, int) else 256 for d in (dh, dv))
        bkv = self.tile_n or (64 if dmax <= 64 else 32)
        bkv = max(bkv, in_, ik)
        if self.tile_m and self.tile_m != waves * im:
            raise ScheduleIllegalError(f"kernel {name}: GPU attention query blocks are {waves} waves x {im} rows "
                                       f"= {waves * im}; tile-m={self.tile_m} is not that")
        if bkv % max(in_, ik):
            raise ScheduleIllegalError(f"kernel {name}: key block tile-n={bkv} is not a multiple of "
                                       f"{max(in_, ik)} ({rec.id})")
        pad = lambda d, q: -(-d // q) * q   # noqa: E731
        shared = shared_bytes(im, waves, bkv, pad(dmax, ik), pad(dmax, in_), ELEM_BYTES.get(dtype, 2))
        if shared > shared_limit(self.target, self.arch):
            raise ScheduleIllegalError(f"kernel {name}: key blocks of {bkv} with head dim {dmax} take {shared} bytes "
                                       f"of shared memory; {self.arch} allows {shared_limit(self.target, self.arch)} "
                                       "(pin a smaller tile-n)")
        self._kernel(fop, name, {
            "parallel": StringAttr("bh*q"), "threads": i64_attr(waves * wave), "staging": i64_attr(1),
            "mma": StringAttr(rec.id), "register_tile": int_array([1, 1]), "vector": i64_attr(wave),
            "loops": str_array(["bh", "q", "kv"]), "tiles": int_array([1, waves * im, bkv]),
            "order": str_array(["bh", "q", "kv"])})

    def _attention_bwd(self, fop: g.FusionOp, isa, name: str) -> None:
        """Flash-attention backward (``kernels/gpu_attention_backward.py``): workgroups of 4 waves
        over blocks of 4*m keys (dK, dV) and 4*m queries (dQ), one grid."""
        from tessera.passes.tile.kernels.gpu_attention_backward import shared_bytes
        op = next(o for o in fop.body.block.ops if isinstance(o, g.AttentionGradOp))
        dtype = _dtype(op.q.type.element_type)
        if self.mma_family == "wgmma":
            raise ScheduleIllegalError(f"kernel {name}: the GPU attention backward has no wgmma generator (it runs "
                                       "on mma_sync on sm_90a too)")
        # AMD: the 16x16 instruction (blocks of 64 rows; 32x32 MFMA blocks of 128 overflow the 64 KiB LDS)
        sel = self._select(isa, name, op.name, dtype, family="mma_sync" if self.target == "nvidia" else None,
                           shape=(16, 16, 16) if self.target == "rocm" else None)
        rec = sel.record
        im, in_, ik = rec.shape
        wave = rec.lanes or 32
        waves = 4
        blk = waves * im
        for opt, v in (("tile-m", self.tile_m), ("tile-n", self.tile_n)):
            if v and v != blk:
                raise ScheduleIllegalError(f"kernel {name}: GPU attention backward blocks are {waves} waves x {im} "
                                           f"rows = {blk}; {opt}={v} is not that")
        if blk % max(in_, ik):
            raise ScheduleIllegalError(f"kernel {name}: a block of {blk} rows is not whole {rec.id} tiles")
        dh = op.q.type.dims[3]
        if not isinstance(dh, int):   # fragments per row live in registers: the head dim is a compile-time fact
            raise SpecializeRequest(f"kernel {name}: the GPU attention backward needs a static head dim ({dh} is "
                                    "symbolic)", symbols=[str(dh)])
        dmax = dh
        dpx = max(-(-dmax // ik) * ik, -(-dmax // in_) * in_)
        shared = shared_bytes(im, waves, dpx, ELEM_BYTES.get(dtype, 2))
        if shared > shared_limit(self.target, self.arch):
            raise ScheduleIllegalError(f"kernel {name}: blocks of {blk} with head dim {dmax} take {shared} bytes of "
                                       f"shared memory; {self.arch} allows {shared_limit(self.target, self.arch)}")
        self._kernel(fop, name, {
            "parallel": StringAttr("bh*kv*q"), "threads": i64_attr(waves * wave), "staging": i64_attr(1),
            "mma": StringAttr(rec.id), "register_tile": int_array([1, 1]), "vector": i64_attr(wave),
            "loops": str_array(["bh", "kv", "q"]), "tiles": int_array([1, blk, blk]),
            "order": str_array(["bh", "kv", "q"])})

    def _schedule(self, fop: g.FusionOp, isa, name: str) -> None:
        kind = fop.kind.data
        if kind == "attention":
            return self._attention(fop, isa, name)
        if kind == "attention_bwd":
            return self._attention_bwd(fop, isa, name)
        if kind in schedule_gpu_rows.ROW_KINDS:   # memory-bound kernels: schedule_gpu_rows.py
            return self._kernel(fop, name, schedule_gpu_rows.rows_schedule(fop, name, self.target,
                                                                           isa.wave_sizes[0]))
        if kind != "gemm":
            ops = ", ".join(o.name for o in fop.body.block.ops if o.name != "tessera.yield")
            raise ScheduleIllegalError(
                f"kernel {name} ({ops}): the {self.target} lane generates gemm and attention kernels only; a "
                f"{kind} kernel has no {self.target} generator yet")
        mm = next(o for o in fop.body.block.ops if isinstance(o, g.MatmulOp))
        for r in fop.results:   # a cast to an int ending the epilogue: the GPU GEMM stores floats only
            et = getattr(r.type, "element_type", None)
            if isinstance(et, IntegerType) and et.width.data > 1:
                raise ScheduleIllegalError(
                    f"kernel {name} (tessera.cast): the {self.target} lane has no GEMM epilogue storing {from_ir(et)}; "
                    'target="cpu" compiles it')
        dtype = _dtype(mm.lhs.type.element_type)
        if mm.rhs.type.element_type != mm.lhs.type.element_type:     # fp8 e4m3 x e5m2
            dtype = f"{dtype}x{_dtype(mm.rhs.type.element_type)}"
        sel = self._select(isa, name, mm.name, dtype)
        if sel.record.family == "wgmma" and not self.mma_shape:
            # one m64nNk16 (fp8: k32) per warpgroup spans the block's columns: N = tile-n (128 by default)
            sel = self._select(isa, name, mm.name, dtype, shape=(64, min(self.tile_n or WGMMA_TILE["bn"], 256),
                                                                 sel.record.k))
        rec = sel.record
        im, in_, ik = rec.shape
        esize = ELEM_BYTES.get(dtype, 1 if dtype.startswith("f8") else 2)
        d = default_tiles(self.target, rec.shape, self.arch, esize)
        if rec.family == "wgmma":      # k-blocks of one 128-byte swizzled row
            d = {**WGMMA_TILE, "bk": 128 // esize}
        fm, fn_ = (self.register_tile if self.register_tile else (d["fm"], d["fn"]))
        bm = self.tile_m or d["bm"]
        bn = self.tile_n or d["bn"]
        bk = self.tile_k or d["bk"]
        staging = self.staging or d["staging"]
        wave = rec.lanes or 32
        bad = []
        if bm % (fm * im):
            bad.append(f"tile-m={bm} is not a multiple of FM*{im}={fm * im}")
        if bn % (fn_ * in_):
            bad.append(f"tile-n={bn} is not a multiple of FN*{in_}={fn_ * in_}")
        if bk % max(ik, 8):
            bad.append(f"tile-k={bk} is not a multiple of {max(ik, 8)} (the instruction's K, and 8-element rows)")
        if not 1 <= staging <= 4:
            bad.append(f"staging={staging} is not in 1..4")
        if bad:
            raise ScheduleIllegalError(f"kernel {name} ({rec.id}): " + "; ".join(bad))
        waves = (bm // (fm * im)) * (bn // (fn_ * in_))
        threads = waves * wave
        if threads > 1024:
            raise ScheduleIllegalError(f"kernel {name}: {waves} waves of {wave} lanes = {threads} threads per "
                                       "workgroup; at most 1024")
        acc_regs = fm * fn_ * (sel.regs_per_lane or 0)
        budget = WGMMA_ACC_BUDGET if rec.family == "wgmma" else ACC_BUDGET[self.target]
        if acc_regs > budget:
            raise ScheduleIllegalError(f"kernel {name}: register tile {fm}x{fn_} of {rec.id} keeps {acc_regs:g} "
                                       f"accumulator registers per lane; at most {budget}")
        shared = gemm_shared_bytes(bm, bn, bk, staging, rec.family, esize)
        if shared > shared_limit(self.target, self.arch):
            raise ScheduleIllegalError(f"kernel {name}: {staging} stages of {bm}x{bk} A and {bk}x{bn} B blocks take "
                                       f"{shared} bytes of shared memory; {self.arch} allows "
                                       f"{shared_limit(self.target, self.arch)} per workgroup")
        engine = {}
        if self.copy_engine:
            if self.copy_engine not in ("threads", "tma"):
                raise ScheduleIllegalError(f"kernel {name}: copy-engine={self.copy_engine!r}; legal: threads, tma")
            if self.copy_engine == "tma" and (rec.family != "wgmma" or staging < 3):
                raise ScheduleIllegalError(f"kernel {name}: copy-engine=tma stages wgmma GEMM blocks on sm_90a with "
                                           f"3 or 4 stages; this kernel runs {rec.id} in {staging} stage(s)")
            engine = {"copy_engine": StringAttr(self.copy_engine)}
        self._kernel(fop, name, {
            **engine,
            "parallel": StringAttr("b*m*n"), "threads": i64_attr(threads), "staging": i64_attr(staging),
            "mma": StringAttr(rec.id), "register_tile": int_array([fm, fn_]), "vector": i64_attr(wave),
            "loops": str_array(["b", "m", "n", "k"]), "tiles": int_array([1, bm, bn, bk]),
            "order": str_array(["b", "m", "n", "k"])})
