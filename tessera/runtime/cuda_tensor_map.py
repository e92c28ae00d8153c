"""Tensor maps encoded by the CUDA driver (``cuTensorMapEncodeTiled``), for copy-engine kernels.

The map is opaque: its 128 bytes are whatever the driver writes for this GPU and driver
version, so Tessera never builds one itself.  :func:`encode` hands the driver the fields of a
validated :class:`tessera.ir.tensor_map.TensorMapSpec` — data type, rank 2, the global
address, dims (innermost first), the one row stride in bytes, the box, element strides 1,
no interleave, the swizzle mode, L2 promotion of 128 bytes, out-of-bounds fill NONE (zeros)
— and returns the bytes it wrote, which the launch plan copies into the kernel's 64-byte
aligned by-value parameter.  A refusal by the driver is a ``TensorMapError`` naming the spec.
"""
from __future__ import annotations

import ctypes
from typing import Any

from tessera.errors import TensorMapError
from tessera.ir import tensor_map as TM

DATA_TYPES = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
              "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "f8E4M3FN": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
              "f8E5M2": "CU_TENSOR_MAP_DATA_TYPE_UINT8"}
SWIZZLES = {"none": "CU_TENSOR_MAP_SWIZZLE_NONE", "32B": "CU_TENSOR_MAP_SWIZZLE_32B",
            "64B": "CU_TENSOR_MAP_SWIZZLE_64B", "128B": "CU_TENSOR_MAP_SWIZZLE_128B"}
OOB_FILLS = {"zero": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"}   # NONE fills zeros (NAN_REQUEST_ZERO_FMA: NaN)


def arguments(cu: Any, spec: TM.TensorMapSpec) -> tuple:
    """The positional arguments of ``cuTensorMapEncodeTiled`` for ``spec`` (validated first)."""
    TM.validate(spec)
    # cuda-python takes the arrays as lists of its cuuint64_t / cuuint32_t wrappers (and checks their type)
    u64, u32 = getattr(cu, "cuuint64_t", int), getattr(cu, "cuuint32_t", int)
    return (getattr(cu.CUtensorMapDataType, DATA_TYPES[spec.elem]), 2, spec.address, [u64(d) for d in spec.dims],
            [u64(s) for s in spec.strides], [u32(b) for b in spec.box], [u32(e) for e in spec.element_strides],
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(cu.CUtensorMapSwizzle, SWIZZLES[spec.swizzle]),
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            getattr(cu.CUtensorMapFloatOOBfill, OOB_FILLS[spec.oob]))


def encode(cu: Any, spec: TM.TensorMapSpec) -> bytes:
    """The driver's 128-byte encoding of ``spec``."""
    result = cu.cuTensorMapEncodeTiled(*arguments(cu, spec))
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", None) or f"CUresult {int(err)}"
        raise TensorMapError(f"cuTensorMapEncodeTiled refused {spec}: {name}")
    tmap = rest[0]
    if hasattr(tmap, "getPtr"):
        return ctypes.string_at(int(tmap.getPtr()), TM.MAP_BYTES)
    return bytes(tmap)


__all__ = ["encode", "arguments", "DATA_TYPES", "SWIZZLES", "OOB_FILLS"]
