"""Target IR for x86: the ``tessera_x86`` dialect (xDSL's own ``x86`` is a different thing).

Values are builtin ``vector<W x elem>`` registers, scalars, ``index`` and
``!llvm.ptr`` base pointers; addressing is ``base[offset]`` in elements.  Each op
is one instruction (or one short fixed idiom) that ``tessera.codegen.x86`` turns
into LLVM IR:

  vzero        vxorps                           vfma       vfmadd231ps
  vbroadcast   vbroadcastss / vpbroadcastd       vdpbf16ps  vdpbf16ps (AVX512-BF16)
  vload/vstore vmovups (masked with a count)     vbinary    vaddps/vsubps/vmulps/vdivps/vmaxps/vminps
  vunary       a math-library sequence (exp, tanh, erf, ...) or one instruction (sqrt, abs)
  vreduce      horizontal add/max, result in every lane
  vsplat       broadcast a scalar register       vconstant  a constant vector
  vcvt         vcvtneps2bf16 / vcvtph2ps ...     load/store scalar moves (packing)
  workspace    the calling thread's scratch slice
  launch       host program step (kernel symbol, threads over the parallel loop)

AMX (tile registers, values of type ``!tessera_x86.amx``: one 16-row x 64-byte tile; LLVM
allocates tmm0-7 and writes the tile configuration):

  tzero        tilezero      tload   tileloadd (rows of 64 bytes, ``stride`` bytes apart)
  tstore       tilestored    tdp     one tile product (``instr``: tdpbf16ps), acc + a x b
"""
from __future__ import annotations

