"""x86 records and CPU names.

An x86 ``arch`` is an LLVM CPU name from :data:`CPUS` (its features decide which
records are legal), ``host`` (LLVM's host CPU name and its reported features), or
an ISA-level name from :data:`ISA_LEVELS`, which maps to ``x86-64-v3``/``x86-64-v4``
plus a feature string — it never reaches LLVM as a CPU name (LLVM aborts the
process at codegen on a CPU name it does not know).

Sources: Intel SDM vol. 2 (VFMADD231PS/PD, VDPBF16PS, VPDPBUSD, TDPBF16PS, TDPBSSD),
LLVM ``IntrinsicsX86.td``; ``cycles`` (reciprocal throughput on one core) from the Intel
optimization reference manual (Sapphire Rapids: two 512-bit FMA ports, one TMUL that
retires a 16x16x32 bf16 product every 16 cycles).  Ranking only uses their ratio.
"""
from __future__ import annotations

import re
from functools import lru_cache

from tessera.mma.records import MmaRecord

LOWERING = "lower-tile-to-x86"

RECORDS: tuple[MmaRecord, ...] = (
    MmaRecord("x86.avx2.fma.f32", "x86", "fma", (1, 8, 1), "f32", "f32", "f32", "vfmadd231ps ymm",
              "llvm.fma.v8f32", features=("avx2", "fma"), vector_width=8, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<8 x float>", llvm_args=("<8 x float>",) * 3,
              asm_regex=r"vfmadd\d{3}ps\s+%ymm", cycles=0.5,
              note="one broadcast A element x 8 B lanes; register tile of MR x NR of these"),
    MmaRecord("x86.avx512.fma.f32", "x86", "fma", (1, 16, 1), "f32", "f32", "f32", "vfmadd231ps zmm",
              "llvm.fma.v16f32", features=("avx512f",), vector_width=16, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<16 x float>", llvm_args=("<16 x float>",) * 3,
              asm_regex=r"vfmadd\d{3}ps\s+%zmm", cycles=0.5),
    # float64: the same broadcast-A x vector-B register tile in f64 vectors (half the lanes)
    MmaRecord("x86.avx2.fma.f64", "x86", "fma", (1, 4, 1), "f64", "f64", "f64", "vfmadd231pd ymm",
              "llvm.fma.v4f64", features=("avx2", "fma"), vector_width=4, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<4 x double>", llvm_args=("<4 x double>",) * 3,
              asm_regex=r"vfmadd\d{3}pd\s+%ymm", cycles=0.5,
              note="one broadcast A element x 4 B lanes; f64 products and sums (numpy's float64 matmul)"),
    MmaRecord("x86.avx512.fma.f64", "x86", "fma", (1, 8, 1), "f64", "f64", "f64", "vfmadd231pd zmm",
              "llvm.fma.v8f64", features=("avx512f",), vector_width=8, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<8 x double>", llvm_args=("<8 x double>",) * 3,
              asm_regex=r"vfmadd\d{3}pd\s+%zmm", cycles=0.5),
    # bf16 on chips without a bf16 instruction: both panels are packed as f32 (a bf16 value widens
    # exactly), then the f32 FMA kernel runs; ranked below any bf16 instruction the chip has
    MmaRecord("x86.avx2.fma.bf16", "x86", "fma", (1, 8, 1), "bf16", "bf16", "f32", "vfmadd231ps ymm",
              "llvm.fma.v8f32", features=("avx2", "fma"), vector_width=8, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<8 x float>", llvm_args=("<8 x float>",) * 3,
              asm_regex=r"vfmadd\d{3}ps\s+%ymm", cycles=0.5, widen="f32",
              semantics="bf16 inputs widened exactly to f32 while packing, then f32 FMA: exact products, "
                        "f32 sums, subnormals kept"),
    MmaRecord("x86.avx512.fma.bf16", "x86", "fma", (1, 16, 1), "bf16", "bf16", "f32", "vfmadd231ps zmm",
              "llvm.fma.v16f32", features=("avx512f",), vector_width=16, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<16 x float>", llvm_args=("<16 x float>",) * 3,
              asm_regex=r"vfmadd\d{3}ps\s+%zmm", cycles=0.5, widen="f32",
              semantics="bf16 inputs widened exactly to f32 while packing, then f32 FMA: exact products, "
                        "f32 sums, subnormals kept"),
    # f16 the same way (F16C's vcvtph2ps widens exactly while packing): f32 FMA, f32 sums
    MmaRecord("x86.avx2.fma.f16", "x86", "fma", (1, 8, 1), "f16", "f16", "f32", "vfmadd231ps ymm",
              "llvm.fma.v8f32", features=("avx2", "fma", "f16c"), vector_width=8, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<8 x float>", llvm_args=("<8 x float>",) * 3,
              asm_regex=r"vfmadd\d{3}ps\s+%ymm", cycles=0.5, widen="f32",
              semantics="f16 inputs widened exactly to f32 while packing, then f32 FMA: exact products, "
                        "f32 sums, subnormals kept"),
    MmaRecord("x86.avx512.fma.f16", "x86", "fma", (1, 16, 1), "f16", "f16", "f32", "vfmadd231ps zmm",
              "llvm.fma.v16f32", features=("avx512f",), vector_width=16, lowered_by=LOWERING,
              a_layout="col_major", b_layout="row_major", llvm_ret="<16 x float>", llvm_args=("<16 x float>",) * 3,
              asm_regex=r"vfmadd\d{3}ps\s+%zmm", cycles=0.5, widen="f32",
              semantics="f16 inputs widened exactly to f32 while packing, then f32 FMA: exact products, "
                        "f32 sums, subnormals kept"),
    MmaRecord("x86.avx512_bf16.dpbf16ps", "x86", "avx512_bf16", (1, 16, 2), "bf16", "bf16", "f32",
              "vdpbf16ps zmm", "llvm.x86.avx512bf16.dpbf16ps.512", features=("avx512bf16", "avx512f"),
              vector_width=16, lowered_by=LOWERING, a_layout="col_major", b_layout="row_major",
              llvm_ret="<16 x float>", llvm_args=("<16 x float>", "<32 x bfloat>", "<32 x bfloat>"),
              asm_regex=r"vdpbf16ps\s+%zmm", cycles=0.5,
              semantics="pairwise bf16 dot product into f32; denormal inputs and outputs are flushed to zero "
                        "and rounding ignores MXCSR (round to nearest even)"),
    MmaRecord("x86.avx512_vnni.vpdpbusd", "x86", "avx512_vnni", (1, 16, 4), "u8", "s8", "i32",
              "vpdpbusd zmm", "llvm.x86.avx512.vpdpbusd.512", features=("avx512vnni", "avx512f"), vector_width=16,
              llvm_ret="<16 x i32>", llvm_args=("<16 x i32>",) * 3, asm_regex=r"vpdpbusd\s+%zmm", cycles=0.5,
              semantics="u8 x s8 products, four per i32 lane, summed into i32 without saturation"),
    MmaRecord("x86.amx.bf16", "x86", "amx", (16, 16, 32), "bf16", "bf16", "f32", "tdpbf16ps",
              "llvm.x86.tdpbf16ps", features=("amx-tile", "amx-bf16"), llvm_ret="void", llvm_imms=(0, 1, 2),
              llvm_imm_type="i8", asm_regex=r"tdpbf16ps", cycles=16.0, register_file=8, lowered_by=LOWERING,
              a_layout="row_major", b_layout="vnni",
              semantics="tile registers (tmm0-7), 16 rows x 64 bytes; B in VNNI pairs (k, k+1 adjacent); "
                        "pairwise bf16 products into f32, denormal inputs and outputs flushed to zero, round to "
                        "nearest even; the process must be granted the tile state (arch_prctl) before use"),
    MmaRecord("x86.amx.int8", "x86", "amx", (16, 16, 64), "s8", "s8", "i32", "tdpbssd",
              "llvm.x86.tdpbssd", features=("amx-tile", "amx-int8"), llvm_ret="void", llvm_imms=(0, 1, 2),
              llvm_imm_type="i8", asm_regex=r"tdpbssd", cycles=16.0, register_file=8, b_layout="vnni",
              semantics="s8 x s8 into i32 tile registers"),
)


