"""The emulator's tensor copy engine (TMA) and ``mbarrier``s (sm_90a): a mixin of the Emulator.

Written from the PTX ISA (mbarrier: phases, pending arrival count, tx-count, expect_tx,
complete_tx, try_wait.parity; cp.async.bulk.tensor; fence.mbarrier_init / fence.proxy.async)
and the CUDA driver's tensor-map description (dims, row stride in bytes, box, swizzle mode,
out-of-bounds fill), independently of the lowering:

- a barrier is set up by ``mbarrier.init`` (count arrivals per phase, phase 0, tx-count 0);
  another thread may use it only after a workgroup barrier, and the copy engine (an
  async-proxy access) only after the initialising thread's ``fence.mbarrier_init`` or
  ``fence.proxy.async`` (else ``EMULATE_RACE``);
- ``arrive.expect_tx b`` adds b to the tx-count and arrives once; a copy's bytes are
  subtracted when it lands (complete_tx); the phase completes when no arrival is pending and
  the tx-count is zero: its parity flips and the count is re-armed;
- a copy reads its box from global memory when issued (elements past the tensor: 0), and
  lands — writes shared memory through the map's swizzle, completes its bytes — only when a
  thread waits on its barrier (the latest moment it may land); until then its elements are
  in flight: a wgmma or load reading them is a race, a wgmma group still in flight over
  them reads what the copy will write (it may land at any time);
- ``try_wait.parity P`` returns once the phase of parity P has completed (the barrier's
  current phase parity is not P).  Landing the barrier's copies must complete the phase;
  if it cannot (a tx-count announced but never completed, a missing arrival) the wait would
  spin forever: ``EMULATE``; copies completing more bytes than announced may complete the
  phase before all of them land: ``EMULATE_RACE``.
"""
from __future__ import annotations

import numpy as np

from tessera.emulate import smem_desc as SD
from tessera.errors import EmulatorDivergenceError, EmulatorError, EmulatorFaultError, EmulatorRaceError
from tessera.ir import tensor_map as TM
from tessera.ir.attrs import ival


