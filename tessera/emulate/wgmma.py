"""The emulator's ``wgmma`` (sm_90a) ops: a mixin of :class:`tessera.emulate.simt.Emulator`.

Semantics it enforces, from the PTX ISA (wgmma.mma_async, wgmma.fence, commit_group,
wait_group; fence.proxy.async; the async proxy):

- every wgmma of a group follows a ``wgmma.fence`` of its warpgroup issued since the last
  ``commit_group`` (a missing fence: ``EMULATE_RACE``);
- operands are read from shared memory through descriptors decoded by
  :mod:`tessera.emulate.smem_desc` (its own descriptor and swizzle model); an element
  written by a generic-proxy store not followed by the writer's ``fence.proxy.async``, or
  written in the current barrier interval, is a race;
- the accumulator registers hold their result only once a ``wait_group`` lands the group:
  until then they read as NaN (a missing wait poisons the output); within a group the next
  wgmma on the same registers chains on the pending value, as the hardware does.
"""
from __future__ import annotations

import numpy as np

from tessera.emulate import layouts as L
from tessera.emulate import smem_desc as SD
from tessera.errors import EmulatorDivergenceError, EmulatorFaultError, EmulatorRaceError
from tessera.ir.attrs import ival


class WgmmaOps:
    def _wg_state(self, ctx):
        if not hasattr(ctx, "wg"):
            ctx.wg = {"fenced": np.zeros(ctx.nthreads, bool), "pending": {}, "open": [], "groups": []}
        return ctx.wg

    def op_tessera_nvidia_shared_address(self, ctx, op, mask):
        buf = self.v(ctx, op.buf)
        idx = np.asarray(self.v(ctx, op.index), dtype=np.int64)
        ctx.vals[op.result] = buf.base_bytes + idx * buf.data.dtype.itemsize

    def op_tessera_nvidia_fence_proxy_async(self, ctx, op, mask):
        """This thread's generic-proxy shared-memory writes become visible to the async proxy."""
        active = np.zeros((ctx.groups, ctx.block), bool)
        active[ctx.gid[mask], ctx.tid[mask]] = True
        for buf in ctx.shared.values():
            if buf.unfenced is None:
                continue
            g = np.arange(ctx.groups)[:, None]
            w = buf.w_thread
            hit = (w >= 0) & active[np.broadcast_to(g, w.shape), np.maximum(w, 0)]
            buf.unfenced &= ~hit

    def op_tessera_nvidia_wgmma_fence(self, ctx, op, mask):
        self.require_uniform(ctx, op, mask, 128, "wgmma.fence")
        self._wg_state(ctx)["fenced"][mask] = True

    def op_tessera_nvidia_wgmma_commit(self, ctx, op, mask):
        self.require_uniform(ctx, op, mask, 128, "wgmma.commit_group")
        st = self._wg_state(ctx)
        st["groups"].append(st["open"])
        st["open"] = []
        st["fenced"][mask] = False

    def op_tessera_nvidia_wgmma_wait(self, ctx, op, mask):
        self.require_uniform(ctx, op, mask, 128, "wgmma.wait_group")
        st = self._wg_state(ctx)
        keep = ival(op.pending)
        land = st["groups"][:max(0, len(st["groups"]) - keep)]
        st["groups"] = st["groups"][len(land):]
        for group in land:
            for r in group:
                ctx.vals[r] = st["pending"].pop(r)

    def _operand(self, ctx, op, desc: int, rows: int, k: int, g: int, what: str) -> np.ndarray:
        """[rows, k] float64 of workgroup ``g``'s shared memory named by ``desc``."""
        addr = SD.kmajor_addresses(desc, rows, k)
        out = np.empty(addr.shape)
        for buf in ctx.shared.values():
            es = buf.data.dtype.itemsize
            lo, hi = buf.base_bytes, buf.base_bytes + buf.data.shape[1] * es
            inside = (addr >= lo) & (addr < hi)
            if not inside.any():
                continue
            e = (addr[inside] - lo) // es
            if buf.unfenced is not None and buf.unfenced[g, e].any():
                raise self.fail(EmulatorRaceError, ctx, op, f"wgmma reads {what} elements written by generic-proxy "
                                "stores with no fence.proxy.async after them")
            if (buf.w_epoch[g, e] == ctx.epoch[g]).any():
                raise self.fail(EmulatorRaceError, ctx, op, f"wgmma reads {what} elements written in this barrier "
                                "interval (no barrier between the copy and the wgmma)")
            if buf.pending is not None and buf.pending[g, e].any():
                raise self.fail(EmulatorRaceError, ctx, op, f"wgmma reads {what} elements a cp.async in flight will "
                                "write (missing wait)")
            out[inside] = buf.data[g, e].astype(np.float64)
            buf.r_epoch[g, e] = ctx.epoch[g]     # read by the warpgroup: a write before the next barrier races
            buf.r_thread[g, e] = -2
            addr = np.where(inside, -1, addr)
        if (addr >= 0).any():
            raise self.fail(EmulatorFaultError, ctx, op, f"wgmma {what} descriptor names shared bytes outside every "
                            f"buffer (first {int(addr[addr >= 0].min())})")
        return out

    def op_tessera_nvidia_wgmma(self, ctx, op, mask):
        m, n, k = (int(x) for x in op.shape.data[1:].replace("n", " ").replace("k", " ").split())
        self.require_uniform(ctx, op, mask, 128, "wgmma")
        st = self._wg_state(ctx)
        if not st["fenced"][mask].all():
            raise self.fail(EmulatorRaceError, ctx, op, "wgmma issued with no wgmma.fence since the last commit_group",
                            np.flatnonzero(mask & ~st["fenced"])[:1])
        lay = L.instr_layout("wgmma", (m, n, k), arch=self.arch, lanes=128, dtype=op.atype.data).c
        da = np.broadcast_to(np.asarray(self.v(ctx, op.desc_a), dtype=np.int64), (ctx.nthreads,))
        db = np.broadcast_to(np.asarray(self.v(ctx, op.desc_b), dtype=np.int64), (ctx.nthreads,))
        cs = [np.broadcast_to(np.asarray(st["pending"].get(c, None) if c in st["pending"] else self.v(ctx, c),
                                         dtype=np.float64), (ctx.nthreads,)) for c in op.c]
        cregs = np.stack(cs, axis=1)                   # [T, n/2]
        out = np.full((ctx.nthreads, n // 2), np.nan, np.float32)
        for w0 in range(0, ctx.nthreads, 128):
            sl = slice(w0, w0 + 128)
            if not mask[sl].any():
                continue
            for d, what in ((da, "A"), (db, "B")):
                if not (d[sl] == d[w0]).all():
                    raise self.fail(EmulatorDivergenceError, ctx, op, f"threads of one warpgroup pass different "
                                    f"{what} descriptors", [w0])
            g = int(ctx.gid[w0])
            a = self._operand(ctx, op, int(da[w0]), 64, k, g, "A")          # [64, k]
            bt = self._operand(ctx, op, int(db[w0]), n, k, g, "B")          # [n, k]: B^T
            c = np.zeros((64, n))
            r, cc = lay.index[..., 0], lay.index[..., 1]
            c[r, cc] = cregs[sl]
            dmat = a @ bt.T + c
            out[sl] = dmat[r, cc].astype(np.float32)
        for i, res in enumerate(op.d):
            st["pending"][res] = out[:, i]
            ctx.vals[res] = np.full(ctx.nthreads, np.nan, np.float32)   # not readable before wait_group
            st["open"].append(res)