def _fp8(a: str, b: str, avx512: bool) -> MmaRecord:
    """fp8 (OCP e4m3 / e5m2, either on each side) on the f32 FMA kernel: every fp8 value is exactly
    an f32, so packing decodes both panels to f32 (passes/target/x86: the pack's conversion)."""
    w, reg = (16, "zmm") if avx512 else (8, "ymm")
    short = {"f8e4m3fn": "e4m3", "f8e5m2": "e5m2"}
    rid = f"x86.{'avx512' if avx512 else 'avx2'}.fma.{short[a]}" + (f".{short[b]}" if b != a else "")
    return MmaRecord(rid, "x86", "fma", (1, w, 1), a, b, "f32", f"vfmadd231ps {reg}", f"llvm.fma.v{w}f32",
                     features=("avx512f",) if avx512 else ("avx2", "fma"), vector_width=w, lowered_by=LOWERING,
                     a_layout="col_major", b_layout="row_major", llvm_ret=f"<{w} x float>",
                     llvm_args=(f"<{w} x float>",) * 3, asm_regex=rf"vfmadd\d{{3}}ps\s+%{reg}", cycles=0.5,
                     widen="f32", semantics="fp8 inputs decoded exactly to f32 while packing, then f32 FMA: exact "
                                            "products, f32 sums")


