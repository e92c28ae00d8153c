"""``schedule-cpu{arch=...}``: Graph IR fusion groups -> ``schedule.kernel`` (x86).

Every decision lands on the kernel op and is read by schedule -> tile:

- gemm: the MMA record from the selector (``select_mma`` for the input dtype on
  this arch), the register tile from ``register_tile`` (MR x NR instructions
  within the register file), cache blocks from the host's cache sizes (the B
  micro-panel KC x NR*W fills half of L1, the A block MC x KC half of L2, the B
  panel KC x NC a share of L3), the BLIS loop order (b, n, k, m), the row loop in
  parallel across the CPUs this process may use, a 4x unrolled k loop;
- rowwise / elementwise / reduce / transpose: rows in parallel, a vector width of
  the arch's register, a column chunk of several registers.

A kernel that touches a float64 tensor computes in f64 (``register_elem``): its vectors
hold half the lanes (8 with AVX-512, 4 with AVX2), its GEMM takes the f64 FMA record.

Options pin choices (``tessera.jit(schedule=...)``); an illegal pin is a
``SCHEDULE_ILLEGAL`` error naming what is legal.
"""
from __future__ import annotations

import dataclasses
import math

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (BFloat16Type, Float8E4M3FNType, Float8E5M2Type, Float16Type, Float32Type, ModuleOp,
                                   StringAttr, f32)

from tessera import host
from tessera.errors import MmaSelectorError, ScheduleIllegalError, UnknownArchError
from tessera.ir import graph as g
from tessera.ir import schedule as s
from tessera.ir.attrs import i64_attr, int_array, str_array
from tessera.mma.selector import get_isa, register_tile, require_lowering, select_mma
from tessera.passes.base import TesseraPass, option, register
from tessera.passes.schedule import bounds
from tessera.passes.tile.kernels import attention_decode
from tessera.passes.util import function_blocks, register_elem, swap_op

DTYPE = {Float32Type: "f32", BFloat16Type: "bf16", Float16Type: "f16", Float8E4M3FNType: "f8e4m3fn",
         Float8E5M2Type: "f8e5m2"}
PARALLEL_LEGAL = {"gemm": ("m", "b*m", "none", "n"), "rowwise": ("r", "none"), "elementwise": ("r", "none"),
                  "reduce": ("r", "none"), "transpose": ("r", "none"), "concat": ("r", "none"),
                  "attention": ("bh*q", "none"),
                  "gather": ("r", "none"),
                  "pad": ("r", "none")}
PARALLEL_LEGAL["scan"] = ("r", "none")
PARALLEL_LEGAL["scatter"] = ("r", "none")
PARALLEL_LEGAL["rowreduce"] = ("r", "none")
PARALLEL_LEGAL["attention_bwd"] = ("bh", "none")   # bh: one (batch, kv head) per item (dK, dV owned)
PARALLEL_LEGAL["attention"] += ("bh*kv",)   # bh*kv: the split-K decode kernel (kernels/attention_decode.py)


def _dtype(elem) -> str:
    for cls, name in DTYPE.items():
        if isinstance(elem, cls):
            return name
    return str(elem)


def _decode_rows(fop: g.FusionOp) -> int | None:
    """Rows per work item when the fusion's attention runs as the split-K decode kernel, else None."""
    att = [o for o in fop.body.block.ops if isinstance(o, g.AttentionOp)]
    # an attention that also writes its log-sum-exp (for its gradient) runs the flash kernel
    return attention_decode.decode_rows(att[0]) if len(att) == 1 and att[0].lse is None else None


