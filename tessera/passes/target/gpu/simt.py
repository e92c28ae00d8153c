"""The machinery the GPU tile -> target lowerings share: Tile IR (written per wave) ->
the program of one thread (``tessera_gpu`` ops + the target's matrix instructions).

The compiler owns the lane mapping.  A target supplies a :class:`LaneMap` per
instruction: for each operand, which matrix element (row, col) every item of a
lane's registers holds, as per-lane base expressions plus static offsets
(:class:`Item`), how the items group into registers, and how to emit the
instruction.  With it this module lowers:

- ``tile.fragment_pack`` -> per-lane loads of exactly the elements the lane holds
  (runs of consecutive columns become one vector load; edge views are masked);
- ``tile.mma`` -> the target instruction on the registers, the accumulator threaded;
- ``tile.fragment_unpack`` / ``tile.elementwise`` / ``tile.store`` -> per-lane math
  on the accumulator's items and masked stores at their coordinates; ``tile.load``
  operands (bias rows) are loaded at the coordinates of the tile they combine with;
- ``tile.async_copy`` into shared memory -> the workgroup's threads each moving a
  share (16-byte vectors when strides and alignment allow, else elements);
- ``tile.program_id`` / ``tile.wave_id`` / ``tile.barrier`` / ``tile.alloc``.

- ``tile.mask`` -> a select per item on its coordinates (column bound, causal diagonal);
- ``tile.reduce`` of a wave's tile in shared memory -> one lane per row folding it, the
  result a per-wave vector in shared memory read back as a column broadcast.

- int32 / int64 / bool tiles hold their own type in registers (bools as ``i1``): a typed
  ``tile.elementwise`` becomes a typed ``tessera_gpu.math`` (``simt_typed.py``; ``pow`` is refused
  by name), ``tile.load_index`` an index read and clamped.

``tile.splat_index`` is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd

from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import (
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    StringAttr,
    VectorType,
    f32,
)
from xdsl.ir import Attribute, Block, Region, SSAValue

from tessera.errors import CodegenError, PassFailedError

# tile.elementwise functions the GPU lanes refuse by name (tessera.ops's log1p, exp2, expm1; log, sin and
# cos run as the CPU lane's f64-widened polynomials: log_softmax and rotary embeddings need them)
GPU_REFUSED_FNS = ("log1p", "exp2", "expm1")
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ival
from tessera.ir.builder import INDEX, Builder
from tessera.ir.target import gpu as G
from tessera.passes.target.lowering import OpLowerer
from tessera.passes.util import swap_op



from tessera.passes.target.gpu.simt_copy import SimtCopies
from tessera.passes.target.gpu.simt_typed import GPU_REFUSED_TYPED, SimtTyped  # noqa: F401  (re-exported)
from tessera.passes.target.gpu.simt_values import (  # noqa: F401  (re-exported)
    Deferred, Dist, Frag, Idx, Item, LaneMap, OperandMap, Splat, View, _pow2_floor, const_int, elem_bytes,
    lane_split, part_type, vec,
)


@dataclass
class IndexTile:
    """A ``tile.index`` in a matrix kernel: item (r, c) = base + r * rs + c * cs, of type ``elem``."""
    base: SSAValue
    rs: int
    cs: int
    elem: Attribute


# --------------------------------------------------------------------------- the lowerer
@dataclass
class SimtLowerer(SimtTyped, SimtCopies, OpLowerer):
    maps: dict                       # FragmentType (m, n, k, family, elem) key -> LaneMap
    wave: int
    block: int                       # threads per workgroup
    space: str                       # lds | smem
    vmap: dict = field(default_factory=dict)
    shared_bytes: int = 0
    unpacked: "Dist | None" = None    # the last accumulator unpacked (an epilogue's lane map)
    lowering_name = "the GPU lowering"

    # ------------------------------------------------------------------ entry
    def lower_kernel(self, fn: func.FuncOp, make_map) -> func.FuncOp:
        src = fn.body.block
        block = Block(arg_types=[a.type for a in src.args])
        for a, n in zip(src.args, block.args):
            self.vmap[a] = n
        b = Builder(block)
        tid = b.op(G.ThreadIdOp.create(result_types=[INDEX])).results[0]
        self.tid = tid
        self.lane = b.rem(tid, self.wave)
        self.wave_id = b.div(tid, self.wave)
        for op in fn.walk():
            for r in op.results:
                if isinstance(r.type, t.FragmentType):
                    key = self.key(r.type)
                    if key not in self.maps:
                        lm = make_map(r.type)
                        lm.build(b, b.c(self.lane))
                        self.maps[key] = lm
        self.lower_block(src, b)
        new = func.FuncOp(fn.sym_name.data, ([a.type for a in src.args], []), Region(block))
        for k in ("gpu.block", "gpu.waves", "vector", "tma.maps"):
            if k in fn.attributes:
                new.attributes[k] = fn.attributes[k]
        new.attributes["gpu.shared"] = i64_attr(self.shared_bytes)
        new.attributes["gpu.kernel"] = StringAttr(self.space)
        return new

    @staticmethod
    def key(ft: t.FragmentType) -> tuple:
        # A/B fragments of different dtypes are different instructions (f16 vs bf16 mma); the
        # accumulator's layout depends on the shape alone
        return ft.mnk + (ft.family.data, "acc" if ft.role.data == "acc" else str(ft.elem))

    def lmap(self, ft: t.FragmentType) -> LaneMap:
        try:
            return self.maps[self.key(ft)]
        except KeyError:
            raise CodegenError(f"no lane map for {ft}") from None

    # ------------------------------------------------------------------ values
    def scalar(self, v: SSAValue) -> SSAValue:
        r = self.vmap[v]
        if not isinstance(r, SSAValue):
            raise CodegenError(f"expected a scalar for {v}")
        return r

    def flat(self, v: SSAValue) -> list[SSAValue]:
        r = self.vmap[v]
        if isinstance(r, (Dist, Frag)):
            return list(r.parts)
        if r is None:
            return []
        if isinstance(r, SSAValue):
            return [r]
        raise CodegenError(f"{type(r).__name__} values cannot cross a loop or branch on the GPU")

    def types_of(self, v: SSAValue) -> list[Attribute]:
        r = self.vmap.get(v)
        return [p.type for p in self.flat(v)] if r is not None else []

    def rebuild(self, template, vals: list[SSAValue]):
        if isinstance(template, Dist):
            return Dist(vals, template.omap, template.shape)
        if isinstance(template, Frag):
            return Frag(vals, template.omap)
        if template is None:
            return None
        return vals[0]

    # ------------------------------------------------------------------ blocks
    def _carried(self, values: list[SSAValue]) -> list:
        return [self.vmap[v] if not isinstance(v.type, t.TokenType) else None for v in values]

    def op_scf_for(self, op: scf.ForOp, b: Builder) -> None:
        templates = self._carried(list(op.iter_args))
        init = [v for a in op.iter_args for v in self.flat(a)]
        src = op.body.block
        block = Block(arg_types=[INDEX] + [v.type for v in init])
        self.vmap[src.args[0]] = block.args[0]
        i = 1
        for a, tpl in zip(src.args[1:], templates):
            n = len(tpl.parts) if isinstance(tpl, (Dist, Frag)) else 0 if tpl is None else 1
            self.vmap[a] = self.rebuild(tpl, list(block.args[i:i + n]))
            i += n
        self.lower_block(src, b.child(block))
        new = scf.ForOp(self.scalar(op.lb), self.scalar(op.ub), self.scalar(op.step), init, Region(block))
        b.op(new)
        i = 0
        for r, tpl in zip(op.results, templates):
            n = len(tpl.parts) if isinstance(tpl, (Dist, Frag)) else 0 if tpl is None else 1
            self.vmap[r] = self.rebuild(tpl, list(new.results[i:i + n]))
            i += n

    def op_scf_yield(self, op: scf.YieldOp, b: Builder) -> None:
        b.op(scf.YieldOp(*[v for a in op.operands for v in self.flat(a)]))

    def op_scf_if(self, op: scf.IfOp, b: Builder) -> None:
        if op.results:
            raise CodegenError("scf.if with results is not produced by the GPU generators")
        regions = []
        for region in (op.true_region, op.false_region):
            if not region.blocks:
                regions.append(None)
                continue
            block = Block()
            self.lower_block(region.block, b.child(block))
            regions.append(Region(block))
        b.op(scf.IfOp(self.scalar(op.cond), [], regions[0], regions[1]))

    def op_func_return(self, op, b: Builder) -> None:
        b.op(func.ReturnOp())

    # ------------------------------------------------------------------ work distribution
    def op_tile_program_id(self, op: t.ProgramIdOp, b: Builder) -> None:
        self.vmap[op.result] = b.op(G.BlockIdOp.create(attributes={"axis": op.axis},
                                                        result_types=[INDEX])).results[0]

    def op_tile_wave_id(self, op, b: Builder) -> None:
        self.vmap[op.result] = b.c(self.wave_id)

    def op_tile_barrier(self, op, b: Builder) -> None:
        b.op(G.BarrierOp.create())

    def op_tile_wait(self, op: t.WaitOp, b: Builder) -> None:
        pass  # plain loads and stores: the copy is complete when the thread reaches this point

    def op_tile_alloc(self, op: t.AllocOp, b: Builder) -> None:
        ty: t.BufferType = op.result.type
        if ty.space.data != self.space:
            raise CodegenError(f"tile.alloc in {ty.space.data!r}: this GPU's shared memory is {self.space!r}")
        off = (self.shared_bytes + 15) // 16 * 16
        size = ival(op.size)
        new = G.SharedOp.create(attributes={"offset": i64_attr(off), "size": i64_attr(size)},
                                result_types=[ty])
        b.op(new)
        self.shared_bytes = off + size * elem_bytes(ty.element_type)
        self.vmap[op.result] = new.result

    def op_tile_view(self, op: t.ViewOp, b: Builder) -> None:
        ty = op.result.type
        R, C = ty.dims
        rk, ck = const_int(self.scalar(op.rows)), const_int(self.scalar(op.cols))
        full = rk is not None and ck is not None and rk >= R and ck >= C
        rows = b.max(b.min(self.scalar(op.rows), R), 0)
        cols = b.max(b.min(self.scalar(op.cols), C), 0)
        self.vmap[op.result] = View(self.scalar(op.source), self.scalar(op.offset), self.scalar(op.row_stride),
                                    self.scalar(op.col_stride), b.c(rows), b.c(cols), (R, C), ty.element_type,
                                    ival(op.align) if op.align is not None else 1, full)

    # ------------------------------------------------------------------ element access
    def load(self, b: Builder, base: SSAValue, index: Idx, ty: Attribute, align: int) -> SSAValue:
        return b.op(G.LoadOp.create(operands=[base, b.c(index)], attributes={"align": i64_attr(align)},
                                    result_types=[ty])).results[0]

    def store(self, b: Builder, value: SSAValue, base: SSAValue, index: Idx, align: int) -> None:
        b.op(G.StoreOp.create(operands=[value, base, b.c(index)], attributes={"align": i64_attr(align)}))

    def fconst(self, b: Builder, value: float, elem: Attribute = f32) -> SSAValue:
        if isinstance(elem, IntegerType):      # int / bool values (true is 1)
            iv = int(value != 0) if elem.width.data == 1 else int(value)
            return b.op(arith.ConstantOp(IntegerAttr(iv, elem), elem)).results[0]
        return b.op(arith.ConstantOp(FloatAttr(value, elem), elem)).results[0]

    def convert(self, b: Builder, v: SSAValue, to: Attribute) -> SSAValue:
        src = G.element_of(v.type)
        if src == to:
            return v
        ty = vec(to, G.lanes_of(v.type)) if isinstance(v.type, VectorType) else to
        if isinstance(to, IntegerType) or (isinstance(src, IntegerType) and src.width.data > 1):
            return self.typed(b, "cvt", [v], ty)     # int lanes: numpy's astype (typed cvt)
        return b.op(G.ConvertOp.create(operands=[v], result_types=[ty])).results[0]

    def pack(self, b: Builder, scalars: list[SSAValue]) -> SSAValue:
        if len(scalars) == 1:
            return scalars[0]
        return b.op(G.PackOp.create(operands=scalars, result_types=[vec(scalars[0].type, len(scalars))])).results[0]

    def extract(self, b: Builder, v: SSAValue, i: int) -> SSAValue:
        if not isinstance(v.type, VectorType):
            return v
        return b.op(G.ExtractOp.create(operands=[v], attributes={"position": i64_attr(i)},
                                       result_types=[v.type.element_type])).results[0]

    def items_of(self, d: Dist | Frag, b: Builder) -> list[SSAValue]:
        out = []
        for (lo, hi), p in zip(d.omap.part_slices(), d.parts):
            out += [self.extract(b, p, i) for i in range(hi - lo)]
        return out

    def coords(self, b: Builder, it: Item) -> tuple[Idx, Idx]:
        return b.add(it.rbase, it.rdelta), b.add(it.cbase, it.cdelta)

    def address(self, b: Builder, vv: View, r: Idx, c: Idx) -> Idx:
        return b.add(vv.off, b.add(b.mul(r, vv.rs), b.mul(c, vv.cs)))

    def valid(self, b: Builder, vv: View, r: Idx | None, c: Idx | None) -> SSAValue | None:
        conds = []
        if r is not None:
            conds.append(b.cmp("slt", r, vv.rows))
        if c is not None:
            conds.append(b.cmp("slt", c, vv.cols))
        if not conds:
            return None
        out = conds[0]
        for x in conds[1:]:
            out = b.op(arith.AndIOp(out, x)).results[0]
        return out

    def masked_load(self, b: Builder, vv: View, r: Idx, c: Idx, to: Attribute, pad: float,
                    check_rows: bool = True, check_cols: bool = True) -> SSAValue:
        """Element (r, c) of the view converted to ``to``; ``pad`` outside the valid extent."""
        ok = None if vv.full else self.valid(b, vv, r if check_rows else None, c if check_cols else None)
        if ok is None:
            return self.convert(b, self.load(b, vv.base, self.address(b, vv, r, c), vv.elem, elem_bytes(vv.elem)), to)
        # the load sits under the branch: lanes outside the extent never form their address
        raw = b.if_(ok, lambda bt: [self.load(bt, vv.base, self.address(bt, vv, r, c), vv.elem, elem_bytes(vv.elem))],
                    lambda be: [self.fconst(be, pad, vv.elem)], [vv.elem])[0]
        return self.convert(b, raw, to)

    def gather(self, b: Builder, vv: View, omap: OperandMap, to: Attribute, pad: float = 0.0) -> list[SSAValue]:
        """The items of ``omap`` read from the view, one value per register part."""
        parts = []
        cs1 = const_int(vv.cs) == 1
        rs1 = const_int(vv.rs) == 1     # a transposed view (K^T read from K's rows)
        esize = elem_bytes(vv.elem)
        for lo, hi in omap.part_slices():
            items = omap.items[lo:hi]
            scalars: list[SSAValue] = []
            i = 0
            while i < len(items):
                it = items[i]
                j = i + 1
                if vv.full and cs1:   # a run of consecutive columns in one row: one vector load
                    while (j < len(items) and items[j].rbase is it.rbase and items[j].rdelta == it.rdelta
                           and items[j].cbase is it.cbase and items[j].cdelta == items[j - 1].cdelta + 1):
                        j += 1
                elif vv.full and rs1:  # a run of consecutive rows in one column: also contiguous
                    while (j < len(items) and items[j].cbase is it.cbase and items[j].cdelta == it.cdelta
                           and items[j].rbase is it.rbase and items[j].rdelta == items[j - 1].rdelta + 1):
                        j += 1
                n = j - i
                r, c = self.coords(b, it)
                if n > 1:
                    base_align, delta = (it.calign, it.cdelta) if cs1 else (it.ralign, it.rdelta)
                    el_align = gcd(gcd(vv.align, base_align), delta) if delta else gcd(vv.align, base_align)
                    align = min(_pow2_floor(el_align * esize) if el_align else esize, _pow2_floor(n * esize))
                    v = self.load(b, vv.base, self.address(b, vv, r, c), vec(vv.elem, n), max(align, esize))
                    v = self.convert(b, v, to)
                    if n == hi - lo and i == 0:
                        parts.append(v)
                        scalars = []
                        i = j
                        continue
                    scalars += [self.extract(b, v, q) for q in range(n)]
                else:
                    scalars.append(self.masked_load(b, vv, r, c, to, pad))
                i = j
            if scalars:
                parts.append(self.pack(b, scalars))
        return parts

    # ------------------------------------------------------------------ fragments
    def op_tile_fragment_zero(self, op: t.FragmentZeroOp, b: Builder) -> None:
        lm = self.lmap(op.result.type)
        zero = self.fconst(b, 0.0)
        parts = [self.pack(b, [zero] * n) for n in lm.c.parts]
        self.vmap[op.result] = Dist(parts, lm.c, op.result.type.data_shape)

    def op_tile_fragment_pack(self, op: t.FragmentPackOp, b: Builder) -> None:
        ft: t.FragmentType = op.result.type
        lm = self.lmap(ft)
        vv: View = self.vmap[op.source]
        role = ft.role.data
        if role == "acc":
            self.vmap[op.result] = Dist(self.gather(b, vv, lm.c, f32), lm.c, ft.data_shape)
            return
        omap = lm.a if role == "a" else lm.b
        self.vmap[op.result] = Frag(self.pack_operand(b, vv, omap, ft), omap)

    def pack_operand(self, b: Builder, vv: View, omap: OperandMap, ft: t.FragmentType) -> list[SSAValue]:
        """A/B registers from a view (a target may use a matrix-load instruction instead)."""
        parts = self.gather(b, vv, omap, ft.elem)
        return [p if isinstance(p.type, VectorType) else self.pack(b, [p]) for p in parts]

    def op_tile_mma(self, op: t.MmaOp, b: Builder) -> None:
        fa, fb, fc = self.vmap[op.a], self.vmap[op.b], self.vmap[op.c]
        lm = self.lmap(op.a.type)        # the operands' dtype picks the instruction (f16 and bf16 share a C layout)
        parts = lm.emit_mma(b, op.c.type, fa.parts, fb.parts, fc.parts)
        self.vmap[op.result] = Dist(parts, fc.omap, fc.shape)

    def op_tile_fragment_unpack(self, op, b: Builder) -> None:
        d: Dist = self.vmap[op.source]
        self.vmap[op.result] = self.unpacked = Dist(d.parts, d.omap, op.result.type.dims)

    # ------------------------------------------------------------------ tiles
    def op_tile_load(self, op: t.LoadOp, b: Builder) -> None:
        self.vmap[op.result] = Deferred(self.vmap[op.source], op.pad.value.data if op.pad is not None else 0.0,
                                        op.result.type.element_type)

    def op_tile_constant(self, op: t.ConstantOp, b: Builder) -> None:
        if op.step is not None:
            raise PassFailedError("tile.constant with a step (column indices) has no GPU lowering")
        elem = op.result.type.element_type
        val = op.value.value.data
        self.vmap[op.result] = Splat(int(val != 0) if elem == IntegerType(1) else val, elem)

    def materialise(self, b: Builder, v, like: Dist) -> list[SSAValue]:
        """A broadcast operand in ``like``'s distribution (one value per register part)."""
        if isinstance(v, Dist):
            if v.omap is not like.omap:
                raise CodegenError("tiles of two different lane distributions meet in one elementwise op")
            return v.parts
        if isinstance(v, Splat):
            c = self.fconst(b, v.value, v.elem)
            return [self.pack(b, [c] * n) for n in like.omap.parts]
        if isinstance(v, IndexTile):
            return self.index_parts(b, v, like)
        if isinstance(v, Deferred):
            vv = v.view
            R, C = vv.shape
            cache: dict = {}
            parts = []
            for lo, hi in like.omap.part_slices():
                scalars = []
                for it in like.omap.items[lo:hi]:
                    key = ((id(it.rbase), it.rdelta) if R > 1 else None, (id(it.cbase), it.cdelta) if C > 1 else None)
                    if key not in cache:
                        r, c = self.coords(b, it)
                        cache[key] = self.masked_load(b, vv, r if R > 1 else 0, c if C > 1 else 0, v.elem, v.pad,
                                                      check_rows=R > 1, check_cols=C > 1)
                    scalars.append(cache[key])
                parts.append(self.pack(b, scalars))
            return parts
        raise CodegenError(f"cannot use {type(v).__name__} as a tile operand on the GPU")

    def op_tile_index(self, op, b: Builder) -> None:
        """``tile.index`` in a matrix kernel (an iota in a GEMM epilogue): kept as an :class:`IndexTile`
        and computed per item where an elementwise op meets it, from the item's coordinates in the
        accumulator's lane map (a tile of two index operands takes that of the last unpacked one)."""
        self.vmap[op.result] = IndexTile(self.scalar(op.base), ival(op.row_step), ival(op.col_step),
                                         op.result.type.element_type)

    def index_parts(self, b: Builder, v: "IndexTile", like: Dist) -> list[SSAValue]:
        parts = []
        for lo, hi in like.omap.part_slices():
            items = []
            for it in like.omap.items[lo:hi]:
                r, c = self.coords(b, it)
                idx = b.add(v.base, b.add(b.mul(r, v.rs), b.mul(c, v.cs)))
                i64 = b.op(arith.IndexCastOp(b.c(idx), IntegerType(64))).results[0]
                items.append(self.convert(b, i64, v.elem))
            parts.append(self.pack(b, items))
        return parts

    def op_tile_elementwise(self, op: t.ElementwiseOp, b: Builder) -> None:
        self.refuse_typed(op)
        if op.fn.data in GPU_REFUSED_FNS:
            raise CodegenError(f"tile.elementwise {op.fn.data} has no lowering on this GPU lane ({self.lowering_name}); "
                               f'target="cpu" compiles tessera.ops.{op.fn.data}')
        vals = [self.vmap[v] for v in op.inputs]
        like = next((v for v in vals if isinstance(v, Dist)), None)
        if like is None and any(isinstance(v, IndexTile) for v in vals) and self.unpacked is not None:
            like = self.unpacked       # row index vs column index: in the accumulator's distribution
        if like is None:
            raise CodegenError(f"tile.elementwise {op.fn.data} needs one operand distributed over the wave")
        operands = [self.materialise(b, v, like) for v in vals]
        parts = []
        relem = op.result.type.element_type
        for i, n in enumerate(like.omap.parts):
            args = [o[i] for o in operands]
            rt = part_type(relem, n) if self.is_typed(op) else args[0].type
            parts.append(b.op(G.MathOp.create(operands=args, attributes={"fn": op.fn}, result_types=[rt])).results[0])
        self.vmap[op.result] = Dist(parts, like.omap, op.result.type.dims)

    def op_tile_store(self, op: t.StoreOp, b: Builder) -> None:
        d = self.vmap[op.value]
        vv: View = self.vmap[op.dest]
        if not isinstance(d, Dist):
            raise CodegenError("tile.store on the GPU stores a tile distributed over the wave")
        vals = self.items_of(d, b)
        esize = elem_bytes(vv.elem)
        for it, v in zip(d.omap.items, vals):
            r, c = self.coords(b, it)
            val = self.convert(b, v, vv.elem)
            ok = None if vv.full else self.valid(b, vv, r, c)
            if ok is None:
                self.store(b, val, vv.base, self.address(b, vv, r, c), esize)
            else:
                b.if_(ok, lambda bt, r=r, c=c, val=val: self.store(bt, val, vv.base, self.address(bt, vv, r, c),
                                                                   esize) or [])

    # ------------------------------------------------------------------ row statistics
    def op_tile_mask(self, op: t.MaskOp, b: Builder) -> None:
        """Per item: keep it when its column is < cols (and <= its row + diag; ``side = "ge"``:
        >= its row + diag), else ``pad``."""
        d = self.vmap[op.input]
        if not isinstance(d, Dist):
            raise CodegenError("tile.mask on the GPU masks a tile distributed over the wave")
        ge = op.keep_side == "ge"     # the causal edge seen in a transposed (key-row) score block
        cols = self.scalar(op.cols)
        diag = self.scalar(op.diag) if op.diag is not None else None
        pad = self.fconst(b, op.pad.value.data)
        vals = self.items_of(d, b)
        kept = []
        for it, v in zip(d.omap.items, vals):
            r, c = self.coords(b, it)
            ok = b.cmp("slt", c, cols)
            if diag is not None:
                ok = b.op(arith.AndIOp(ok, b.cmp("sge" if ge else "sle", c, b.add(r, diag)))).results[0]
            kept.append(b.select(ok, v, pad))
        parts, i = [], 0
        for n in d.omap.parts:
            parts.append(self.pack(b, kept[i:i + n]))
            i += n
        self.vmap[op.result] = Dist(parts, d.omap, d.shape)

    def op_tile_reduce(self, op: t.ReduceOp, b: Builder) -> None:
        """A row reduction of a wave's tile in shared memory (``tile.load`` of a view written
        before a ``tile.barrier``): lane r < R folds row r serially and writes the result to a
        per-wave R-vector in shared memory; after a barrier the result is that vector, read
        at the rows of the tile it meets (a column broadcast)."""
        src = self.vmap[op.input]
        R, C = op.input.type.dims
        if ival(op.axis) != 1 or not isinstance(src, Deferred) or src.view.base.type.space.data != self.space:
            raise CodegenError("tile.reduce on the GPU folds rows (axis 1) of a tile loaded from shared memory")
        if R > self.wave:
            raise CodegenError(f"tile.reduce of {R} rows: a wave has {self.wave} lanes (one row each)")
        vv, kind = src.view, op.kind.data
        kind = "max" if kind == "select_max" else kind   # NaN kept: a valid select_max
        if kind not in ("add", "max"):
            raise CodegenError(f"tile.reduce kind {kind!r} has no GPU lowering")
        nwaves = self.block // self.wave
        alloc = t.AllocOp.create(attributes={"size": i64_attr(R * nwaves)},
                                 result_types=[t.BufferType(f32, StringAttr(self.space))])
        self.op_tile_alloc(alloc, b)
        scratch = self.vmap.pop(alloc.result)
        base = b.mul(self.wave_id, R)
        lane = b.c(self.lane)
        init = float("-inf") if kind == "max" else 0.0

        fn = StringAttr("max" if kind == "max" else "add")

        def combine(bc: Builder, x, y):
            return bc.op(G.MathOp.create(operands=[x, y], attributes={"fn": fn}, result_types=[x.type])).results[0]

        def fold(bt: Builder):
            if vv.full and const_int(vv.cs) == 1 and C % 4 == 0 and vv.align % 4 == 0:
                # the row is contiguous and 16-byte aligned: 16-byte loads, four partial results
                # folded once at the end (independent loads instead of a serial chain)
                acc = self.pack(bt, [self.fconst(bt, init)] * 4)
                for c0 in range(0, C, 4):
                    acc = combine(bt, acc, self.load(bt, vv.base, self.address(bt, vv, lane, c0), vec(f32, 4), 16))
                lanes = [self.extract(bt, acc, i) for i in range(4)]
                acc = combine(bt, combine(bt, lanes[0], lanes[1]), combine(bt, lanes[2], lanes[3]))
            else:
                acc = bt.for_(0, C, 1, lambda bc, c, a: [combine(bc, a[0], self.masked_load(bc, vv, lane, c, f32,
                                                                                             src.pad))],
                              [self.fconst(bt, init)])[0]
            self.store(bt, acc, scratch, bt.add(base, lane), 4)
            return []
        b.if_(b.cmp("slt", lane, R), fold)
        b.op(G.BarrierOp.create())
        one, zero = b.c(1), b.c(0)
        self.vmap[op.result] = Deferred(View(scratch, b.c(base), one, b.c(zero), b.c(R), one, (R, 1), f32, 1, True),
                                        0.0)

    def op_tile_splat_index(self, op, b) -> None:
        raise CodegenError(f"{op.name} has no GPU lowering (GPU kernels fold runtime sizes at generation)")


