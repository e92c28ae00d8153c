"""Strided views: a tensor seen through transposes and reshapes of a contiguous buffer.

Used by the fusion passes (to decide whether a reshape/transpose chain can become
strides instead of a copy) and by the kernel generators (to address the buffer).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.ir import dims as D


def row_major_strides(dims: Sequence[D.Dim]) -> list[D.Dim]:
    out: list[D.Dim] = []
    acc: D.Dim = 1
    for d in reversed(dims):
        out.append(acc)
        acc = D.mul(acc, d)
    return list(reversed(out))


@dataclass(frozen=True)
class StridedView:
    """A tensor seen through transposes/reshapes of a contiguous kernel input."""

    arg: int
    dims: tuple[D.Dim, ...]
    strides: tuple[D.Dim, ...]
    # elements from the buffer's start to the view's first: a sum of these terms (sizes are
    # products of symbols, so a sum stays a list)
    offset: tuple[D.Dim, ...] = ()
    # a convolution's implicit-GEMM operand (tessera.conv_patches): the last axis runs over taps of
    # ``cg`` elements (stride 1 within a tap); tap t starts (t // kw) * step_h + (t % kw) * step_w
    # further in.  (kw, cg, step_h, step_w), or () for a plain strided view.
    taps: tuple[int, ...] = ()

    @staticmethod
    def contiguous(arg: int, dims: Sequence[D.Dim]) -> "StridedView":
        return StridedView(arg, tuple(dims), tuple(row_major_strides(dims)))

    def transpose(self, perm: Sequence[int]) -> "StridedView":
        return StridedView(self.arg, tuple(self.dims[p] for p in perm), tuple(self.strides[p] for p in perm),
                           self.offset)

    def slice(self, starts: Sequence[int], steps: Sequence[int], sizes: Sequence[D.Dim]) -> "StridedView":
        """Every axis windowed: ``sizes[i]`` elements from ``starts[i]`` in steps of ``steps[i]``."""
        terms = list(self.offset)
        for a, st in zip(starts, self.strides):
            if a and st != 0:
                terms.append(D.mul(a, st))
        static = sum(t for t in terms if isinstance(t, int))
        off = tuple(t for t in terms if not isinstance(t, int)) + ((static,) if static else ())
        return StridedView(self.arg, tuple(sizes), tuple(D.mul(s, k) if k != 1 else s
                                                         for s, k in zip(self.strides, steps)), off)

    def reshape(self, new: Sequence[D.Dim]) -> "StridedView | None":
        """Only when expressible as strides: groups of old dims merge (if they are
        contiguous with each other) or split into new dims.  A tensor with no elements reads
        nothing: any reshape of it is the contiguous view of the new shape."""
        if any(isinstance(d, int) and d == 0 for d in (*self.dims, *new)):
            return StridedView.contiguous(self.arg, new)
        if self.taps:
            return None   # (an implicit-GEMM patches view is read by the GEMM packing only)
        old = [(d, s) for d, s in zip(self.dims, self.strides) if d != 1]
        new_nz = [d for d in new if d != 1]
        out: list[D.Dim] = []
        i = j = 0
        while i < len(old) or j < len(new_nz):
            if i >= len(old) or j >= len(new_nz):
                return None
            og, ng = [old[i]], [new_nz[j]]
            i, j = i + 1, j + 1
            while D.product(d for d, _ in og) != D.product(ng):
                po, pn = D.product(d for d, _ in og), D.product(ng)
                if isinstance(po, int) and isinstance(pn, int):
                    if po < pn and i < len(old):
                        og.append(old[i]); i += 1
                    elif pn < po and j < len(new_nz):
                        ng.append(new_nz[j]); j += 1
                    else:
                        return None
                elif i < len(old) and (len(ng) == 1 or j >= len(new_nz)):
                    og.append(old[i]); i += 1
                elif j < len(new_nz):
                    ng.append(new_nz[j]); j += 1
                else:
                    return None
            for (d0, s0), (d1, s1) in zip(og, og[1:]):
                if D.mul(d1, s1) != s0:
                    return None  # not contiguous with each other
            base = og[-1][1]
            out.extend(D.mul(s, base) for s in row_major_strides(ng))
        strides = []
        it = iter(out)
        for d in new:
            strides.append(0 if d == 1 else next(it))
        return StridedView(self.arg, tuple(new), tuple(strides), self.offset)



