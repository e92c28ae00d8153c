"""Target IR shared by the GPU lanes: the ``tessera_gpu`` dialect (per-thread SIMT ops).

A GPU kernel at Target IR is the program of ONE thread (``tessera_gpu.thread_id`` says
which) written with these ops plus ``arith``/``scf``/``func``; the wave- or warp-wide
matrix instructions come from the target's own dialect (``tessera_rocm.wmma/mfma``,
``tessera_nvidia.mma_sync/ldmatrix/cp_async``).  Both GPU lanes share this dialect and
its translation (``tessera.codegen.gpu``) and the emulator (``tessera.emulate``); a
target adds only its matrix and copy instructions.

Pointers are ``!tile.buffer<elem, space>`` values (``global``; ``lds``/``smem`` for
workgroup-shared memory) indexed in elements.

  thread_id     this thread's index in its workgroup (1-D workgroups)
  block_id      this workgroup's index along grid axis 0/1/2
  shared        a buffer at byte ``offset`` of the workgroup's shared memory
  load / store  one element, or N consecutive ones as ``vector<N x elem>``; ``align`` (bytes)
                is what the address is promised to be a multiple of
  barrier       workgroup barrier; shared and global memory written before it are
                visible to the workgroup after it
  pack          scalars -> ``vector<N x elem>``     extract   one element of a vector
  convert       float <-> float (f32, f16, bf16), elementwise on vectors
  math          ``fn`` on f32 scalars or vectors (the ``tile.elementwise`` functions); typed lanes: the
                typed functions (``cvt``, ``cmp_*``, ``select``, ``and/or/xor/not``, ``shl/shr``,
                ``floordiv/mod``, ``isnan/isinf/isfinite``) and add/sub/mul/max/min/neg/abs on int32/int64
                lanes, bools as ``i1`` (one byte in memory: loads compare with 0, stores widen)
  shuffle_xor   the f32 value of lane ``lane ^ mask`` of this thread's wave (every lane of the wave
                takes part: a butterfly step of a wave-wide reduction)
  launch        host program step: run kernel ``callee`` on a grid of workgroups
"""
from __future__ import annotations

from xdsl.dialects.builtin import (
    ArrayAttr,
    IntegerType,
    BFloat16Type,
    FlatSymbolRefAttr,
    Float16Type,
    Float32Type,
    IndexType,
    IntegerAttr,
    StringAttr,
    VectorType,
)
from xdsl.ir import Attribute, Dialect
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import Pure

from tessera.errors import TargetVerifyError
from tessera.ir.attrs import ival
from tessera.ir.tile import (
    BINARY_FNS,
    TYPED_BINARY_FNS,
    TYPED_TERNARY_FNS,
    TYPED_UNARY_FNS,
    UNARY_FNS,
    BufferType,
    check_typed_elementwise,
)

# the typed functions the GPU lanes lower (float ``pow`` too: the CPU lane's f64-lane translation,
# codegen/x86_pow.py, reused by codegen/gpu_typed.py)
GPU_TYPED_FNS = TYPED_UNARY_FNS + TYPED_BINARY_FNS + TYPED_TERNARY_FNS
GPU_INT_FNS = ("add", "sub", "mul", "max", "min", "neg", "abs")   # float names on int lanes

FLOATS = (Float32Type, Float16Type, BFloat16Type)
SHARED_SPACES = ("lds", "smem")


def element_of(t: Attribute) -> Attribute:
    return t.element_type if isinstance(t, VectorType) else t


def lanes_of(t: Attribute) -> int:
    return t.get_shape()[0] if isinstance(t, VectorType) else 1


def _bad(op, msg: str) -> TargetVerifyError:
    return TargetVerifyError(f"{op.name}: {msg}", op=op)