# what every GPU tile -> target lowering consumes and produces (a target adds its own ops)
GPU_CONSUMES = ("tile.alloc", "tile.view", "tile.async_copy", "tile.wait", "tile.barrier", "tile.fragment_zero",
                "tile.fragment_pack", "tile.mma", "tile.fragment_unpack", "tile.load", "tile.store", "tile.constant",
                "tile.elementwise", "tile.mask", "tile.reduce", "tile.program_id", "tile.wave_id", "tile.launch",
                "tile.splat_index", "tile.load_index", "tile.index")
GPU_PRODUCES = ("tessera_gpu.thread_id", "tessera_gpu.block_id", "tessera_gpu.shared", "tessera_gpu.load",
                "tessera_gpu.store", "tessera_gpu.barrier", "tessera_gpu.pack", "tessera_gpu.extract",
                "tessera_gpu.convert", "tessera_gpu.math", "tessera_gpu.launch",
                "tessera_gpu.shuffle_xor")


def lower_for_arch(module: ModuleOp, pass_name: str, target: str, arch: str, make_lowerer, make_map) -> None:
    """A GPU lowering pass's body: refuse an unknown arch, lower every kernel, and name the
    pass and arch in any selector refusal."""
    from tessera.errors import MmaSelectorError, UnknownArchError
    from tessera.mma.selector import get_isa
    try:
        get_isa(target, arch)
    except UnknownArchError as e:
        raise PassFailedError(f"{pass_name}: {e.message}") from None
    try:
        lower_module(module, pass_name, make_lowerer, make_map)
    except MmaSelectorError as e:
        raise type(e)(f"{pass_name}{{arch={arch}}}: {e.message}") from None


