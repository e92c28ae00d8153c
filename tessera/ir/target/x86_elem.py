"""``tessera_x86.velem``: one typed lane-wise operation on vector registers whose element types
may differ between operands and result, or are integers: int8/int32/int64 lanes, bool lanes
(``i1`` in registers, one byte in memory), and the comparisons, selects, conversions and
integer arithmetic of Tile IR's typed elementwise functions (``tile.TYPED_*_FNS``, and add /
sub / mul / max / min / neg / abs on int lanes).  ``tessera.codegen.x86_int_elem`` turns it into
LLVM IR.
"""
from __future__ import annotations

from xdsl.dialects.builtin import StringAttr, VectorType
from xdsl.irdl import IRDLOperation, attr_def, irdl_op_definition, result_def, traits_def, var_operand_def
from xdsl.traits import Pure

from tessera.errors import TargetVerifyError
from tessera.ir.tile import CMP_FNS, TYPED_BINARY_FNS, TYPED_TERNARY_FNS, TYPED_UNARY_FNS

INT_FNS = ("add", "sub", "mul", "max", "min", "neg", "abs")   # float names on int lanes
RAMP = ("ramp",)   # i64 lanes: lane l of the result is lane l of the input + l (tile.index)
VELEM_FNS = TYPED_UNARY_FNS + TYPED_BINARY_FNS + TYPED_TERNARY_FNS + INT_FNS + RAMP


@irdl_op_definition
class VElemOp(IRDLOperation):
    name = "tessera_x86.velem"
    fn = attr_def(StringAttr)
    inputs = var_operand_def(VectorType)
    result = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "$fn $inputs attr-dict `:` functional-type($inputs, results)"

    def verify_(self) -> None:
        if self.fn.data not in VELEM_FNS:
            raise TargetVerifyError(f"{self.name}: fn {self.fn.data!r}; legal: {', '.join(VELEM_FNS)}", op=self)
        n = {v.type.get_shape()[0] for v in self.inputs} | {self.result.type.get_shape()[0]}
        if len(n) != 1:
            raise TargetVerifyError(f"{self.name} {self.fn.data}: operands and result differ in lanes", op=self)


__all__ = ["VElemOp", "VELEM_FNS", "CMP_FNS"]
