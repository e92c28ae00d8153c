"""Shared pieces of the schedule -> tile kernel generators.

Kernel ABI (Tile IR, every target): a kernel function takes

  1. one ``!tile.buffer<elem, global>`` per input tensor of the schedule.kernel,
     then one per output, in order;
  2. one ``index`` per entry of the launch's ``dims`` list — sizes and strides as
     symbolic expressions the runtime evaluates from the bound symbols;
  3. ``tid: index, nthreads: index`` — this thread and how many share the work;
  4. ``ws: !tile.buffer<i8, workspace>`` — this thread's scratch; ``tile.alloc``
     carves per-thread staging buffers from it (``workspace`` bytes on the launch);
  5. ``team: !tile.buffer<i8, team>`` — scratch shared by the launch's threads (its
     first 128 bytes are the barrier's); ``tile.alloc`` in space ``team`` carves from it.

A GPU kernel (``KernelSig(gpu=True)``) takes only 1 and 2: which workgroup and wave
runs comes from ``tile.program_id`` / ``tile.wave_id``, and ``tile.alloc`` in ``lds`` /
``smem`` is the workgroup's shared memory.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, IntegerType, StringAttr, f32
from xdsl.ir import Attribute, Block, BlockArgument, Region, SSAValue

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ints
from tessera.ir.builder import INDEX, Builder
from tessera.ir.strided import StridedView, row_major_strides
from tessera.passes.util import view_through_all

WS_TYPE = t.buffer(IntegerType(8), "workspace")
TEAM_TYPE = t.buffer(IntegerType(8), "team")
ALIGN = 64


@dataclass
class KernelSig:
    """Collects a kernel's parameters, then builds its function and entry builder."""

    name: str
    buffers: list[Attribute] = field(default_factory=list)
    dims: list[D.Dim] = field(default_factory=list)
    _dim_index: dict[D.Dim, int] = field(default_factory=dict)
    workspace: int = 0
    allocs: list[tuple[int, int]] = field(default_factory=list)
    gpu: bool = False
    reg: Attribute = f32   # the element type of the kernel's register tiles (f64 for float64 kernels)

    def buffer(self, elem: Attribute) -> int:
        self.buffers.append(t.buffer(elem, "global"))
        return len(self.buffers) - 1

    def dim(self, expr: D.Dim) -> D.Dim:
        """Register a symbolic size; static ints stay constants."""
        expr = D.canon(expr)
        if not isinstance(expr, int) and expr not in self._dim_index:
            self._dim_index[expr] = len(self.dims)
            self.dims.append(expr)
        return expr

    def build(self) -> "KernelFn":
        tail = [] if self.gpu else [INDEX, INDEX, WS_TYPE, TEAM_TYPE]
        arg_types = self.buffers + [INDEX] * len(self.dims) + tail
        block = Block(arg_types=arg_types)
        fn = func.FuncOp(self.name, (arg_types, []), Region(block))
        return KernelFn(self, fn, block)


@dataclass
class KernelFn:
    sig: KernelSig
    fn: func.FuncOp
    block: Block

    def __post_init__(self) -> None:
        self.b = Builder(self.block)
        nb = len(self.sig.buffers)
        self.buffer_args = list(self.block.args[:nb])
        self.dim_args = {e: self.block.args[nb + i] for e, i in self.sig._dim_index.items()}
        if self.sig.gpu:
            self.tid = self.nthreads = self.ws = self.team = None
            return
        self.tid = self.block.args[nb + len(self.sig.dims)]
        self.nthreads = self.block.args[nb + len(self.sig.dims) + 1]
        self.ws = self.block.args[-2]
        self.team = self.block.args[-1]

    @property
    def reg(self) -> Attribute:
        """The element type the kernel computes in (``register_elem`` of its schedule.kernel)."""
        return self.sig.reg

    def size(self, expr: D.Dim) -> SSAValue | int:
        expr = D.canon(expr)
        if isinstance(expr, int):
            return expr
        if expr in self.dim_args:
            return self.dim_args[expr]
        raise KeyError(f"dimension {expr} was not registered on kernel {self.sig.name}")

    def view_offset(self, b: Builder, view: StridedView) -> SSAValue | int:
        """Elements from the buffer's start to ``view``'s first: its offset terms summed (a slice's
        window start; 0 for a whole tensor).  Each term was registered with ``KernelSig.dim``."""
        off: SSAValue | int = 0
        for term in view.offset:
            off = b.add(off, self.size(term))
        return off

    def alloc(self, b: Builder, elems: int, elem: Attribute, space: str) -> SSAValue:
        op = t.AllocOp.create(attributes={"size": i64_attr(elems)}, result_types=[t.buffer(elem, space)])
        b.op(op)
        return op.result

    def finish(self) -> func.FuncOp:
        self.block.add_op(func.ReturnOp())
        return self.fn


