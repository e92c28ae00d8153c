"""Tensor maps: what a kernel's copy engine (TMA, sm_90a) knows of a global tensor.

A kernel that stages through the copy engine names each global tensor it reads by a *map
record* (its function attribute ``tma.maps``, one JSON object per map; the ABI lists them as
by-value kernel parameters of 128 bytes, 64-byte aligned).  A record says which buffer
argument the map describes and its 2-D view, every size either a constant or a reference
``"s<i>"`` to the kernel's i-th size argument:

  arg     the buffer argument's index          elem    its element type (bf16, f16, ...)
  dims    [inner, outer] elements              stride  elements between consecutive outer rows
  box     [inner, outer] elements per copy     swizzle 128B | 64B | 32B | none
  oob     zero (elements past the tensor read as 0)

At launch the host binds it to an address and the sizes (:func:`spec_for`), checks it against
the copy engine's limits (:func:`validate`: a coded ``TensorMapError``, never a launch that
faults) and hands the :class:`TensorMapSpec` to the driver's ``cuTensorMapEncodeTiled``
(``runtime/cuda.py``); the warp emulator executes copies from the same spec.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from tessera.errors import TensorMapError

ELEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f8E4M3FN": 1, "f8E5M2": 1}
SWIZZLE_BYTES = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
MAP_BYTES, MAP_ALIGN = 128, 64          # sizeof / alignof(CUtensorMap)


@dataclass(frozen=True)
class TensorMapSpec:
    elem: str
    address: int                        # bytes (0: not bound yet, the emulator's base)
    dims: tuple[int, int]               # inner, outer (elements)
    strides: tuple[int]                 # bytes between outer rows (the rank - 1 strides the driver takes)
    box: tuple[int, int]                # inner, outer (elements)
    element_strides: tuple[int, int] = (1, 1)
    swizzle: str = "128B"
    oob: str = "zero"

    @property
    def esize(self) -> int:
        return ELEM_BYTES[self.elem]

    @property
    def box_bytes(self) -> int:
        """What one copy completes on its barrier: the whole box, elements past the tensor included."""
        return self.box[0] * self.box[1] * self.esize


def record(arg: int, elem: str, dims, stride, box, swizzle: str = "128B") -> str:
    """The JSON text of one map record (``dims``/``stride`` entries: ints or ``"s<i>"``)."""
    return json.dumps({"arg": arg, "elem": elem, "dims": list(dims), "stride": stride, "box": list(box),
                       "swizzle": swizzle, "oob": "zero"}, sort_keys=True)


def parse(text: str) -> dict:
    return json.loads(text)


def _size(ref, sizes) -> int:
    if isinstance(ref, int):
        return ref
    if isinstance(ref, str) and ref.startswith("s"):
        return int(sizes[int(ref[1:])])
    raise TensorMapError(f"tensor map size {ref!r} is neither an int nor a size reference 's<i>'")


def spec_for(rec: dict, address: int, sizes) -> TensorMapSpec:
    """The map ``rec`` bound to a buffer at ``address`` and the kernel's evaluated ``sizes``; validated."""
    if rec["elem"] not in ELEM_BYTES:
        raise TensorMapError(f"tensor map of {rec['elem']} elements: the copy engine takes "
                             f"{', '.join(ELEM_BYTES)} here")
    es = ELEM_BYTES[rec["elem"]]
    inner, outer = (_size(d, sizes) for d in rec["dims"])
    spec = TensorMapSpec(rec["elem"], int(address), (inner, outer), (_size(rec["stride"], sizes) * es,),
                         tuple(int(b) for b in rec["box"]), (1, 1), rec["swizzle"], rec.get("oob", "zero"))
    validate(spec)
    return spec


def validate(spec: TensorMapSpec) -> None:
    """The copy engine's rules (CUDA driver API, cuTensorMapEncodeTiled), as coded errors."""
    why = []
    if spec.address % 16:
        why.append(f"the tensor's address {spec.address:#x} is not 16-byte aligned")
    if any(not 1 <= d <= (1 << 32) for d in spec.dims):
        why.append(f"dims {spec.dims} are not in 1..2^32")
    for s in spec.strides:
        if s % 16 or not 0 < s < (1 << 40):
            why.append(f"the row stride of {s} bytes is not a positive multiple of 16 below 2^40 (rows of "
                       f"{s // spec.esize if spec.esize else s} {spec.elem} elements)")
    if any(not 1 <= b <= 256 for b in spec.box):
        why.append(f"box {spec.box} is not 1..256 elements a side")
    inner_bytes = spec.box[0] * spec.esize
    if inner_bytes % 16:
        why.append(f"the box's inner extent ({inner_bytes} bytes) is not a multiple of 16 bytes")
    if spec.swizzle not in SWIZZLE_BYTES:
        why.append(f"swizzle {spec.swizzle!r}; legal: {', '.join(SWIZZLE_BYTES)}")
    elif SWIZZLE_BYTES[spec.swizzle] and inner_bytes > SWIZZLE_BYTES[spec.swizzle]:
        why.append(f"the box's inner extent ({inner_bytes} bytes) exceeds the {spec.swizzle} swizzle span")
    if spec.element_strides != (1, 1):
        why.append(f"element strides {spec.element_strides}: this lane copies dense boxes (1, 1)")
    if spec.oob != "zero":
        why.append(f"out-of-bounds fill {spec.oob!r}: edge tiles need zeros")
    if why:
        raise TensorMapError("tensor map cannot be encoded: " + "; ".join(why))


__all__ = ["TensorMapSpec", "record", "parse", "spec_for", "validate", "MAP_BYTES", "MAP_ALIGN", "ELEM_BYTES",
           "SWIZZLE_BYTES"]
