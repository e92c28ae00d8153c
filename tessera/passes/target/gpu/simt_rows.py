"""The GPU SIMT lowering of row kernels (``gpu.rows`` kernels: elementwise chains, softmax /
layer_norm / rms_norm, row reductions, copies), shared by both GPU lanes.

The Tile IR of such a kernel is written per workgroup: a ``[1, C]`` tile is one chunk of a row,
and the lowering owns its distribution: thread ``tid`` holds columns ``tid*V .. tid*V + V - 1``
(``V = C / block``; consecutive threads hold consecutive runs, so a warp's accesses are
coalesced).  A ``[1, 1]`` tile is one f32 value every thread of the workgroup holds.

- ``tile.load`` of a ``[1, C]`` view: one vector load per thread (16 bytes for 16-bit data with
  V = 8, or f32 with V = 4) where the thread's run lies inside the view's valid extent and its
  address is V-element aligned; else element loads with the view's pad outside the extent
  (the row's tail, or a row whose start is not aligned); a strided view (a transposed leaf)
  loads element by element;
- ``tile.store``: the same, vector or masked elements; a ``[1, 1]`` value is stored by thread 0;
- ``tile.reduce`` of a ``[1, C]`` tile: each thread folds its V items in order, the wave folds
  with ``tessera_gpu.shuffle_xor`` butterflies (every lane ends with the wave's result), then
  lane 0 of each wave writes it to shared memory and, after a barrier, every thread folds the
  waves' results in wave order: one value per workgroup, the same in every thread, in a fixed
  order (results do not depend on timing);
- ``tile.elementwise`` on vectors of V items (a ``[1, 1]`` operand broadcast), ``tile.mask``
  per item on its column, ``tile.splat_index`` as an index converted to f32.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerType, StringAttr, f32
from xdsl.ir import Attribute, SSAValue

from tessera.errors import CodegenError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ival
from tessera.ir.builder import Builder
from tessera.ir.target import gpu as G
from tessera.passes.target.gpu.simt import GPU_REFUSED_FNS, SimtLowerer
from tessera.passes.target.gpu.simt_values import (
    Dist,
    Item,
    OperandMap,
    Splat,
    View,
    const_int,
    elem_bytes,
    part_type,
    vec,
)

REDUCE_FNS = {"add": "add", "max": "max", "select_max": "max", "min": "min", "mul": "mul"}
NEUTRAL = {"add": 0.0, "max": float("-inf"), "min": float("inf"), "mul": 1.0}


def is_row_kernel(fn) -> bool:
    return "gpu.rows" in fn.attributes


@dataclass
class RowsLowerer(SimtLowerer):
    """A :class:`SimtLowerer` for ``gpu.rows`` kernels (no fragments)."""

    # ------------------------------------------------------------------ distribution
    def per_thread(self, C: int) -> int:
        if C % self.block:
            raise CodegenError(f"a [1, {C}] row tile is not whole runs of the workgroup's {self.block} threads")
        return C // self.block

    def row_map(self, b: Builder, C: int) -> OperandMap:
        V = self.per_thread(C)
        base = b.mul(self.tid, V)
        return OperandMap([Item(0, 0, base, i, V) for i in range(V)], [V])

    def run_start(self, b: Builder, C: int):
        return b.mul(self.tid, self.per_thread(C))

    def splat_dist(self, b: Builder, value: SSAValue, C: int) -> Dist:
        V = self.per_thread(C)
        return Dist([self.pack(b, [value] * V)], self.row_map(b, C), (1, C))

    def const(self, b: Builder, v):
        return self.fconst(b, v.value, v.elem) if isinstance(v, Splat) else v

    def as_parts(self, b: Builder, v, like: Dist) -> list[SSAValue]:
        V = like.omap.parts[0]
        if isinstance(v, Dist):
            if v.omap.parts != like.omap.parts:
                raise CodegenError("row tiles of different widths meet in one elementwise op")
            return v.parts
        s = self.const(b, v)
        if not isinstance(s, SSAValue):
            raise CodegenError(f"cannot use {type(v).__name__} as a row tile operand on the GPU")
        return [self.pack(b, [s] * V)]

    def op_scf_for(self, op, b: Builder) -> None:
        """A constant ``[1, 1]`` tile carried by a loop (top_k's starting sentinel) becomes the value
        every thread holds, as a loop-carried register."""
        for a in op.iter_args:
            v = self.vmap.get(a)
            if isinstance(v, Splat):
                self.vmap[a] = self.fconst(b, v.value, v.elem)
        super().op_scf_for(op, b)

    # ------------------------------------------------------------------ memory
    def _fast(self, b: Builder, vv: View, c0, V: int):
        """True where this thread's V columns lie inside the extent at a V-aligned address."""
        inside = b.cmp("sle", b.add(c0, V), vv.cols)
        aligned = b.cmp("eq", b.rem(b.add(vv.off, c0), V), 0)
        return b.op(arith.AndIOp(inside, aligned)).results[0]

    def load_row(self, b: Builder, vv: View, pad: float, to: Attribute = f32) -> Dist:
        C = vv.shape[1]
        V = self.per_thread(C)
        c0 = self.run_start(b, C)
        omap = self.row_map(b, C)

        def elements(be: Builder):
            return [self.pack(be, [self.masked_load(be, vv, 0, be.add(c0, i), to, pad, check_rows=False)
                                   for i in range(V)])]
        if V == 1 or const_int(vv.cs) != 1:
            return Dist(elements(b), omap, (1, C))
        esize = elem_bytes(vv.elem)

        def vector(bv: Builder):
            raw = self.load(bv, vv.base, self.address(bv, vv, 0, c0), vec(vv.elem, V), min(V * esize, 16))
            return [self.convert(bv, raw, to)]
        part = b.if_(self._fast(b, vv, c0, V), vector, elements, [vec(to, V)])[0]
        return Dist([part], omap, (1, C))

    def op_tile_load(self, op: t.LoadOp, b: Builder) -> None:
        vv: View = self.vmap[op.source]
        R, C = vv.shape
        pad = op.pad.value.data if op.pad is not None else 0.0
        to = op.result.type.element_type      # f32 registers; int / bool tiles hold their own type
        if R != 1:
            raise CodegenError(f"a row kernel loads [1, C] tiles, not [{R}, {C}]")
        if C == 1:      # one value per row (a broadcast leaf): every thread reads it
            self.vmap[op.result] = self.masked_load(b, vv, 0, 0, to, pad)
            return
        self.vmap[op.result] = self.load_row(b, vv, pad, to)

    def op_tile_store(self, op: t.StoreOp, b: Builder) -> None:
        vv: View = self.vmap[op.dest]
        d = self.vmap[op.value]
        C = vv.shape[1]
        esize = elem_bytes(vv.elem)
        if C == 1:
            val = self.convert(b, self.const(b, d), vv.elem)
            b.if_(b.cmp("eq", self.tid, 0), lambda bt: self.store(bt, val, vv.base, vv.off, esize) or [])
            return
        if not isinstance(d, Dist):
            d = self.splat_dist(b, self.const(b, d), C)
        V = self.per_thread(C)
        c0 = self.run_start(b, C)
        part = d.parts[0]

        def elements(be: Builder):
            for i in range(V):
                c = be.add(c0, i)
                val = self.convert(be, self.extract(be, part, i), vv.elem)
                be.if_(be.cmp("slt", c, vv.cols), lambda bt, c=c, val=val: self.store(
                    bt, val, vv.base, self.address(bt, vv, 0, c), esize) or [])
            return []
        if V == 1 or const_int(vv.cs) != 1:
            elements(b)
            return

        def vector(bv: Builder):
            self.store(bv, self.convert(bv, part, vv.elem), vv.base, self.address(bv, vv, 0, c0), min(V * esize, 16))
            return []
        b.if_(self._fast(b, vv, c0, V), vector, elements)

    # ------------------------------------------------------------------ math
    def op_tile_elementwise(self, op: t.ElementwiseOp, b: Builder) -> None:
        fn = op.fn.data
        self.refuse_typed(op)
        if fn in GPU_REFUSED_FNS:
            raise CodegenError(f"tile.elementwise {fn} has no lowering on this GPU lane ({self.lowering_name}); "
                               f'target="cpu" compiles tessera.ops.{fn}')
        vals = [self.vmap[v] for v in op.inputs]
        like = next((v for v in vals if isinstance(v, Dist)), None)
        C = op.result.type.dims[1]
        relem = op.result.type.element_type
        typed = self.is_typed(op)
        if like is None:
            args = [self.const(b, v) for v in vals]
            r = b.op(G.MathOp.create(operands=args, attributes={"fn": op.fn},
                                     result_types=[relem if typed else f32])).results[0]
            self.vmap[op.result] = r if C == 1 else self.splat_dist(b, r, C)
            return
        args = [self.as_parts(b, v, like)[0] for v in vals]
        rt = part_type(relem, like.omap.parts[0]) if typed else args[0].type
        r = b.op(G.MathOp.create(operands=args, attributes={"fn": op.fn}, result_types=[rt])).results[0]
        self.vmap[op.result] = Dist([r], like.omap, op.result.type.dims)

    def op_tile_constant(self, op: t.ConstantOp, b: Builder) -> None:
        C = op.result.type.dims[1]
        if op.step is not None:     # column indices: value + step * column, per item
            elem = op.result.type.element_type
            if isinstance(elem, IntegerType) or C == 1:
                raise CodegenError("tile.constant with a step is a float [1, C] ramp on the GPU")
            base, step = op.value.value.data, op.step.value.data
            omap = self.row_map(b, C)
            items = []
            for it in omap.items:
                col = b.op(G.ConvertOp.create(operands=[b.c(b.add(it.cbase, it.cdelta))],
                                              result_types=[f32])).results[0]
                items.append(b.op(G.MathOp.create(operands=[self.fconst(b, base), b.op(G.MathOp.create(
                    operands=[col, self.fconst(b, step)], attributes={"fn": StringAttr("mul")},
                    result_types=[f32])).results[0]], attributes={"fn": StringAttr("add")},
                    result_types=[f32])).results[0])
            self.vmap[op.result] = Dist([self.pack(b, items)], omap, (1, C))
            return
        super().op_tile_constant(op, b)
        if C > 1:   # a [1, C] constant carried through a loop must have the row tile's registers
            self.vmap[op.result] = self.splat_dist(b, self.const(b, self.vmap[op.result]), C)

    def op_tile_index(self, op: t.IndexOp, b: Builder) -> None:
        """``tile.index`` of a row tile: item i of this thread is base + its column (col_step 1), or
        base (col_step 0), in the tile's element type (an int, or f32)."""
        R, C = op.result.type.dims
        elem = op.result.type.element_type
        base = self.scalar(op.base)
        if R != 1 or ival(op.row_step) != 0 and R > 1:
            raise CodegenError("tile.index in a row kernel is a [1, C] tile")

        def value(idx) -> SSAValue:
            i64 = b.op(arith.IndexCastOp(b.c(idx), IntegerType(64))).results[0]
            return self.convert(b, i64, elem)
        if C == 1 or ival(op.col_step) == 0:
            v = value(base)
            self.vmap[op.result] = v if C == 1 else self.splat_dist(b, v, C)
            return
        omap = self.row_map(b, C)
        items = [value(b.add(base, b.add(it.cbase, it.cdelta))) for it in omap.items]
        self.vmap[op.result] = Dist([self.pack(b, items)], omap, (1, C))

    def op_tile_splat_index(self, op, b: Builder) -> None:
        self.vmap[op.result] = b.op(G.ConvertOp.create(operands=[self.scalar(op.input)], result_types=[f32])).results[0]

    def op_tile_mask(self, op: t.MaskOp, b: Builder) -> None:
        if op.diag is not None:
            raise CodegenError("tile.mask with a diagonal has no row-kernel lowering")
        super().op_tile_mask(op, b)

    # ------------------------------------------------------------------ reductions
    def combine(self, b: Builder, fn: str, x: SSAValue, y: SSAValue) -> SSAValue:
        return b.op(G.MathOp.create(operands=[x, y], attributes={"fn": StringAttr(fn)},
                                    result_types=[x.type])).results[0]

    def butterfly(self, b: Builder, fn: str, v: SSAValue) -> SSAValue:
        """The wave's fold of v in every lane: xor-shuffles of 16, 8, 4, 2, 1 (32 first on wave64)."""
        m = self.wave // 2
        while m >= 1:
            other = b.op(G.ShuffleXorOp.create(operands=[v], attributes={"mask": i64_attr(m),
                                                                         "width": i64_attr(self.wave)},
                                               result_types=[f32])).results[0]
            v = self.combine(b, fn, v, other)
            m //= 2
        return v

    def wave_totals(self, b: Builder, t_: SSAValue) -> list[SSAValue]:
        """Every wave's value of ``t_`` (the same in all its lanes), in wave order, in every thread:
        lane 0 of each wave writes it to shared memory; a barrier; all read; a barrier (so the
        next use of the scratch, in a loop, writes after every read)."""
        nwaves = self.block // self.wave
        if nwaves == 1:
            return [t_]
        alloc = t.AllocOp.create(attributes={"size": i64_attr(nwaves)},
                                 result_types=[t.BufferType(f32, StringAttr(self.space))])
        self.op_tile_alloc(alloc, b)
        scratch = self.vmap.pop(alloc.result)
        wid = b.c(self.wave_id)
        b.if_(b.cmp("eq", b.c(self.lane), 0), lambda bt: self.store(bt, t_, scratch, wid, 4) or [])
        b.op(G.BarrierOp.create())
        vals = [self.load(b, scratch, b.c(w), f32, 4) for w in range(nwaves)]
        b.op(G.BarrierOp.create())
        return vals

    def op_tile_scan(self, op: t.ScanOp, b: Builder) -> None:
        """Inclusive scan of a row chunk: each thread scans its V items in order; the threads'
        totals are scanned across the wave with xor-shuffles (at distance m a lane whose bit m is set
        takes its partner group's total into its exclusive prefix; every lane folds the partner's total
        into its group's), then across waves through shared memory; item i of a thread is
        carry . (earlier waves) . (earlier lanes) . (its items 0..i)."""
        src = self.vmap[op.input]
        fn = op.kind.data
        if not isinstance(src, Dist):
            raise CodegenError("tile.scan on the GPU scans a row tile distributed over the workgroup")
        carry = self.const(b, self.vmap[op.carry])
        items = self.items_of(src, b)
        run = [items[0]]
        for x in items[1:]:
            run.append(self.combine(b, fn, run[-1], x))
        total = run[-1]
        excl = self.fconst(b, NEUTRAL[fn])
        m = 1
        while m < self.wave:
            other = b.op(G.ShuffleXorOp.create(operands=[total], attributes={"mask": i64_attr(m),
                                                                             "width": i64_attr(self.wave)},
                                               result_types=[f32])).results[0]
            upper = b.cmp("eq", b.rem(b.div(b.c(self.lane), m), 2), 1)
            excl = self.typed(b, "select", [upper, self.combine(b, fn, other, excl), excl], f32)
            total = self.combine(b, fn, other, total)
            m *= 2
        waves = self.wave_totals(b, total)
        before, chunk_total = carry, carry
        for w, tw in enumerate(waves):
            if len(waves) > 1:
                take = b.cmp("slt", w, b.c(self.wave_id))
                before = self.typed(b, "select", [take, self.combine(b, fn, before, tw), before], f32)
            chunk_total = self.combine(b, fn, chunk_total, tw)
        prefix = self.combine(b, fn, before, excl)
        out = [self.combine(b, fn, prefix, r) for r in run]
        parts, i = [], 0
        for lo, hi in src.omap.part_slices():
            parts.append(self.pack(b, out[i:i + hi - lo]))
            i += hi - lo
        self.vmap[op.result] = Dist(parts, src.omap, src.shape)
        self.vmap[op.total] = chunk_total

    def op_tile_reduce(self, op: t.ReduceOp, b: Builder) -> None:
        src = self.vmap[op.input]
        kind = op.kind.data
        if ival(op.axis) != 1 or kind not in REDUCE_FNS:
            raise CodegenError(f"tile.reduce kind {kind!r} on axis {ival(op.axis)} has no row-kernel lowering")
        fn = REDUCE_FNS[kind]
        if not isinstance(src, Dist):   # a [1, 1] tile: already the row's value
            self.vmap[op.result] = self.fconst(b, src.value) if isinstance(src, Splat) else src
            return
        items = self.items_of(src, b)
        acc = items[0]
        for x in items[1:]:
            acc = self.combine(b, fn, acc, x)
        acc = self.butterfly(b, fn, acc)
        nwaves = self.block // self.wave
        if nwaves > 1:
            alloc = t.AllocOp.create(attributes={"size": i64_attr(nwaves)},
                                     result_types=[t.BufferType(f32, StringAttr(self.space))])
            self.op_tile_alloc(alloc, b)
            scratch = self.vmap.pop(alloc.result)
            wid = b.c(self.wave_id)
            b.if_(b.cmp("eq", b.c(self.lane), 0), lambda bt: self.store(bt, acc, scratch, wid, 4) or [])
            b.op(G.BarrierOp.create())
            vals = []
            for w0 in range(0, nwaves, 4):
                n = min(4, nwaves - w0)
                if n == 4:
                    v4 = self.load(b, scratch, b.c(w0), vec(f32, 4), 16)
                    vals += [self.extract(b, v4, i) for i in range(4)]
                else:
                    vals += [self.load(b, scratch, b.c(w0 + i), f32, 4) for i in range(n)]
            acc = vals[0]
            for x in vals[1:]:
                acc = self.combine(b, fn, acc, x)
        self.vmap[op.result] = acc


__all__ = ["RowsLowerer", "is_row_kernel"]