from xdsl.dialects.builtin import (
    IntegerType,
    UnitAttr,
    ArrayAttr,
    FlatSymbolRefAttr,
    FloatAttr,
    IndexType,
    IntegerAttr,
    StringAttr,
    VectorType,
)
from xdsl.dialects.llvm import LLVMPointerType
from xdsl.ir import Dialect, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.irdl import (
    VarConstraint,
    base,
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    opt_attr_def,
    opt_operand_def,
    operand_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from typing import ClassVar

from xdsl.traits import Pure

from tessera.errors import TargetVerifyError
from tessera.ir.attrs import ival
from tessera.ir.tile import MATH_FNS

PTR = LLVMPointerType()  # x86 code addresses one flat space

UNARY = ("neg", "exp", "exp_bounded", "exp2_bounded", "tanh", "erf", "relu", "silu", "gelu_tanh", "gelu_erf", "sqrt", "rsqrt", "recip", "copy",
         "abs", "finite_or_zero", "round_f32", "round_bf16", "round_f16") + MATH_FNS
BINARY = ("add", "sub", "mul", "div", "max", "min", "safe_div", "mask_select", "select_max")
BINARY += ("same",)


def _check(cond: bool, op: IRDLOperation, msg: str) -> None:
    if not cond:
        raise TargetVerifyError(f"{op.name}: {msg}", op=op)


@irdl_op_definition
class VZeroOp(IRDLOperation):
    name = "tessera_x86.vzero"
    result = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"


@irdl_op_definition
class VConstantOp(IRDLOperation):
    name = "tessera_x86.vconstant"
    value = attr_def(FloatAttr | IntegerAttr)
    step = opt_attr_def(FloatAttr)   # lane l holds value + l * step
    result = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "`(` $value `)` attr-dict `:` type($result)"


@irdl_op_definition
class VSplatOp(IRDLOperation):
    name = "tessera_x86.vsplat"
    scalar = operand_def()
    result = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "$scalar attr-dict `:` type($scalar) `->` type($result)"


@irdl_op_definition
class VBroadcastOp(IRDLOperation):
    """Load ``group`` consecutive elements at base[offset] and repeat them across the vector."""

    name = "tessera_x86.vbroadcast"
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    group = attr_def(IntegerAttr)
    result = result_def(VectorType)
    assembly_format = "$base `[` $offset `]` attr-dict `:` type($result)"

    def verify_(self) -> None:
        n = self.result.type.get_shape()[0]  # type: ignore[attr-defined]
        _check(ival(self.group) >= 1 and n % ival(self.group) == 0, self, "group must divide the vector width")


@irdl_op_definition
class VLoadOp(IRDLOperation):
    """Load a vector from base[offset]; with ``count``, only the first count lanes (rest 0)."""

    name = "tessera_x86.vload"
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    count = opt_operand_def(IndexType)
    result = result_def(VectorType)
    assembly_format = "$base `[` $offset `]` (`count` $count^)? attr-dict `:` type($result)"


@irdl_op_definition
class VGatherOp(IRDLOperation):
    """Load lane l from base[offset + l * stride] (any stride, 0 included); with ``count``,
    only the first count lanes (rest 0).  Lowered to a masked gather."""

    name = "tessera_x86.vgather"
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    stride = operand_def(IndexType)
    count = opt_operand_def(IndexType)
    result = result_def(VectorType)
    assembly_format = "$base `[` $offset `,` $stride `]` (`count` $count^)? attr-dict `:` type($result)"


@irdl_op_definition
class VStoreOp(IRDLOperation):
    """Store a vector to base[offset]; with ``count``, only the first count lanes.  With the
    ``nontemporal`` unit attribute: a streaming store (vmovntps; the address must be
    aligned to the vector size)."""

    name = "tessera_x86.vstore"
    value = operand_def(VectorType)
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    count = opt_operand_def(IndexType)
    nontemporal = opt_attr_def(UnitAttr)
    assembly_format = "$value `,` $base `[` $offset `]` (`count` $count^)? attr-dict `:` type($value)"


@irdl_op_definition
class AlignedOp(IRDLOperation):
    """Whether the address of base[offset] (elements of ``elem_bytes``) is a multiple of ``bytes``."""

    name = "tessera_x86.aligned"
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    bytes = attr_def(IntegerAttr)
    elem_bytes = attr_def(IntegerAttr)
    result = result_def(IntegerType(1))
    traits = traits_def(Pure())
    assembly_format = "$base `[` $offset `]` attr-dict"


@irdl_op_definition
class BarrierOp(IRDLOperation):
    """All ``nthreads`` threads sharing ``team`` arrive before any continues (a sense-reversing
    barrier on two atomic words at the start of the team buffer; spins with pause, yields)."""

    name = "tessera_x86.barrier"
    team = operand_def(PTR)
    nthreads = operand_def(IndexType)
    assembly_format = "$team `,` $nthreads attr-dict"


TEAM_HEADER = 192   # bytes at the start of the team buffer: barrier count @0, generation @64, work counter @128
WORK_COUNTER = 128
ENTRY_SUFFIX = ".entry"  # <kernel>.entry(args, tid): the kernel as worker threads call it (codegen/x86.py)
# The floating-point mode a kernel's entry sets (codegen/x86.py: add_entry): MXCSR_DEFAULT (round to
# nearest, every exception masked, no FTZ/DAZ) with the caller's FTZ/DAZ bits, or without them on a
# kernel function that carries DETERMINISTIC (lower-tile-to-x86{deterministic=true})
MXCSR_DEFAULT, MXCSR_FTZ, MXCSR_DAZ = 0x1F80, 0x8000, 0x0040
DETERMINISTIC = "deterministic"


@irdl_op_definition
class ClaimOp(IRDLOperation):
    """Atomically add 1 to the team's work counter (an i64 at byte 128); the old value."""

    name = "tessera_x86.claim"
    team = operand_def(PTR)
    result = result_def(IndexType)
    assembly_format = "$team attr-dict"


@irdl_op_definition
class PrefetchOp(IRDLOperation):
    """Fetch the cache line holding base[offset] (``elem_bytes`` elements) into all cache levels
    (prefetcht0); never faults."""

    name = "tessera_x86.prefetch"
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    elem_bytes = attr_def(IntegerAttr)
    assembly_format = "$base `[` $offset `]` attr-dict"


@irdl_op_definition
class SFenceOp(IRDLOperation):
    """Order this thread's streaming stores before anything that follows (sfence)."""

    name = "tessera_x86.sfence"
    assembly_format = "attr-dict"


@irdl_op_definition
class LoadOp(IRDLOperation):
    """Scalar load base[offset]."""

    name = "tessera_x86.load"
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    result = result_def()
    assembly_format = "$base `[` $offset `]` attr-dict `:` type($result)"


@irdl_op_definition
class StoreOp(IRDLOperation):
    name = "tessera_x86.store"
    value = operand_def()
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    assembly_format = "$value `,` $base `[` $offset `]` attr-dict `:` type($value)"


@irdl_op_definition
class VFmaOp(IRDLOperation):
    """``acc + a * b`` lane-wise (vfmadd231ps)."""

    T: ClassVar = VarConstraint("T", base(VectorType))
    name = "tessera_x86.vfma"
    a = operand_def(T)
    b = operand_def(T)
    acc = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$a `,` $b `,` $acc attr-dict `:` type($result)"

    def verify_(self) -> None:
        _check(self.a.type == self.b.type == self.acc.type == self.result.type, self, "operand types differ")


@irdl_op_definition
class VDpbf16psOp(IRDLOperation):
    """``acc[i] += a[2i]*b[2i] + a[2i+1]*b[2i+1]`` on bf16 pairs, f32 accumulate (denormals flushed)."""

    name = "tessera_x86.vdpbf16ps"
    A: ClassVar = VarConstraint("A", base(VectorType))
    C: ClassVar = VarConstraint("C", base(VectorType))
    a = operand_def(A)
    b = operand_def(A)
    acc = operand_def(C)
    result = result_def(C)
    traits = traits_def(Pure())
    assembly_format = "$a `,` $b `,` $acc attr-dict `:` type($a) `,` type($acc)"

    def verify_(self) -> None:
        wa = self.a.type.get_shape()[0]  # type: ignore[attr-defined]
        wc = self.acc.type.get_shape()[0]  # type: ignore[attr-defined]
        _check(self.a.type == self.b.type and wa == 2 * wc and self.result.type == self.acc.type, self,
               "needs bf16 vectors twice as wide as the f32 accumulator")


@irdl_op_definition
class VBinaryOp(IRDLOperation):
    T: ClassVar = VarConstraint("T", base(VectorType))
    name = "tessera_x86.vbinary"
    fn = attr_def(StringAttr)
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$fn $lhs `,` $rhs attr-dict `:` type($result)"

    def verify_(self) -> None:
        _check(self.fn.data in BINARY, self, f"fn {self.fn.data!r}; legal: {', '.join(BINARY)}")


@irdl_op_definition
class VUnaryOp(IRDLOperation):
    T: ClassVar = VarConstraint("T", base(VectorType))
    name = "tessera_x86.vunary"
    fn = attr_def(StringAttr)
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$fn $input attr-dict `:` type($result)"

    def verify_(self) -> None:
        _check(self.fn.data in UNARY, self, f"fn {self.fn.data!r}; legal: {', '.join(UNARY)}")


@irdl_op_definition
class VReduceOp(IRDLOperation):
    """Horizontal reduction; the result holds the reduced value in every lane."""

    T: ClassVar = VarConstraint("T", base(VectorType))
    name = "tessera_x86.vreduce"
    kind = attr_def(StringAttr)
    input = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$kind $input attr-dict `:` type($result)"


@irdl_op_definition
class VCvtOp(IRDLOperation):
    """Convert lane-wise between element types (f32 <-> bf16/f16), round to nearest even."""

    name = "tessera_x86.vcvt"
    input = operand_def(VectorType)
    result = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"


@irdl_op_definition
class VLaneSelectOp(IRDLOperation):
    """Lanes below ``count`` from ``value``, the rest from ``other`` (vblendmps with a lane mask)."""

    name = "tessera_x86.vlaneselect"
    T: ClassVar = VarConstraint("T", base(VectorType))
    value = operand_def(T)
    other = operand_def(T)
    count = operand_def(IndexType)
    result = result_def(T)
    traits = traits_def(Pure())
    assembly_format = "$value `,` $other `count` $count attr-dict `:` type($result)"


@irdl_op_definition
class VTransposeOp(IRDLOperation):
    """Transpose R vectors of W 32-bit units (an R x W block) into R vectors holding the W x R
    block in row-major order: output unit u*R + r = input vector r, unit u (vpermt2ps tree)."""

    name = "tessera_x86.vtranspose"
    inputs = var_operand_def(VectorType)
    outputs = var_result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "$inputs attr-dict `:` type($inputs) `->` type($outputs)"

    def verify_(self) -> None:
        ts = {v.type for v in self.inputs} | {r.type for r in self.outputs}
        _check(len(ts) == 1 and len(self.inputs) == len(self.outputs) >= 1, self,
               "needs as many results as operands, all of one vector type")


@irdl_op_definition
class VInterleaveOp(IRDLOperation):
    """Interleave two vectors lane by lane: [a0, b0, a1, b1, ...] (vpunpcklwd/vpermt2w)."""

    name = "tessera_x86.vinterleave"
    T: ClassVar = VarConstraint("T", base(VectorType))
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"

    def verify_(self) -> None:
        n = self.lhs.type.get_shape()[0]  # type: ignore[attr-defined]
        _check(self.result.type.get_shape()[0] == 2 * n, self, "result must be twice as wide")  # type: ignore[attr-defined]


@irdl_attr_definition
class AmxTileType(ParametrizedAttribute, TypeAttribute):
    """One AMX tile register: 16 rows of 64 bytes (LLVM's ``x86_amx``)."""

    name = "tessera_x86.amx"


AMX_ROWS, AMX_ROW_BYTES = 16, 64
AMX_INSTRS = ("tdpbf16ps",)   # tile products this dialect lowers (each an AMX record's mnemonic)


@irdl_op_definition
class TZeroOp(IRDLOperation):
    name = "tessera_x86.tzero"
    result = result_def(AmxTileType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"


@irdl_op_definition
class TLoadOp(IRDLOperation):
    """Load a tile: 16 rows of 64 bytes at base[offset] (``elem_bytes`` elements), ``stride`` bytes apart."""

    name = "tessera_x86.tload"
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    stride = operand_def(IndexType)
    elem_bytes = attr_def(IntegerAttr)
    result = result_def(AmxTileType)
    assembly_format = "$base `[` $offset `]` `stride` $stride attr-dict `:` type($result)"


@irdl_op_definition
class TStoreOp(IRDLOperation):
    """Store a tile's 16 rows of 64 bytes at base[offset], ``stride`` bytes apart."""

    name = "tessera_x86.tstore"
    value = operand_def(AmxTileType)
    base = operand_def(PTR)
    offset = operand_def(IndexType)
    stride = operand_def(IndexType)
    elem_bytes = attr_def(IntegerAttr)
    assembly_format = "$value `,` $base `[` $offset `]` `stride` $stride attr-dict `:` type($value)"


@irdl_op_definition
class TDpOp(IRDLOperation):
    """``acc + a x b`` on tiles: a is 16 x 64 bytes of rows, b 16 rows of k groups (VNNI)."""

    name = "tessera_x86.tdp"
    instr = attr_def(StringAttr)
    a = operand_def(AmxTileType)
    b = operand_def(AmxTileType)
    acc = operand_def(AmxTileType)
    result = result_def(AmxTileType)
    traits = traits_def(Pure())
    assembly_format = "$instr $a `,` $b `,` $acc attr-dict `:` type($result)"

    def verify_(self) -> None:
        _check(self.instr.data in AMX_INSTRS, self, f"instr {self.instr.data!r}; legal: {', '.join(AMX_INSTRS)}")


@irdl_op_definition
class WorkspaceOp(IRDLOperation):
    """The calling thread's scratch at byte ``offset`` of its workspace slice."""

    name = "tessera_x86.workspace"
    base = operand_def(PTR)
    offset = attr_def(IntegerAttr)
    result = result_def(PTR)
    traits = traits_def(Pure())
    assembly_format = "$base `[` $offset `]` attr-dict"


@irdl_op_definition
class LaunchOp(IRDLOperation):
    """Host program step: call the compiled kernel ``callee`` on whole tensors, its
    ``parallel`` loop split over up to ``threads`` threads."""

    name = "tessera_x86.launch"
    callee = attr_def(FlatSymbolRefAttr)
    args = var_operand_def()
    outs = var_result_def()
    dims = attr_def(ArrayAttr)
    workspace = attr_def(IntegerAttr)
    team = attr_def(IntegerAttr)
    threads = attr_def(IntegerAttr)
    limits = opt_attr_def(ArrayAttr)
    parallel = opt_attr_def(StringAttr)
    inplace = opt_attr_def(ArrayAttr)   # "i:j" from tile.launch: argument i read only at result j's index
    assembly_format = "$callee `(` $args `)` attr-dict `:` functional-type($args, results)"


from tessera.ir.target.x86_elem import VElemOp  # noqa: E402  (typed and integer lanes)

X86 = Dialect(
    "tessera_x86",
    [VZeroOp, VConstantOp, VSplatOp, VBroadcastOp, VLoadOp, VGatherOp, VStoreOp, AlignedOp, SFenceOp, BarrierOp, ClaimOp, PrefetchOp, LoadOp, StoreOp, VFmaOp, VDpbf16psOp,
     VBinaryOp, VUnaryOp, VReduceOp, VCvtOp, VLaneSelectOp, VTransposeOp, VInterleaveOp, TZeroOp, TLoadOp, TStoreOp,
     TDpOp, WorkspaceOp, LaunchOp,
     VElemOp],
    [AmxTileType],
)
