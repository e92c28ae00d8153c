"""NVIDIA warp-level matrix instructions: ``mma.sync`` (sm_75 .. sm_120) and ``wgmma`` (sm_90a).

Sources: PTX ISA 8.7, "Warp-level matrix multiply-accumulate instructions" (shapes and
types per target) and "wgmma.mma_async"; LLVM ``IntrinsicsNVVM.td`` for the intrinsic names
(checked by compiling each record with llvmlite's NVPTX backend in ``tests/test_mma_oracle.py``).
PTX version: the higher of the arch's minimum and the instruction's (fp8 needs 8.4;
sm_120 needs 8.7).
"""
from __future__ import annotations

from tessera.mma.records import MmaIsa, MmaRecord

ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120")
ARCH_MIN_PTX = {"sm_75": (6, 3), "sm_80": (7, 0), "sm_86": (7, 1), "sm_89": (7, 8), "sm_90": (7, 8),
                "sm_90a": (8, 0), "sm_120": (8, 7)}
SM80_UP = frozenset({"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120"})
SM89_UP = frozenset({"sm_89", "sm_90", "sm_90a", "sm_120"})
SM90_UP = frozenset({"sm_90", "sm_90a", "sm_120"})
REGISTER_BUDGET = 255  # 32-bit registers per thread
LOWERING = "lower-tile-to-nvidia"
# m64nNk16 f16/bf16 and m64nNk32 fp8 -> f32 (passes/target/nvidia/wgmma.py; fp8 reads both operands K-major)
WGMMA_LOWERED = ("f16", "bf16", "f8e4m3fn", "f8e5m2")
LOWERED = {((16, 8, 16), "f16"), ((16, 8, 8), "f16"), ((16, 8, 16), "bf16"), ((16, 8, 8), "bf16"),
           # tf32: f32 inputs rounded to tf32 (cvt.rna.tf32.f32) in registers, f32 accumulation
           ((16, 8, 8), "f32"), ((16, 8, 4), "f32"),
           # fp8 (sm_89+): four bytes per 32-bit register, f32 accumulation
           ((16, 8, 32), "f8e4m3fn"), ((16, 8, 32), "f8e5m2")}

PTX_TYPE = {"f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64", "s8": "s8", "i32": "s32",
            "f8e4m3fn": "e4m3", "f8e5m2": "e5m2"}
S4F = "{float, float, float, float}"
S4I = "{i32, i32, i32, i32}"
H2 = "<2 x half>"


def _mma(shape, a, acc, archs, intrinsic, args, ret, *, math_mode=None, min_ptx=(7, 0), semantics="",
         b=None) -> MmaRecord:
    m, n, k = shape
    b = b or a
    ptx_a = PTX_TYPE[a] if not math_mode else math_mode
    ptx_b = PTX_TYPE[b] if not math_mode else math_mode
    ptx_acc = PTX_TYPE[acc]
    mnemonic = f"mma.sync.aligned.m{m}n{n}k{k}.row.col.{ptx_acc}.{ptx_a}.{ptx_b}.{ptx_acc}"
    rid = f"nvidia.mma_sync.m{m}n{n}k{k}.{ptx_a}" + (f".{ptx_b}" if ptx_b != ptx_a else "")
    return MmaRecord(rid, "nvidia", "mma_sync", shape, a, b, acc, mnemonic, intrinsic, archs=frozenset(archs),
                     math_mode=math_mode, lanes=32, min_ptx=min_ptx,
                     min_ptx_by_arch=(("sm_120", (8, 7)),), semantics=semantics,
                     lowered_by=LOWERING if ((m, n, k), a) in LOWERED else None,
                     a_layout="row_major", b_layout="col_major", llvm_ret=ret, llvm_args=args,
                     asm_regex=mnemonic.replace(".", r"\."))


