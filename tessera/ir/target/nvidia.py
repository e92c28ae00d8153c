"""Target IR for NVIDIA: the ``tessera_nvidia`` dialect.

``tessera_nvidia.mma_sync`` is one warp-wide ``mma.sync.aligned`` instruction: each
of the 32 lanes passes its registers of A, B and C and receives its registers of D.
Which element each lane register holds is fixed by the PTX ISA fragment layout of
``shape``/``atype``; the lowering that produces this op owns that mapping.
"""
from __future__ import annotations

import re

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Dialect
from xdsl.irdl import AttrSizedOperandSegments, IRDLOperation, attr_def, irdl_op_definition, traits_def, var_operand_def, var_result_def
from xdsl.traits import Pure

from tessera.errors import TargetVerifyError

_SHAPE = re.compile(r"m(\d+)n(\d+)k(\d+)\Z")


@irdl_op_definition
class MmaSyncOp(IRDLOperation):
    name = "tessera_nvidia.mma_sync"
    shape = attr_def(StringAttr)
    atype = attr_def(StringAttr)
    ctype = attr_def(StringAttr)
    a = var_operand_def()
    b = var_operand_def()
    c = var_operand_def()
    d = var_result_def()
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(Pure())
    assembly_format = ("$shape `a` `(` $a `:` type($a) `)` `b` `(` $b `:` type($b) `)` "
                       "`c` `(` $c `:` type($c) `)` attr-dict `->` type($d)")

    def verify_(self) -> None:
        if not _SHAPE.match(self.shape.data):
            raise TargetVerifyError(f"mma_sync shape {self.shape.data!r} is not mMnNkK", op=self)
        if len(self.c) != len(self.d) or [v.type for v in self.c] != [r.type for r in self.d]:
            raise TargetVerifyError("mma_sync D registers must match C registers", op=self)


NVIDIA = Dialect("tessera_nvidia", [MmaSyncOp], [])
