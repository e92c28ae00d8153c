"""wgmma shared-memory matrix descriptors and the 128-byte swizzle, for the emulator.

Written from the PTX ISA ("Asynchronous Warpgroup Level Matrix Shared Memory Layout":
"Matrix Descriptor Format" and the swizzling-mode figures), independently of the lowering
(``tessera/passes/target/nvidia/wgmma.py`` was not read to write it):

- the descriptor is 64 bits: start address bits 0-13, leading dimension byte offset bits
  16-29, stride dimension byte offset bits 32-45 (all three in units of 16 bytes), matrix
  base offset bits 49-51, swizzle mode bits 62-63 (0 none, 1 128-byte, 2 64-byte,
  3 32-byte);
- a K-major operand with the 128-byte swizzle is made of atoms of 8 rows x 128 bytes; the
  stride byte offset is the distance between atoms along M (or N); the leading byte offset
  is not used;
- the swizzle permutes the 16-byte units of each 128-byte row: unit u of the row that is
  row r (mod 8) of its 1024-byte-aligned atom is stored at unit u XOR r, i.e. on the full
  shared address, bits 4-6 are XORed with bits 7-9;
- an MN-major operand (``imm-trans-a``/``imm-trans-b`` = 1; for f16/bf16 only) with the 128-byte
  swizzle has the canonical layout ``Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))``
  (elements, T = 8 16-bit elements per 16 bytes): 64 consecutive M (or N) elements form one
  128-byte row, the 8 rows of an atom are 8 consecutive k, the next 8 k are SBO bytes on, and
  the next 64 of M/N are LBO bytes on ("Leading/Stride Dimension Byte Offset": for swizzled
  MN-major layouts the leading offset is between (swizzle-bytes/16)-row groups of M/N, the
  stride offset between 8-column groups of k).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SWIZZLE_NAMES = {0: "none", 1: "128B", 2: "64B", 3: "32B"}


@dataclass(frozen=True)
class Descriptor:
    start: int          # bytes
    lbo: int            # bytes
    sbo: int            # bytes
    base_offset: int
    swizzle: str


def decode(desc: int) -> Descriptor:
    d = int(desc) & ((1 << 64) - 1)
    return Descriptor(start=(d & 0x3FFF) << 4, lbo=((d >> 16) & 0x3FFF) << 4, sbo=((d >> 32) & 0x3FFF) << 4,
                      base_offset=(d >> 49) & 7, swizzle=SWIZZLE_NAMES[(d >> 62) & 3])


def swizzle128(addr: np.ndarray) -> np.ndarray:
    """The 128-byte swizzle on shared byte addresses: bits 4-6 ^= bits 7-9."""
    addr = np.asarray(addr, dtype=np.int64)
    return addr ^ (((addr >> 7) & 7) << 4)


SWIZZLE_ROWS = {"none": 0, "32B": 1, "64B": 3, "128B": 7}   # the row bits (7-9) XORed into the 16-byte unit (4-6)


def swizzle_address(addr: np.ndarray, mode: str) -> np.ndarray:
    """Shared byte addresses under a tensor map's swizzle mode (CUDA driver API,
    CUtensorMapSwizzle): the 16-byte unit of a 2^(4+b)-byte row is XORed with the row's index
    in its 8-row pattern, b = 3 (128B), 2 (64B), 1 (32B); none leaves addresses alone."""
    addr = np.asarray(addr, dtype=np.int64)
    return addr ^ (((addr >> 7) & SWIZZLE_ROWS[mode]) << 4)


def _decode_128b(desc: int):
    """``decode(desc)``, refused unless it is what this model covers: the 128-byte swizzle with
    atoms at 1024-byte aligned addresses."""
    d = decode(desc)
    if d.swizzle != "128B":
        raise ValueError(f"descriptor swizzle {d.swizzle}: this model covers the 128-byte swizzle only")
    if d.base_offset != 0:
        raise ValueError(f"descriptor base offset {d.base_offset}: this model covers atoms at 1024-byte "
                         "aligned addresses (base offset 0) only")
    return d


def kmajor_addresses(desc: int, rows: int, k: int, esize: int = 2) -> np.ndarray:
    """Byte address [rows, k] of element (row, kk) of a K-major operand named by ``desc``
    (A: rows = 64 of M; B: rows = N, element (n, kk) is B[kk, n])."""
    d = _decode_128b(desc)
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(k, dtype=np.int64)[None, :]
    linear = d.start + (r // 8) * d.sbo + (r % 8) * 128 + c * esize
    return swizzle128(linear)


def mnmajor_addresses(desc: int, mn: int, k: int, esize: int = 2) -> np.ndarray:
    """Byte address [mn, k] of element (i, kk) of an MN-major operand named by ``desc``
    (B with ``imm-trans-b`` = 1: element (n, kk) is B[kk, n], n contiguous in memory)."""
    d = _decode_128b(desc)
    per_row = 128 // esize
    i = np.arange(mn, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    linear = d.start + (i // per_row) * d.lbo + (i % per_row) * esize + (kk // 8) * d.sbo + (kk % 8) * 128
    return swizzle128(linear)


def store_address(tile_base: int, r: int, c: int, esize: int = 2, row_bytes: int = 128) -> int:
    """Where element (r, c) of a rows x (row_bytes/esize) K-major block at a 1024-byte-aligned
    ``tile_base`` lies under the 128-byte swizzle (the same rule, element-wise)."""
    return int(swizzle128(np.int64(tile_base + r * row_bytes + c * esize)))


__all__ = ["Descriptor", "decode", "swizzle128", "swizzle_address", "kmajor_addresses", "mnmajor_addresses", "store_address"]