def trace_view(value: SSAValue, block: Block) -> StridedView | None:
    """Follow reshape/transpose ops from ``value`` back to a block argument."""
    if isinstance(value.owner, g.ConvPatchesOp):   # only read directly, from a kernel input
        return patches_view(value.owner, block)
    chain = []
    v = value
    while not (isinstance(v, BlockArgument) and v.block is block):
        op = v.owner
        if isinstance(op, (g.ReshapeOp, g.TransposeOp, g.SliceOp)):
            chain.append(op)
            v = op.input
        else:
            return None
    return view_through_all(StridedView.contiguous(v.index, v.type.dims), reversed(chain))  # type: ignore[attr-defined]


def patches_view(op, block: Block) -> StridedView | None:
    """The implicit-GEMM view of ``tessera.conv_patches`` over a contiguous NHWC kernel input."""
    src = op.input
    if not (isinstance(src, BlockArgument) and src.block is block):
        return None
    _, H, W, C = src.type.dims
    (kh, kw), (sh, sw), (dh, dw), (c0, cg) = (ints(a) for a in (op.kernel, op.stride, op.dilation, op.channels))
    n, ho, wo, k = op.result.type.dims
    return StridedView(src.index, (n, ho, wo, k), (H * W * C, sh * W * C, sw * C, 1), (c0,) if c0 else (),
                       (kw, cg, dh * W * C, dw * C))


def scalar_constant(op) -> float | int | None:
    """The value of a one-element constant: a float, or an int for an int / bool constant."""
    if isinstance(op, g.ConstantOp):
        vals = op.value.get_values()  # type: ignore[attr-defined]
        if len(vals) == 1:
            if isinstance(op.result.type.element_type, IntegerType):
                return int(vals[0]) if op.result.type.element_type.width.data > 1 else int(vals[0] != 0)
            return float(vals[0])
    return None


def reg_elem(elem: Attribute, reg: Attribute) -> Attribute:
    """The element type of a register tile holding values of ``elem``: int / bool (i1) tiles keep
    their type; float ones take the kernel's register type ``reg``."""
    return elem if isinstance(elem, IntegerType) else reg


def tile_const(b: Builder, value: float, elem: Attribute = f32) -> SSAValue:
    attr = IntegerAttr(int(value), elem) if isinstance(elem, IntegerType) else FloatAttr(value, elem)
    op = t.ConstantOp.create(attributes={"value": attr}, result_types=[t.tile_type(1, 1, elem)])
    b.op(op)
    return op.result


def splat_row(b: Builder, n: int, value: float, elem: Attribute = f32) -> SSAValue:
    """A [1, n] tile of ``value`` (a zero row plus the scalar) in registers of ``elem``."""
    z = t.ConstantOp.create(attributes={"value": FloatAttr(0.0, elem)}, result_types=[t.tile_type(1, n, elem)])
    b.op(z)
    return elementwise(b, "add", [z.result, tile_const(b, value, elem)])


def mask_cols(b: Builder, x: SSAValue, cols, pad: float) -> SSAValue:
    """``x`` with its columns from ``cols`` on replaced by ``pad``."""
    op = t.MaskOp.create(operands=[x, b.c(cols)], attributes={"pad": FloatAttr(pad, f32)}, result_types=[x.type])
    b.op(op)
    return op.result


def elementwise(b: Builder, fn: str, operands: Sequence[SSAValue]) -> SSAValue:
    shape = operands[0].type.dims  # type: ignore[attr-defined]
    for o in operands[1:]:
        shape = t.broadcast_tile(shape, o.type.dims)  # type: ignore[attr-defined]
    elem = operands[0].type.element_type  # type: ignore[attr-defined]
    op = t.ElementwiseOp.create(operands=list(operands), attributes={"fn": t.StringAttr(fn)},
                                result_types=[t.tile_type(shape[0], shape[1], elem)])
    b.op(op)
    return op.result


