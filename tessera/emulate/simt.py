"""Execute GPU Target IR in numpy: every lane of every wave of every workgroup.

The emulator runs the program the lowering produced — the per-thread address
arithmetic, the loads, the shared-memory traffic, the barriers, the matrix
instructions and the stores — for all threads at once: each SSA value is an array
with one entry (or one vector) per thread.  Control flow is predicated: both sides
of a divergent ``scf.if`` run under masks, a loop runs while any thread still
iterates.  Matrix instructions take their semantics from :mod:`tessera.emulate.layouts`
(written from the ISA documents, independently of the lowering): lane ``l`` item ``e``
holds element ``index[l, e]``; the emulator scatters the lanes' registers into
matrices, multiplies in float64, rounds to the accumulator type and gathers the
result back the same way.

It also checks what hardware would punish or silently get wrong: an access outside
a buffer (``EMULATE_OUT_OF_BOUNDS``), an access less aligned than promised
(``EMULATE_MISALIGNED``), two threads of a workgroup touching one shared element
with no barrier between, or reading shared memory that a ``cp.async`` in flight
will still write (``EMULATE_RACE``), and a wave instruction or barrier reached by
part of its wave or workgroup, or replicated operands that disagree
(``EMULATE_DIVERGENT``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float8E4M3FNType,
    Float8E5M2Type,
    Float16Type,
    Float32Type,
    FloatAttr,
    IndexType,
    IntegerType,
    ModuleOp,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue

from tessera.emulate import layouts as L
from tessera.emulate.typed import run as typed_run
from tessera.emulate.tma import TmaOps
from tessera.emulate.wgmma import WgmmaOps
from tessera.errors import (
    EmulatorAlignError,
    EmulatorDivergenceError,
    EmulatorError,
    EmulatorFaultError,
    EmulatorRaceError,
)
from tessera.ir.attrs import ival
from tessera.ir.target import gpu as G
from tessera.ir.target import nvidia as NV

BUFFER_ALIGN = 256          # device allocations are at least this aligned


def np_of(elem: Attribute) -> np.dtype:
    if isinstance(elem, Float32Type):
        return np.dtype(np.float32)
    if isinstance(elem, Float16Type):
        return np.dtype(np.float16)
    if isinstance(elem, BFloat16Type):
        return np.dtype(ml_dtypes.bfloat16)
    if isinstance(elem, (IndexType,)):
        return np.dtype(np.int64)
    if isinstance(elem, Float8E4M3FNType):       # fp8 bytes: ml_dtypes decodes them (astype)
        return np.dtype(ml_dtypes.float8_e4m3fn)
    if isinstance(elem, Float8E5M2Type):
        return np.dtype(ml_dtypes.float8_e5m2)
    if isinstance(elem, IntegerType):
        return np.dtype(np.bool_) if elem.width.data == 1 else np.dtype(
            f"{'u' if elem.signedness.data.name == 'UNSIGNED' else ''}int{elem.width.data}")
    raise EmulatorError(f"the emulator has no numpy type for {elem}")


@dataclass
class Buf:
    """A buffer value: global memory (``data``: flat array) or shared memory (per workgroup)."""

    space: str
    data: np.ndarray            # global: [n]; shared: [groups, n]
    base_bytes: int = 0         # shared: byte offset in the workgroup's shared memory
    name: str = ""
    # shared-memory race bookkeeping, per workgroup and element
    w_epoch: np.ndarray | None = None
    w_thread: np.ndarray | None = None
    r_epoch: np.ndarray | None = None
    r_thread: np.ndarray | None = None
    pending: np.ndarray | None = None   # elements a cp.async in flight will write
    unfenced: np.ndarray | None = None  # written by generic-proxy stores, no fence.proxy.async yet (wgmma)


@dataclass
class Ctx:
    kernel: str
    nthreads: int               # threads in this batch of workgroups
    block: int
    groups: int
    tid: np.ndarray             # thread index within its workgroup
    gid: np.ndarray             # workgroup index within the batch
    block_ids: list[np.ndarray]
    epoch: np.ndarray           # barrier generation per workgroup
    vals: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)
    async_groups: list = field(default_factory=list)   # per thread: committed cp.async groups
    async_open: list = field(default_factory=list)     # copies since the last commit


class Emulator(TmaOps, WgmmaOps):
    """Runs kernels of one Target IR module for one target (``rocm:<arch>`` / ``nvidia:<sm>``)."""

    def __init__(self, module: ModuleOp, target: str, arch: str, max_groups_per_batch: int = 64):
        self.module = module
        self.target = target
        self.arch = arch
        self.kernels = {op.sym_name.data: op for op in module.body.block.ops
                        if isinstance(op, func.FuncOp) and "gpu.kernel" in op.attributes}
        self.batch = max_groups_per_batch
        self.ops_run = 0

    # ------------------------------------------------------------------ launch
    def launch(self, kernel: str, grid: tuple[int, int, int], buffers: list[np.ndarray], sizes: list[int],
               maps: list | None = None) -> None:
        """``maps``: (TensorMapSpec, buffer index) per tensor map as a host encoded them; by default
        the kernel's own records bound to ``sizes`` (emulate/tma.py)."""
        fn = self.kernels.get(kernel)
        if fn is None:
            raise EmulatorError(f"no kernel @{kernel} in the module")
        block = ival(fn.attributes["gpu.block"])
        total = grid[0] * grid[1] * grid[2]
        flat = [Buf("global", np.ascontiguousarray(b).reshape(-1), name=f"arg{i}") for i, b in enumerate(buffers)]
        tmaps = self.tensor_maps(fn, flat, sizes) if maps is None else [(sp, flat[i]) for sp, i in maps]
        for start in range(0, total, self.batch):
            groups = min(self.batch, total - start)
            linear = np.repeat(np.arange(start, start + groups, dtype=np.int64), block)
            ids = [linear % grid[0], (linear // grid[0]) % grid[1], linear // (grid[0] * grid[1])]
            ctx = Ctx(kernel, groups * block, block, groups, np.tile(np.arange(block, dtype=np.int64), groups),
                      np.repeat(np.arange(groups, dtype=np.int64), block), ids, np.zeros(groups, dtype=np.int64))
            ctx.async_groups = []
            ctx.tmaps = tmaps
            args = fn.body.block.args
            for a, v in zip(args, flat + [np.int64(s) for s in sizes]):
                ctx.vals[a] = v
            mask = np.ones(ctx.nthreads, dtype=bool)
            self.run_block(ctx, fn.body.block, mask)
        for b, f in zip(buffers, flat):
            if b.size:
                b.reshape(-1)[...] = f.data

    # ------------------------------------------------------------------ interpretation
    def run_block(self, ctx: Ctx, block: Block, mask: np.ndarray):
        for op in block.ops:
            if isinstance(op, (scf.YieldOp,)):
                return [ctx.vals[v] for v in op.operands]
            if isinstance(op, func.ReturnOp):
                return []
            self.ops_run += 1
            h = getattr(self, "op_" + op.name.replace(".", "_"), None)
            if h is None:
                raise EmulatorError(f"the emulator cannot execute {op.name}")
            h(ctx, op, mask)
        return []

    def v(self, ctx: Ctx, s: SSAValue):
        return ctx.vals[s]

    def fail(self, cls, ctx: Ctx, op: Operation, msg: str, threads=None) -> EmulatorError:
        where = ""
        if threads is not None and len(threads) and int(threads[0]) < len(ctx.tid):
            th = int(threads[0])
            where = (f" (workgroup {[int(b[th]) for b in ctx.block_ids]}, thread {int(ctx.tid[th])}"
                     + (f" and {len(threads) - 1} more)" if len(threads) > 1 else ")"))
        return cls(f"@{ctx.kernel}: {op.name}: {msg}{where}")

    # ------------------------------------------------------------------ structure
    def op_scf_for(self, ctx: Ctx, op: scf.ForOp, mask):
        lb, ub, step = (np.broadcast_to(self.v(ctx, x), (ctx.nthreads,)) for x in (op.lb, op.ub, op.step))
        iv = lb.astype(np.int64).copy()
        carried = [self.v(ctx, a) for a in op.iter_args]
        body = op.body.block
        while True:
            active = mask & (iv < ub)
            if not active.any():
                break
            ctx.vals[body.args[0]] = iv
            for a, c in zip(body.args[1:], carried):
                ctx.vals[a] = c
            out = self.run_block(ctx, body, active)
            carried = [_where(active, n, o) for n, o in zip(out, carried)]
            iv = np.where(active, iv + step, iv)
        for r, c in zip(op.results, carried):
            ctx.vals[r] = c

    def op_scf_if(self, ctx: Ctx, op: scf.IfOp, mask):
        cond = np.broadcast_to(self.v(ctx, op.cond), (ctx.nthreads,))
        tm, em = mask & cond, mask & ~cond
        tv = self.run_block(ctx, op.true_region.block, tm) if tm.any() else None
        ev = None
        if op.false_region.blocks and em.any():
            ev = self.run_block(ctx, op.false_region.block, em)
        for i, r in enumerate(op.results):
            a = tv[i] if tv is not None else None
            b = ev[i] if ev is not None else None
            if a is None:
                ctx.vals[r] = b
            elif b is None:
                ctx.vals[r] = a
            else:
                ctx.vals[r] = _where(cond, a, b)

    # ------------------------------------------------------------------ arith
    def op_arith_constant(self, ctx, op, mask):
        a = op.value
        if isinstance(a, FloatAttr):
            ctx.vals[op.result] = np.array(a.value.data, dtype=np_of(op.result.type))
        else:
            ctx.vals[op.result] = np.array(ival(a), dtype=np.int64 if not isinstance(op.result.type, IntegerType)
                                           or op.result.type.width.data != 1 else np.bool_)

    def _bin(self, ctx, op, f):
        ctx.vals[op.result] = f(np.asarray(self.v(ctx, op.lhs)), np.asarray(self.v(ctx, op.rhs)))

    def op_arith_addi(self, ctx, op, mask):
        self._bin(ctx, op, np.add)

    def op_arith_subi(self, ctx, op, mask):
        self._bin(ctx, op, np.subtract)

    def op_arith_muli(self, ctx, op, mask):
        self._bin(ctx, op, np.multiply)

    def op_arith_divui(self, ctx, op, mask):
        self._bin(ctx, op, lambda a, b: a // np.where(b == 0, 1, b))

    def op_arith_remui(self, ctx, op, mask):
        self._bin(ctx, op, lambda a, b: a % np.where(b == 0, 1, b))

    def op_arith_ceildivui(self, ctx, op, mask):
        self._bin(ctx, op, lambda a, b: -(-a // np.where(b == 0, 1, b)))

    def op_arith_minsi(self, ctx, op, mask):
        self._bin(ctx, op, np.minimum)

    def op_arith_maxsi(self, ctx, op, mask):
        self._bin(ctx, op, np.maximum)

    def op_arith_andi(self, ctx, op, mask):
        self._bin(ctx, op, np.bitwise_and)      # i1: logical; i64: bitwise

    def op_arith_ori(self, ctx, op, mask):
        self._bin(ctx, op, np.bitwise_or)

    def op_arith_xori(self, ctx, op, mask):
        self._bin(ctx, op, np.bitwise_xor)

    def op_arith_shrui(self, ctx, op, mask):
        self._bin(ctx, op, lambda a, b: (a.astype(np.uint64) >> b.astype(np.uint64)).astype(np.int64))

    def op_arith_shli(self, ctx, op, mask):
        self._bin(ctx, op, np.left_shift)

    _PRED = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal,
             6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal}

    def op_arith_cmpi(self, ctx, op, mask):
        self._bin(ctx, op, self._PRED[ival(op.predicate)])

    def op_arith_index_cast(self, ctx, op, mask):
        ctx.vals[op.result] = np.asarray(self.v(ctx, op.input)).astype(np_of(op.result.type))

    def op_arith_select(self, ctx, op, mask):
        ctx.vals[op.result] = _where(np.asarray(self.v(ctx, op.cond)), self.v(ctx, op.lhs), self.v(ctx, op.rhs))

    # ------------------------------------------------------------------ work distribution
    def op_tessera_gpu_thread_id(self, ctx, op, mask):
        ctx.vals[op.result] = ctx.tid

    def op_tessera_gpu_block_id(self, ctx, op, mask):
        ctx.vals[op.result] = ctx.block_ids[ival(op.axis)]

    def op_tessera_gpu_shared(self, ctx, op: G.SharedOp, mask):
        key = ival(op.offset)
        ty = op.result.type
        if key not in ctx.shared:
            size = ival(op.size)
            shape = (ctx.groups, size)
            # shared memory starts as garbage: NaN, so a read before any write shows up
            dt = np_of(ty.element_type)
            data = np.full(shape, -1 if dt.kind in "iub" else np.nan, dtype=dt)
            ctx.shared[key] = Buf(ty.space.data, data, key, f"shared+{key}", np.full(shape, -1, np.int64),
                                  np.full(shape, -1, np.int64), np.full(shape, -1, np.int64),
                                  np.full(shape, -1, np.int64), np.zeros(shape, bool), np.zeros(shape, bool))
        ctx.vals[op.result] = ctx.shared[key]

    def op_tessera_gpu_barrier(self, ctx, op, mask):
        self.require_uniform(ctx, op, mask, ctx.block, "a barrier")
        hit = np.unique(ctx.gid[mask])
        ctx.epoch[hit] += 1

    def require_uniform(self, ctx, op, mask, width: int, what: str) -> None:
        m = mask.reshape(-1, width)
        partial = m.any(axis=1) & ~m.all(axis=1)
        if partial.any():
            first = int(np.flatnonzero(partial)[0]) * width
            raise self.fail(EmulatorDivergenceError, ctx, op, f"{what} reached by part of its "
                            f"{'workgroup' if width == ctx.block else 'wave'} only", [first])

    # ------------------------------------------------------------------ memory
    def _index(self, ctx, op, buf: Buf, idx: np.ndarray, n: int, mask, align: int, esize: int) -> np.ndarray:
        """Element indices [T, n] of an access; checks bounds and alignment for active threads."""
        idx = np.broadcast_to(np.asarray(idx, dtype=np.int64), (ctx.nthreads,))
        elems = idx[:, None] + np.arange(n)
        size = buf.data.shape[-1]
        bad = mask & ((idx < 0) | (idx + n > size))
        if bad.any():
            th = np.flatnonzero(bad)
            raise self.fail(EmulatorFaultError, ctx, op, f"{buf.space} access at element {int(idx[th[0]])} (+{n}) "
                            f"of a {size}-element buffer", th)
        addr = buf.base_bytes + idx * esize
        mis = mask & (addr % align != 0)
        if mis.any():
            th = np.flatnonzero(mis)
            raise self.fail(EmulatorAlignError, ctx, op, f"byte address {int(addr[th[0]])} is not {align}-byte "
                            "aligned", th)
        return elems

    def read(self, ctx, op, buf: Buf, idx, n: int, mask, align: int, dtype) -> np.ndarray:
        esize = buf.data.dtype.itemsize
        elems = self._index(ctx, op, buf, idx, n, mask, align, esize)
        out = np.zeros((ctx.nthreads, n), dtype=buf.data.dtype)
        act = np.flatnonzero(mask)
        if buf.space == "global":
            out[act] = buf.data[elems[act]]
        else:
            g = ctx.gid[act][:, None]
            e = elems[act]
            self._check_read(ctx, op, buf, g, e, act)
            out[act] = buf.data[g, e]
        return out if n > 1 else out[:, 0]

    def write(self, ctx, op, buf: Buf, idx, values: np.ndarray, mask, align: int) -> None:
        vals = np.asarray(values)      # [T, n]
        n = vals.shape[1]
        esize = buf.data.dtype.itemsize
        elems = self._index(ctx, op, buf, idx, n, mask, align, esize)
        act = np.flatnonzero(mask)
        v = np.broadcast_to(vals, (ctx.nthreads, n))[act].astype(buf.data.dtype)
        if buf.space == "global":
            buf.data[elems[act]] = v
        else:
            g = np.broadcast_to(ctx.gid[act][:, None], elems[act].shape)
            self._check_write(ctx, op, buf, g, elems[act], act)
            buf.data[g, elems[act]] = v
            buf.unfenced[g, elems[act]] = True

    def _check_read(self, ctx, op, buf: Buf, g, e, act) -> None:
        g = np.broadcast_to(g, e.shape)
        th = np.broadcast_to(ctx.tid[act][:, None], e.shape)
        if buf.pending[g, e].any():
            bad = act[np.flatnonzero(buf.pending[g, e].any(axis=1))]
            raise self.fail(EmulatorRaceError, ctx, op, "reads shared memory that a cp.async in flight will write "
                            "(missing wait)", bad)
        ep = ctx.epoch[g]
        raw = (buf.w_epoch[g, e] == ep) & (buf.w_thread[g, e] != th)
        if raw.any():
            bad = act[np.flatnonzero(raw.any(axis=1))]
            raise self.fail(EmulatorRaceError, ctx, op, "reads a shared element another thread wrote with no barrier "
                            "between", bad)
        # readers: one thread, or -2 for several in this barrier interval
        same = buf.r_epoch[g, e] == ep
        prev = buf.r_thread[g, e]
        new = np.where(same & (prev != th), -2, th)
        # several threads reading one element in this access: mark them all as many
        key = (g * buf.data.shape[1] + e).reshape(-1)
        thr = th.reshape(-1)
        order = np.lexsort((thr, key))
        ks, ts = key[order], thr[order]
        multi_key = ks[1:][(ks[1:] == ks[:-1]) & (ts[1:] != ts[:-1])]
        newf = new.reshape(-1)
        if multi_key.size:
            newf[np.isin(key, multi_key)] = -2
        buf.r_thread[g.reshape(-1), e.reshape(-1)] = newf
        buf.r_epoch[g, e] = ep

    def _check_write(self, ctx, op, buf: Buf, g, e, act) -> None:
        th = np.broadcast_to(ctx.tid[act][:, None], e.shape)
        ep = ctx.epoch[g]
        war = (buf.r_epoch[g, e] == ep) & (buf.r_thread[g, e] != th) & (buf.r_thread[g, e] != -1)
        waw = (buf.w_epoch[g, e] == ep) & (buf.w_thread[g, e] != th)
        bad = war | waw
        if bad.any():
            rows = act[np.flatnonzero(bad.any(axis=1))]
            raise self.fail(EmulatorRaceError, ctx, op, "writes a shared element another thread "
                            f"{'read' if war.any() else 'wrote'} with no barrier between", rows)
        key = (g * buf.data.shape[1] + e).reshape(-1)
        uniq, counts = np.unique(key, return_counts=True)
        if (counts > 1).any():
            raise self.fail(EmulatorRaceError, ctx, op, "two threads write one shared element in one access", act[:1])
        buf.w_epoch[g, e] = ep
        buf.w_thread[g, e] = th

    def op_tessera_gpu_load(self, ctx, op: G.LoadOp, mask):
        buf = self.v(ctx, op.base)
        n = G.lanes_of(op.result.type)
        ctx.vals[op.result] = self.read(ctx, op, buf, self.v(ctx, op.index), n, mask, ival(op.align),
                                        buf.data.dtype)

    def op_tessera_gpu_store(self, ctx, op: G.StoreOp, mask):
        buf = self.v(ctx, op.base)
        val = np.asarray(self.v(ctx, op.value))
        n = G.lanes_of(op.value.type)
        val = np.broadcast_to(val, (ctx.nthreads, n) if n > 1 else (ctx.nthreads,))
        self.write(ctx, op, buf, self.v(ctx, op.index), val if n > 1 else val[:, None], mask, ival(op.align))

    # ------------------------------------------------------------------ values
    def op_tessera_gpu_pack(self, ctx, op, mask):
        parts = [np.broadcast_to(np.asarray(self.v(ctx, e)), (ctx.nthreads,)) for e in op.elements]
        ctx.vals[op.result] = np.stack(parts, axis=1)

    def op_tessera_gpu_extract(self, ctx, op, mask):
        v = np.asarray(self.v(ctx, op.vector))
        ctx.vals[op.result] = v[..., ival(op.position)]

    def op_tessera_gpu_convert(self, ctx, op, mask):
        ctx.vals[op.result] = np.asarray(self.v(ctx, op.input)).astype(np_of(G.element_of(op.result.type)))

    def op_tessera_gpu_math(self, ctx, op: G.MathOp, mask):
        if op.is_typed():       # int / bool lanes (emulate/typed.py)
            args = [np.asarray(self.v(ctx, a)).astype(np_of(G.element_of(a.type))) for a in op.inputs]
            out = np_of(G.element_of(op.result.type))
            ctx.vals[op.result] = np.asarray(typed_run(op.fn.data, args, out)).astype(out)
            return
        args = [np.asarray(self.v(ctx, a), dtype=np.float32) for a in op.inputs]
        with np.errstate(all="ignore"):
            ctx.vals[op.result] = MATH[op.fn.data](*args).astype(np.float32)

    def op_tessera_gpu_shuffle_xor(self, ctx, op: G.ShuffleXorOp, mask):
        """Lane l of each wave gets lane (l ^ mask)'s value; the whole wave must take part."""
        width = ival(op.width)
        self.require_uniform(ctx, op, mask, width, "a wave shuffle")
        v = np.broadcast_to(np.asarray(self.v(ctx, op.value), dtype=np.float32), (ctx.nthreads,))
        t = np.arange(ctx.nthreads)
        ctx.vals[op.result] = v[(t - t % width) + ((t % width) ^ ival(op.mask))].copy()

    # ------------------------------------------------------------------ matrix instructions
    def _layout(self, family: str, shape, lanes: int, dtype: str) -> L.InstrLayout:
        try:
            return L.instr_layout(family, shape, arch=self.arch, lanes=lanes, dtype=dtype)
        except KeyError as e:
            raise EmulatorError(f"no {family} {shape} layout for {self.arch}: {e}") from None

    def matrix(self, ctx, op, lay: L.InstrLayout, a: np.ndarray, b: np.ndarray, c: np.ndarray, mask) -> np.ndarray:
        """D = A B + C for every wave; a/b/c are [T, items] lane registers."""
        lanes = lay.lanes
        self.require_uniform(ctx, op, mask, lanes, f"{op.name}")
        waves = ctx.nthreads // lanes
        mats = []
        for regs, ol, what in ((a, lay.a, "A"), (b, lay.b, "B"), (c, lay.c, "C")):
            regs = np.asarray(regs, dtype=np.float64).reshape(waves, lanes, ol.items)
            mat = np.zeros((waves, ol.rows, ol.cols))
            r, cc = ol.index[..., 0], ol.index[..., 1]
            mat[:, r, cc] = regs
            if ol.replicated and not np.array_equal(mat[:, r, cc], regs, equal_nan=True):
                w = int(np.flatnonzero((mat[:, r, cc] != regs).reshape(waves, -1).any(axis=1))[0])
                raise self.fail(EmulatorDivergenceError, ctx, op, f"lanes holding copies of one {what} element "
                                "disagree (operand not replicated as the instruction requires)", [w * lanes])
            mats.append(mat)
        d = mats[0] @ mats[1] + mats[2]
        r, cc = lay.c.index[..., 0], lay.c.index[..., 1]
        return d[:, r, cc].reshape(ctx.nthreads, lay.c.items).astype(np.float32)

    def _rocm(self, ctx, op, mask, family: str):
        shape = tuple(int(x) for x in op.shape.data.split("x"))
        if op.arch.data != self.arch:
            raise EmulatorError(f"{op.name} lowered for {op.arch.data}, emulating {self.arch}")
        a, b, c = (_per_thread(ctx, self.v(ctx, x)) for x in (op.a, op.b, op.c))
        dtype = "bf16" if isinstance(op.a.type.element_type, BFloat16Type) else "f16"
        lanes = None
        for cand in (32, 64):
            try:
                lay = L.instr_layout(family, shape, arch=self.arch, lanes=cand, dtype=dtype)
            except KeyError:
                continue
            if lay.a.items == a.shape[1] and lay.c.items == c.shape[1]:
                lanes = cand
                break
        if lanes is None:
            raise EmulatorError(f"no {family} {op.shape.data} layout on {self.arch} with {a.shape[1]} A and "
                                f"{c.shape[1]} C items per lane")
        ctx.vals[op.d] = self.matrix(ctx, op, lay, a, b, c, mask)

    def op_tessera_rocm_wmma(self, ctx, op, mask):
        self._rocm(ctx, op, mask, "wmma")

    def op_tessera_rocm_mfma(self, ctx, op, mask):
        self._rocm(ctx, op, mask, "mfma")

    def op_tessera_nvidia_mma_sync(self, ctx, op: NV.MmaSyncOp, mask):
        m, n, k = (int(x) for x in op.shape.data[1:].replace("n", " ").replace("k", " ").split())
        flat = [np.concatenate([_per_thread(ctx, self.v(ctx, r)).reshape(ctx.nthreads, -1) for r in regs], axis=1)
                for regs in (op.a, op.b, op.c)]
        lay = self._layout("mma_sync", (m, n, k), 32, op.atype.data)
        btype = op.btype.data if op.btype is not None else op.atype.data
        flat = [L.as_format(flat[0], op.atype.data), L.as_format(flat[1], btype), flat[2]]
        if op.atype.data == "f32":     # the tf32 record: A and B rounded as cvt.rna.tf32.f32 does (codegen/nvptx.py)
            flat = [L.tf32_rna(flat[0]), L.tf32_rna(flat[1]), flat[2]]
        d = self.matrix(ctx, op, lay, *flat, mask)
        for i, r in enumerate(op.d):
            ctx.vals[r] = d[:, i]

    def op_tessera_nvidia_ldmatrix(self, ctx, op: NV.LdmatrixOp, mask):
        num = len(op.regs)
        lay = L.ldmatrix_layout(num, op.trans is not None)
        self.require_uniform(ctx, op, mask, 32, "ldmatrix")
        buf: Buf = self.v(ctx, op.buf)
        idx = np.broadcast_to(np.asarray(self.v(ctx, op.index), dtype=np.int64), (ctx.nthreads,))
        warps = ctx.nthreads // 32
        lane = np.arange(32)
        # rows: [warp, matrix, row] -> element index of the row's first element (16 bytes, 8 elements)
        rows = np.full((warps, num, 8), -1, dtype=np.int64)
        used = lay.addr[:, 0] >= 0
        q, r = lay.addr[used, 0], lay.addr[used, 1]
        rows[:, q, r] = idx.reshape(warps, 32)[:, lane[used]]
        # each row: 8 consecutive 16-bit elements, 16-byte aligned
        flat_rows = rows.reshape(-1)
        # only the active warps read (a warp masked off, e.g. a workgroup whose loop already ended while
        # another's runs on, neither reads nor counts as a reader for the race check)
        row_mask = np.repeat(mask.reshape(warps, 32)[:, 0], num * 8)
        fake = Ctx(ctx.kernel, flat_rows.size, 8, ctx.groups, np.zeros(flat_rows.size, np.int64),
                   np.repeat(ctx.gid.reshape(warps, 32)[:, 0], num * 8), ctx.block_ids, ctx.epoch)
        fake.tid = np.repeat(ctx.tid.reshape(warps, 32)[:, 0], num * 8)  # attribute reads to the warp's lane 0
        data = self.read(fake, op, buf, flat_rows, 8, row_mask, 16, buf.data.dtype)
        data = data.reshape(warps, num, 8, 8)
        res = lay.result  # [32, num, 2, 3]
        w = np.arange(warps)[:, None, None, None]
        out = data[w, res[None, ..., 0], res[None, ..., 1], res[None, ..., 2]]  # [warps, 32, num, 2]
        out = out.reshape(ctx.nthreads, num, 2)
        for j, reg in enumerate(op.regs):
            ctx.vals[reg] = out[:, j, :]

    def op_tessera_nvidia_cp_async(self, ctx, op: NV.CpAsyncOp, mask):
        """The copy is recorded as in flight: its shared elements may not be read (by anyone)
        until a ``cp_async_wait`` lands its group; it may land at any time from now on, so
        writing over elements another thread read in this barrier interval is a race now."""
        dst: Buf = self.v(ctx, op.dst)
        src: Buf = self.v(ctx, op.src)
        nbytes = ival(op.bytes)
        esize = dst.data.dtype.itemsize
        n = nbytes // esize
        srcb = np.broadcast_to(np.asarray(self.v(ctx, op.src_bytes), dtype=np.int64), (ctx.nthreads,))
        if (mask & ((srcb < 0) | (srcb > nbytes) | (srcb % esize != 0))).any():
            raise self.fail(EmulatorError, ctx, op, f"src_bytes outside 0..{nbytes} or not whole elements",
                            np.flatnonzero(mask)[:1])
        reads = mask & (srcb > 0)
        idx = np.broadcast_to(np.asarray(self.v(ctx, op.src_index), dtype=np.int64), (ctx.nthreads,))
        data = np.zeros((ctx.nthreads, n), dtype=src.data.dtype)
        if reads.any():
            self._index(ctx, op, src, idx, 1, reads, nbytes, esize)   # the source address: aligned, in bounds
            for q in range(n):
                ok = reads & (srcb // esize > q)
                if ok.any():
                    data[ok, q] = self.read(ctx, op, src, idx + q, 1, ok, esize, src.data.dtype)[ok]
        didx = np.broadcast_to(np.asarray(self.v(ctx, op.dst_index), dtype=np.int64), (ctx.nthreads,))
        elems = self._index(ctx, op, dst, didx, n, mask, nbytes, esize)
        act = np.flatnonzero(mask)
        e = elems[act]
        g = np.broadcast_to(ctx.gid[act][:, None], e.shape)
        if dst.pending[g, e].any():
            raise self.fail(EmulatorRaceError, ctx, op, "two copies in flight write one shared element", act[:1])
        th = np.broadcast_to(ctx.tid[act][:, None], e.shape)
        war = (dst.r_epoch[g, e] == ctx.epoch[g]) & (dst.r_thread[g, e] != th) & (dst.r_thread[g, e] != -1)
        if war.any():
            raise self.fail(EmulatorRaceError, ctx, op, "a copy may overwrite shared elements another thread read "
                            "with no barrier between", act[np.flatnonzero(war.any(axis=1))])
        dst.pending[g, e] = True
        ctx.async_open.append((dst, g, e, data[act], act))

    def op_tessera_nvidia_cp_async_commit(self, ctx, op, mask):
        ctx.async_groups.append(ctx.async_open)
        ctx.async_open = []

    def op_tessera_nvidia_cp_async_wait(self, ctx, op, mask):
        keep = ival(op.pending)
        land = ctx.async_groups[:max(0, len(ctx.async_groups) - keep)]
        ctx.async_groups = ctx.async_groups[len(land):]
        for group in land:
            for dst, g, e, data, act in group:
                dst.pending[g, e] = False
                self._check_write(ctx, op, dst, g, e, act)
                dst.data[g, e] = data.astype(dst.data.dtype)
                if dst.unfenced is not None:       # cp.async writes through the generic proxy
                    dst.unfenced[g, e] = True

    def op_tessera_gpu_launch(self, ctx, op, mask):
        raise EmulatorError("tessera_gpu.launch is a host step, not kernel code")


def _per_thread(ctx: Ctx, v) -> np.ndarray:
    a = np.asarray(v)
    return np.broadcast_to(a, (ctx.nthreads,)) if a.ndim == 0 else a


def _where(cond, a, b):
    if a is None:
        return b
    if b is None:
        return a
    a, b = np.asarray(a), np.asarray(b)
    c = np.asarray(cond)
    while c.ndim < max(a.ndim, b.ndim):
        c = c[..., None]
    return np.where(c, a, b)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


_erf64 = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    return _erf64(x.astype(np.float64)).astype(np.float32)


MATH = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum, "min": np.minimum,
    "neg": np.negative, "exp": np.exp, "exp_bounded": np.exp, "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0),
    "exp2_bounded": lambda x: np.where(x < -126, np.float32(0), np.exp2(x)),
    "abs": np.abs, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "recip": lambda x: 1 / x,
    "copy": lambda x: x, "silu": lambda x: x / (1 + np.exp(-x)), "gelu_tanh": _gelu_tanh,
    "gelu_erf": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(np.float32(2)))), "erf": _erf,
    "finite_or_zero": lambda x: np.where(np.isfinite(x), x, np.float32(0)),
    "safe_div": lambda a, b: np.where(b == 0, np.float32(0), a / np.where(b == 0, np.float32(1), b)),
    "mask_select": lambda a, b: np.where(b != 0, a, np.float32(-np.inf)),
    "select_max": lambda a, b: np.where(a > b, a, b),
    "floor": np.floor, "ceil": np.ceil, "round": np.rint, "square": np.square, "sign": np.sign,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "log": np.log, "sin": np.sin, "cos": np.cos,
}


__all__ = ["Emulator", "MATH"]
