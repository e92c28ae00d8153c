"""Typed values in the GPU SIMT lowering (int32 / int64 lanes, bools as ``i1``): the typed
``tessera_gpu.math`` ops a ``tile.elementwise`` becomes, the refusal of what has no GPU form, and
``tile.load_index`` (a gather's index as an ``index`` value)."""
from __future__ import annotations

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr, IntegerType, StringAttr
from xdsl.ir import Attribute, SSAValue

from tessera.errors import CodegenError
from tessera.ir import tile as t
from tessera.ir.builder import INDEX, Builder
from tessera.ir.target import gpu as G
from tessera.passes.target.gpu.simt_values import elem_bytes

# typed tile functions the GPU lanes refuse, naming the tessera.ops function they come from (none now:
# comparisons, where, logic, shifts, int arithmetic, floordiv / mod, pow, isnan / isinf / isfinite, casts
# lower to typed tessera_gpu.math on f32 / int32 / int64 / bool registers)
GPU_REFUSED_TYPED: dict[str, str] = {}


class SimtTyped:
    """Mixin of :class:`~tessera.passes.target.gpu.simt.SimtLowerer`."""

    def typed(self, b: Builder, fn: str, args: list[SSAValue], ty: Attribute) -> SSAValue:
        return b.op(G.MathOp.create(operands=args, attributes={"fn": StringAttr(fn)}, result_types=[ty])).results[0]

    @staticmethod
    def is_typed(op: t.ElementwiseOp) -> bool:
        """A typed function, or any function on int / bool tiles (lowered to typed tessera_gpu.math)."""
        return op.fn.data in G.GPU_TYPED_FNS or any(isinstance(v.type.element_type, IntegerType)
                                                    for v in list(op.inputs) + [op.result])

    def refuse_typed(self, op: t.ElementwiseOp) -> None:
        fn = op.fn.data
        if fn in GPU_REFUSED_TYPED or (self.is_typed(op) and fn not in G.GPU_TYPED_FNS + G.GPU_INT_FNS):
            what = GPU_REFUSED_TYPED.get(fn, f"{fn} on int or bool values")
            raise CodegenError(f"tessera.ops.{what} has no lowering on this GPU lane ({self.lowering_name}); "
                               'target="cpu" compiles it')

    def op_tile_load_index(self, op: t.LoadIndexOp, b: Builder) -> None:
        """One element of an i32 / i64 index array as an ``index`` (32 bits on the GPU): an int64
        index is clamped into the int32 range first, so a kernel's bounds check sees every value
        that lies outside an array as outside (an int64 index of 2**32 + 1 is not read as 1)."""
        from xdsl.dialects.builtin import i64
        elem = op.source.type.element_type
        v = self.load(b, self.scalar(op.source), b.c(self.scalar(op.offset)), elem, elem_bytes(elem))
        if elem != i64:      # an int32 index is inside the range already
            self.vmap[op.result] = b.op(arith.IndexCastOp(v, INDEX)).results[0]
            return
        lo = b.op(arith.ConstantOp(IntegerAttr(-(2 ** 31), i64), i64)).results[0]
        hi = b.op(arith.ConstantOp(IntegerAttr(2 ** 31 - 1, i64), i64)).results[0]
        v = b.op(arith.MaxSIOp(b.op(arith.MinSIOp(v, hi)).results[0], lo)).results[0]
        self.vmap[op.result] = b.op(arith.IndexCastOp(v, INDEX)).results[0]
