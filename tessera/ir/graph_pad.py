"""``tessera.pad``: the Graph IR op of ``tessera.ops.pad`` (kept apart from graph.py, which
imports it into the dialect)."""
from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, FloatAttr, StringAttr
from xdsl.irdl import attr_def, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from tessera.errors import GraphAttributeError
from tessera.ir.attrs import ints
from tessera.ir.graph import _FMT1, GraphOp, TensorType, _operand_tensor

PAD_MODES = ("constant", "reflect", "edge")


@irdl_op_definition
class PadOp(GraphOp):
    """``input`` padded along every axis by ``pads`` = [lo0, hi0, lo1, hi1, ...] (>= 0) with
    ``mode``: constant (``value``), reflect (mirror without repeating the edge, numpy's
    ``reflect``: each pad smaller than its axis) or edge (the edge value repeated).  A padded
    axis has a static size."""

    name = "tessera.pad"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    pads = attr_def(ArrayAttr)
    mode = attr_def(StringAttr)
    value = attr_def(FloatAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        p = ints(self.pads)
        mode = self.mode.data
        if mode not in PAD_MODES:
            raise GraphAttributeError(f"tessera.pad: mode {mode!r}; legal: {', '.join(PAD_MODES)}")
        if len(p) != 2 * t.rank or any(x < 0 for x in p):
            raise GraphAttributeError(f"tessera.pad: pads {p} must be 2 x rank ({t.rank}) non-negative widths")
        dims = []
        for ax, d in enumerate(t.dims):
            lo, hi = p[2 * ax], p[2 * ax + 1]
            if lo == hi == 0:
                dims.append(d)
                continue
            if not isinstance(d, int):
                raise GraphAttributeError(f"tessera.pad: padded axis {ax} must have a static size, got {d}")
            if mode == "reflect" and max(lo, hi) >= d:
                raise GraphAttributeError(f"tessera.pad: reflect pads ({lo}, {hi}) must be smaller than axis "
                                          f"{ax} ({d})")
            if mode == "edge" and d == 0:
                raise GraphAttributeError(f"tessera.pad: edge mode cannot pad the empty axis {ax}")
            dims.append(d + lo + hi)
        return TensorType.of(dims, t.element_type)


__all__ = ["PadOp", "PAD_MODES"]
