"""Target IR for AMD GPUs: the ``tessera_rocm`` dialect.

``tessera_rocm.wmma`` (RDNA 3/3.5/4, wave32 or wave64) and ``tessera_rocm.mfma``
(CDNA 2/3/4, wave64) are one wave-wide matrix instruction each: every lane passes
its A/B operand vector and its accumulator vector.  ``arch`` is part of the op:
gfx11 and gfx12 WMMA share intrinsic names but not operand types, and MFMA
mnemonics differ per arch, so nothing here is defaulted.
"""
from __future__ import annotations

import re

from xdsl.dialects.builtin import StringAttr, VectorType
from xdsl.ir import Dialect
from xdsl.irdl import IRDLOperation, attr_def, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from tessera.errors import TargetVerifyError

_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)\Z")
_ARCH = re.compile(r"gfx[0-9a-f]+\Z")


class _WaveMma(IRDLOperation):
    shape = attr_def(StringAttr)
    arch = attr_def(StringAttr)
    a = operand_def(VectorType)
    b = operand_def(VectorType)
    c = operand_def(VectorType)
    d = result_def(VectorType)
    traits = traits_def(Pure())
    assembly_format = "$shape $a `,` $b `,` $c attr-dict `:` type($a) `,` type($b) `,` type($c) `->` type($d)"

    def verify_(self) -> None:
        if not _SHAPE.match(self.shape.data):
            raise TargetVerifyError(f"{self.name} shape {self.shape.data!r} is not MxNxK", op=self)
        if not _ARCH.match(self.arch.data):
            raise TargetVerifyError(f"{self.name} arch {self.arch.data!r} is not a gfx name", op=self)
        if self.c.type != self.d.type:
            raise TargetVerifyError(f"{self.name} result must have the accumulator's type", op=self)


@irdl_op_definition
class WmmaOp(_WaveMma):
    name = "tessera_rocm.wmma"


@irdl_op_definition
class MfmaOp(_WaveMma):
    name = "tessera_rocm.mfma"


ROCM = Dialect("tessera_rocm", [WmmaOp, MfmaOp], [])
