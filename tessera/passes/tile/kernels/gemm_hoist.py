"""B packed once per thread: a GEMM whose B is the same for every batch entry (batch strides
0: a weight shared by a batched A, a convolution's HWIO kernel against its patches) and whose
packed B fits the thread's B panel buffer keeps every k-block of it there, each in its own
slot, and packs them only for the first batch entry the thread computes.

Without this, a ``b*m`` GEMM repacks the same B for every batch entry: the 3x3 convolution of
the conv block (batch 4 x 28 output rows, 28 x 576 x 64 GEMMs) packed its 576 x 64 weight 112
times, 2.3x the elements it packed of A.

The slots are the k-blocks in order: slot i holds k-block i (KB rows padded to the
instruction's K, by N padded to whole NR*W slivers) at element ``i * slot``.  Only static K and
N qualify (the slot count and size are compile-time), one n-block (N <= NC) and the private
panels of the ``b*m`` split (a shared ``m`` panel is packed by the team already once per phase).
"""
from __future__ import annotations

from tessera.ir import dims as D


def _static(d) -> int | None:
    v = D.canon(d)
    return v if isinstance(v, int) else None


def k_block_rows(K: int, KC: int, step: int) -> int:
    """The plain (no taps) k-block size generate() computes at run time, for a static K:
    blocks of equal size, at most KC, a multiple of ``step`` (the instruction's K x unroll)."""
    nkb = max(-(-K // KC), 1)
    ks = max(-(-(-(-K // nkb)) // step) * step, step)
    return min(ks, KC)


def plan_slots(plan, mode: str, amx: bool, kp: int, U: int, NRW: int, KC: int, NC: int,
               cstep: int | None, nkloop_taps: int | None) -> int | None:
    """The slot size (elements) of each k-block's packed B when B is packed once per thread,
    else None.  ``cstep`` / ``nkloop_taps``: an implicit-GEMM A's k-block size and count."""
    if mode != "b*m" or amx or not plan.batch or plan.gather is not None:
        return None
    if any(D.canon(st) != 0 for st in plan.b.strides[:-2]):
        return None            # B differs between batch entries
    K, N = _static(plan.k), _static(plan.n)
    if K is None or N is None or K == 0 or N == 0 or N > NC:
        return None
    if cstep is not None:
        rows, count = cstep, nkloop_taps
    else:
        rows = k_block_rows(K, KC, kp * U)
        count = -(-K // rows)
    slot = -(-rows // kp) * kp * (-(-N // NRW) * NRW)
    if count * slot > KC * NC:
        return None            # the buffer holds one KC x NC block
    return slot


__all__ = ["plan_slots", "k_block_rows"]