def lower_module(module: ModuleOp, pass_name: str, make_lowerer, make_map) -> None:
    """Lower every GPU kernel function and turn ``tile.launch`` into ``tessera_gpu.launch``."""
    kernels: dict[str, func.FuncOp] = {}
    hosts: list[func.FuncOp] = []
    for op in list(module.body.block.ops):
        if not isinstance(op, func.FuncOp):
            continue
        if "gpu.block" in op.attributes:
            low = make_lowerer(op)
            try:
                new = low.lower_kernel(op, make_map)
            except CodegenError as e:
                raise PassFailedError(f"{pass_name}: kernel @{op.sym_name.data}: {e.message}") from None
            module.body.block.insert_op_before(new, op)
            op.detach()
            op.erase()
            kernels[new.sym_name.data] = new
        elif any(isinstance(o, t.LaunchOp) for o in op.walk()):
            hosts.append(op)
    for fn in hosts:
        for op in list(fn.walk()):
            if not isinstance(op, t.LaunchOp):
                continue
            name = op.callee.root_reference.data
            k = kernels.get(name)
            if k is None or op.grid is None or op.block is None:
                raise PassFailedError(f"{pass_name}: launch of @{name} is not a GPU kernel launch (no grid/block)")
            new = G.LaunchOp.create(operands=list(op.args), result_types=[r.type for r in op.outs], attributes={
                "callee": op.callee, "dims": op.dims, "grid": op.grid, "block": op.block,
                "shared": k.attributes["gpu.shared"]})
            swap_op(op, new)
