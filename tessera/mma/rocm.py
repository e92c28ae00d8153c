"""AMD matrix instructions: MFMA (CDNA 2/3/4, wave64 only) and WMMA (RDNA 3/3.5 gfx11, RDNA 4 gfx12).

Sources: AMD "CDNA3 Instruction Set Architecture" and "CDNA4 ISA" (MFMA shapes, fp8 FNUZ on
gfx942 vs OCP on gfx950, xf32 on gfx942 only), "RDNA3 ISA" and "RDNA4 ISA" (WMMA; gfx11 A/B
operands hold 16 elements per lane and are replicated across half-waves, gfx12 hold 8),
LLVM ``IntrinsicsAMDGPU.td``.  Every record is compiled for each of its archs by
``tests/test_mma_oracle.py``; the spellings differ per arch (gfx90a ``v_mfma_f32_32x32x8f16``,
gfx942/gfx950 ``v_mfma_f32_32x32x8_f16``).
"""
from __future__ import annotations

from tessera.mma.records import MmaIsa, MmaRecord

GFX9 = ("gfx90a", "gfx942", "gfx950")
GFX11 = ("gfx1100", "gfx1101", "gfx1102", "gfx1151")
GFX12 = ("gfx1200", "gfx1201")
ARCHS = GFX9 + GFX11 + GFX12
WAVES = {**{a: (64,) for a in GFX9}, **{a: (32, 64) for a in GFX11 + GFX12}}
REGISTER_BUDGET = 512  # VGPRs (ArchVGPR + AccVGPR on CDNA; 256 x 2 banks) per lane, upper bound
LOWERING = "lower-tile-to-rocm"
# the (family, shape, in dtype, wave) the lowering implements; every other record is "no lowering yet"
LOWERED = {("mfma", (32, 32, 8), "f16", 64), ("mfma", (32, 32, 8), "bf16", 64), ("mfma", (16, 16, 16), "f16", 64),
           ("mfma", (16, 16, 16), "bf16", 64), ("wmma", (16, 16, 16), "f16", 32), ("wmma", (16, 16, 16), "bf16", 32)}


def _lowering(family, shape, dtype, lanes):
    return LOWERING if (family, tuple(shape), dtype, lanes) in LOWERED else None

V = "<{} x {}>".format


def _mfma(shape, a, acc, archs, intrinsic, args, ret, mnemonic_by_arch, *, math_mode=None, blocks=1,
          semantics="") -> list[MmaRecord]:
    out = []
    for group, arch_set in archs:
        m, n, k = shape
        mn = mnemonic_by_arch[group]
        out.append(MmaRecord(f"rocm.mfma.{m}x{n}x{k}.{a}.{group}", "rocm", "mfma", shape, a, a, acc, mn, intrinsic,
                             archs=frozenset(arch_set), math_mode=math_mode, lanes=64, blocks=blocks,
                             semantics=semantics, lowered_by=_lowering("mfma", shape, a, 64), llvm_ret=ret,
                             llvm_args=args, llvm_imms=(0, 0, 0), asm_regex=mn))
    return out


def _wmma(a, gen: str, wave: int, args, ret, intrinsic, mnemonic, archs, semantics="") -> MmaRecord:
    return MmaRecord(f"rocm.wmma.16x16x16.{a}.{gen}.w{wave}", "rocm", "wmma", (16, 16, 16), a, a, "f32", mnemonic,
                     intrinsic, archs=frozenset(archs), lanes=wave, semantics=semantics,
                     lowered_by=_lowering("wmma", (16, 16, 16), a, wave),
                     llvm_ret=ret, llvm_args=args, llvm_features="+wavefrontsize64" if wave == 64 else "",
                     asm_regex=mnemonic)


