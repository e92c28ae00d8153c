"""Tile IR: the ``tile`` dialect — explicit tiles, memory spaces and typed fragments.

Types
  ``!tile.buffer<elem, space>``       a pointer into one memory space
  ``!tile.view<[R, C], elem, space>`` an R x C window of a buffer (runtime offset, strides
                                      and valid extent; elements past the extent read as 0
                                      and are not written)
  ``!tile.tile<[R, C], elem>``        a value held in registers
  ``!tile.fragment<m, n, k, elem, acc, role, layout, family>``
                                      one operand of a matrix instruction (or of a register
                                      tile of them), typed by its role a / b / acc
  ``!tile.token``                     completion of an asynchronous copy

``tile.mma`` accepts typed fragments only; there is no untyped form.  Verifier
failures raise coded ``Tile*`` errors (see ``tessera.errors``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    FlatSymbolRefAttr,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    StringAttr,
)
from xdsl.ir import Dialect
from xdsl.irdl import (
    IRDLOperation,
    opt_operand_def,
    attr_def,
    irdl_op_definition,
    opt_attr_def,
    operand_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import Pure

from tessera.ir.attrs import ival
from tessera.errors import (
    TileMemorySpaceError,
    TileShapeMismatch,
    TileVerifyError,
)

from tessera.ir.tile_types import (  # noqa: F401  (re-exported: the dialect's public names)
    FAMILIES,
    LAYOUTS,
    ROLES,
    SHARED_SPACES,
    SPACES,
    STAGING_SPACES,
    BufferType,
    FragmentType,
    TileType,
    TokenType,
    ViewType,
    _ints,
    buffer,
    fragment,
    tile_type,
    view_type,
)

# --------------------------------------------------------------------------- memory ops
@irdl_op_definition
class AllocOp(IRDLOperation):
    """A staging buffer of ``size`` elements in a staging memory space, owned by the
    runtime's per-thread workspace (CPU) or the workgroup's LDS / shared memory (GPU)."""

    name = "tile.alloc"
    size = attr_def(IntegerAttr)
    result = result_def(BufferType)
    assembly_format = "attr-dict `:` type($result)"

    def verify_(self) -> None:
        t = self.result.type
        if isinstance(t, BufferType) and t.space.data not in STAGING_SPACES:
            raise TileMemorySpaceError(f"tile.alloc into {t.space.data!r}; staging spaces: "
                                       f"{', '.join(STAGING_SPACES)}", op=self)
        if ival(self.size) <= 0:
            raise TileVerifyError("tile.alloc size must be positive", op=self)


@irdl_op_definition
class ViewOp(IRDLOperation):
    """``%v = tile.view %buf[%offset] strides [%rs, %cs] bounds [%rows, %cols]``.

    Element (i, j) of the view is ``buf[offset + i * rs + j * cs]``; it exists when
    ``i < rows`` and ``j < cols`` (the valid extent, clamped to the view's shape):
    loads of missing elements give 0 and stores skip them.  ``align`` (optional, in
    elements) promises that the offset and the row stride are multiples of it, so a
    lowering may use wide loads; the GPU emulator checks the promise on every access."""

    name = "tile.view"
    source = operand_def(BufferType)
    offset = operand_def(IndexType)
    row_stride = operand_def(IndexType)
    col_stride = operand_def(IndexType)
    rows = operand_def(IndexType)
    cols = operand_def(IndexType)
    align = opt_attr_def(IntegerAttr)  # elements: offset and row stride are multiples of it (generator's promise)
    result = result_def(ViewType)
    traits = traits_def(Pure())
    assembly_format = ("$source `[` $offset `]` `strides` `[` $row_stride `,` $col_stride `]` "
                       "`bounds` `[` $rows `,` $cols `]` attr-dict `:` type($source) `->` type($result)")

    def verify_(self) -> None:
        s, r = self.source.type, self.result.type
        if self.align is not None and ival(self.align) <= 0:
            raise TileVerifyError("tile.view align must be positive", op=self)
        if isinstance(s, BufferType) and isinstance(r, ViewType):
            if s.element_type != r.element_type or s.space != r.space:
                raise TileMemorySpaceError(
                    f"tile.view of {s} cannot have type {r} (element type and space must match)", op=self)


@irdl_op_definition
class AsyncCopyOp(IRDLOperation):
    """Copy a view into a staging buffer, packed as ``layout`` says.

    Layouts: ``row_major`` (all R rows of the view, ``panel`` elements apart, elements
    outside the valid extent written as 0), ``a_panel`` (``panel``-row
    slivers, each stored column by column: the CPU GEMM's packed A), ``b_panel``
    (``panel``-column slivers stored row by row: packed B), with ``kpack`` consecutive
    k elements interleaved (2 for bf16 dot-product instructions).  Edge slivers are
    zero-padded to the full panel, and k to a multiple of ``kblock`` (default ``kpack``:
    AMX packs B in pairs but steps k by 32).  The packed data starts at element ``dest_offset`` of the
    destination.  ``swizzle128`` (NVIDIA sm_90a, for wgmma descriptors): rows of ``panel``
    elements = 128 bytes, in 1024-byte atoms of 8 rows, the 16-byte chunk j of row r stored
    at chunk j XOR (r mod 8) (the PTX ISA's 128-byte swizzle); a view wider than ``panel`` is
    stored as panels of R rows each (panel p at R*panel*p), and a view of such a block
    reaching past ``panel`` columns continues in the next panel.  Returns a token that
    ``tile.wait`` consumes.

    On a GPU a copy into a workgroup-shared space (``lds``/``smem``) is collective: every
    thread of the workgroup executes it and moves its share of the elements."""

    name = "tile.async_copy"
    source = operand_def(ViewType)
    dest = operand_def(BufferType)
    dest_offset = operand_def(IndexType)
    layout = attr_def(StringAttr)
    panel = attr_def(IntegerAttr)
    kpack = attr_def(IntegerAttr)
    kblock = opt_attr_def(IntegerAttr)
    token = result_def(TokenType)
    assembly_format = "$source `,` $dest `[` $dest_offset `]` attr-dict `:` type($source) `,` type($dest)"

    LAYOUTS: ClassVar[tuple[str, ...]] = ("row_major", "a_panel", "b_panel", "swizzle128")

    def verify_(self) -> None:
        d = self.dest.type
        if isinstance(d, BufferType) and d.space.data not in STAGING_SPACES:
            raise TileMemorySpaceError(f"tile.async_copy destination must be a staging space, got {d.space.data!r}",
                                       op=self)
        if self.layout.data not in self.LAYOUTS:
            raise TileVerifyError(f"tile.async_copy layout {self.layout.data!r}; legal: {', '.join(self.LAYOUTS)}",
                                  op=self)
        if ival(self.panel) <= 0 or ival(self.kpack) <= 0:
            raise TileVerifyError("tile.async_copy panel and kpack must be positive", op=self)
        if self.kblock is not None and (ival(self.kblock) <= 0 or ival(self.kblock) % ival(self.kpack)):
            raise TileVerifyError("tile.async_copy kblock must be a positive multiple of kpack", op=self)


@irdl_op_definition
class WaitOp(IRDLOperation):
    """Wait until the copies behind ``tokens`` have landed (for this thread).  ``outstanding``
    (default 0) says how many copies issued after them may still be in flight, so a
    multi-stage pipeline waits only for the oldest stage (``cp.async.wait_group N``)."""

    name = "tile.wait"
    tokens = var_operand_def(TokenType)
    outstanding = opt_attr_def(IntegerAttr)
    assembly_format = "$tokens attr-dict"


@irdl_op_definition
class BarrierOp(IRDLOperation):
    """Every thread of the launch (GPU: of the workgroup) arrives before any continues:
    staging written by some threads becomes visible to all."""

    name = "tile.barrier"
    assembly_format = "attr-dict"


@irdl_op_definition
class ClaimOp(IRDLOperation):
    """``%i = tile.claim``: atomically take the next number from the launch's shared work
    counter (zero when the launch starts; every thread of the launch draws from it).  Work
    handed out this way goes to whichever thread is free, so a slower core does less of it;
    which thread computes an item never changes how the item is computed."""

    name = "tile.claim"
    result = result_def(IndexType)
    assembly_format = "attr-dict"


# --------------------------------------------------------------------------- tile values
@irdl_op_definition
class LoadIndexOp(IRDLOperation):
    """``%i = tile.load_index %buf[%offset]``: one element of an i32 / i64 buffer (a gather's
    index array) as a signed ``index`` value; a kernel then bounds it before addressing with it."""

    name = "tile.load_index"
    source = operand_def(BufferType)
    offset = operand_def(IndexType)
    result = result_def(IndexType)
    traits = traits_def(Pure())
    assembly_format = "$source `[` $offset `]` attr-dict `:` type($source)"

    def verify_(self) -> None:
        e = self.source.type.element_type if isinstance(self.source.type, BufferType) else None
        if not (isinstance(e, IntegerType) and e.width.data in (32, 64)):
            raise TileVerifyError(f"tile.load_index reads an i32 or i64 buffer, not {self.source.type}", op=self)


@irdl_op_definition
class PrefetchOp(IRDLOperation):
    """``tile.prefetch %view``: ask for the memory of the view's first row ahead of its use (a
    hint: no value changes, and an address past the data is harmless).  Row kernels fetch
    a later row while they compute on the cached current one, so memory never idles."""

    name = "tile.prefetch"
    source = operand_def(ViewType)
    assembly_format = "$source attr-dict `:` type($source)"


@irdl_op_definition
class LoadOp(IRDLOperation):
    """Read a view into registers; elements outside the valid extent read as ``pad``
    (0 unless given: a max-reduction pads with -inf)."""

    name = "tile.load"
    source = operand_def(ViewType)
    pad = opt_attr_def(FloatAttr)
    result = result_def(TileType)
    assembly_format = "$source attr-dict `:` type($source) `->` type($result)"

    def verify_(self) -> None:
        v, t = self.source.type, self.result.type
        if isinstance(v, ViewType) and isinstance(t, TileType):
            if v.dims != t.dims:
                raise TileShapeMismatch(f"tile.load of {list(v.dims)} view gives {list(t.dims)} tile", op=self)


@irdl_op_definition
class StoreOp(IRDLOperation):
    """Write a tile to a view (only the valid extent is written); converts element type.

    With ``stream`` (an i1), the store may bypass the caches when it is true (the data
    is large and will not be read again soon): non-temporal stores on x86."""

    name = "tile.store"
    value = operand_def(TileType)
    dest = operand_def(ViewType)
    stream = opt_operand_def(IntegerType(1))
    assembly_format = ("$value `,` $dest (`stream` $stream^)? attr-dict `:` type($value) `,` type($dest)")

    def verify_(self) -> None:
        t, v = self.value.type, self.dest.type
        if isinstance(v, ViewType) and isinstance(t, TileType) and t.dims != v.dims:
            raise TileShapeMismatch(f"tile.store of {list(t.dims)} tile into {list(v.dims)} view", op=self)


@irdl_op_definition
class ConstantOp(IRDLOperation):
    """A tile of one value: a FloatAttr for float tiles, an IntegerAttr for int and bool (i1) ones.
    With ``step`` (float tiles), element (i, j) is ``value + j * step``: column indices for argmax /
    top_k on the CPU lane (the GPU lanes refuse a step)."""

    name = "tile.constant"
    value = attr_def(FloatAttr | IntegerAttr)
    step = opt_attr_def(FloatAttr)
    result = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = "`(` $value `)` attr-dict `:` type($result)"


@irdl_op_definition
class SplatIndexOp(IRDLOperation):
    """An index value (a runtime size) as a [1, 1] float tile."""

    name = "tile.splat_index"
    input = operand_def(IndexType)
    result = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = "$input attr-dict `:` type($result)"


# Elementwise functions.  Unary ones take one operand, binary two, select three.
# exp_bounded: exp for arguments <= 88.7 (or NaN), unspecified above: emitted only for a difference
# from a running maximum (softmax, attention), where the x86 math library drops the overflow clamp.
# exp2_bounded: 2^x for x <= 127, 0 below -126: attention's probabilities with the scores in log2 units
# (beside the row maximum's weight of 1, a probability below 2^-126 moves an output by less than
# 2^-126 times the values it weighs).
# round_f32 / round_bf16 / round_f16: the value rounded (once, to nearest even) to that narrower type
# and widened back exactly: a cast inside a kernel whose registers are wider than its result
# (tensor.cast(x, f32) in an f64 kernel, then more f64 math) keeps numpy's rounding.
ROUND_FNS = ("round_f32", "round_bf16", "round_f16")
# the elementwise math of tessera.ops (round: to the nearest integer, ties to even, as numpy)
MATH_FNS = ('log', 'log1p', 'exp2', 'expm1', 'sin', 'cos', 'sigmoid', 'sign', 'floor', 'ceil', 'round', 'square')
UNARY_FNS = ("neg", "exp", "exp_bounded", "exp2_bounded", "tanh", "erf", "relu", "silu", "gelu_tanh", "gelu_erf", "sqrt", "rsqrt", "recip",
             "copy", "abs", "finite_or_zero") + ROUND_FNS + MATH_FNS
# safe_div: a / b, or 0 where b == 0.  mask_select: a where b != 0, else -inf.  select_max:
# a > b ? a : b (one vmaxps; a NaN in a is dropped, so only for a consumer whose result is NaN
# anyway when an operand was: softmax's row maximum, since the NaN reaches the row's sum).
BINARY_FNS = ("add", "sub", "mul", "div", "max", "min", "safe_div", "mask_select", "select_max")
# same: 1.0 where a == b or both are NaN, else 0.0 (argmax's first match of the row maximum)
BINARY_FNS += ("same",)
ELEMENTWISE_FNS = UNARY_FNS + BINARY_FNS


def broadcast_tile(a: Sequence[int], b: Sequence[int]) -> tuple[int, int] | None:
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)  # type: ignore[return-value]


@irdl_op_definition
class ElementwiseOp(IRDLOperation):
    """Apply ``fn`` elementwise with row/column broadcasting of 1-sized tile dims."""

    name = "tile.elementwise"
    fn = attr_def(StringAttr)
    inputs = var_operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = "$fn $inputs attr-dict `:` functional-type($inputs, results)"

    def verify_(self) -> None:
        fn = self.fn.data
        arity = 1 if fn in UNARY_FNS + TYPED_UNARY_FNS else 2 if fn in BINARY_FNS + TYPED_BINARY_FNS else \
            3 if fn in TYPED_TERNARY_FNS else None
        if arity is None:
            raise TileVerifyError(f"tile.elementwise fn {fn!r}; legal: {', '.join(ELEMENTWISE_FNS)}", op=self)
        if len(self.inputs) != arity:
            raise TileVerifyError(f"tile.elementwise {fn} takes {arity} operand(s), got {len(self.inputs)}", op=self)
        shape: tuple[int, ...] | None = self.inputs[0].type.dims  # type: ignore[attr-defined]
        for v in self.inputs[1:]:
            shape = broadcast_tile(shape, v.type.dims) if shape else None  # type: ignore[attr-defined]
        r = self.result.type
        if shape is None or r.dims != shape:  # type: ignore[attr-defined]
            raise TileShapeMismatch(f"tile.elementwise {fn}: operand shapes "
                                    f"{[list(v.type.dims) for v in self.inputs]} do not give {r}", op=self)  # type: ignore[attr-defined]
        if fn in TYPED_UNARY_FNS + TYPED_BINARY_FNS + TYPED_TERNARY_FNS:
            check_typed_elementwise(self)
        elif any(v.type.element_type != r.element_type for v in self.inputs):  # type: ignore[attr-defined]
            raise TileShapeMismatch(f"tile.elementwise {fn}: element types differ", op=self)


@irdl_op_definition
class MaskOp(IRDLOperation):
    """Keep elements in columns ``< cols`` (and, with ``diag``, in columns ``<= row + diag``: a
    causal edge; with ``side = "ge"``, in columns ``>= row + diag``: the same edge seen in a
    transposed score block); the others become ``pad`` (neutral values for reductions)."""

    name = "tile.mask"
    input = operand_def(TileType)
    cols = operand_def(IndexType)
    diag = opt_operand_def(IndexType)
    pad = attr_def(FloatAttr)
    side = opt_attr_def(StringAttr)
    result = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = ("$input `cols` $cols (`diag` $diag^)? `pad` `(` $pad `)` attr-dict `:` type($input) `->` "
                       "type($result)")

    @property
    def keep_side(self) -> str:
        return self.side.data if self.side is not None else "le"

    def verify_(self) -> None:
        if self.input.type != self.result.type:
            raise TileShapeMismatch("tile.mask keeps the tile type", op=self)
        if self.side is not None and (self.side.data not in ("le", "ge") or self.diag is None):
            raise TileShapeMismatch("tile.mask side is 'le' or 'ge' and needs a diag", op=self)


# select_max: the maximum, a NaN in the tile possibly dropped (one vmaxps per step on x86; a lowering
# may propagate NaN instead): only for a consumer whose result is NaN anyway when an element was
REDUCE_KINDS = ("add", "max", "select_max")
REDUCE_KINDS += ("mul",)   # reduce_prod
REDUCE_KINDS += ("min",)   # argmin's row minimum, any


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """Reduce a tile along ``axis`` (0: rows -> [1, C], 1: columns -> [R, 1])."""

    name = "tile.reduce"
    kind = attr_def(StringAttr)
    axis = attr_def(IntegerAttr)
    input = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = "$kind $input attr-dict `:` type($input) `->` type($result)"

    def verify_(self) -> None:
        if self.kind.data not in REDUCE_KINDS:
            raise TileVerifyError(f"tile.reduce kind {self.kind.data!r}; legal: {', '.join(REDUCE_KINDS)}", op=self)
        if ival(self.axis) not in (0, 1):
            raise TileVerifyError("tile.reduce axis must be 0 or 1", op=self)
        r, c = self.input.type.dims  # type: ignore[attr-defined]
        want = (1, c) if ival(self.axis) == 0 else (r, 1)
        if self.result.type.dims != want:  # type: ignore[attr-defined]
            raise TileShapeMismatch(f"tile.reduce over axis {ival(self.axis)} of [{r}, {c}] gives {list(want)}",
                                    op=self)


SCAN_KINDS = ("add", "mul")


@irdl_op_definition
class ScanOp(IRDLOperation):
    """GPU row kernels: the inclusive running sum (product) of a ``[1, C]`` chunk of a row after
    ``carry`` (``[1, 1]``: the fold of the row's earlier chunks); ``total`` is carry folded with the
    whole chunk (the next chunk's carry).  The fold order is the lowering's (per thread, then across
    the wave and the waves), not numpy's left-to-right one."""

    name = "tile.scan"
    kind = attr_def(StringAttr)
    input = operand_def(TileType)
    carry = operand_def(TileType)
    result = result_def(TileType)
    total = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = "$kind $input `,` $carry attr-dict `:` type($input) `,` type($carry) `->` type($result) `,` " \
                      "type($total)"

    def verify_(self) -> None:
        if self.kind.data not in SCAN_KINDS:
            raise TileVerifyError(f"tile.scan kind {self.kind.data!r}; legal: {', '.join(SCAN_KINDS)}", op=self)
        r, c = self.input.type.dims  # type: ignore[attr-defined]
        if r != 1 or self.result.type != self.input.type or self.carry.type.dims != (1, 1) or \
                self.total.type != self.carry.type:  # type: ignore[attr-defined]
            raise TileShapeMismatch(f"tile.scan scans a [1, C] tile after a [1, 1] carry (got [{r}, {c}])", op=self)


# --------------------------------------------------------------------------- GPU work distribution
@irdl_op_definition
class ProgramIdOp(IRDLOperation):
    """GPU: the index of this workgroup (thread block) along grid ``axis`` (0, 1, 2)."""

    name = "tile.program_id"
    axis = attr_def(IntegerAttr)
    result = result_def(IndexType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"

    def verify_(self) -> None:
        if ival(self.axis) not in (0, 1, 2):
            raise TileVerifyError("tile.program_id axis must be 0, 1 or 2", op=self)


@irdl_op_definition
class WaveIdOp(IRDLOperation):
    """GPU: which wave (NVIDIA: warp) of the workgroup executes this code.  Tile IR on a GPU
    is written per wave: fragments live in one wave's registers."""

    name = "tile.wave_id"
    result = result_def(IndexType)
    traits = traits_def(Pure())
    assembly_format = "attr-dict `:` type($result)"


# --------------------------------------------------------------------------- host level
@irdl_op_definition
class LaunchOp(IRDLOperation):
    """Host program step: run kernel ``callee`` on whole tensors.

    ``dims`` lists the symbolic sizes passed to the kernel (evaluated by the runtime
    from the bound symbols); ``workspace`` is the per-thread scratch in bytes and ``team``
    the scratch shared by the launch's threads (GPU: shared memory per workgroup);
    ``grid`` and ``block`` give a GPU launch's workgroups and threads per workgroup."""

    name = "tile.launch"
    callee = attr_def(FlatSymbolRefAttr)
    args = var_operand_def()
    outs = var_result_def()
    dims = attr_def(ArrayAttr)
    workspace = attr_def(IntegerAttr)
    team = opt_attr_def(IntegerAttr)
    limits = opt_attr_def(ArrayAttr)  # "expr<=n" bounds the runtime checks before the call
    parallel = opt_attr_def(StringAttr)
    grid = opt_attr_def(ArrayAttr)     # GPU: workgroups along x, y, z (symbolic size expressions)
    block = opt_attr_def(IntegerAttr)  # GPU: threads per workgroup
    # "i:j": the kernel reads argument i only at the element it writes result j (the host program
    # may write j into i's buffer when the caller donated it: runtime/cpu.py)
    inplace = opt_attr_def(ArrayAttr)
    assembly_format = "$callee `(` $args `)` attr-dict `:` functional-type($args, results)"


# Elementwise functions whose operand and result element types may differ, or that take int
# (i8/i32/i64) and bool (i1) tiles: int and bool tiles hold their own type in registers (a float
# tile holds the kernel's register type, f32 or f64).  Rules (check_typed_elementwise):
#   cvt            any -> any (numpy's astype; float -> int truncates and saturates, NaN -> 0)
#   cmp_*          T, T -> i1 (IEEE: NaN compares unequal, and false for every ordered predicate)
#   select         i1, T, T -> T
#   isnan/isinf/isfinite   float -> i1
#   not / and / or / xor   i1 or int (bitwise), one type;  shl / shr   int
#   floordiv / mod / pow   one type (numpy's floor division and modulo; pow on floats)
#   iadd ... the ints' add/sub/mul/max/min/neg/abs are the float names on int tiles
CMP_FNS = ("cmp_eq", "cmp_ne", "cmp_lt", "cmp_le", "cmp_gt", "cmp_ge")
TYPED_UNARY_FNS = ("cvt", "not", "isnan", "isinf", "isfinite")
TYPED_BINARY_FNS = CMP_FNS + ("and", "or", "xor", "shl", "shr", "floordiv", "mod", "pow")
TYPED_TERNARY_FNS = ("select",)


def check_typed_elementwise(op) -> None:
    fn = op.fn.data
    ins = [v.type.element_type for v in op.inputs]
    r = op.result.type.element_type

    def bad(why: str):
        raise TileShapeMismatch(f"tile.elementwise {fn}: {why} (operands {', '.join(map(str, ins))} -> {r})",
                                op=op)

    def is_i1(e) -> bool:
        return isinstance(e, IntegerType) and e.width.data == 1
    if fn == "cvt":
        return
    if fn in CMP_FNS or fn in ("isnan", "isinf", "isfinite"):
        if not is_i1(r) or len(set(ins)) != 1:
            bad("compares operands of one type into an i1 tile")
        if fn in ("isnan", "isinf", "isfinite") and isinstance(ins[0], IntegerType):
            bad("takes a float tile")
        return
    if fn == "select":
        if not is_i1(ins[0]) or ins[1] != r or ins[2] != r:
            bad("takes an i1 condition and two values of the result's type")
        return
    if any(e != r for e in ins):
        bad("element types differ")
    if fn in ("not", "and", "or", "xor", "shl", "shr") and not isinstance(r, IntegerType):
        bad("takes int or bool tiles")
    if fn in ("shl", "shr") and is_i1(r):
        bad("takes int tiles")


from tessera.ir.tile_fragment import FragmentPackOp, FragmentUnpackOp, FragmentZeroOp, MmaOp  # noqa: E402


@irdl_op_definition
class IndexOp(IRDLOperation):
    """A tile of indices: element (i, j) = base + i * row_step + j * col_step, in the result's
    element type (int, or the float registers): the loop coordinates an ``iota`` reads."""

    name = "tile.index"
    base = operand_def(IndexType)
    row_step = attr_def(IntegerAttr)
    col_step = attr_def(IntegerAttr)
    result = result_def(TileType)
    traits = traits_def(Pure())
    assembly_format = "$base attr-dict `:` type($result)"

    def verify_(self) -> None:
        if ival(self.row_step) not in (0, 1) or ival(self.col_step) not in (0, 1):
            raise TileVerifyError("tile.index steps are 0 or 1", op=self)


from tessera.ir.tile_bulk import BULK_OPS, BulkCopyOp, BulkExpectOp, BulkInitOp, BulkWaitOp  # noqa: E402,F401

Tile = Dialect(
    "tile",
    [IndexOp, *BULK_OPS,
     AllocOp, ViewOp, AsyncCopyOp, WaitOp, BarrierOp, ClaimOp, PrefetchOp, FragmentZeroOp, FragmentPackOp, MmaOp, FragmentUnpackOp, LoadOp,
     StoreOp, ConstantOp, SplatIndexOp, ElementwiseOp, MaskOp, ReduceOp, ScanOp, ProgramIdOp, WaveIdOp, LaunchOp,
     LoadIndexOp],
    [BufferType, ViewType, TileType, FragmentType, TokenType],
)
