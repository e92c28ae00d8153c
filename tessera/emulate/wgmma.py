"""The emulator's ``wgmma`` (sm_90a) ops: a mixin of :class:`tessera.emulate.simt.Emulator`.

Semantics it enforces, from the PTX ISA (wgmma.mma_async, wgmma.fence, commit_group,
wait_group; fence.proxy.async; the async proxy):

- every wgmma of a group follows a ``wgmma.fence`` of its warpgroup issued since the last
  ``commit_group`` (a missing fence: ``EMULATE_RACE``);
- operands are read from shared memory through descriptors decoded by
  :mod:`tessera.emulate.smem_desc` (its own descriptor and swizzle model; K-major, or MN-major
  B under ``trans_b``); at issue, an element written by a generic-proxy store not followed by
  the writer's ``fence.proxy.async``, written in the current barrier interval, or still to be
  written by a cp.async in flight, is a race;
- the instruction is asynchronous: its operands are read and its product formed only when a
  ``wait_group`` lands its group — the latest moment the hardware may read them — so shared
  memory overwritten while the group is in flight (a stage reused too early) gives a wrong
  answer; a cp.async issued meanwhile is taken to have landed already (it may land at any
  time), so a stage refilled while the group still reads it is caught too;
- the accumulator registers hold their result only once a ``wait_group`` lands the group:
  until then they read as NaN whose payload names the pending register (a missing wait
  poisons the output; arithmetic on such a value stays NaN).  A later wgmma of the same shape
  may chain on a pending accumulator (the hardware orders those), across groups too, which is
  what ``wait_group 1`` pipelining relies on.
"""
from __future__ import annotations

import numpy as np
from xdsl.dialects import scf
from xdsl.ir import BlockArgument

from tessera.emulate import layouts as L
from tessera.emulate import smem_desc as SD
from tessera.errors import EmulatorDivergenceError, EmulatorError, EmulatorFaultError, EmulatorRaceError
from tessera.ir.attrs import ival

_QNAN = np.uint32(0x7FC00000)
_PAYLOAD = np.uint32(0x003FFFFF)


def _handles(a: np.ndarray) -> np.ndarray:
    """Mask of the elements of a float32 array that are pending-register handles."""
    bits = a.view(np.uint32)
    return ((bits & np.uint32(0xFFC00000)) == _QNAN) & ((bits & _PAYLOAD) != 0)