RECORDS_MMA: tuple[MmaRecord, ...] = (
    _mma((16, 8, 8), "f16", "f32", {"sm_75"} | SM80_UP, "llvm.nvvm.mma.m16n8k8.row.col.f32.f32",
         (H2, H2, H2, "float", "float", "float", "float"), S4F, min_ptx=(6, 5)),
    _mma((16, 8, 16), "f16", "f32", SM80_UP, "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
         (H2,) * 6 + ("float",) * 4, S4F),
    _mma((16, 8, 8), "bf16", "f32", SM80_UP, "llvm.nvvm.mma.m16n8k8.row.col.bf16", ("i32",) * 3 + ("float",) * 4,
         S4F),
    _mma((16, 8, 16), "bf16", "f32", SM80_UP, "llvm.nvvm.mma.m16n8k16.row.col.bf16",
         ("i32",) * 6 + ("float",) * 4, S4F),
    _mma((16, 8, 4), "f32", "f32", SM80_UP, "llvm.nvvm.mma.m16n8k4.row.col.tf32", ("i32",) * 3 + ("float",) * 4,
         S4F, math_mode="tf32", semantics="fp32 inputs rounded to tf32 (10-bit mantissa)"),
    _mma((16, 8, 8), "f32", "f32", SM80_UP, "llvm.nvvm.mma.m16n8k8.row.col.tf32", ("i32",) * 6 + ("float",) * 4,
         S4F, math_mode="tf32", semantics="fp32 inputs rounded to tf32 (10-bit mantissa)"),
    _mma((16, 8, 16), "s8", "i32", SM80_UP, "llvm.nvvm.mma.m16n8k16.row.col.s8", ("i32",) * 3 + ("i32",) * 4, S4I),
    _mma((16, 8, 32), "s8", "i32", SM80_UP, "llvm.nvvm.mma.m16n8k32.row.col.s8", ("i32",) * 6 + ("i32",) * 4, S4I),
    _mma((16, 8, 32), "f8e4m3fn", "f32", SM89_UP, "llvm.nvvm.mma.m16n8k32.row.col.f32.e4m3.e4m3.f32",
         ("i32",) * 6 + ("float",) * 4, S4F, min_ptx=(8, 4), semantics="OCP fp8 e4m3"),
    _mma((16, 8, 32), "f8e5m2", "f32", SM89_UP, "llvm.nvvm.mma.m16n8k32.row.col.f32.e5m2.e5m2.f32",
         ("i32",) * 6 + ("float",) * 4, S4F, min_ptx=(8, 4), semantics="OCP fp8 e5m2"),
    # the PTX ISA's .kind f8 takes either format on each side
    _mma((16, 8, 32), "f8e4m3fn", "f32", SM89_UP, "llvm.nvvm.mma.m16n8k32.row.col.f32.e4m3.e5m2.f32",
         ("i32",) * 6 + ("float",) * 4, S4F, min_ptx=(8, 4), semantics="OCP fp8 e4m3 x e5m2", b="f8e5m2"),
    _mma((16, 8, 32), "f8e5m2", "f32", SM89_UP, "llvm.nvvm.mma.m16n8k32.row.col.f32.e5m2.e4m3.f32",
         ("i32",) * 6 + ("float",) * 4, S4F, min_ptx=(8, 4), semantics="OCP fp8 e5m2 x e4m3", b="f8e4m3fn"),
    _mma((8, 8, 4), "f64", "f64", SM80_UP, "llvm.nvvm.mma.m8n8k4.row.col.f64", ("double",) * 4, "{double, double}"),
    _mma((16, 8, 4), "f64", "f64", SM90_UP, "llvm.nvvm.mma.m16n8k4.row.col.f64", ("double",) * 7,
         "{double, double, double, double}", min_ptx=(7, 8)),
    _mma((16, 8, 8), "f64", "f64", SM90_UP, "llvm.nvvm.mma.m16n8k8.row.col.f64", ("double",) * 10,
         "{double, double, double, double}", min_ptx=(7, 8)),
    _mma((16, 8, 16), "f64", "f64", SM90_UP, "llvm.nvvm.mma.m16n8k16.row.col.f64", ("double",) * 16,
         "{double, double, double, double}", min_ptx=(7, 8)),
)


def _wgmma(n: int, dtype: str, btype: str | None = None) -> MmaRecord:
    k = 32 if dtype.startswith("f8") else 16
    names = {"f16": "f16", "bf16": "bf16", "f8e4m3fn": "e4m3", "f8e5m2": "e5m2"}
    btype = btype or dtype
    ptx, ptx_b = names[dtype], names[btype]
    mnemonic = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptx}.{ptx_b}"
    rid = f"nvidia.wgmma.m64n{n}k{k}.{ptx}" + (f".{ptx_b}" if ptx_b != ptx else "")
    return MmaRecord(rid, "nvidia", "wgmma", (64, n, k), dtype, btype, "f32", mnemonic,
                     f"asm: {mnemonic} {{d...}}, descA, descB, p, 1, 1{', 0, 0' if k == 16 else ''};",
                     archs=frozenset({"sm_90a"}), lanes=128, min_ptx=(8, 0),
                     lowered_by=LOWERING if dtype in WGMMA_LOWERED else None,
                     a_layout="smem_desc", b_layout="smem_desc",
                     semantics="asynchronous warpgroup MMA; A and B from shared-memory descriptors; LLVM has no "
                               "intrinsic, so inline asm (accumulators tied) checked by ptxas -arch=sm_90a",
                     asm_regex=mnemonic.replace(".", r"\."))


RECORDS_WGMMA = tuple(_wgmma(n, dt) for dt in ("f16", "bf16", "f8e4m3fn", "f8e5m2") for n in range(8, 257, 8)) + \
    tuple(_wgmma(n, a, b) for a, b in (("f8e4m3fn", "f8e5m2"), ("f8e5m2", "f8e4m3fn")) for n in range(8, 257, 8))
RECORDS = RECORDS_MMA + RECORDS_WGMMA


def ptx_version(arch: str, record: MmaRecord | None = None) -> tuple[int, int]:
    v = ARCH_MIN_PTX[arch]
    if record is not None and record.min_ptx_for(arch):
        v = max(v, record.min_ptx_for(arch))
    return v


def isa(arch: str) -> MmaIsa:
    recs = tuple(r for r in RECORDS if arch in r.archs)
    return MmaIsa("nvidia", arch, recs, REGISTER_BUDGET, llvm_cpu=arch.rstrip("a") if arch != "sm_90a" else "sm_90a",
                  wave_sizes=(32,))