class TmaOps:
    # ------------------------------------------------------------------ launch
    def tensor_maps(self, fn, flat: list, sizes: list[int]) -> list:
        """The kernel's tensor maps as the host encodes them (ir/tensor_map.py), with their buffers."""
        attr = fn.attributes.get("tma.maps")
        if attr is None:
            return []
        out = []
        for a in attr.data:
            rec = TM.parse(a.data)
            out.append((self.map_spec(rec, sizes), flat[rec["arg"]]))
        return out

    def map_spec(self, rec: dict, sizes) -> TM.TensorMapSpec:
        """The spec the host would pass to cuTensorMapEncodeTiled (device buffers are 256-byte aligned)."""
        return TM.spec_for(rec, 256, sizes)

    # ------------------------------------------------------------------ barrier state
    def _mbar(self, ctx, op, buf, idx: int, g: int, create: bool = False) -> dict:
        bars = ctx.__dict__.setdefault("mbar", {})
        key = (buf.base_bytes, int(idx))
        st = bars.get(key)
        if st is None:
            n = ctx.groups
            st = bars[key] = {"init": np.zeros(n, bool), "count": np.zeros(n, np.int64),
                              "pending": np.zeros(n, np.int64), "tx": np.zeros(n, np.int64),
                              "phase": np.zeros(n, np.int64), "epoch": np.full(n, -1, np.int64),
                              "thread": np.full(n, -1, np.int64), "fenced": np.zeros(n, bool), "key": key}
        if not create and not st["init"][g]:
            raise self.fail(EmulatorError, ctx, op, f"mbarrier at shared byte {key[0] + 8 * key[1]} used before "
                            "mbarrier.init")
        return st

    def _visible(self, ctx, op, st, g: int, tid: int) -> None:
        if st["epoch"][g] == ctx.epoch[g] and st["thread"][g] != tid:
            raise self.fail(EmulatorRaceError, ctx, op, "mbarrier used by a thread before a workgroup barrier made "
                            "its init visible")

    def _active(self, ctx, mask):
        act = np.flatnonzero(mask)
        return [(int(i), int(ctx.gid[i]), int(ctx.tid[i])) for i in act]

    @staticmethod
    def _complete_phase(st, g: int) -> None:
        if st["pending"][g] == 0 and st["tx"][g] == 0:
            st["phase"][g] ^= 1
            st["pending"][g] = st["count"][g]

    # ------------------------------------------------------------------ ops
    def op_tessera_nvidia_mbarrier_init(self, ctx, op, mask):
        buf = self.v(ctx, op.bars)
        idx = np.broadcast_to(np.asarray(self.v(ctx, op.index), np.int64), (ctx.nthreads,))
        for i, g, tid in self._active(ctx, mask):
            if not 0 <= idx[i] < buf.data.shape[1]:
                raise self.fail(EmulatorFaultError, ctx, op, f"mbarrier {int(idx[i])} outside its buffer", [i])
            st = self._mbar(ctx, op, buf, idx[i], g, create=True)
            cnt = ival(op.count)
            st["init"][g], st["count"][g], st["pending"][g], st["tx"][g], st["phase"][g] = True, cnt, cnt, 0, 0
            st["epoch"][g], st["thread"][g], st["fenced"][g] = ctx.epoch[g], tid, False

    def _fence_inits(self, ctx, mask) -> None:
        for _, g, tid in self._active(ctx, mask):
            for st in ctx.__dict__.get("mbar", {}).values():
                if st["init"][g] and st["thread"][g] == tid:
                    st["fenced"][g] = True

    def op_tessera_nvidia_fence_mbarrier_init(self, ctx, op, mask):
        self._fence_inits(ctx, mask)

    def op_tessera_nvidia_fence_proxy_async(self, ctx, op, mask):
        super().op_tessera_nvidia_fence_proxy_async(ctx, op, mask)
        self._fence_inits(ctx, mask)

    def op_tessera_nvidia_mbarrier_expect_tx(self, ctx, op, mask):
        buf = self.v(ctx, op.bars)
        idx = np.broadcast_to(np.asarray(self.v(ctx, op.index), np.int64), (ctx.nthreads,))
        for i, g, tid in self._active(ctx, mask):
            st = self._mbar(ctx, op, buf, idx[i], g)
            self._visible(ctx, op, st, g, tid)
            st["tx"][g] += ival(op.bytes)
            st["pending"][g] -= 1
            if st["pending"][g] < 0:
                raise self.fail(EmulatorError, ctx, op, "more arrivals on an mbarrier than its count in one phase",
                                [i])
            self._complete_phase(st, g)

    def op_tessera_nvidia_tma_load(self, ctx, op, mask):
        dst = self.v(ctx, op.dst)
        bars = self.v(ctx, op.bars)
        maps = getattr(ctx, "tmaps", [])
        m = ival(op.map)
        if m >= len(maps):
            raise self.fail(EmulatorError, ctx, op, f"tensor map {m} was not passed ({len(maps)} maps)")
        spec, src = maps[m]
        vals = {k: np.broadcast_to(np.asarray(self.v(ctx, x), np.int64), (ctx.nthreads,))
                for k, x in (("di", op.dst_index), ("bi", op.bar_index), ("c0", op.c0), ("c1", op.c1))}
        es = dst.data.dtype.itemsize
        if es != spec.esize:
            raise self.fail(EmulatorError, ctx, op, f"tensor map of {spec.elem} copied into a buffer of "
                            f"{dst.data.dtype}")
        bi, bo = spec.box
        span = {"128B": 1024, "64B": 512, "32B": 256, "none": 128}[spec.swizzle]
        for i, g, tid in self._active(ctx, mask):
            st = self._mbar(ctx, op, bars, vals["bi"][i], g)
            self._visible(ctx, op, st, g, tid)
            if not st["fenced"][g]:
                raise self.fail(EmulatorRaceError, ctx, op, "the copy engine completes on an mbarrier whose init was "
                                "not fenced for the async proxy (fence.mbarrier_init / fence.proxy.async)", [i])
            start = dst.base_bytes + int(vals["di"][i]) * es
            if start % span:
                raise self.fail(EmulatorFaultError, ctx, op, f"shared destination byte {start} is not {span}-byte "
                                f"aligned (the {spec.swizzle} swizzle's span)", [i])
            r = int(vals["c1"][i]) + np.arange(bo)[:, None]
            c = int(vals["c0"][i]) + np.arange(bi)[None, :]
            inside = (r >= 0) & (r < spec.dims[1]) & (c >= 0) & (c < spec.dims[0])
            gidx = np.where(inside, r * (spec.strides[0] // es) + c, 0)
            data = np.where(inside, src.data[np.minimum(gidx, src.data.size - 1)].astype(np.float64), 0.0)
            linear = start + (np.arange(bo)[:, None] * bi + np.arange(bi)[None, :]) * es
            e = (SD.swizzle_address(linear, spec.swizzle) - dst.base_bytes) // es
            if (e < 0).any() or (e >= dst.data.shape[1]).any():
                raise self.fail(EmulatorFaultError, ctx, op, "the copy's box runs past its shared buffer", [i])
            e = e.reshape(-1)
            if dst.pending[g, e].any():
                raise self.fail(EmulatorRaceError, ctx, op, "two copies in flight write one shared element", [i])
            war = (dst.r_epoch[g, e] == ctx.epoch[g]) & (dst.r_thread[g, e] != tid) & (dst.r_thread[g, e] != -1)
            if war.any():
                raise self.fail(EmulatorRaceError, ctx, op, "a copy may overwrite shared elements read in this "
                                "barrier interval (the stage is still being read)", [i])
            dst.pending[g, e] = True
            ctx.__dict__.setdefault("tma_flight", []).append(
                {"dst": dst, "g": g, "e": e, "data": data.reshape(-1), "bar": st["key"], "bytes": spec.box_bytes})

    def op_tessera_nvidia_mbarrier_wait(self, ctx, op, mask):
        buf = self.v(ctx, op.bars)
        idx = np.broadcast_to(np.asarray(self.v(ctx, op.index), np.int64), (ctx.nthreads,))
        par = np.broadcast_to(np.asarray(self.v(ctx, op.parity), np.int64), (ctx.nthreads,))
        seen: dict = {}
        for i, g, tid in self._active(ctx, mask):
            key = (g, int(idx[i]))
            if key in seen:
                if seen[key] != int(par[i]):
                    raise self.fail(EmulatorDivergenceError, ctx, op, "threads wait on one mbarrier for different "
                                    "phases", [i])
                continue
            seen[key] = int(par[i])
            st = self._mbar(ctx, op, buf, idx[i], g)
            self._visible(ctx, op, st, g, tid)
            if st["phase"][g] != par[i]:
                continue                       # the phase of that parity has completed
            self._land(ctx, op, st, g)
            if st["phase"][g] == par[i]:
                raise self.fail(EmulatorError, ctx, op, f"mbarrier wait for phase parity {int(par[i])} would never "
                                f"return: {int(st['tx'][g])} announced bytes never arrive and {int(st['pending'][g])}"
                                " arrivals are missing (expect_tx larger than the copies?)", [i])

    def _land(self, ctx, op, st, g: int) -> None:
        """Every copy in flight on barrier ``st`` of workgroup ``g`` lands now, completing its bytes."""
        keep = []
        for rec in ctx.__dict__.get("tma_flight", []):
            if rec["bar"] != st["key"] or rec["g"] != g:
                keep.append(rec)
                continue
            dst, e = rec["dst"], rec["e"]
            dst.pending[g, e] = False
            dst.data[g, e] = rec["data"].astype(dst.data.dtype)
            dst.w_epoch[g, e] = -1            # written by the async proxy, ordered by the barrier
            dst.w_thread[g, e] = -1
            if dst.unfenced is not None:
                dst.unfenced[g, e] = False
            st["tx"][g] -= rec["bytes"]
            if st["tx"][g] < 0:
                raise self.fail(EmulatorRaceError, ctx, op, f"copies complete {-int(st['tx'][g])} bytes more than "
                                "expect_tx announced: the phase may complete before they all land")
            self._complete_phase(st, g)
        ctx.tma_flight = keep

    def inflight_copies(self, ctx):
        """(dst, group indices, elements, data) of every copy in flight: cp.async groups and bulk copies."""
        for grp in ctx.async_groups + [ctx.async_open]:
            for dst, gg, ee, dd, _act in grp:
                yield dst, gg, ee, dd
        for rec in ctx.__dict__.get("tma_flight", []):
            yield rec["dst"], np.full(rec["e"].shape, rec["g"]), rec["e"], rec["data"]


__all__ = ["TmaOps"]
