"""The emulator's lane-layout table against the vendors' documents.

The literal examples below are transcribed from the documents' figures, tables and
example code (the expression quoted next to each example is the document's, evaluated by
hand at that lane and item), never from the formulas in ``tessera.emulate.layouts``.
Source tags ([PTX], [RDNA3-BLOG], ...) are spelled out in that module's docstring.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tessera.emulate.layouts import (
    InstrLayout,
    OperandLayout,
    instr_layout,
    ldmatrix_layout,
)

# --------------------------------------------------------------------------- checkers


def check_examples(op: OperandLayout, examples) -> None:
    """Each (lane, item, (row, col)) from a document must be what the table says."""
    for lane, item, want in examples:
        got = tuple(int(x) for x in op.index[lane, item])
        assert got == want, f"lane {lane} item {item}: table says {got}, document says {want}"


def check_ldmatrix_examples(lay, addr_examples=(), result_examples=()) -> None:
    for lane, want in addr_examples:
        got = tuple(int(x) for x in lay.addr[lane])
        assert got == want, f"addr lane {lane}: table says {got}, document says {want}"
    for lane, reg, half, want in result_examples:
        got = tuple(int(x) for x in lay.result[lane, reg, half])
        assert got == want, (f"result lane {lane} reg {reg} half {half}: table says {got}, "
                             f"document says {want}")


def check_operand_structure(op: OperandLayout, rows: int, cols: int, lanes: int,
                            items: int) -> None:
    assert (op.rows, op.cols, op.lanes, op.items) == (rows, cols, lanes, items)
    assert op.index.shape == (lanes, items, 2) and op.index.dtype == np.int64
    assert op.index[..., 0].min() >= 0 and op.index[..., 0].max() < rows
    assert op.index[..., 1].min() >= 0 and op.index[..., 1].max() < cols
    flat = [tuple(map(int, rc)) for rc in op.index.reshape(-1, 2)]
    everything = {(r, c) for r in range(rows) for c in range(cols)}
    assert set(flat) == everything, "some matrix element is held by no lane"
    if op.replicated:
        assert len(flat) > len(everything)
    else:
        assert len(flat) == len(everything), "not a bijection onto the matrix"


def check_half_wave_replication(op: OperandLayout) -> None:
    """gfx11 WMMA A/B: every group of 16 lanes holds what lanes 0-15 hold."""
    for start in range(16, op.lanes, 16):
        assert np.array_equal(op.index[start:start + 16], op.index[0:16]), (
            f"lanes {start}-{start + 15} differ from lanes 0-15")


# --------------------------------------------------------------------------- examples
# gfx11 (RDNA3) wave32, v_wmma_f32_16x16x16_{f16,bf16}.

# [RDNA3-BLOG] wmma_matmul: ``lane = lIdx % 16; a_frag[ele] = a[16 * lane + ele]`` (A row major).
GFX11_W32_A = [
    (0, 0, (0, 0)),       # a[0]
    (5, 9, (5, 9)),       # a[16*5 + 9] = a[89]
    (21, 3, (5, 3)),      # upper half-wave: lane = 21 % 16 = 5 -> a[83]
    (31, 15, (15, 15)),   # lane = 15 -> a[255]
    (16, 1, (0, 1)),      # lane = 0 -> a[1]
]
# [RDNA3-BLOG]: ``b_frag[ele] = b[16*ele + lane]`` (B row major).
GFX11_W32_B = [
    (3, 10, (10, 3)),     # b[163]
    (19, 10, (10, 3)),    # upper half-wave, lane = 3 -> b[163]
    (31, 0, (0, 15)),     # b[15]
    (8, 15, (15, 8)),     # b[248]
]
# [RDNA3-BLOG]: ``r = ele * 2 + (lIdx / 16); c[16 * r + lane] = c_frag[ele*2]``
# (register ele of the result), and [CALC] README, "--register-layout --D-matrix" table for
# RDNA3 V_WMMA_F16_16X16X16_F16 (cell D[row][col] = v<reg>{<lane>}).
GFX11_W32_C = [
    (0, 0, (0, 0)),       # blog: lIdx 0, ele 0 -> r 0 -> c[0]
    (17, 3, (7, 1)),      # blog: lIdx 17, ele 3 -> r 7, lane 1 -> c[113]
    (6, 5, (10, 6)),      # blog: lIdx 6, ele 5 -> r 10 -> c[166]
    (0, 1, (2, 0)),       # calculator table: D[2][0] = v1{0}
    (16, 0, (1, 0)),      # calculator table: D[1][0] = v0{16}
    (19, 5, (11, 3)),     # calculator table: D[11][3] = v5{19}
    (31, 7, (15, 15)),    # calculator table: D[15][15] = v7{31}
]

# gfx11 wave64: [CALC] InstCalcGfx11 (wave_width 64): A[i][k] is slot k in lanes i, i+16,
# i+32, i+48 (B[k][j] likewise in lanes j, j+16, ...); D[i][j] is register
# int(i / (64/16)), lane (16 * (i % 64) + j) % 64.  No published wave64 table was found.
GFX11_W64_A = [
    (51, 7, (3, 7)),      # A[3][7] -> lanes 3, 19, 35, 51, slot 7
    (47, 0, (15, 0)),     # A[15][0] -> lanes 15, 31, 47, 63, slot 0
    (25, 12, (9, 12)),    # A[9][12] -> lanes 9, 25, 41, 57, slot 12
    (32, 0, (0, 0)),      # A[0][0] -> lanes 0, 16, 32, 48
]
GFX11_W64_B = [
    (41, 12, (12, 9)),    # B[12][9] -> lanes 9, 25, 41, 57, slot 12
    (48, 0, (0, 0)),      # B[0][0] -> lanes 0, 16, 32, 48
    (63, 15, (15, 15)),   # B[15][15] -> lanes 15, 31, 47, 63
    (20, 2, (2, 4)),      # B[2][4] -> lanes 4, 20, 36, 52
]
GFX11_W64_C = [
    (18, 1, (5, 2)),      # D[5][2]: register 5 // 4 = 1, lane (80 + 2) % 64 = 18
    (63, 3, (15, 15)),    # D[15][15]: register 3, lane 255 % 64 = 63
    (39, 0, (2, 7)),      # D[2][7]: register 0, lane 32 + 7 = 39
    (0, 3, (12, 0)),      # D[12][0]: register 3, lane 192 % 64 = 0
]

# gfx12 (RDNA4) wave32, v_wmma_f32_16x16x16_{f16,bf16}: [RDNA4-BLOG] example kernel,
# ``col = lane % 16; row_base = (lane / 16) * 8;``
# ``a_frag[j] = A[(row_base + j) * 16 + col]`` (A column major: A[m=col][k=row_base+j]).
GFX12_A = [
    (0, 0, (0, 0)),       # A[0]
    (20, 3, (4, 11)),     # col 4, row_base 8: A[11*16 + 4] -> m 4, k 11
    (15, 7, (15, 7)),     # A[7*16 + 15]
    (31, 5, (15, 13)),    # A[13*16 + 15]
]
# ``b_frag[j] = B[(row_base + j) * 16 + col]`` (B row major: B[k=row_base+j][n=col]).
GFX12_B = [
    (20, 3, (11, 4)),
    (2, 6, (6, 2)),
    (31, 7, (15, 15)),
    (16, 0, (8, 0)),
]
# ``D[(row_base + j) * 16 + col] = c_frag[j]``; [CALC] rdna4 (quoted): D[m][n] = v{m%8}{n+16*(m/8)}.
GFX12_C = [
    (20, 3, (11, 4)),     # also the calculator's D[11][4] = v3{20}
    (0, 7, (7, 0)),
    (31, 7, (15, 15)),
    (9, 2, (2, 9)),
]

# MFMA v_mfma_f32_16x16x16{f16,bf16} (wave64): [CDNA-BLOG] section 5.2 kernel.
# ``a_reg = *(fp16x4_t*)(A + 4 * (threadIdx.x / 16) + 16 * (threadIdx.x % 16))`` (A row major).
MFMA16_A = [
    (0, 0, (0, 0)),       # A[0]
    (17, 2, (1, 6)),      # A[4 + 16 + 2] = A[22]
    (63, 3, (15, 15)),    # A[12 + 240 + 3] = A[255]
    (40, 1, (8, 9)),      # A[8 + 128 + 1] = A[137]
]
# ``b_reg[i] = *(B + i * 16 + threadIdx.x % 16 + (threadIdx.x / 16) * 64)``.
MFMA16_B = [
    (33, 2, (10, 1)),     # B[32 + 1 + 128] = B[161]
    (63, 3, (15, 15)),    # B[48 + 15 + 192] = B[255]
    (5, 0, (0, 5)),       # B[5]
    (22, 1, (5, 6)),      # B[16 + 6 + 64] = B[86]
]
# ``*(C + i * 16 + threadIdx.x % 16 + (threadIdx.x / 16) * 64) = c_reg[i]``.
MFMA16_C = [
    (50, 1, (13, 2)),     # C[16 + 2 + 192] = C[210]
    (15, 3, (3, 15)),     # C[48 + 15] = C[63]
    (16, 0, (4, 0)),      # C[64]
    (63, 2, (14, 15)),    # C[32 + 15 + 192] = C[239]
]

# MFMA v_mfma_f32_32x32x8{f16,bf16}: [GCNASM] matrix_core/matrix_core.cc, lane diagram
# ("Matrix A: L0~31 k0..k3 in v0/v1, L32~63 k4..k7") and kernel:
# ``offset_a = (threadIdx.x / 32 * 4) + (threadIdx.x % 32 * stride_a)``, four halves loaded.
MFMA32x8_A = [
    (0, 0, (0, 0)),
    (37, 2, (5, 6)),      # row 37 % 32 = 5, k 4 + 2
    (63, 3, (31, 7)),
    (10, 1, (10, 1)),
]
# ``offset_b = (threadIdx.x / 32 * 4) + (threadIdx.x % 32 * stride_b)`` (B stored N x K).
MFMA32x8_B = [
    (40, 3, (7, 8)),      # n 8, k 4 + 3
    (31, 0, (0, 31)),
    (32, 0, (4, 0)),
    (1, 2, (2, 1)),
]
# ``col_id_c = threadIdx.x % 32; row_id_c = threadIdx.x / 32 * 4;``
# ``row_offset = (i % 4) + (i / 4 * 8)``; diagram: a4 is row 8 for L0~31, row 12 for L32~63.
MFMA32_C = [
    (33, 5, (13, 1)),     # 4 + 1 + 8
    (0, 15, (27, 0)),     # 0 + 3 + 24
    (63, 15, (31, 31)),   # 4 + 3 + 24
    (20, 4, (8, 20)),     # diagram: a4, row 8, lanes 0-31
    (40, 4, (12, 8)),     # diagram: a4, row 12, lanes 32-63
]

# MFMA v_mfma_f32_32x32x16_{f16,bf16} (gfx950): [GCNASM] matrix_core_gfx950/matrix_core.cc,
# ``offset_a = (threadIdx.x / 32 * 8) + (threadIdx.x % 32 * stride_a)``, eight halves loaded;
# C stored with the same loop as 32x32x8.
MFMA32x16_A = [
    (45, 6, (13, 14)),    # row 13, k 8 + 6
    (1, 7, (1, 7)),
    (63, 7, (31, 15)),
    (32, 0, (0, 8)),
]
MFMA32x16_B = [
    (32, 0, (8, 0)),
    (7, 5, (5, 7)),
    (63, 7, (15, 31)),
    (50, 3, (11, 18)),
]

# mma.sync.aligned.m16n8k16 .f16/.bf16: [PTX] 9.7.14.5.8.  Figure 79 (A): rows 0-7 hold
# T(4r)..T(4r+3) {a0,a1} in columns 0-7 and {a4,a5} in columns 8-15; rows 8-15 hold
# {a2,a3} and {a6,a7}.
MMA16816_A = [
    (0, 0, (0, 0)),       # T0:a0
    (1, 1, (0, 3)),       # T1:a1
    (5, 4, (1, 10)),      # T5:a4
    (0, 2, (8, 0)),       # T0:a2
    (22, 3, (13, 5)),     # T22:a3
    (31, 7, (15, 15)),    # T31:a7
]
# Figure 81 (B, 16x8): column g holds T(4g)..T(4g+3); {b0,b1} rows 0-7, {b2,b3} rows 8-15.
MMA16816_B = [
    (0, 0, (0, 0)),       # T0:b0
    (0, 1, (1, 0)),       # T0:b1
    (7, 2, (14, 1)),      # T7:b2
    (31, 3, (15, 7)),     # T31:b3
]
# Figure 83 (C/D, 16x8): rows 0-7 {c0,c1}, rows 8-15 {c2,c3}.
MMA_C = [
    (0, 0, (0, 0)),       # T0:c0
    (3, 1, (0, 7)),       # T3:c1
    (4, 2, (9, 0)),       # T4:c2
    (31, 3, (15, 7)),     # T31:c3
]
# mma.sync.aligned.m16n8k8 .f16/.bf16: [PTX] 9.7.14.5.7, Figure 71 (A, 16x8).
MMA1688_A = [
    (0, 0, (0, 0)),       # T0:a0
    (2, 1, (0, 5)),       # T2:a1
    (9, 2, (10, 2)),      # T9:a2
    (31, 3, (15, 7)),     # T31:a3
]
# Figure 74 (B, 8x8): column g holds T(4g)..T(4g+3), {b0,b1}.
MMA1688_B = [
    (0, 0, (0, 0)),       # T0:b0
    (0, 1, (1, 0)),       # T0:b1
    (6, 1, (5, 1)),       # T6:b1
    (28, 0, (0, 7)),      # T28:b0
    (31, 1, (7, 7)),      # T31:b1
]


def _get(family, shape, arch, lanes, dtype="f16") -> InstrLayout:
    return instr_layout(family, shape, arch=arch, lanes=lanes, dtype=dtype)


EXAMPLE_CASES = [
    # (family, shape, archs, lanes, A examples, B examples, C examples)
    ("wmma", (16, 16, 16), ("gfx1100", "gfx1101", "gfx1102", "gfx1151"), 32,
     GFX11_W32_A, GFX11_W32_B, GFX11_W32_C),
    ("wmma", (16, 16, 16), ("gfx1100", "gfx1151"), 64, GFX11_W64_A, GFX11_W64_B, GFX11_W64_C),
    ("wmma", (16, 16, 16), ("gfx1200", "gfx1201"), 32, GFX12_A, GFX12_B, GFX12_C),
    ("mfma", (16, 16, 16), ("gfx90a", "gfx942", "gfx950"), 64, MFMA16_A, MFMA16_B, MFMA16_C),
    ("mfma", (32, 32, 8), ("gfx90a", "gfx942", "gfx950"), 64, MFMA32x8_A, MFMA32x8_B, MFMA32_C),
    ("mfma", (32, 32, 16), ("gfx950",), 64, MFMA32x16_A, MFMA32x16_B, MFMA32_C),
    ("mma_sync", (16, 8, 16), ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120"), 32,
     MMA16816_A, MMA16816_B, MMA_C),
    ("mma_sync", (16, 8, 8), ("sm_75", "sm_80", "sm_90a", "sm_120"), 32,
     MMA1688_A, MMA1688_B, MMA_C),
]


@pytest.mark.parametrize("family,shape,archs,lanes,a_ex,b_ex,c_ex", EXAMPLE_CASES,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_document_examples(family, shape, archs, lanes, a_ex, b_ex, c_ex):
    for arch in archs:
        lay = _get(family, shape, arch, lanes)
        check_examples(lay.a, a_ex)
        check_examples(lay.b, b_ex)
        check_examples(lay.c, c_ex)


# ldmatrix .m8n8 .b16: [PTX] 9.7.14.5.15, the thread/address table ("Threads 0-7: addr0-addr7,
# Threads 8-15: addr8-addr15, ...", "addr8-addr15 correspond to the rows of the second
# matrix"), and Figure 104 (row r holds T(4r) T(4r) T(4r+1) T(4r+1) ... T(4r+3) T(4r+3)).
def test_ldmatrix_document_examples():
    check_ldmatrix_examples(
        ldmatrix_layout(4, False),
        addr_examples=[(0, (0, 0)), (13, (1, 5)), (16, (2, 0)), (31, (3, 7))],
        result_examples=[
            (0, 0, 0, (0, 0, 0)),    # Figure 104: row 0 column 0 is T0
            (5, 0, 1, (0, 1, 3)),    # row 1 columns 2-3 are T5
            (10, 1, 0, (1, 2, 4)),   # second matrix, in the second register
            (31, 3, 1, (3, 7, 7)),   # row 7 column 7 is T31
        ])
    check_ldmatrix_examples(ldmatrix_layout(2, False),
                            addr_examples=[(15, (1, 7)), (16, (-1, -1)), (31, (-1, -1))])
    check_ldmatrix_examples(ldmatrix_layout(1, False),
                            addr_examples=[(7, (0, 7)), (8, (-1, -1))])
    # .trans: "the matrix is loaded in column-major format" -- the same figure read down
    # the columns: T5 receives column 1 of rows 2 and 3.
    check_ldmatrix_examples(
        ldmatrix_layout(4, True),
        result_examples=[
            (5, 0, 0, (0, 2, 1)),
            (4, 0, 1, (0, 1, 1)),
            (3, 0, 0, (0, 6, 0)),
            (31, 2, 1, (2, 7, 7)),
        ])


# --------------------------------------------------------------------------- structure

ALL_COVERED = (
    [("wmma", (16, 16, 16), a, l, d)
     for a in ("gfx1100", "gfx1101", "gfx1102", "gfx1151") for l in (32, 64)
     for d in ("f16", "bf16")]
    + [("wmma", (16, 16, 16), a, 32, d) for a in ("gfx1200", "gfx1201") for d in ("f16", "bf16")]
    + [("mfma", s, a, 64, d) for s in ((32, 32, 8), (16, 16, 16))
       for a in ("gfx90a", "gfx942", "gfx950") for d in ("f16", "bf16")]
    + [("mfma", (32, 32, 16), "gfx950", 64, d) for d in ("f16", "bf16")]
    + [("mma_sync", s, a, 32, d) for s in ((16, 8, 16), (16, 8, 8))
       for a in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120") for d in ("f16", "bf16")]
    + [("mma_sync", (16, 8, 8), "sm_75", 32, "f16")]
)

# Items per lane the brief and the documents agree on: (A, B, C).
ITEMS = {
    ("wmma", 32, "gfx11"): (16, 16, 8),
    ("wmma", 64, "gfx11"): (16, 16, 4),
    ("wmma", 32, "gfx12"): (8, 8, 8),
    ("mfma", (32, 32, 8)): (4, 4, 16),
    ("mfma", (16, 16, 16)): (4, 4, 4),
    ("mfma", (32, 32, 16)): (8, 8, 16),
    ("mma_sync", (16, 8, 16)): (8, 4, 4),
    ("mma_sync", (16, 8, 8)): (4, 2, 4),
}


def _items_key(family, shape, arch, lanes):
    if family == "wmma":
        return (family, lanes, "gfx12" if arch.startswith("gfx12") else "gfx11")
    return (family, shape)


def check_structure(lay: InstrLayout, family, shape, arch, lanes) -> None:
    m, n, k = shape
    assert lay.family == family and lay.shape == shape and lay.lanes == lanes
    assert lay.source
    ia, ib, ic = ITEMS[_items_key(family, shape, arch, lanes)]
    check_operand_structure(lay.a, m, k, lanes, ia)
    check_operand_structure(lay.b, k, n, lanes, ib)
    check_operand_structure(lay.c, m, n, lanes, ic)
    assert not lay.c.replicated
    gfx11 = family == "wmma" and not arch.startswith("gfx12")
    assert lay.a.replicated == gfx11 and lay.b.replicated == gfx11
    if gfx11:
        check_half_wave_replication(lay.a)
        check_half_wave_replication(lay.b)


@pytest.mark.parametrize("family,shape,arch,lanes,dtype", ALL_COVERED)
def test_structure(family, shape, arch, lanes, dtype):
    lay = _get(family, shape, arch, lanes, dtype)
    check_structure(lay, family, shape, arch, lanes)


@pytest.mark.parametrize("family,shape,arch,lanes", sorted(
    {(f, s, a, l) for f, s, a, l, d in ALL_COVERED if d == "bf16"}))
def test_bf16_layout_is_the_f16_layout(family, shape, arch, lanes):
    f16 = _get(family, shape, arch, lanes, "f16")
    bf16 = _get(family, shape, arch, lanes, "bf16")
    for op in ("a", "b", "c"):
        assert np.array_equal(getattr(f16, op).index, getattr(bf16, op).index)


def test_table_is_read_only():
    lay = _get("mfma", (16, 16, 16), "gfx942", 64)
    with pytest.raises(ValueError):
        lay.a.index[0, 0, 0] = 5
    with pytest.raises(ValueError):
        ldmatrix_layout(4, False).result[0, 0, 0, 0] = 1


def test_target_id_features_are_ignored():
    plain = _get("mfma", (32, 32, 8), "gfx942", 64)
    featured = _get("mfma", (32, 32, 8), "gfx942:sramecc+:xnack-", 64)
    assert np.array_equal(plain.c.index, featured.c.index)


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_structure(num, trans):
    lay = ldmatrix_layout(num, trans)
    assert (lay.num, lay.trans) == (num, trans)
    assert lay.addr.shape == (32, 2) and lay.result.shape == (32, num, 2, 3)
    assert lay.addr.dtype == np.int64 and lay.result.dtype == np.int64
    used = [tuple(map(int, a)) for a in lay.addr if a[0] >= 0]
    assert sorted(used) == [(q, r) for q in range(num) for r in range(8)]
    assert all(tuple(map(int, a)) == (-1, -1) for a in lay.addr[8 * num:])
    for j in range(num):
        got = lay.result[:, j].reshape(-1, 3)
        assert set(int(q) for q in got[:, 0]) == {j}, "register j holds matrix j"
        cells = {(int(r), int(c)) for _, r, c in got}
        assert cells == {(r, c) for r in range(8) for c in range(8)} and len(got) == 64


def test_ldmatrix_trans_is_the_transpose():
    plain, trans = ldmatrix_layout(4, False), ldmatrix_layout(4, True)
    assert np.array_equal(plain.result[..., 1], trans.result[..., 2])
    assert np.array_equal(plain.result[..., 2], trans.result[..., 1])


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("family,shape,arch,lanes,dtype", [
    ("mfma", (16, 16, 16), "gfx1151", 64, "f16"),      # no MFMA on RDNA
    ("wmma", (16, 16, 16), "gfx942", 32, "f16"),       # no WMMA on CDNA3
    ("wmma", (16, 16, 16), "gfx942", 64, "f16"),
    ("mfma", (16, 16, 16), "gfx942", 32, "f16"),       # MFMA is wave64 only
    ("mfma", (32, 32, 16), "gfx942", 64, "f16"),       # 32x32x16 f16 is gfx950 only
    ("wmma", (16, 16, 16), "gfx1201", 64, "f16"),      # gfx12 wave64 not in the table
    ("wmma", (16, 16, 16), "gfx1100", 32, "f32"),      # not an A/B type here
    ("mma_sync", (16, 8, 16), "sm_75", 32, "f16"),     # m16n8k16 .f16 needs sm_80
    ("mma_sync", (16, 8, 8), "sm_75", 32, "bf16"),     # .bf16 needs sm_80
    ("mma_sync", (16, 8, 16), "sm_80", 64, "f16"),
    ("mma_sync", (8, 8, 4), "sm_80", 32, "f16"),
    ("wgmma", (64, 128, 16), "sm_90", 128, "f16"),      # wgmma needs sm_90a (the arch-specific target)
    ("wgmma", (64, 128, 16), "sm_90a", 128, "f8e4m3fn"),  # fp8 wgmma is m64nNk32
    ("mma_sync", (16, 8, 32), "sm_80", 32, "f8e5m2"),     # fp8 mma.sync needs sm_89
])
def test_uncovered_raises_keyerror_naming_coverage(family, shape, arch, lanes, dtype):
    with pytest.raises(KeyError) as info:
        instr_layout(family, shape, arch=arch, lanes=lanes, dtype=dtype)
    message = str(info.value)
    assert family in message and arch in message
    assert "covered" in message
    for covered_bit in ("wmma 16x16x16", "mfma 32x32x8", "mma_sync 16x8x16", "gfx950",
                        "sm_75", "gfx1151"):
        assert covered_bit in message


@pytest.mark.parametrize("num,trans", [(3, False), (8, True), (0, False), (4, "yes")])
def test_ldmatrix_uncovered_raises_keyerror(num, trans):
    with pytest.raises(KeyError, match="covered"):
        ldmatrix_layout(num, trans)


# --------------------------------------------------------------------------- teeth

def _with_lanes_swapped(lay: InstrLayout, operand: str, l0: int, l1: int) -> InstrLayout:
    op = getattr(lay, operand)
    index = op.index.copy()
    index[[l0, l1]] = index[[l1, l0]]
    return dataclasses.replace(lay, **{operand: dataclasses.replace(op, index=index)})


@pytest.mark.parametrize("family,shape,arch,lanes,operand,examples,l0,l1", [
    ("wmma", (16, 16, 16), "gfx1201", 32, "a", GFX12_A, 0, 20),
    ("mfma", (32, 32, 8), "gfx942", 64, "c", MFMA32_C, 33, 1),
    ("mma_sync", (16, 8, 16), "sm_80", 32, "b", MMA16816_B, 7, 6),
    ("wmma", (16, 16, 16), "gfx1100", 32, "c", GFX11_W32_C, 17, 18),
])
def test_swapped_lanes_fail_the_document_check(family, shape, arch, lanes, operand, examples,
                                               l0, l1):
    lay = _get(family, shape, arch, lanes)
    check_examples(getattr(lay, operand), examples)          # the real table passes
    broken = _with_lanes_swapped(lay, operand, l0, l1)
    with pytest.raises(AssertionError, match="document says"):
        check_examples(getattr(broken, operand), examples)
    assert not np.array_equal(getattr(broken, operand).index, getattr(lay, operand).index)


def test_swapped_lanes_fail_the_replication_check():
    lay = _get("wmma", (16, 16, 16), "gfx1100", 32)
    check_half_wave_replication(lay.a)
    broken = _with_lanes_swapped(lay, "a", 3, 4)    # lanes 0-15 change, 16-31 do not
    with pytest.raises(AssertionError, match="differ from lanes 0-15"):
        check_half_wave_replication(broken.a)


def test_swapped_lanes_fail_the_ldmatrix_check():
    lay = ldmatrix_layout(4, False)
    result = lay.result.copy()
    result[[5, 6]] = result[[6, 5]]
    broken = dataclasses.replace(lay, result=result)
    with pytest.raises(AssertionError, match="document says"):
        check_ldmatrix_examples(broken, result_examples=[(5, 0, 1, (0, 1, 3))])