class WgmmaOps:
    def _wg_state(self, ctx):
        if not hasattr(ctx, "wg"):
            ctx.wg = {"fenced": np.zeros(ctx.nthreads, bool), "open": [], "groups": [], "slots": {}, "next": 1}
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
        if not land:
            return
        for group in land:
            for rec in group:
                self._complete(ctx, st, rec)
        self._resolve_registers(ctx, st)

    def op_tessera_nvidia_wgmma_fence_operand(self, ctx, op, mask):
        """The registers as they are now: after the wait that lands them, their values; before
        it (a fence placed too early), still NaN handles — but as computed values, which no
        later wait resolves."""
        for c, d in zip(op.c, op.d):
            ctx.vals[d] = np.array(np.broadcast_to(np.asarray(self.v(ctx, c), dtype=np.float32), (ctx.nthreads,)))
            h = _handles(ctx.vals[d])
            ctx.vals[d][h] = np.nan

    # ------------------------------------------------------------------ pending registers
    def _resolve(self, ctx, st, arr, op) -> np.ndarray:
        """``arr`` (per thread) with every pending-register handle replaced by its value."""
        a = np.array(np.broadcast_to(np.asarray(arr, dtype=np.float32), (ctx.nthreads,)))
        h = _handles(a)
        if h.any():
            slots = a.view(np.uint32)[h] & _PAYLOAD
            th = np.flatnonzero(h)
            for s in np.unique(slots):
                vals = st["slots"].get(int(s))
                if vals is None:
                    raise self.fail(EmulatorError, ctx, op, f"wgmma reads pending accumulator slot {int(s)} that no "
                                    "landed or in-flight wgmma produced")
                sel = th[slots == s]
                a[sel] = vals[sel]
        return a

    def _resolve_registers(self, ctx, st) -> None:
        """After a wait: registers (wgmma results, block arguments and loop/if results: values
        copied, not computed) holding handles of landed slots get their values; values computed
        from a handle before the wait stay NaN.  Slots no in-flight wgmma needs are dropped."""
        landed = {s for s, v in st["slots"].items() if v is not None}
        for key, val in list(ctx.vals.items()):
            if not isinstance(val, np.ndarray) or val.dtype != np.float32 or val.shape != (ctx.nthreads,):
                continue
            if not (isinstance(key, BlockArgument) or getattr(key.owner, "name", "") == "tessera_nvidia.wgmma"
                    or isinstance(getattr(key, "owner", None), (scf.ForOp, scf.IfOp))):
                continue
            h = _handles(val)
            if h.any():
                slots = val.view(np.uint32)[h] & _PAYLOAD
                if any(int(s) in landed for s in np.unique(slots)):
                    out = val.copy()
                    th = np.flatnonzero(h)
                    for s in np.unique(slots):
                        if int(s) in landed:
                            sel = th[slots == s]
                            out[sel] = st["slots"][int(s)][sel]
                    ctx.vals[key] = out
        needed = set()
        for group in st["groups"] + [st["open"]]:
            for rec in group:
                c = rec["c"]
                h = _handles(c)
                needed.update(int(s) for s in np.unique(c.view(np.uint32)[h] & _PAYLOAD))
        for s in landed - needed:
            del st["slots"][s]

    # ------------------------------------------------------------------ operands
    def _locate(self, ctx, op, addr: np.ndarray, g: int, what: str) -> list:
        """Where the bytes ``addr`` of workgroup ``g`` lie: [(buf, inside mask, elements)];
        the visibility checks of an issue happen here."""
        out = []
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
                raise self.fail(EmulatorRaceError, ctx, op, f"wgmma reads {what} elements a cp.async in flight or a "
                                "bulk copy in flight will write (missing or early wait)")
            buf.r_epoch[g, e] = ctx.epoch[g]     # read by the warpgroup: a write before the next barrier races
            buf.r_thread[g, e] = -2
            out.append((buf, inside, e))
            addr = np.where(inside, -1, addr)
        if (addr >= 0).any():
            raise self.fail(EmulatorFaultError, ctx, op, f"wgmma {what} descriptor names shared bytes outside every "
                            f"buffer (first {int(addr[addr >= 0].min())})")
        return out

    def _read(self, ctx, loc: list, shape, g: int, fmt: str = "") -> np.ndarray:
        """The operand's values now, with every cp.async still in flight taken as landed; fp8
        bytes decoded as the instruction's ``fmt`` says (simt.as_format)."""
        out = np.empty(shape)
        for buf, inside, e in loc:
            data = buf.data[g]
            if buf.pending is not None and buf.pending[g, e].any():
                data = data.copy()
                for dst, gg, ee, dd in self.inflight_copies(ctx):     # cp.async and bulk copies (tma.py)
                    if dst is buf:
                        sel = gg == g
                        data[ee[sel]] = dd[sel].astype(data.dtype)
            out[inside] = L.as_format(data[e], fmt).astype(np.float64)
        return out

    def op_tessera_nvidia_wgmma(self, ctx, op, mask):
        m, n, k = (int(x) for x in op.shape.data[1:].replace("n", " ").replace("k", " ").split())
        self.require_uniform(ctx, op, mask, 128, "wgmma")
        st = self._wg_state(ctx)
        if not st["fenced"][mask].all():
            raise self.fail(EmulatorRaceError, ctx, op, "wgmma issued with no wgmma.fence since the last commit_group",
                            np.flatnonzero(mask & ~st["fenced"])[:1])
        trans_b = op.trans_b is not None
        da = np.broadcast_to(np.asarray(self.v(ctx, op.desc_a), dtype=np.int64), (ctx.nthreads,))
        db = np.broadcast_to(np.asarray(self.v(ctx, op.desc_b), dtype=np.int64), (ctx.nthreads,))
        c = np.stack([np.broadcast_to(np.asarray(self.v(ctx, x), dtype=np.float32), (ctx.nthreads,)) for x in op.c],
                     axis=1)                                  # [T, n/2]: values or pending handles
        reads = []
        for w0 in range(0, ctx.nthreads, 128):
            sl = slice(w0, w0 + 128)
            if not mask[sl].any():
                continue
            for d, what in ((da, "A"), (db, "B")):
                if not (d[sl] == d[w0]).all():
                    raise self.fail(EmulatorDivergenceError, ctx, op, f"threads of one warpgroup pass different "
                                    f"{what} descriptors", [w0])
            g = int(ctx.gid[w0])
            es = 1 if k == 32 else 2      # m64nNk32: fp8 bytes (K-major only); k16: 16-bit elements
            if trans_b and es == 1:
                raise self.fail(EmulatorError, ctx, op, "fp8 wgmma has no imm-trans-b (B is K-major only)")
            addr_b = (SD.mnmajor_addresses if trans_b else SD.kmajor_addresses)(int(db[w0]), n, k, es)   # [n, k]
            reads.append((sl, g, self._locate(ctx, op, SD.kmajor_addresses(int(da[w0]), 64, k, es), g, "A"),
                          self._locate(ctx, op, addr_b, g, "B")))
        s0 = st["next"]
        st["next"] += n // 2
        if st["next"] > int(_PAYLOAD):
            raise self.fail(EmulatorError, ctx, op, "too many wgmma results pending in one launch batch")
        for i, res in enumerate(op.d):
            st["slots"][s0 + i] = None
            ctx.vals[res] = np.full(ctx.nthreads, _QNAN | np.uint32(s0 + i), np.uint32).view(np.float32)
        rec = {"op": op, "m": m, "n": n, "k": k, "c": c.reshape(-1).copy().reshape(c.shape), "reads": reads,
               "slot0": s0}
        st["open"].append(rec)

    def _complete(self, ctx, st, rec) -> None:
        """The wgmma of ``rec`` completes: read its operands now, form D = A B + C."""
        op, n, k = rec["op"], rec["n"], rec["k"]
        lay = L.instr_layout("wgmma", (rec["m"], n, k), arch=self.arch, lanes=128, dtype=op.atype.data).c
        cregs = np.stack([self._resolve(ctx, st, rec["c"][:, i], op) for i in range(n // 2)], axis=1)
        out = np.full((ctx.nthreads, n // 2), np.nan, np.float32)
        r, cc = lay.index[..., 0], lay.index[..., 1]
        for sl, g, loc_a, loc_b in rec["reads"]:
            btype = op.btype.data if op.btype is not None else op.atype.data
            a = self._read(ctx, loc_a, (64, k), g, op.atype.data)
            bt = self._read(ctx, loc_b, (n, k), g, btype)                   # [n, k]: B^T
            cm = np.zeros((64, n))
            cm[r, cc] = cregs[sl]
            out[sl] = (a @ bt.T + cm)[r, cc].astype(np.float32)
        for i in range(n // 2):
            st["slots"][rec["slot0"] + i] = out[:, i]
