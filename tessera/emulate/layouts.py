"""Lane layouts of GPU matrix instructions, for the wave/warp emulator.

For each covered matrix instruction this module says which matrix element every lane's
register item holds: ``index[lane, item] = (row, col)``.  Items are numbered in register
order, flattened; when a 32-bit register packs two 16-bit values, register ``r`` holds
items ``2r`` (bits 15:0) and ``2r + 1`` (bits 31:16).  A is M x K, B is K x N, C and D
are M x N, so an A item's ``col`` is its k and a B item's ``row`` is its k.

This table is written from the vendors' documents, independently of the compiler's
lowering (nothing under ``tessera/passes`` or ``tessera/mma`` was read to write it), so
that a misreading in either place shows up as a disagreement.  Each builder below quotes
the rule it transcribes.

Sources
-------
[PTX]  NVIDIA, "Parallel Thread Execution ISA" (PTX ISA 8.x/9.x HTML; section numbers
       as in 8.7-8.8, earlier releases number them 9.7.13.4.x):
       - 9.7.14.5.7  "Matrix Fragments for mma.m16n8k8": A .f16/.bf16 (Figure 71),
         B .f16/.bf16 (Figure 74), C/D .f16x2/.f32 (Figure 77).
       - 9.7.14.5.8  "Matrix Fragments for mma.m16n8k16 with floating point type":
         A (Figure 79), B (Figure 81), C/D (Figure 83).
       - 9.7.14.5.14 "mma", Target ISA Notes: ".f16 ... with .m16n8k8 shape requires
         sm_75 or higher", ".f16 ... with .m16n8k16 shape requires sm_80 or higher",
         ".bf16 ... requires sm_80 or higher".
       - 9.7.14.5.15 "Warp-level matrix load instruction: ldmatrix": the thread/address
         table and Figure 104 ("ldmatrix fragment layout for one 8x8 Matrix with 16-bit
         elements").
[RDNA3-BLOG]  AMD GPUOpen, "How to accelerate AI applications on RDNA 3 using WMMA"
       (A. Vasishta), the ``wmma_matmul`` example kernel (a_frag / b_frag / c_frag loops).
[CALC] AMD Matrix Instruction Calculator, github.com/ROCm/amd_matrix_instruction_calculator
       (v1.01): README "--register-layout --D-matrix" example for RDNA3
       V_WMMA_F16_16X16X16_F16, and the ``InstCalcGfx11`` (wave32 and wave64) and
       ``InstCalcGfx9`` (MFMA) element-to-register/lane rules.  Later releases add
       ``--architecture rdna4``/``cdna3``; their output is quoted where used.
[RDNA4-BLOG]  AMD GPUOpen, "Using the Matrix Cores of AMD RDNA 4 architecture GPUs"
       (T. Harada, A. Yoshimura, 2025): example kernel with
       ``__builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12`` ("B, C, and D matrices are row
       major while A is transposed thus column major").
[CDNA-BLOG]  AMD ROCm Blogs, "Matrix Core Programming on AMD CDNA3 and CDNA4
       architecture" (A. Salykov, A. Luo, C. Huang, P. Sun, 2025): section 5.2
       (``__builtin_amdgcn_mfma_f32_16x16x16f16`` kernel) and the 32x32 C store loops of
       sections 5.1 and 5.3.
[GCNASM] github.com/carlushuang/gcnasm (C. Huang, AMD): ``matrix_core/matrix_core.cc``
       (v_mfma_f32_32x32x8f16 lane diagram and kernel) and ``matrix_core_gfx950/
       matrix_core.cc`` (v_mfma_f32_32x32x16_f16 kernel).
[LLVM-MC] LLVM ``test/MC/AMDGPU`` gfx11 WMMA tests: wave32 ``v_wmma_f32_16x16x16_f16
       v[16:23], v[0:7], v[8:15]``, wave64 ``v[16:19], v[0:7], v[8:15]`` (A/B are eight
       VGPRs in both wave sizes, C/D eight VGPRs in wave32 and four in wave64).

Confidence notes
----------------
- gfx11 wave64: from [CALC]'s ``InstCalcGfx11`` rules (input copies in lanes i, i+16,
  i+32, i+48; output lane ``16*(i % 4) + j``, register ``i // 4``) and the register counts
  of [LLVM-MC]; no published lane table for wave64 was found.
- gfx12: the RDNA4 ISA guide's own WMMA tables could not be read here; the layout is the
  one [RDNA4-BLOG]'s example kernel uses (as quoted in public repositories) and agrees with
  [CALC] ``--architecture rdna4`` output as quoted publicly (``D[m][n] = v{m%8}{n +
  16*(m/8)}``).
- gfx950 32x32x16: from [GCNASM]'s gfx950 kernel (eight contiguous k per lane, lanes
  32-63 holding k 8-15), which is the 32x32x8 pattern with twice the k per lane.
- ldmatrix ``.trans``: [PTX] says only that the matrix "is loaded in column-major format";
  the table reads that as thread ``t`` receiving, in half ``h``, row ``2*(t%4)+h`` of the
  supplied rows at column ``t//4`` (the non-transposed fragment of the transpose).
- bf16 MFMA on gfx90a is the ``_1k`` encoding (v_mfma_f32_32x32x8bf16_1k,
  v_mfma_f32_16x16x16bf16_1k); the older non-``_1k`` bf16 MFMAs have other shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import ml_dtypes
import numpy as np

__all__ = [
    "OperandLayout",
    "InstrLayout",
    "LdmatrixLayout",
    "instr_layout",
    "ldmatrix_layout",
]


@dataclass(frozen=True)
class OperandLayout:
    rows: int            # A: M x K, B: K x N, C/D: M x N
    cols: int
    lanes: int
    items: int           # elements each lane holds, in register order (flattened; for packed
                         # registers, register r holds items [r*p, r*p+p) with the LOW half/bits first)
    index: np.ndarray    # int64 [lanes, items, 2]: (row, col) of the element lane l item e holds
    replicated: bool     # True when some matrix element is held by more than one lane


@dataclass(frozen=True)
class InstrLayout:
    family: str          # "wmma" | "mfma" | "mma_sync" | "wgmma"
    shape: tuple[int, int, int]   # (M, N, K)
    lanes: int           # 32 or 64
    a: OperandLayout
    b: OperandLayout
    c: OperandLayout     # accumulator C and result D have the same layout
    source: str          # citation: document, section / figure / table


@dataclass(frozen=True)
class LdmatrixLayout:
    num: int             # 1, 2 or 4 8x8 matrices of 16-bit elements
    trans: bool
    addr: np.ndarray     # int64 [32, 2]: (matrix q, row r) whose 16-byte row address lane l
                         # supplies; (-1, -1) if the lane's address is unused
    result: np.ndarray   # int64 [32, num, 2, 3]: lane l, destination register j, half h (low
                         # first) -> (matrix, row, col) of the element it receives; "row" is the
                         # row whose address was supplied, col = 0..7 within it


# --------------------------------------------------------------------------- builders

def _operand(rows: int, cols: int, lanes: int, items: int,
             at: Callable[[int, int], tuple[int, int]], replicated: bool) -> OperandLayout:
    """Tabulate ``at(lane, item) -> (row, col)``; check the declared replication."""
    index = np.empty((lanes, items, 2), dtype=np.int64)
    for lane in range(lanes):
        for item in range(items):
            index[lane, item] = at(lane, item)
    held = {(int(r), int(c)) for r, c in index.reshape(-1, 2)}
    if held != {(r, c) for r in range(rows) for c in range(cols)}:
        raise AssertionError("layout table bug: operand does not cover its matrix exactly")
    if replicated != (lanes * items > len(held)):
        raise AssertionError("layout table bug: replicated flag disagrees with the index")
    index.setflags(write=False)
    return OperandLayout(rows, cols, lanes, items, index, replicated)


@lru_cache(maxsize=None)
def _wmma_gfx11(lanes: int) -> InstrLayout:
    # [RDNA3-BLOG] wmma_matmul: ``lane = lIdx % 16`` ("lane is (0-31) mod 16 instead of 0-31
    # due to matrix replication in RDNA 3"); ``a_frag[ele] = a[16 * lane + ele]`` with a
    # row-major 16x16 A, so item ele of lane l is A[l % 16][ele];
    # ``b_frag[ele] = b[16*ele + lane]``: B[ele][l % 16].
    # [CALC] InstCalcGfx11: A[i][k] is register slot k in lanes i, i+16 (wave32) and also
    # i+32, i+48 (wave64): the same 16 items in every group of 16 lanes.
    a = _operand(16, 16, lanes, 16, lambda l, e: (l % 16, e), replicated=True)
    b = _operand(16, 16, lanes, 16, lambda l, e: (e, l % 16), replicated=True)
    if lanes == 32:
        # [RDNA3-BLOG]: ``r = ele * 2 + (lIdx / 16); c[16 * r + lane] = c_frag[ele*2]``
        # (f16 result, low halves); [CALC] InstCalcGfx11 for 32-bit results: register
        # i // 2, lane 16 * (i % 2) + j.  So f32 register r of lane l is C[2r + l//16][l%16].
        c = _operand(16, 16, 32, 8, lambda l, r: (2 * r + l // 16, l % 16), replicated=False)
    else:
        # [CALC] InstCalcGfx11, wave64: rows_per_reg_slot = 4, register i // 4,
        # lane (16 * i + j) % 64 = 16 * (i % 4) + j; [LLVM-MC] four C VGPRs in wave64.
        c = _operand(16, 16, 64, 4, lambda l, r: (4 * r + l // 16, l % 16), replicated=False)
    return InstrLayout(
        "wmma", (16, 16, 16), lanes, a, b, c,
        "AMD GPUOpen 'How to accelerate AI applications on RDNA 3 using WMMA' (wmma_matmul "
        "kernel); AMD Matrix Instruction Calculator v1.01 (RDNA3 --register-layout example; "
        "InstCalcGfx11 rules, wave32/wave64); LLVM MC gfx11 wmma tests (register counts)",
    )


@lru_cache(maxsize=None)
def _wmma_gfx12() -> InstrLayout:
    # [RDNA4-BLOG] example kernel: ``col = lane % 16; row_base = (lane / 16) * 8;
    # a_frag[j] = A[(row_base + j) * 16 + col]`` with A column major -> A[m=col][k=row_base+j];
    # ``b_frag[j] = B[(row_base + j) * 16 + col]`` with B row major -> B[k=row_base+j][n=col];
    # ``D[(row_base + j) * 16 + col] = c_frag[j]`` with D row major -> D[row_base+j][col].
    # [CALC] --architecture rdna4 (as quoted): D[m][n] = v{m%8}{n + 16*(m/8)}.
    a = _operand(16, 16, 32, 8, lambda l, e: (l % 16, 8 * (l // 16) + e), replicated=False)
    b = _operand(16, 16, 32, 8, lambda l, e: (8 * (l // 16) + e, l % 16), replicated=False)
    c = _operand(16, 16, 32, 8, lambda l, r: (8 * (l // 16) + r, l % 16), replicated=False)
    return InstrLayout(
        "wmma", (16, 16, 16), 32, a, b, c,
        "AMD GPUOpen 'Using the Matrix Cores of AMD RDNA 4 architecture GPUs' (example "
        "kernel, __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12); AMD Matrix Instruction "
        "Calculator --architecture rdna4 (D[m][n] = v{m%8}{n+16*(m/8)})",
    )


def _mfma_c32(l: int, r: int) -> tuple[int, int]:
    # [GCNASM] 32x32x8: ``col_id_c = threadIdx.x % 32; row_id_c = threadIdx.x / 32 * 4;
    # row_offset = (i % 4) + (i / 4 * 8)``; [CDNA-BLOG] 5.1/5.3: C[tid%32 + (tid/32)*4*32 +
    # 32*j + i*32*8] = c_reg[i*4 + j]; [CALC] InstCalcGfx9: register 4*floor(i/8) + (i%4),
    # lane 32*floor(i/4)%64 + j.
    return 8 * (r // 4) + 4 * (l // 32) + r % 4, l % 32


@lru_cache(maxsize=None)
def _mfma(shape: tuple[int, int, int]) -> InstrLayout:
    m, n, k = shape
    if shape == (32, 32, 8):
        # [GCNASM] matrix_core.cc: ``offset_a = (threadIdx.x / 32 * 4) + (threadIdx.x % 32 *
        # stride_a)`` loading fp16x4: A[l % 32][4*(l // 32) + e]; B (stored N x K) likewise:
        # B[4*(l // 32) + e][l % 32].  [CALC] InstCalcGfx9: lane = 32*floor(k/4) + i,
        # register slot k % 4.
        kl = 4
        src = ("carlushuang/gcnasm matrix_core/matrix_core.cc (32x32x8f16 lane diagram and "
               "kernel); AMD Matrix Instruction Calculator v1.01 InstCalcGfx9 rules; ROCm "
               "blog 'Matrix Core Programming on AMD CDNA3 and CDNA4' 5.1 (32x32 C stores)")
    elif shape == (32, 32, 16):
        # [GCNASM] matrix_core_gfx950/matrix_core.cc: ``offset_a = (threadIdx.x / 32 * 8) +
        # (threadIdx.x % 32 * stride_a)`` loading fp16x8: A[l % 32][8*(l // 32) + e].
        kl = 8
        src = ("carlushuang/gcnasm matrix_core_gfx950/matrix_core.cc "
               "(v_mfma_f32_32x32x16_f16 kernel); ROCm blog 'Matrix Core Programming on AMD "
               "CDNA3 and CDNA4' 5.3 (32x32 C stores)")
    else:  # (16, 16, 16)
        # [CDNA-BLOG] 5.2: ``a_reg = *(fp16x4_t*)(A + 4 * (threadIdx.x / 16) + 16 *
        # (threadIdx.x % 16))``: A[l % 16][4*(l // 16) + e];
        # ``b_reg[i] = *(B + i * 16 + threadIdx.x % 16 + (threadIdx.x / 16) * 64)``:
        # B[4*(l // 16) + i][l % 16]; ``*(C + i * 16 + threadIdx.x % 16 + (threadIdx.x / 16)
        # * 64) = c_reg[i]``: C[4*(l // 16) + i][l % 16].
        kl = 4
        src = ("ROCm blog 'Matrix Core Programming on AMD CDNA3 and CDNA4 architecture' 5.2 "
               "(__builtin_amdgcn_mfma_f32_16x16x16f16 kernel); AMD Matrix Instruction "
               "Calculator v1.01 InstCalcGfx9 rules")
    a = _operand(m, k, 64, kl, lambda l, e: (l % m, kl * (l // m) + e), replicated=False)
    b = _operand(k, n, 64, kl, lambda l, e: (kl * (l // n) + e, l % n), replicated=False)
    if m == 32:
        c = _operand(32, 32, 64, 16, _mfma_c32, replicated=False)
    else:
        c = _operand(16, 16, 64, 4, lambda l, r: (4 * (l // 16) + r, l % 16), replicated=False)
    return InstrLayout("mfma", shape, 64, a, b, c, src)


@lru_cache(maxsize=None)
def _mma_sync(shape: tuple[int, int, int]) -> InstrLayout:
    # [PTX]: groupID = %laneid >> 2, threadID_in_group = %laneid % 4.
    def g(l: int) -> int:
        return l >> 2

    def t(l: int) -> int:
        return l % 4

    # C/D (both shapes, Figures 77 and 83): row = groupID for c0, c1 and groupID + 8 for
    # c2, c3; col = threadID_in_group * 2 + (i & 0x1).
    c = _operand(16, 8, 32, 4, lambda l, i: (g(l) + 8 * (i // 2), 2 * t(l) + (i & 1)),
                 replicated=False)
    if shape == (16, 8, 16):
        # A, Figure 79: row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8
        # otherwise; col = threadID_in_group * 2 + (i & 0x1) for i < 4, + 8 for i >= 4.
        a = _operand(16, 16, 32, 8,
                     lambda l, i: (g(l) + 8 * ((i // 2) % 2), 2 * t(l) + (i & 1) + 8 * (i // 4)),
                     replicated=False)
        # B, Figure 81: row = threadID_in_group * 2 + (i & 0x1) for bi where i < 2, + 8 for
        # i >= 2; col = groupID.
        b = _operand(16, 8, 32, 4, lambda l, i: (2 * t(l) + (i & 1) + 8 * (i // 2), g(l)),
                     replicated=False)
        src = ("NVIDIA PTX ISA 9.7.14.5.8 'Matrix Fragments for mma.m16n8k16 with floating "
               "point type', Figures 79 (A), 81 (B), 83 (C/D)")
    else:  # (16, 8, 8)
        # A, Figure 71: row = groupID for a0 and a1, groupID + 8 for a2 and a3;
        # col = threadID_in_group * 2 + (i & 0x1).
        a = _operand(16, 8, 32, 4, lambda l, i: (g(l) + 8 * (i // 2), 2 * t(l) + (i & 1)),
                     replicated=False)
        # B, Figure 74: row = (threadID_in_group * 2) + i for bi where i = {0, 1};
        # col = groupID.
        b = _operand(8, 8, 32, 2, lambda l, i: (2 * t(l) + i, g(l)), replicated=False)
        src = ("NVIDIA PTX ISA 9.7.14.5.7 'Matrix Fragments for mma.m16n8k8', Figures 71 (A), "
               "74 (B), 77 (C/D)")
    return InstrLayout("mma_sync", shape, 32, a, b, c, src)


@lru_cache(maxsize=None)
def _mma_sync_tf32(shape: tuple[int, int, int]) -> InstrLayout:
    # [PTX] "Matrix Fragments for mma.m16n8k8" and "mma.m16n8k4", .tf32 (one element per .b32
    # register); groupID = %laneid >> 2, threadID_in_group = %laneid % 4.  C/D as for f16.
    def g(l: int) -> int:
        return l >> 2

    def t(l: int) -> int:
        return l % 4

    c = _operand(16, 8, 32, 4, lambda l, i: (g(l) + 8 * (i // 2), 2 * t(l) + (i & 1)), replicated=False)
    if shape == (16, 8, 8):
        # A (.tf32): row = groupID for a0 and a2, groupID + 8 for a1 and a3;
        # col = threadID_in_group for a0 and a1, threadID_in_group + 4 for a2 and a3.
        a = _operand(16, 8, 32, 4, lambda l, i: (g(l) + (8 if i in (1, 3) else 0), t(l) + (4 if i >= 2 else 0)),
                     replicated=False)
        # B (.tf32): row = threadID_in_group for b0, threadID_in_group + 4 for b1; col = groupID.
        b = _operand(8, 8, 32, 2, lambda l, i: (t(l) + (4 if i == 1 else 0), g(l)), replicated=False)
        src = "NVIDIA PTX ISA 'Matrix Fragments for mma.m16n8k8' (.tf32 A and B)"
    else:  # (16, 8, 4)
        # A (.tf32): row = groupID for a0, groupID + 8 for a1; col = threadID_in_group.
        a = _operand(16, 4, 32, 2, lambda l, i: (g(l) + (8 if i == 1 else 0), t(l)), replicated=False)
        # B (.tf32): row = threadID_in_group; col = groupID.
        b = _operand(4, 8, 32, 1, lambda l, i: (t(l), g(l)), replicated=False)
        src = "NVIDIA PTX ISA 'Matrix Fragments for mma.m16n8k4' (.tf32 A and B)"
    return InstrLayout("mma_sync", shape, 32, a, b, c, src)


def tf32_rna(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest tf32 (10-bit mantissa), ties away from zero, as ``cvt.rna.tf32.f32``
    (the result is a float32 whose low 13 mantissa bits are zero; NaN and infinity kept)."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).astype(np.uint32)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


def _wgmma(n: int, k: int = 16) -> InstrLayout:
    # [PTX] 9.7.15.5.1 "Register Fragments and Shared Memory Matrix Layouts" of wgmma,
    # accumulator D for .m64nNk16 with .f32: the warpgroup's four warps each hold 16 rows
    # (warp w: rows 16w..16w+15); within a warp the m16n8 pattern repeats every 8 columns:
    # row = 16*w + groupID + 8*((i/2) % 2), col = 8*(i/4) + 2*threadID_in_group + (i % 2),
    # for d_i, i < N/2 (groupID = laneid / 4, threadID_in_group = laneid % 4).
    def d(t: int, i: int) -> tuple[int, int]:
        w, l = t // 32, t % 32
        return 16 * w + (l >> 2) + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (l % 4) + (i & 1)
    c = _operand(64, n, 128, n // 2, d, replicated=False)
    # A and B are read from shared memory through matrix descriptors (emulate/smem_desc.py):
    # no register items
    # no register items.  .m64nNk32 (e4m3/e5m2) has the same f32 D fragment (it depends on N only).
    none = OperandLayout(64, k, 128, 0, np.zeros((128, 0, 2), np.int64), False)
    return InstrLayout("wgmma", (64, n, k), 128, none, OperandLayout(k, n, 128, 0, np.zeros((128, 0, 2), np.int64),
                                                                      False), c,
                       f"NVIDIA PTX ISA 9.7.15.5.1 wgmma .m64nNk{k} register fragment, accumulator D (f32)")


def _mma_sync_k32() -> InstrLayout:
    # [PTX] 9.7.14.5.10 "Matrix Fragments for mma.m16n8k32" (.s8/.u8/.e4m3/.e5m2): A is four
    # .b32 registers of 4 elements: row = groupID for a_i, 0 <= i < 4 or 8 <= i < 12, groupID + 8
    # otherwise; col = threadID_in_group * 4 + (i & 0x3) for i < 8, + 16 for i >= 8.  B is two
    # .b32 registers of 4: row = threadID_in_group * 4 + (i & 0x3) for i < 4, + 16 for i >= 4;
    # col = groupID.  C/D (f32) as for m16n8k16.
    def g(l: int) -> int:
        return l >> 2

    def t(l: int) -> int:
        return l % 4
    c = _operand(16, 8, 32, 4, lambda l, i: (g(l) + 8 * (i // 2), 2 * t(l) + (i & 1)), replicated=False)
    a = _operand(16, 32, 32, 16, lambda l, i: (g(l) + 8 * ((i // 4) % 2), 4 * t(l) + (i & 3) + 16 * (i // 8)),
                 replicated=False)
    b = _operand(32, 8, 32, 8, lambda l, i: (4 * t(l) + (i & 3) + 16 * (i // 4), g(l)), replicated=False)
    return InstrLayout("mma_sync", (16, 8, 32), 32, a, b, c,
                       "NVIDIA PTX ISA 9.7.14.5.10 'Matrix Fragments for mma.m16n8k32' (8-bit A/B, f32 C/D)")


# --------------------------------------------------------------------------- the table

_GFX11 = ("gfx1100", "gfx1101", "gfx1102", "gfx1151")
_GFX12 = ("gfx1200", "gfx1201")
_MFMA = ("gfx90a", "gfx942", "gfx950")
_SM80 = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120")
_F16_BF16 = ("f16", "bf16")
_FP8 = ("f8e4m3fn", "f8e5m2")


@dataclass(frozen=True)
class _Entry:
    family: str
    shape: tuple[int, int, int]
    archs: tuple[str, ...]
    lanes: int
    dtypes: tuple[str, ...]
    build: Callable[[], InstrLayout]


_TABLE: tuple[_Entry, ...] = (
    _Entry("wmma", (16, 16, 16), _GFX11, 32, _F16_BF16, lambda: _wmma_gfx11(32)),
    _Entry("wmma", (16, 16, 16), _GFX11, 64, _F16_BF16, lambda: _wmma_gfx11(64)),
    _Entry("wmma", (16, 16, 16), _GFX12, 32, _F16_BF16, _wmma_gfx12),
    _Entry("mfma", (32, 32, 8), _MFMA, 64, _F16_BF16, lambda: _mfma((32, 32, 8))),
    _Entry("mfma", (16, 16, 16), _MFMA, 64, _F16_BF16, lambda: _mfma((16, 16, 16))),
    _Entry("mfma", (32, 32, 16), ("gfx950",), 64, _F16_BF16, lambda: _mfma((32, 32, 16))),
    _Entry("mma_sync", (16, 8, 16), _SM80, 32, _F16_BF16, lambda: _mma_sync((16, 8, 16))),
    _Entry("mma_sync", (16, 8, 8), _SM80, 32, _F16_BF16, lambda: _mma_sync((16, 8, 8))),
    _Entry("mma_sync", (16, 8, 8), _SM80, 32, ("f32",), lambda: _mma_sync_tf32((16, 8, 8))),
    _Entry("mma_sync", (16, 8, 4), _SM80, 32, ("f32",), lambda: _mma_sync_tf32((16, 8, 4))),
    # [PTX] mma Target ISA Notes: only .f16 with .m16n8k8 is available on sm_75
    # (.m16n8k16 .f16 and all .bf16 forms require sm_80).
    _Entry("mma_sync", (16, 8, 8), ("sm_75",), 32, ("f16",), lambda: _mma_sync((16, 8, 8))),
    # wgmma m64nNk16 (N = 8, 16, ..., 256), sm_90a only, a warpgroup of 128 threads
    *(_Entry("wgmma", (64, n, 16), ("sm_90a",), 128, _F16_BF16, lambda n=n: _wgmma(n)) for n in range(8, 257, 8)),
    # wgmma m64nNk32 e4m3/e5m2 (A and B K-major from shared memory), the same D fragment
    *(_Entry("wgmma", (64, n, 32), ("sm_90a",), 128, _FP8, lambda n=n: _wgmma(n, 32)) for n in range(8, 257, 8)),
    # mma.sync m16n8k32 e4m3/e5m2 -> f32: sm_89 and later
    _Entry("mma_sync", (16, 8, 32), ("sm_89", "sm_90", "sm_90a", "sm_120"), 32, _FP8, _mma_sync_k32),
)


def _covered() -> str:
    """One line per table entry: what ``instr_layout`` has a layout for."""
    lines = []
    for e in _TABLE:
        m, n, k = e.shape
        lines.append(f"{e.family} {m}x{n}x{k} lanes={e.lanes} dtype={'/'.join(e.dtypes)} "
                     f"arch={','.join(e.archs)}")
    return "; ".join(lines)


def instr_layout(family: str, shape: tuple[int, int, int], *, arch: str, lanes: int,
                 dtype: str) -> InstrLayout:
    """The lane layout of one matrix instruction.

    ``shape`` is (M, N, K); ``dtype`` is the A/B element type (the accumulator is f32);
    ``arch`` may carry a target-ID feature suffix (``gfx942:sramecc+:xnack-``).
    Raise KeyError(message naming what is covered) when the table has no entry.
    """
    key_shape = tuple(int(x) for x in shape)
    base_arch = str(arch).split(":", 1)[0].lower()
    for e in _TABLE:
        if (e.family == family and e.shape == key_shape and base_arch in e.archs
                and e.lanes == lanes and dtype in e.dtypes):
            return e.build()
    raise KeyError(
        f"no lane layout for family={family!r} shape={key_shape} arch={arch!r} "
        f"lanes={lanes} dtype={dtype!r}; covered: {_covered()}")


@lru_cache(maxsize=None)
def _ldmatrix(num: int, trans: bool) -> LdmatrixLayout:
    # [PTX] ldmatrix: "Addresses addr0-addr7 correspond to the rows of the first matrix,
    # addresses addr8-addr15 correspond to the rows of the second matrix, and so on";
    # .x1 uses threads 0-7, .x2 threads 0-15, .x4 threads 0-31.
    addr = np.full((32, 2), -1, dtype=np.int64)
    for lane in range(8 * num):
        addr[lane] = (lane // 8, lane % 8)
    # Figure 104: "A group of four threads loads an entire row of the matrix": thread t gets
    # row t // 4, columns 2*(t % 4) and 2*(t % 4) + 1 (low half first).  The j-th destination
    # register holds the fragment of the j-th matrix.  With .trans the matrix "is loaded in
    # column-major format": thread t gets column t // 4 of rows 2*(t % 4) and 2*(t % 4) + 1.
    result = np.empty((32, num, 2, 3), dtype=np.int64)
    for lane in range(32):
        for j in range(num):
            for h in range(2):
                if trans:
                    result[lane, j, h] = (j, 2 * (lane % 4) + h, lane // 4)
                else:
                    result[lane, j, h] = (j, lane // 4, 2 * (lane % 4) + h)
    addr.setflags(write=False)
    result.setflags(write=False)
    return LdmatrixLayout(num, trans, addr, result)


def ldmatrix_layout(num: int, trans: bool) -> LdmatrixLayout:
    """``ldmatrix.sync.aligned.m8n8.x{num}{.trans}.b16``; KeyError for other forms."""
    if num not in (1, 2, 4) or not isinstance(trans, (bool, np.bool_)):
        raise KeyError(f"no ldmatrix layout for num={num!r} trans={trans!r}; covered: "
                       ".m8n8 .b16 with num in (1, 2, 4), trans in (False, True)")
    return _ldmatrix(int(num), bool(trans))


FP8_FORMATS = {"f8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "f8e5m2": np.dtype(ml_dtypes.float8_e5m2)}


def as_format(raw: np.ndarray, name: str) -> np.ndarray:
    """Operand bytes read as the instruction's declared type, not the buffer's or register's: an
    fp8 instruction decodes its bytes as its .atype / .btype says (a wrong type in the emitted
    instruction then shows as a wrong answer).  Other types pass through."""
    want = FP8_FORMATS.get(name)
    if want is None:
        return raw
    if raw.dtype.itemsize != 1:
        raise ValueError(f"an {name} instruction operand holds {raw.dtype} values, not bytes")
    return raw.view(want)