@irdl_op_definition
class ThreadIdOp(IRDLOperation):
    name = "tessera_gpu.thread_id"
    result = result_def(IndexType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"


@irdl_op_definition
class BlockIdOp(IRDLOperation):
    name = "tessera_gpu.block_id"
    axis = attr_def(IntegerAttr)
    result = result_def(IndexType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"

    def verify_(self) -> None:
        if ival(self.axis) not in (0, 1, 2):
            raise _bad(self, "axis must be 0, 1 or 2")


@irdl_op_definition
class SharedOp(IRDLOperation):
    name = "tessera_gpu.shared"
    offset = attr_def(IntegerAttr)   # bytes from the start of the workgroup's shared memory
    size = attr_def(IntegerAttr)     # elements
    result = result_def(BufferType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"

    def verify_(self) -> None:
        t = self.result.type
        if isinstance(t, BufferType) and t.space.data not in SHARED_SPACES:
            raise _bad(self, f"shared memory is space lds or smem, not {t.space.data}")
        if ival(self.offset) < 0 or ival(self.size) <= 0:
            raise _bad(self, "offset must be >= 0 and size > 0")


def _check_access(op, buf: Attribute, value: Attribute, align: int) -> None:
    if not isinstance(buf, BufferType):
        raise _bad(op, f"base must be a !tile.buffer, got {buf}")
    if element_of(value) != buf.element_type:
        raise _bad(op, f"value element {element_of(value)} differs from the buffer's {buf.element_type}")
    if align <= 0 or align & (align - 1):
        raise _bad(op, f"align {align} must be a positive power of two")


@irdl_op_definition
class LoadOp(IRDLOperation):
    name = "tessera_gpu.load"
    base = operand_def(BufferType)
    index = operand_def(IndexType)
    align = attr_def(IntegerAttr)
    result = result_def()
    assembly_format = "$base `[` $index `]` attr-dict `:` type($base) `->` type($result)"

    def verify_(self) -> None:
        _check_access(self, self.base.type, self.result.type, ival(self.align))


@irdl_op_definition
class StoreOp(IRDLOperation):
    name = "tessera_gpu.store"
    value = operand_def()
    base = operand_def(BufferType)
    index = operand_def(IndexType)
    align = attr_def(IntegerAttr)
    assembly_format = "$value `,` $base `[` $index `]` attr-dict `:` type($value) `,` type($base)"

    def verify_(self) -> None:
        _check_access(self, self.base.type, self.value.type, ival(self.align))


@irdl_op_definition
class BarrierOp(IRDLOperation):
    name = "tessera_gpu.barrier"
    assembly_format = "attr-dict"


@irdl_op_definition
class PackOp(IRDLOperation):
    name = "tessera_gpu.pack"
    elements = var_operand_def()
    result = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "$elements attr-dict `:` type($elements) `->` type($result)"

    def verify_(self) -> None:
        t = self.result.type
        if len(self.elements) != lanes_of(t) or any(e.type != t.element_type for e in self.elements):
            raise _bad(self, f"{len(self.elements)} operands do not build {t}")


@irdl_op_definition
class ExtractOp(IRDLOperation):
    name = "tessera_gpu.extract"
    vector = operand_def(VectorType)
    position = attr_def(IntegerAttr)
    result = result_def()
    traits = traits_def(Pure())
    assembly_format = "$vector `[` $position `]` attr-dict `:` type($vector) `->` type($result)"

    def verify_(self) -> None:
        t = self.vector.type
        if not 0 <= ival(self.position) < lanes_of(t) or self.result.type != t.element_type:
            raise _bad(self, f"cannot extract element {ival(self.position)} of {t} as {self.result.type}")


@irdl_op_definition
class ConvertOp(IRDLOperation):
    name = "tessera_gpu.convert"
    input = operand_def()
    result = result_def()
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def verify_(self) -> None:
        a, r = self.input.type, self.result.type
        src_ok = isinstance(element_of(a), FLOATS) or element_of(a) == IntegerType(1)   # bool masks -> 0.0 / 1.0
        src_ok = src_ok or isinstance(a, IndexType)     # a row length as a float (a mean's divisor)
        if lanes_of(a) != lanes_of(r) or not src_ok or not isinstance(element_of(r), FLOATS):
            raise _bad(self, f"converts floats (or bools to floats) of one shape: {a} -> {r}")


@irdl_op_definition
class MathOp(IRDLOperation):
    name = "tessera_gpu.math"
    fn = attr_def(StringAttr)
    inputs = var_operand_def()
    result = result_def()
    traits = traits_def(Pure())
    assembly_format = "$fn $inputs attr-dict `:` functional-type($inputs, results)"

    def is_typed(self) -> bool:
        """A typed lane-wise function (int / bool lanes, or operand and result types that differ)."""
        return self.fn.data in GPU_TYPED_FNS or any(isinstance(element_of(v.type), IntegerType)
                                                    for v in list(self.inputs) + [self.result])

    def verify_(self) -> None:
        fn = self.fn.data
        if self.is_typed():
            return self._verify_typed()
        arity = 1 if fn in UNARY_FNS else 2 if fn in BINARY_FNS else None
        if arity is None or len(self.inputs) != arity:
            raise _bad(self, f"fn {fn!r} with {len(self.inputs)} operand(s); unary: {', '.join(UNARY_FNS)}; "
                             f"binary: {', '.join(BINARY_FNS)}")
        if any(v.type != self.result.type for v in self.inputs) or \
                not isinstance(element_of(self.result.type), Float32Type):
            raise _bad(self, "operands and result must be the same f32 scalar or vector type")

    def _verify_typed(self) -> None:
        fn = self.fn.data
        arity = (1 if fn in TYPED_UNARY_FNS or fn in ("neg", "abs") else 3 if fn in TYPED_TERNARY_FNS
                 else 2 if fn in TYPED_BINARY_FNS or fn in GPU_INT_FNS else None)
        if fn not in GPU_TYPED_FNS + GPU_INT_FNS or len(self.inputs) != arity:
            raise _bad(self, f"typed fn {fn!r} with {len(self.inputs)} operand(s); legal: "
                             f"{', '.join(GPU_TYPED_FNS + GPU_INT_FNS)}")
        types = [v.type for v in self.inputs] + [self.result.type]
        if len({lanes_of(ty) for ty in types}) != 1:
            raise _bad(self, f"{fn}: operands and result differ in lanes")
        elems = [element_of(ty) for ty in types]
        for e in elems:
            if not (isinstance(e, Float32Type) or (isinstance(e, IntegerType) and e.width.data in (1, 8, 32, 64))):
                raise _bad(self, f"{fn}: lanes of {e}; the GPU registers hold f32, i1, i8, i32 or i64")
        if fn in GPU_INT_FNS and len(set(elems)) != 1:
            raise _bad(self, f"{fn}: operands and result must share one int type")

        class _View:        # the Tile IR rules, on this op's element types
            def __init__(self, e):
                self.type = type("T", (), {"element_type": e})()
        shim = type("Op", (), {})()
        shim.fn, shim.inputs, shim.result = self.fn, [_View(e) for e in elems[:-1]], _View(elems[-1])
        try:
            check_typed_elementwise(shim)
        except Exception as e:        # TileShapeMismatch, reworded as this op's error
            raise _bad(self, str(getattr(e, "message", e))) from None


@irdl_op_definition
class LaunchOp(IRDLOperation):
    """Host program step: kernel ``callee`` over ``grid`` workgroups (``"D/b"``: ceil(D / b))
    of ``block`` threads with ``shared`` bytes of shared memory; ``dims`` are the size
    arguments after the buffers (symbolic expressions the runtime evaluates)."""

    name = "tessera_gpu.launch"
    callee = attr_def(FlatSymbolRefAttr)
    args = var_operand_def()
    outs = var_result_def()
    dims = attr_def(ArrayAttr)
    grid = attr_def(ArrayAttr)
    block = attr_def(IntegerAttr)
    shared = attr_def(IntegerAttr)
    assembly_format = "$callee `(` $args `)` attr-dict `:` functional-type($args, results)"


@irdl_op_definition
class ShuffleXorOp(IRDLOperation):
    """``result`` = ``value`` as lane ``lane ^ mask`` of this wave holds it (``mask`` < the wave size);
    every lane of the wave must reach it (NVIDIA ``shfl.sync.bfly``, AMD ``ds_bpermute``)."""

    name = "tessera_gpu.shuffle_xor"
    value = operand_def(Float32Type)
    mask = attr_def(IntegerAttr)
    width = attr_def(IntegerAttr)     # the wave size the kernel is laid out for
    result = result_def(Float32Type)
    assembly_format = "$value attr-dict `:` type($value) `->` type($result)"

    def verify_(self) -> None:
        m, w = ival(self.mask), ival(self.width)
        if w not in (32, 64) or not 0 < m < w:
            raise _bad(self, f"mask {m} must be in 1..{w - 1} of a wave of 32 or 64 lanes")


GPU = Dialect("tessera_gpu", [ThreadIdOp, BlockIdOp, SharedOp, LoadOp, StoreOp, BarrierOp, PackOp, ExtractOp,
                              ConvertOp, MathOp, LaunchOp,
                              ShuffleXorOp], [])
