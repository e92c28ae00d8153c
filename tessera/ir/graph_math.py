"""Graph IR's elementwise math ops beyond the first set (log, log1p, exp2, expm1, sin, cos,
sigmoid, abs, sign, rsqrt, reciprocal, floor, ceil, round, square): one class each on
``_Unary`` (``tessera`` dialect, imported by :mod:`tessera.ir.graph`)."""
from __future__ import annotations

from typing import ClassVar

from xdsl.irdl import irdl_op_definition

from tessera.ir.graph import _Unary


@irdl_op_definition
class LogOp(_Unary):
    name = "tessera.log"
    FN: ClassVar[str] = "log"


@irdl_op_definition
class Log1pOp(_Unary):
    name = "tessera.log1p"
    FN: ClassVar[str] = "log1p"


@irdl_op_definition
class Exp2Op(_Unary):
    name = "tessera.exp2"
    FN: ClassVar[str] = "exp2"


@irdl_op_definition
class Expm1Op(_Unary):
    name = "tessera.expm1"
    FN: ClassVar[str] = "expm1"


@irdl_op_definition
class SinOp(_Unary):
    name = "tessera.sin"
    FN: ClassVar[str] = "sin"


@irdl_op_definition
class CosOp(_Unary):
    name = "tessera.cos"
    FN: ClassVar[str] = "cos"


@irdl_op_definition
class SigmoidOp(_Unary):
    name = "tessera.sigmoid"
    FN: ClassVar[str] = "sigmoid"


@irdl_op_definition
class AbsOp(_Unary):
    name = "tessera.abs"
    FN: ClassVar[str] = "abs"


@irdl_op_definition
class SignOp(_Unary):
    name = "tessera.sign"
    FN: ClassVar[str] = "sign"


@irdl_op_definition
class RsqrtOp(_Unary):
    name = "tessera.rsqrt"
    FN: ClassVar[str] = "rsqrt"


@irdl_op_definition
class ReciprocalOp(_Unary):
    name = "tessera.reciprocal"
    FN: ClassVar[str] = "recip"


@irdl_op_definition
class FloorOp(_Unary):
    name = "tessera.floor"
    FN: ClassVar[str] = "floor"


@irdl_op_definition
class CeilOp(_Unary):
    name = "tessera.ceil"
    FN: ClassVar[str] = "ceil"


@irdl_op_definition
class RoundOp(_Unary):
    name = "tessera.round"
    FN: ClassVar[str] = "round"


@irdl_op_definition
class SquareOp(_Unary):
    name = "tessera.square"
    FN: ClassVar[str] = "square"