RECORDS: tuple[MmaRecord, ...] = tuple(
    _mfma((32, 32, 8), "f16", "f32", [("gfx90a", {"gfx90a"}), ("gfx94x", {"gfx942", "gfx950"})],
          "llvm.amdgcn.mfma.f32.32x32x8f16", (V(4, "half"), V(4, "half"), V(16, "float")), V(16, "float"),
          {"gfx90a": "v_mfma_f32_32x32x8f16", "gfx94x": "v_mfma_f32_32x32x8_f16"})
    + _mfma((16, 16, 16), "f16", "f32", [("gfx90a", {"gfx90a"}), ("gfx94x", {"gfx942", "gfx950"})],
            "llvm.amdgcn.mfma.f32.16x16x16f16", (V(4, "half"), V(4, "half"), V(4, "float")), V(4, "float"),
            {"gfx90a": "v_mfma_f32_16x16x16f16", "gfx94x": "v_mfma_f32_16x16x16_f16"})
    + _mfma((32, 32, 8), "bf16", "f32", [("gfx90a", {"gfx90a"}), ("gfx94x", {"gfx942", "gfx950"})],
            "llvm.amdgcn.mfma.f32.32x32x8bf16.1k", (V(4, "i16"), V(4, "i16"), V(16, "float")), V(16, "float"),
            {"gfx90a": "v_mfma_f32_32x32x8bf16_1k", "gfx94x": "v_mfma_f32_32x32x8_bf16"})
    + _mfma((16, 16, 16), "bf16", "f32", [("gfx90a", {"gfx90a"}), ("gfx94x", {"gfx942", "gfx950"})],
            "llvm.amdgcn.mfma.f32.16x16x16bf16.1k", (V(4, "i16"), V(4, "i16"), V(4, "float")), V(4, "float"),
            {"gfx90a": "v_mfma_f32_16x16x16bf16_1k", "gfx94x": "v_mfma_f32_16x16x16_bf16"})
    + _mfma((32, 32, 16), "f16", "f32", [("gfx950", {"gfx950"})], "llvm.amdgcn.mfma.f32.32x32x16.f16",
            (V(8, "half"), V(8, "half"), V(16, "float")), V(16, "float"), {"gfx950": "v_mfma_f32_32x32x16_f16"})
    + _mfma((32, 32, 16), "bf16", "f32", [("gfx950", {"gfx950"})], "llvm.amdgcn.mfma.f32.32x32x16.bf16",
            (V(8, "bfloat"), V(8, "bfloat"), V(16, "float")), V(16, "float"), {"gfx950": "v_mfma_f32_32x32x16_bf16"})
    + _mfma((32, 32, 16), "f8e4m3fnuz", "f32", [("gfx942", {"gfx942"})], "llvm.amdgcn.mfma.f32.32x32x16.fp8.fp8",
            ("i64", "i64", V(16, "float")), V(16, "float"), {"gfx942": "v_mfma_f32_32x32x16_fp8_fp8"},
            semantics="fp8 in the FNUZ encoding (e4m3fnuz)")
    + _mfma((32, 32, 16), "f8e4m3fn", "f32", [("gfx950", {"gfx950"})], "llvm.amdgcn.mfma.f32.32x32x16.fp8.fp8",
            ("i64", "i64", V(16, "float")), V(16, "float"), {"gfx950": "v_mfma_f32_32x32x16_fp8_fp8"},
            semantics="fp8 in the OCP encoding (e4m3fn)")
    + _mfma((32, 32, 4), "f32", "f32", [("gfx942", {"gfx942"})], "llvm.amdgcn.mfma.f32.32x32x4.xf32",
            (V(2, "float"), V(2, "float"), V(16, "float")), V(16, "float"), {"gfx942": "v_mfma_f32_32x32x4_xf32"},
            math_mode="xf32", semantics="fp32 inputs with reduced (xf32) precision; gfx942 only (not gfx950)")
    + [
        _wmma("f16", "gfx11", 32, (V(16, "half"), V(16, "half"), V(8, "float")), V(8, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.f16", "v_wmma_f32_16x16x16_f16", GFX11,
              "A/B: 16 elements per lane, replicated across the two half-waves"),
        _wmma("f16", "gfx11", 64, (V(16, "half"), V(16, "half"), V(4, "float")), V(4, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.f16", "v_wmma_f32_16x16x16_f16", GFX11),
        _wmma("bf16", "gfx11", 32, (V(16, "i16"), V(16, "i16"), V(8, "float")), V(8, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.bf16", "v_wmma_f32_16x16x16_bf16", GFX11),
        _wmma("bf16", "gfx11", 64, (V(16, "i16"), V(16, "i16"), V(4, "float")), V(4, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.bf16", "v_wmma_f32_16x16x16_bf16", GFX11),
        _wmma("f16", "gfx12", 32, (V(8, "half"), V(8, "half"), V(8, "float")), V(8, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.f16", "v_wmma_f32_16x16x16_f16", GFX12,
              "A/B: 8 elements per lane (no half-wave replication)"),
        _wmma("f16", "gfx12", 64, (V(4, "half"), V(4, "half"), V(4, "float")), V(4, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.f16", "v_wmma_f32_16x16x16_f16", GFX12),
        _wmma("bf16", "gfx12", 32, (V(8, "i16"), V(8, "i16"), V(8, "float")), V(8, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.bf16", "v_wmma_f32_16x16x16_bf16", GFX12),
        _wmma("bf16", "gfx12", 64, (V(4, "i16"), V(4, "i16"), V(4, "float")), V(4, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.bf16", "v_wmma_f32_16x16x16_bf16", GFX12),
        _wmma("f8e4m3fn", "gfx12", 32, (V(2, "i32"), V(2, "i32"), V(8, "float")), V(8, "float"),
              "llvm.amdgcn.wmma.f32.16x16x16.fp8.fp8", "v_wmma_f32_16x16x16_fp8_fp8", GFX12,
              "fp8 in the OCP encoding; gfx1151 (RDNA 3.5) has no fp8 WMMA"),
    ]
)


def isa(arch: str) -> MmaIsa:
    recs = tuple(r for r in RECORDS if arch in r.archs)
    return MmaIsa("rocm", arch, recs, REGISTER_BUDGET, llvm_cpu=arch, wave_sizes=WAVES[arch])
