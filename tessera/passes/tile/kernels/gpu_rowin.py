"""The input row of a GPU row kernel whose results are not row-shaped (argmax / argmin, top_k), read
chunk by chunk with its fused elementwise prologue: each leaf the prologue reads (a kernel input seen
through reshapes, transposes, slices or broadcasts) is loaded at the chunk's columns, the prologue's
ops are applied in f32 registers (ints and bools in their own), and the chunk is masked past the
row's end with the caller's pad (a masked column holds the pad whatever the prologue made of it).
Such a kernel has no epilogue (its results are one or k values per row)."""
from __future__ import annotations

from xdsl.dialects.builtin import f32

from tessera.errors import ScheduleIllegalError
from tessera.ir import dims as D
from tessera.passes.tile.kernels import rows as R
from tessera.passes.tile.kernels.common import KernelSig, mask_cols

MASK_TAIL = True     # a chunk's leaves are read up to the row's end (a test plants False: the emulator faults)


class RowInput:
    """Builds the kernel's signature (inputs, the given outputs, the leaves' dims) and reads chunks."""

    def __init__(self, kop, prologue, op, epilogue, out_elems, what: str):
        from tessera.passes.tile.kernels.gpu_rows import _program_id, _setup
        from tessera.passes.tile.kernels.rowwise import _Use
        self.name, self.T, self.wave, self.chunk = _setup(kop, "rowwise")
        if epilogue:
            raise ScheduleIllegalError(f"kernel {self.name}: the GPU {what} kernel fuses no elementwise op after it "
                                       "(its results are not rows)")
        block = kop.body.block
        self.x = op.input
        self.dims = tuple(self.x.type.dims)
        self.prologue = prologue
        self.leaves = R.find_leaves(block, self.dims, prologue if prologue else [_Use(self.x)])
        sig = KernelSig(self.name, gpu=True)
        for v in kop.inputs:
            sig.buffer(v.type.element_type)
        self.out_bufs = [sig.buffer(e) for e in out_elems]
        R.register_dims(sig, self.dims, self.leaves)
        self.sig = sig
        self.kf = kf = sig.build()
        self.b = b = kf.b
        self.C = kf.size(self.dims[-1])
        self.r = _program_id(b)
        self.offsets = R.RowCtx(kf, b, self.r, self.dims, self.leaves).offsets
        self.nrows = D.product(self.dims[:-1])

    def chunk_at(self, bc, c, pad: float):
        """(the [1, chunk] f32 tile of the row's columns c.., masked with ``pad`` past the end, left)."""
        left = bc.sub(self.C, c)
        extent = left if MASK_TAIL else self.chunk
        vals = {v: R.load_leaf(self.kf, bc, lf, self.offsets[v], c, extent, self.chunk,
                               pad if v == self.x else None) for v, lf in self.leaves.items()}
        R.emit_ops(bc, self.prologue, vals, f32)
        xv = vals[self.x]
        if xv.type.dims != (1, self.chunk):
            xv = R._widen(bc, xv, self.chunk)
        return mask_cols(bc, xv, left, pad), left

    def finish(self):
        from tessera.passes.tile.kernels.gpu_rows import _finish
        kf = self.kf
        return _finish(kf, kf.finish(), [D.ceil_extent(self.nrows, 1)], self.T, self.wave), self.sig.dims, 0, []


__all__ = ["RowInput"]