def _round_down(v: int, m: int) -> int:
    return max(m, v // m * m)


@register
@dataclass(frozen=True)
class ScheduleCpu(TesseraPass):
    """Graph IR fusion groups -> schedule.kernel with x86 tiling, register tile and parallel loop."""

    name = "schedule-cpu"
    kind = "layer-boundary"
    consumes = ("tessera.fusion",)
    produces = ("schedule.kernel",)
    arch: str = option(doc="x86 CPU name or ISA level (host resolved before lowering); required")
    threads: int = option(0, doc="threads per kernel (0: the CPUs this process may use)")
    tile_m: int = option(0, doc="gemm MC (rows per A block); 0: from the cache sizes")
    tile_n: int = option(0, doc="gemm NC (columns of the widest B block; a wider B runs blocks of half); "
                                "0: from the cache sizes")
    tile_k: int = option(0, doc="gemm KC (k per panel); 0: from the cache sizes")
    register_tile: tuple[int, ...] = option((), doc="gemm MR,NR instructions per register tile; (): the selector's")
    mma_shape: tuple[int, ...] = option((), doc="gemm instruction shape M,N,K to prefer (selector-checked)")
    parallel: str = option("", doc="loop split across threads: m or bm (gemm), r (others), or none")
    unroll: int = option(4, doc="unroll of the gemm k loop")
    chunk: int = option(0, doc="columns per step of row/elementwise kernels (0: 4 vector registers)")
    split: int = option(0, doc="gemm (parallel m/n): row chunks per thread at least, 1..16 (0: 4); decode "
                               "attention: key chunks per (batch, kv head) at most, 1..256 (0: at run time)")
    pin_kinds: str = option("", doc="kernel kinds ('+'-joined) the tile, register-tile, mma-shape, chunk, parallel "
                                    "and split pins apply to; '': every kernel (the tuner scopes its pins to the "
                                    "family it tuned)")

    def __post_init__(self) -> None:
        """Options out of their legal range are refused when the pipeline is parsed (bounds.py)."""
        bounds.check_static({k: getattr(self, k) for k in ("threads", "tile_m", "tile_n", "tile_k", "register_tile",
                                                           "mma_shape", "unroll", "chunk", "split")}, "cpu",
                            "schedule-cpu: ")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        try:
            isa = get_isa("x86", self.arch)
        except UnknownArchError:
            raise
        w = 16 if "avx512f" in isa.features else 8
        threads = self.threads or min(host.usable_cpus(), bounds.THREADS_MAX)
        if threads < 1:
            raise ScheduleIllegalError("threads must be >= 1")
        n = 0
        for block in function_blocks(module):
            for op in list(block.ops):
                if isinstance(op, g.FusionOp):
                    self._schedule(op, isa, w, threads, f"k{n}_{op.kind.data}")
                    n += 1

    def _schedule(self, fop: g.FusionOp, isa, w: int, threads: int, name: str) -> None:
        kind = fop.kind.data
        if self.pin_kinds and kind not in self.pin_kinds.split("+"):   # pins of another family: the model's own
            plain = dataclasses.replace(self, tile_m=0, tile_n=0, tile_k=0, register_tile=(), mma_shape=(), chunk=0,
                                        parallel="", split=0, pin_kinds="")
            return plain._schedule(fop, isa, w, threads, name)
        if register_elem(fop) != f32:
            w //= 2   # f64 registers: the same vector bits, half the lanes
        decode = _decode_rows(fop) if kind == "attention" else None
        par = self.parallel or (self._gemm_parallel(fop) if kind == "gemm" else
                                ("bh*kv" if decode else "bh*q") if kind == "attention" else
                                "bh" if kind == "attention_bwd" else "r")
        if par not in PARALLEL_LEGAL.get(kind, ()):
            raise ScheduleIllegalError(f"kernel {name}: parallel={par!r} is not legal for a {kind} kernel; "
                                       f"legal: {', '.join(PARALLEL_LEGAL[kind])}")
        attrs = {"sym_name": StringAttr(name), "kind": StringAttr(kind), "parallel": StringAttr(par),
                 "threads": i64_attr(threads if par != "none" else 1), "staging": i64_attr(1),
                 "unroll": i64_attr(1), "mma": StringAttr(""), "register_tile": int_array([]),
                 "vector": i64_attr(w)}
        takes_split = kind == "gemm" or kind == "attention" and bool(decode)
        if self.split and takes_split:
            if par not in s.SPLIT_PARALLEL[kind] or not 1 <= self.split <= s.SPLIT_MAX[kind]:
                raise ScheduleIllegalError(f"kernel {name}: split={self.split} is illegal for a {kind} kernel with "
                                           f"parallel {par!r}; legal: 1..{s.SPLIT_MAX[kind]} with parallel "
                                           f"{' or '.join(s.SPLIT_PARALLEL[kind])}")
            attrs["split"] = i64_attr(self.split)
        elif self.split and self.pin_kinds:   # scoped to this kind, and it cannot take it
            raise ScheduleIllegalError(f"kernel {name}: split={self.split} applies to gemm kernels and decode "
                                       f"attention, not this {kind} kernel")
        if kind == "gemm":
            attrs.update(self._gemm(fop, isa, w, name, threads if par != "none" else 1))
        elif kind == "attention" and par == "bh*kv" or kind == "attention" and par == "none" and decode:
            if not decode:
                raise ScheduleIllegalError(f"kernel {name}: parallel='bh*kv' (the decode kernel) needs at most "
                                           f"{attention_decode.MAX_SQ} queries and {attention_decode.MAX_ROWS} rows "
                                           f"per kv head, static heads and head dims")
            attrs["sym_name"] = StringAttr(f"{name}_decode")
            attrs.update(self._attention_decode(isa, w, decode, _dtype(register_elem(fop))))
        elif kind in ("attention", "attention_bwd"):   # the backward runs the forward's blocks
            attrs.update(self._attention(isa, w, name, _dtype(register_elem(fop))))
        else:
            chunk = self.chunk or 4 * w
            bounds.check_chunk(chunk, w, isa.register_budget, name)
            attrs.update({"loops": str_array(["r", "c"]), "tiles": int_array([1, chunk]),
                          "order": str_array(["r", "c"])})
        region = fop.detach_region(fop.body)
        kop = s.KernelOp.create(operands=list(fop.inputs), result_types=[r.type for r in fop.outputs],
                                attributes=attrs, regions=[region])
        swap_op(fop, kop)

    # Flash attention's default register tile per vector register file, measured in one process,
    # interleaved (16 x 1024 x 64, f32, 2 threads, scores kept transposed).  32 registers (AVX-512,
    # Emerald Rapids): 4x4 tiles 21.9 ms, 4x2 24.3, 6x4 24.1; four B vectors cover a 64-wide head in
    # one tile.  16 registers (AVX2, Zen 3): 6x2 40.2 ms, 5x2 40.9, 4x2 43.2, 2x4 43.4, 3x3 44.9
    # (4x4 does not fit).  Query/key blocks from 64 to 256 tie within 5 %.
    ATTENTION_TILES = {32: (4, 4), 16: (6, 2)}
    ATTENTION_BLOCKS = (128, 128)

    def _attention_tile(self, budget: int) -> tuple[int, int]:
        """The measured default for the largest register file that fits ``budget``."""
        fits = [n for n in self.ATTENTION_TILES if n <= budget]
        return self.ATTENTION_TILES[max(fits)] if fits else (1, 1)

    def _attention(self, isa, w: int, name: str, acc: str = "f32") -> dict:
        """Flash attention on f32 (f64 for float64 tensors) register tiles: query blocks of about
        128 rows, key blocks of 128 columns."""
        sel = select_mma(isa, acc, out_dtype=acc)
        require_lowering(sel, "lower-tile-to-x86")
        rt = register_tile(isa, sel, prefer_tile=tuple(self.register_tile) if self.register_tile
                           else self._attention_tile(isa.register_budget))
        w = sel.record.vector_width or w
        qunit = math.lcm(rt.mr, rt.nr * w)   # query columns: whole S^T tiles and whole O tiles
        bq = self.tile_m or qunit * max(1, round(self.ATTENTION_BLOCKS[0] / qunit))
        bkv = self.tile_n or rt.mr * -(-self.ATTENTION_BLOCKS[1] // rt.mr)
        if bq % qunit or bkv % rt.mr:
            raise ScheduleIllegalError(f"kernel {name}: query block {bq} must be a multiple of lcm(MR, NR*W) = "
                                       f"{qunit} and key block {bkv} of MR={rt.mr}")
        return {"vector": i64_attr(w), "loops": str_array(["bh", "q", "kv"]), "tiles": int_array([1, bq, bkv]),
                "order": str_array(["bh", "q", "kv"]), "mma": StringAttr(sel.record.id),
                "register_tile": int_array([rt.mr, rt.nr]), "unroll": i64_attr(self.unroll)}

    # Decode attention: keys per block (its S^T scratch: BKV x rows, in L1) and the largest O row tile.
    DECODE_BLOCK = 256
    DECODE_MR = 8

    def _attention_decode(self, isa, w: int, rows: int, acc: str = "f32") -> dict:
        """Split-K decode attention: S^T tiles of MRS keys x the item's rows (whole vectors), O tiles
        of MRO rows x NRO vectors, each within the register file."""
        sel = select_mma(isa, acc, out_dtype=acc)
        require_lowering(sel, "lower-tile-to-x86")
        w = sel.record.vector_width or w
        budget = isa.register_budget
        nrs = -(-rows // w)
        mrs = max(1, min(self.DECODE_MR, (budget - nrs - 1) // nrs))
        nro = 2 if rows <= (budget - 3) // 2 else 1
        mro = max(1, min(rows, self.DECODE_MR, (budget - nro - 1) // nro))
        if self.register_tile:
            mrs, mro = self.register_tile
        bkv = self.tile_n or self.DECODE_BLOCK
        lo, hi = bounds.DECODE_BLOCK_RANGE
        if not lo <= bkv <= hi:
            raise ScheduleIllegalError(f"decode attention: key block tile-n={bkv} is out of range; legal: {lo}..{hi}")
        return {"vector": i64_attr(w), "loops": str_array(["bh", "kv", "g", "v"]),
                "tiles": int_array([1, bkv, rows, nro * w]), "order": str_array(["bh", "kv", "g", "v"]), "mma": StringAttr(sel.record.id),
                "register_tile": int_array([mrs, mro]), "unroll": i64_attr(1)}

    @staticmethod
    def _gemm_parallel(fop: g.FusionOp) -> str:
        """Batched GEMMs split (batch x rows) with private panels; others split rows and share B."""
        mm = next(o for o in fop.body.block.ops if isinstance(o, g.MatmulOp))
        if _few_rows_times_transposed(fop, mm):   # columns split, B read in place (kernels/gemm_dot.py)
            return "n"
        return "b*m" if mm.result.type.rank > 2 else "m"

    def _gemm(self, fop: g.FusionOp, isa, w: int, name: str, threads: int) -> dict:
        mm = next(o for o in fop.body.block.ops if isinstance(o, g.MatmulOp))
        dtype = _dtype(mm.lhs.type.element_type)
        if mm.rhs.type.element_type != mm.lhs.type.element_type:     # fp8 e4m3 x e5m2
            dtype = f"{dtype}x{_dtype(mm.rhs.type.element_type)}"
        try:
            sel = select_mma(isa, dtype, out_dtype="f64" if dtype == "f64" else "f32",
                             prefer_shape=tuple(self.mma_shape) if self.mma_shape else None)
            require_lowering(sel, "lower-tile-to-x86")
        except MmaSelectorError as e:
            e.message = f"kernel {name} ({mm.name}): {e.message}"
            raise e.with_location(None)
        rt = register_tile(isa, sel, prefer_tile=tuple(self.register_tile) if self.register_tile else None)
        rec = sel.record
        kp = rec.k
        esize = rec.packed_bytes
        w = rec.vector_width or w        # tile-register records (AMX) keep the arch's vectors for epilogues
        mrr, nrw = rt.mr * rec.m, rt.nr * rec.n   # rows and columns of one register tile
        caches = host.cache_sizes()
        # KC: the B micro-panel (KC x NR*W) is streamed from L2 for every row tile and its k-loop is
        # the inner loop; an eighth of L2 (at most 128 KiB) keeps it there with room for A and makes k-loops long
        # enough that C's partial-sum traffic (one read and write per KC) stays small.  Measured:
        # KC 512 beats 128 by 15% for f32 6x2 at 2048^3 on Zen 4 (1 MiB L2: 64 KiB panels); on
        # Emerald Rapids (2 MiB L2), 2 threads, interleaved: 6x3 at KC 340 ran 189 GFLOP/s, at KC
        # 512 198, and 6x4 at KC 256 199, at KC 512 215.
        # AMX (tile registers): accumulators leave the tiles through a scratch block at every k-block
        # boundary, so its B micro-panel gets 128 KiB and k-blocks up to 2048 (A blocks shrink to fit L2).
        # Measured interleaved at 2048^3 bf16 on Emerald Rapids: KC 2048 / MC 256 ran 1.2x KC 1024 / MC 512.
        # Zen 5 (1 MiB L2), interleaved: KC 680 (a 128 KiB panel) against 340 (an L2 / 16 one): 2 threads
        # 4096^3 294 ms against 316, 1 thread 2048^3 71 against 82, 777x513x1029 on 2 threads a tie; with an
        # epilogue (2048x1024x4096 + bias + gelu) KC 1024 ran 39.1 ms against 43.4.  128 KiB is what
        # Emerald Rapids' L2 / 16 already gave, so hosts with 2 MiB of L2 keep their blocking.
        # Vector records cap KC so that a packed row of A holds at most 4 KiB (f32 1024, bf16 2048):
        # Zen 4, vdpbf16ps 8x2 at 2048^3 on 2 threads, interleaved against torch: KC 2048 (one k-block,
        # no f32 partial sums round trip) 349 GFLOP/s against 334 at KC 1024; 4096^3 358 against 340;
        # 1024^3 a tie.
        panel, kmax = ((128 << 10), 2048) if rec.register_file else (min(caches["L2"] // 8, 128 << 10),
                                                                    4096 // esize)
        kc = self.tile_k or _round_down(min(max(panel // (nrw * esize), 256), kmax), kp * 4)
        mc = self.tile_m or _round_down(caches["L2"] // 2 // (kc * esize), mrr)
        # NC: the widest shared B block (KC x NC) gets an eighth of L3, and a wider B is packed in blocks
        # of half that (kernels/gemm.py).  A quarter was measured too much on a Zen 3 VM (32 MiB of L3
        # reported, shared with cores this process does not see), pairwise against numpy at KC 1024 /
        # MC 60, 1 thread: 2048^3 in blocks of 2048 columns 0.88, 1024 0.88, 768 0.94, 512 0.98, 256
        # 1.01; 4096^3 2048 0.85, 512 1.01.
        nc = self.tile_n or _round_down(min(caches["L3"] // 8 // (kc * esize), 4096), nrw)
        for label, v, mult in (("tile-m", mc, mrr), ("tile-n", nc, nrw), ("tile-k", kc, kp)):
            if v <= 0 or v % mult:
                raise ScheduleIllegalError(f"kernel {name}: {label}={v} must be a positive multiple of {mult} "
                                           f"(register tile {rt.mr}x{rt.nr} of {sel.record.id}, "
                                           f"{mrr}x{nrw} elements)")
        if not 1 <= self.unroll <= bounds.UNROLL_MAX:
            raise ScheduleIllegalError(f"kernel {name}: schedule unroll={self.unroll}; legal: 1..{bounds.UNROLL_MAX}")
        bounds.check_workspace(name, threads, mc, nc, kc, esize)
        return {"vector": i64_attr(w),
                "loops": str_array(["b", "m", "n", "k"]), "tiles": int_array([1, mc, nc, kc]),
                "order": str_array(["b", "n", "k", "m"]), "mma": StringAttr(sel.record.id),
                "register_tile": int_array([rt.mr, rt.nr]), "unroll": i64_attr(self.unroll)}


def _few_rows_times_transposed(fop: g.FusionOp, mm) -> bool:
    """A 2-D f32 ``A @ X.T``, A and X kernel inputs, of a symbolic or at most 16 rows, whose epilogue
    takes no [M, N] operand (kernels/gemm_dot.py: B read in place, columns split, up to 16 rows)."""
    from xdsl.ir import BlockArgument
    block = fop.body.block
    rt = mm.result.type
    m, n = rt.dims[-2:] if rt.rank == 2 else (None, None)
    rhs = mm.rhs.owner
    ok = (m is not None and (not isinstance(m, int) or m <= 16) and isinstance(mm.lhs, BlockArgument)
          and isinstance(rhs, g.TransposeOp) and isinstance(rhs.input, BlockArgument) and rhs.input.type.rank == 2
          and all(str(v.type.element_type) == "f32" for v in (mm.lhs, mm.rhs, mm.result)))
    return ok and all(a in (mm.lhs, rhs.input) or a.type.rank < 2 or a.type.dims[-2] == 1 for a in block.args)