def illegal(kernel: str, what: str) -> ScheduleIllegalError:
    return ScheduleIllegalError(f"schedule.kernel @{kernel}: {what}")


def gpu_ids(b: Builder) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
    """A GPU kernel's ``tile.program_id`` on axes 0, 1, 2 and its ``tile.wave_id``."""
    ids = [b.op(t.ProgramIdOp.create(result_types=[INDEX], attributes={"axis": i64_attr(a)})).results[0]
           for a in range(3)]
    return ids[0], ids[1], ids[2], b.op(t.WaveIdOp.create(result_types=[INDEX])).results[0]


def for_claimed(b: Builder, base, count, body) -> None:
    """Run ``body(builder, item)`` for items 0..count-1 of one phase, each on whichever thread
    claims it from the team's work counter (``tile.claim``).  Every thread claims until it
    draws a number past the phase, so each overshoots exactly once: a phase that starts at
    ``base`` leaves the counter at ``base + count + nthreads`` (the next phase's base)."""
    def attempt(ba: Builder, _i, carried):
        def take(bt: Builder):
            item = bt.sub(bt.op(t.ClaimOp.create(result_types=[INDEX])).result, base)
            ok = bt.cmp("slt", item, count)
            bt.if_(ok, lambda bw: body(bw, item))
            return [bt.select(ok, bt.c(0), bt.c(1))]

        return [ba.if_(ba.cmp("eq", carried[0], 0), take, lambda bs: [bs.c(1)], [INDEX])[0]]

    b.for_(0, b.add(count, 1), 1, attempt, [b.c(0)])


def claimed_phase_base(b: Builder, kf: KernelFn, phase, count):
    """Where phase number ``phase`` (0, 1, ... in order, every thread walking every phase)
    starts on the work counter when each phase hands out ``count`` items."""
    return b.mul(phase, b.add(count, kf.nthreads))


def pack_now(b: Builder, src, dst, layout: str, panel: int, kpack: int = 1) -> None:
    """Pack ``src`` into ``dst`` (``tile.async_copy`` with ``layout``) and wait for it."""
    tok = t.AsyncCopyOp.create(operands=[src, dst, b.c(0)], attributes={
        "layout": StringAttr(layout), "panel": i64_attr(panel), "kpack": i64_attr(kpack)},
        result_types=[t.TokenType()])
    b.op(tok)
    b.op(t.WaitOp.create(operands=[tok.token]))


def column_strips(b: Builder, nc, width: int, nr: int, cn: int, strip, first_nrv: int = 1) -> None:
    """``strip(b, jr, nrv)`` over ``nc`` columns: full ``width``-wide strips of ``nr`` vectors, then
    one remainder strip of the fewest vectors (``cn`` columns each, trying ``first_nrv`` up) that
    cover the rest (a remainder tile, not a masked full one: 513 columns do 16.03 strips of work)."""
    nfull = b.mul(b.div(nc, width), width)
    b.for_(0, nfull, width, lambda bj, jr, _c: strip(bj, jr, nr))
    rem = b.sub(nc, nfull)

    def remainder(bj: Builder, nrv: int):
        if nrv == nr:
            strip(bj, nfull, nr)
            return []
        bj.if_(bj.cmp("sle", rem, nrv * cn), lambda b3: strip(b3, nfull, nrv), lambda b3: remainder(b3, nrv + 1))
        return []

    b.if_(b.cmp("sgt", rem, 0), lambda b3: remainder(b3, first_nrv))


def single_op(kop, classes, holds: str):
    """The one op of ``classes`` a gather-like kernel holds (beside reshapes of its operands),
    yielding its result; else ``SCHEDULE_ILLEGAL`` saying what such a kernel ``holds``."""
    block = kop.body.block
    ops = [op for op in block.ops if not isinstance(op, (g.YieldOp, g.ReshapeOp))]
    if len(ops) != 1 or not isinstance(ops[0], classes) or list(block.last_op.operands) != [ops[0].result]:
        raise ScheduleIllegalError(f"kernel {kop.sym_name.data}: {holds} (and reshapes of its operands) and "
                                   "yields its result")
    return ops[0]