_F8 = ("f8e4m3fn", "f8e5m2")
RECORDS += tuple(_fp8(a, b, wide) for wide in (False, True) for a in _F8 for b in _F8)

_AVX2 = frozenset({"sse4.2", "avx", "avx2", "fma", "f16c", "bmi2"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}

# LLVM CPU name -> the features that matter to the records (LLVM spelling).
CPUS: dict[str, frozenset[str]] = {
    "x86-64-v3": _AVX2,
    "x86-64-v4": _AVX512,
    "haswell": _AVX2,
    "broadwell": _AVX2,
    "skylake": _AVX2,
    "znver2": _AVX2,
    "znver3": _AVX2,
    "skylake-avx512": _AVX512,
    "cascadelake": _AVX512 | {"avx512vnni"},
    "icelake-server": _AVX512 | {"avx512vnni"},
    "cooperlake": _AVX512 | {"avx512vnni", "avx512bf16"},
    "znver4": _AVX512 | {"avx512vnni", "avx512bf16"},
    "znver5": _AVX512 | {"avx512vnni", "avx512bf16"},
    "sapphirerapids": _AVX512 | {"avx512vnni", "avx512bf16", "amx-tile", "amx-bf16", "amx-int8"},
    "graniterapids": _AVX512 | {"avx512vnni", "avx512bf16", "amx-tile", "amx-bf16", "amx-int8"},
}

# ISA-level names -> (LLVM CPU, extra features).  Never handed to LLVM as a CPU name.
ISA_LEVELS: dict[str, tuple[str, frozenset[str]]] = {
    "avx2": ("x86-64-v3", frozenset()),
    "avx512": ("x86-64-v4", frozenset()),
    "avx512_bf16": ("x86-64-v4", frozenset({"avx512bf16"})),
    "avx512_vnni": ("x86-64-v4", frozenset({"avx512vnni"})),
    "amx": ("x86-64-v4", frozenset({"avx512bf16", "avx512vnni", "amx-tile", "amx-bf16", "amx-int8"})),
}


@lru_cache(maxsize=1)
def host_cpu() -> tuple[str, frozenset[str]]:
    """LLVM's host CPU name and the features LLVM reports enabled on this machine."""
    import llvmlite.binding as llvm

    name = llvm.get_host_cpu_name()
    feats = frozenset(k for k, v in llvm.get_host_cpu_features().items() if v)
    return name, feats


def resolve(arch: str | None) -> tuple[str, str, frozenset[str]]:
    """``arch`` -> (resolved arch name, LLVM CPU name, feature set).  Raises KeyError if unknown."""
    if arch is None or arch == "host":
        name, feats = host_cpu()
        # the host's CPU name stands for it only where that name's table holds on this machine (a
        # virtual machine may hide features: a Zen 4 guest without AVX-512 is still called znver4)
        return (name if name not in CPUS or CPUS[name] <= feats else "host"), name, feats
    if arch in ISA_LEVELS:
        cpu, extra = ISA_LEVELS[arch]
        return arch, cpu, CPUS[cpu] | extra
    if arch in CPUS:
        return arch, arch, CPUS[arch]
    host_name, host_feats = host_cpu()
    if arch == host_name:
        return arch, arch, host_feats
    raise KeyError(arch)


def known_archs() -> list[str]:
    return ["host"] + sorted(ISA_LEVELS) + sorted(CPUS)


# LLVM's x86 vector and tile ISA features: a CPU name implies some of them, and a virtual
# machine may hide them from the guest (a Zen 4 VM without AVX-512 reports the CPU name znver4).
_VECTOR_ISA = re.compile(r"^(avx|amx|fma|f16c|gfni|vaes|vpclmulqdq|xop|evex512)")


@lru_cache(maxsize=1)
def _vector_isa_features() -> frozenset[str]:
    """The vector ISA features this LLVM knows for x86 (empty on another host architecture)."""
    import llvmlite.binding as llvm

    return frozenset(f for f in llvm.get_host_cpu_features() if _VECTOR_ISA.match(f))


def llvm_feature_string(features: frozenset[str]) -> str:
    """``+f`` for every feature in ``features`` and ``-f`` for every vector ISA feature not in it,
    so LLVM never takes one from the CPU name that the feature set (the host's, or an arch's
    table) does not grant."""
    off = _vector_isa_features() - features
    return ",".join([f"+{f}" for f in sorted(features)] + [f"-{f}" for f in sorted(off)])


def register_budget(features: frozenset[str]) -> int:
    return 32 if "avx512f" in features else 16
