"""The instruction record: one real matrix (or vector-FMA) instruction.

Legality is this one table: a record names its target, the archs or CPU features
it needs, its shape, its input and accumulator dtypes, its math mode, and how it
is implemented (mnemonic, LLVM intrinsic or inline asm) and lowered
(``lowered_by``: the pass that implements it, or ``None`` — "no lowering yet").
There is no second shape list or dtype->K map to disagree with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DTYPE_BYTES = {"f64": 8, "f32": 4, "tf32": 4, "xf32": 4, "f16": 2, "bf16": 2, "i32": 4, "i8": 1, "u8": 1,
               "s8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "i4": 0.5}
KNOWN_DTYPES = tuple(DTYPE_BYTES)


@dataclass(frozen=True)
class MmaRecord:
    id: str
    target: str                      # x86 | nvidia | rocm | apple
    family: str                      # fma | avx512_bf16 | avx512_vnni | amx | mma_sync | wgmma | wmma | mfma | simdgroup
    shape: tuple[int, int, int]      # (M, N, K) of one instruction
    a_dtype: str
    b_dtype: str
    acc_dtype: str
    mnemonic: str
    intrinsic: str                   # LLVM intrinsic name, or "asm: <template>"
    archs: frozenset[str] = frozenset()   # GPU archs where legal (empty for CPU records)
    features: tuple[str, ...] = ()   # CPU features required (LLVM spelling)
    math_mode: str | None = None     # tf32 / xf32: fp32 inputs need this mode asked for explicitly
    lanes: int | None = None         # cooperating lanes (warp 32, warpgroup 128, wave 32/64, simdgroup 32)
    min_ptx: tuple[int, int] | None = None     # default minimum PTX ISA version
    min_ptx_by_arch: tuple[tuple[str, tuple[int, int]], ...] = ()  # overrides (e.g. sm_120 needs 8.7)
    semantics: str = ""              # how it differs from a plain multiply-add
    lowered_by: str | None = None    # the pass that lowers tile.mma of this family, or None
    blocks: int = 1                  # independent blocks computed at once (multi-block MFMA)
    vector_width: int | None = None  # CPU: lanes per vector register
    cycles: float | None = None      # CPU: reciprocal throughput per core (cycles per instruction), for ranking
    register_file: int | None = None  # CPU: registers of the instruction's own file (AMX: 8 tmm tile registers)
    widen: str | None = None         # CPU: inputs are widened (exactly) to this dtype while packing; the
                                     # instruction runs on the widened panels (bf16 on f32 FMA)
    a_layout: str = "row_major"
    b_layout: str = "col_major"
    note: str = ""
    # how the LLVM oracle test calls the intrinsic: return type, operand types, trailing
    # immediates (and their type), extra target features, and what the assembly must contain
    llvm_ret: str = ""
    llvm_args: tuple[str, ...] = ()
    llvm_imms: tuple[int, ...] = ()
    llvm_imm_type: str = "i32"
    llvm_features: str = ""
    asm_regex: str = ""

    @property
    def m(self) -> int:
        return self.shape[0]

    @property
    def n(self) -> int:
        return self.shape[1]

    @property
    def k(self) -> int:
        return self.shape[2]

    @property
    def packed_bytes(self) -> int:
        """Bytes of one element of the packed panels the instruction reads (its inputs, or their
        widening): the schedule sizes cache blocks by it, the GEMM generator its workspace."""
        return int(DTYPE_BYTES[self.widen or self.a_dtype])

    @property
    def in_dtype(self) -> str:
        return self.a_dtype if self.a_dtype == self.b_dtype else f"{self.a_dtype}x{self.b_dtype}"

    def min_ptx_for(self, arch: str) -> tuple[int, int] | None:
        for a, v in self.min_ptx_by_arch:
            if a == arch:
                return v
        return self.min_ptx

    def accepts(self, dtype: str) -> bool:
        """Inputs of ``dtype`` on both sides ("u8xs8" names mixed inputs such as VNNI's)."""
        return dtype == self.in_dtype

    def to_dict(self) -> dict:
        return {
            "id": self.id, "target": self.target, "family": self.family, "shape": list(self.shape),
            "a": self.a_dtype, "b": self.b_dtype, "acc": self.acc_dtype, "math_mode": self.math_mode,
            "mnemonic": self.mnemonic, "intrinsic": self.intrinsic, "lanes": self.lanes,
            "archs": sorted(self.archs), "features": list(self.features),
            "min_ptx": ".".join(map(str, self.min_ptx)) if self.min_ptx else None,
            "semantics": self.semantics, "lowered_by": self.lowered_by, "blocks": self.blocks,
            **({"widen": self.widen} if self.widen else {}),
        }


@dataclass(frozen=True)
class MmaIsa:
    """The records legal on one (target, arch), and that arch's register budget."""

    target: str
    arch: str
    records: tuple[MmaRecord, ...]
    register_budget: int             # vector registers (CPU) or 32-bit registers per lane (GPU)
    llvm_cpu: str | None = None      # the CPU/arch name handed to LLVM
    llvm_features: str = ""
    features: frozenset[str] = field(default_factory=frozenset)
    wave_sizes: tuple[int, ...] = ()

    def dtypes(self) -> list[str]:
        seen: list[str] = []
        for r in self.records:
            if r.in_dtype not in seen:
                seen.append(r.in_dtype)
        return seen
