"""Graph IR ops of the neural-network ops: ``tessera.pad`` and ``tessera.conv_patches`` (kept
apart from graph.py, which imports them into the dialect)."""
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


def patches_out(n: int, k: int, s: int, d: int) -> int:
    """Output positions along an axis of ``n`` (already padded) for a kernel of ``k`` taps."""
    return (n - (k - 1) * d - 1) // s + 1


@irdl_op_definition
class ConvPatchesOp(GraphOp):
    """The implicit-GEMM view of a convolution's input: ``input`` [N, Hp, Wp, C] (NHWC, padded,
    static Hp, Wp, C) seen as [N, Ho, Wo, Kh*Kw*Cg] with element (n, i, j, (a*Kw + b)*Cg + c) =
    input[n, i*sh + a*dh, j*sw + b*dw, c0 + c] (``kernel`` = [Kh, Kw], ``stride`` = [sh, sw],
    ``dilation`` = [dh, dw], ``channels`` = [c0, Cg]).  It is never materialised: a GEMM that
    takes it as its A operand packs A panels through this addressing (one strided view per tap)."""

    name = "tessera.conv_patches"
    input = operand_def(TensorType)
    result = result_def(TensorType)
    kernel = attr_def(ArrayAttr)
    stride = attr_def(ArrayAttr)
    dilation = attr_def(ArrayAttr)
    channels = attr_def(ArrayAttr)
    traits = traits_def(Pure())
    assembly_format = _FMT1

    def infer_result_type(self) -> TensorType:
        t = _operand_tensor(self.name, self.input)
        if t.rank != 4:
            raise GraphAttributeError(f"tessera.conv_patches: input must be [N, H, W, C], got {t}")
        kern, st, dil, ch = ints(self.kernel), ints(self.stride), ints(self.dilation), ints(self.channels)
        if len(kern) != 2 or len(st) != 2 or len(dil) != 2 or len(ch) != 2 or min(*kern, *st, *dil, ch[1]) < 1 \
                or ch[0] < 0:
            raise GraphAttributeError(f"tessera.conv_patches: kernel {kern}, stride {st}, dilation {dil} (pairs "
                                      f">= 1) and channels {ch} ([start, count])")
        _, H, W, C = t.dims
        if not all(isinstance(v, int) for v in (H, W, C)):
            raise GraphAttributeError(f"tessera.conv_patches: H, W and C must be static, got {t}")
        if ch[0] + ch[1] > C:
            raise GraphAttributeError(f"tessera.conv_patches: channels {ch} exceed C = {C}")
        ho, wo = patches_out(H, kern[0], st[0], dil[0]), patches_out(W, kern[1], st[1], dil[1])
        if ho < 1 or wo < 1:
            raise GraphAttributeError(f"tessera.conv_patches: kernel {kern} (dilation {dil}) is larger than the "
                                      f"input {H} x {W}")
        return TensorType.of([t.dims[0], ho, wo, kern[0] * kern[1] * ch[1]], t.element_type)


__all__ = ["PadOp", "ConvPatchesOp", "PAD_MODES", "patches_out"]
