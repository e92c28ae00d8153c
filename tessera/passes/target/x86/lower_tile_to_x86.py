"""``lower-tile-to-x86{arch=...}``: Tile IR -> ``tessera_x86`` Target IR.

The compiler owns the register mapping.  A ``!tile.tile<[R, C], elem>`` or an acc
fragment becomes R rows of ceil(C / W) vector registers (W lanes, from the
arch: 16 with AVX-512, 8 with AVX2); a [R, 1] tile is one splatted register per
row.  An A fragment (MR x K) becomes MR broadcast registers (K elements repeated:
pairs for ``vdpbf16ps``), a B fragment (K x NR*W) NR vector loads.  ``tile.mma``
becomes MR*NR ``vfma`` / ``vdpbf16ps``; the accumulator registers are threaded
through ``scf.for`` as loop-carried values.  Views are not values: they become
(base, offset, strides, valid extent) used by loads and stores, which split into
an unmasked path for full tiles and a masked one for edges.  ``tile.async_copy``
expands into packing loops; ``tile.alloc`` carves the thread's workspace.
``arch`` is mandatory: ``None`` in the API is resolved to the host CPU before
any lowering runs.

AMX fragments (family ``amx``) live in tile registers instead: an MR*16 x NR*16
accumulator is MR x NR ``!tessera_x86.amx`` values (loop-carried like vectors), an A
fragment MR tiles loaded from a row-major panel, a B fragment NR tiles loaded from a
VNNI-paired panel; ``tile.mma`` is MR*NR ``tdp``.  Accumulators enter and leave tile
registers through a scratch block in the thread's workspace, so the edges, the
incoming C0 and the epilogue reuse the vector paths.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerType,
    ModuleOp,
    StringAttr,
    UnitAttr,
    VectorType,
    f32,
    f64,
    i1 as I1,
)
from xdsl.ir import Attribute, Block, Region, SSAValue

from tessera.errors import CodegenError, MmaSelectorError, PassFailedError, UnknownArchError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ival
from tessera.ir.builder import INDEX, Builder
from tessera.ir.target import x86 as x
from tessera.mma import x86 as x86_records
from tessera.mma.selector import get_isa
from tessera.passes.base import TesseraPass, option, register
from tessera.passes.schedule import bounds
from tessera.passes.target.lowering import OpLowerer
from tessera.passes.target.x86 import lower_typed_elem as TE
from tessera.passes.target.x86.lower_index import LoadIndexLowering
from tessera.passes.util import swap_op

PTR = x.PTR


@dataclass
class ViewVal:
    base: SSAValue
    off: SSAValue
    rs: SSAValue
    cs: SSAValue
    rows: SSAValue
    cols: SSAValue
    shape: tuple[int, int]
    elem: Attribute


@dataclass
class Regs:
    """A tile or fragment in registers: rows x vectors (or broadcast registers)."""

    shape: tuple[int, int]
    rows: list[list[SSAValue]]
    kind: str = "tile"   # tile | a | b

    def flat(self) -> list[SSAValue]:
        return [v for r in self.rows for v in r]


def _const_int(v: SSAValue) -> int | None:
    op = v.owner
    if isinstance(op, arith.ConstantOp):
        return ival(op.value)
    return None


def _is_half(elem: Attribute) -> bool:
    return isinstance(elem, (BFloat16Type, Float16Type))


def _elem_bytes(elem: Attribute) -> int:
    if isinstance(elem, Float64Type):
        return 8
    return 2 if _is_half(elem) else 1 if isinstance(elem, IntegerType) and elem.width.data == 8 else 4


@lru_cache(maxsize=512)
def _vector(elem: Attribute, n: int) -> VectorType:
    """One ``vector<n x elem>`` object per distinct type (attributes are immutable): building
    one per register cost 0.2 s on the Llama example, and the verifier's memo matches shared
    objects by identity."""
    return VectorType(elem, [n])


@dataclass
class _Lowerer(LoadIndexLowering, OpLowerer):
    w: int
    features: frozenset[str]
    ws_offset: int = 0
    team_offset: int = x.TEAM_HEADER  # the barrier's words and the work counter come first
    used_nt: bool = False
    vmap: dict = field(default_factory=dict)
    amx_scratch: dict = field(default_factory=dict)
    reg: Attribute = f32   # the element type of every register (f64 in a kernel of f64 tiles)
    lowering_name = "lower-tile-to-x86"

    @property
    def vreg(self) -> VectorType:
        """A register: W lanes of the kernel's compute type."""
        return _vector(self.reg, self.w)

    # ------------------------------------------------------------------ values
    def get(self, v: SSAValue):
        return self.vmap[v]

    def scalar(self, v: SSAValue) -> SSAValue:
        r = self.vmap[v]
        assert isinstance(r, SSAValue), v
        return r

    def nvec(self, cols: int) -> int:
        return 1 if cols == 1 else -(-cols // self.w)

    def flatten_types(self, ty: Attribute) -> list[Attribute]:
        if isinstance(ty, t.FragmentType) and ty.family.data == "amx":
            return [x.AmxTileType()] * self._nregs(ty)
        if isinstance(ty, t.TileType):
            return [TE.reg_vec(self, ty.element_type)] * self._nregs(ty)
        if isinstance(ty, t.FragmentType):
            return [self.vreg] * self._nregs(ty)
        if isinstance(ty, t.BufferType):
            return [PTR]
        if isinstance(ty, t.TokenType):
            return []
        return [ty]

    def _nregs(self, ty) -> int:
        if isinstance(ty, t.TileType):
            r, c = ty.dims
            return r * self.nvec(c)
        role = ty.role.data
        m, n, k = ty.mnk
        if role == "acc" and ty.family.data == "amx":
            return (m // x.AMX_ROWS) * (n // x.AMX_ROWS)
        if role == "acc":
            return m * self.nvec(n)
        raise CodegenError(f"{role}-fragments cannot be loop-carried")

    def pack_value(self, ty: Attribute, vals: list[SSAValue]):
        if isinstance(ty, t.FragmentType) and ty.family.data == "amx":
            m, n = ty.data_shape
            nt = n // x.AMX_ROWS
            return Regs((m, n), [vals[i * nt:(i + 1) * nt] for i in range(m // x.AMX_ROWS)], "amx")
        if isinstance(ty, (t.TileType, t.FragmentType)):
            r, c = ty.dims if isinstance(ty, t.TileType) else ty.data_shape
            nv = self.nvec(c)
            return Regs((r, c), [vals[i * nv:(i + 1) * nv] for i in range(r)])
        if isinstance(ty, t.TokenType):
            return None
        return vals[0]

    def flat_value(self, v: SSAValue) -> list[SSAValue]:
        r = self.vmap[v]
        if isinstance(r, Regs):
            return r.flat()
        if r is None:
            return []
        return [r]

    # ------------------------------------------------------------------ blocks
    def op_scf_for(self, op: scf.ForOp, b: Builder) -> None:
        init = [v for a in op.iter_args for v in self.flat_value(a)]
        src = op.body.block
        types = [ty for a in src.args[1:] for ty in self.flatten_types(a.type)]
        block = Block(arg_types=[INDEX] + types)
        self.vmap[src.args[0]] = block.args[0]
        self.bind_flat(list(src.args[1:]), list(block.args[1:]))
        inner = b.child(block)
        self.lower_block(src, inner)
        new = scf.ForOp(self.scalar(op.lb), self.scalar(op.ub), self.scalar(op.step), init, Region(block))
        b.op(new)
        self.bind_flat(list(op.results), list(new.results))

    def bind_flat(self, values: list[SSAValue], flat: list[SSAValue]) -> None:
        """Map each Tile IR value to its registers, taken in order from ``flat``."""
        i = 0
        for v in values:
            n = len(self.flatten_types(v.type))
            self.vmap[v] = self.pack_value(v.type, flat[i:i + n])
            i += n

    def op_scf_yield(self, op: scf.YieldOp, b: Builder) -> None:
        b.op(scf.YieldOp(*[v for a in op.operands for v in self.flat_value(a)]))

    def op_scf_if(self, op: scf.IfOp, b: Builder) -> None:
        types = [ty for r in op.results for ty in self.flatten_types(r.type)]
        regions = []
        for region in (op.true_region, op.false_region):
            if not region.blocks:
                regions.append(None)
                continue
            block = Block()
            self.lower_block(region.block, b.child(block))
            regions.append(Region(block))
        new = scf.IfOp(self.scalar(op.cond), types, regions[0], regions[1])
        b.op(new)
        self.bind_flat(list(op.results), list(new.results))

    def op_func_return(self, op, b: Builder) -> None:
        if self.used_nt:
            b.op(x.SFenceOp.create())  # streaming stores are weakly ordered: publish them before returning
        b.op(func.ReturnOp())

    # ------------------------------------------------------------------ memory
    def op_tile_alloc(self, op: t.AllocOp, b: Builder) -> None:
        elem = op.result.type.element_type
        size = (ival(op.size) * _elem_bytes(elem) + 63) // 64 * 64
        shared = op.result.type.space.data == "team"
        offset = self.team_offset if shared else self.ws_offset
        new = x.WorkspaceOp.create(operands=[self.team if shared else self.ws], attributes={"offset": i64_attr(offset)},
                                   result_types=[PTR])
        b.op(new)
        if shared:
            self.team_offset += size
        else:
            self.ws_offset += size
        self.vmap[op.result] = new.result

    def op_tile_barrier(self, op, b: Builder) -> None:
        b.op(x.BarrierOp.create(operands=[self.team, self.nthreads]))

    def op_tile_claim(self, op, b: Builder) -> None:
        self.vmap[op.result] = b.op(x.ClaimOp.create(operands=[self.team], result_types=[INDEX])).result

    def op_tile_view(self, op: t.ViewOp, b: Builder) -> None:
        ty = op.result.type
        R, C = ty.dims
        rows = b.max(b.min(self.scalar(op.rows), R), 0)
        cols = b.max(b.min(self.scalar(op.cols), C), 0)
        self.vmap[op.result] = ViewVal(self.scalar(op.source), self.scalar(op.offset), self.scalar(op.row_stride),
                                       self.scalar(op.col_stride), b.c(rows), b.c(cols), (R, C), ty.element_type)

    def op_tile_wait(self, op, b: Builder) -> None:
        pass  # CPU copies are synchronous: the packing loops have finished when wait is reached

    # ------------------------------------------------------------------ helpers
    def vtype(self, elem: Attribute, n: int | None = None) -> VectorType:
        if isinstance(elem, IntegerType) and elem.width.data == 1:
            elem = IntegerType(8)  # a bool in memory is one byte
        return _vector(elem, n or self.w)

    def _load_vec(self, b: Builder, base, off, elem, count=None, pad: float = 0.0, stride=None,
                  rt: Attribute | None = None) -> SSAValue:
        """Load W elements (converted to the register type, or to ``rt``'s int / bool lanes); with count:
        masked, missing lanes = pad; with stride: lane l from base[off + l * stride] (a gather)."""
        operands = [base, b.c(off)] + ([b.c(stride)] if stride is not None else []) + (
            [b.c(count)] if count is not None else [])
        ld = (x.VGatherOp if stride is not None else x.VLoadOp).create(operands=operands,
                                                                       result_types=[self.vtype(elem)])
        b.op(ld)
        v = ld.result
        if rt is not None and TE.is_int_elem(rt):   # int / bool lanes: missing lanes are 0 (false)
            return TE.convert(b, v, TE.reg_vec(self, rt))
        if TE.is_int_elem(elem) and elem.width.data != 1:   # int memory into float registers
            v = TE.convert(b, v, self.vreg)
        elif elem != self.reg:
            cv = x.VCvtOp.create(operands=[v], result_types=[self.vreg])
            b.op(cv)
            v = cv.result
        if count is not None and pad != 0.0:
            sel = x.VLaneSelectOp.create(operands=[v, self.vconst(b, pad), b.c(count)], result_types=[self.vreg])
            b.op(sel)
            v = sel.result
        return v

    def vconst(self, b: Builder, value: float) -> SSAValue:
        op = x.VConstantOp.create(attributes={"value": FloatAttr(value, self.reg)}, result_types=[self.vreg])
        b.op(op)
        return op.result

    def _store_vec(self, b: Builder, v, base, off, elem, count=None, nontemporal: bool = False) -> None:
        if TE.is_int_elem(v.type.element_type):   # int lanes, bool lanes -> bytes
            v = TE.convert(b, v, self.vtype(elem))
        elif elem != self.reg:
            cv = x.VCvtOp.create(operands=[v], result_types=[self.vtype(elem)])
            b.op(cv)
            v = cv.result
        operands = [v, base, b.c(off)] + ([b.c(count)] if count is not None else [])
        attrs = {"nontemporal": UnitAttr()} if nontemporal and count is None else {}
        b.op(x.VStoreOp.create(operands=operands, attributes=attrs))

    def _bcast(self, b: Builder, base, off, elem, group: int = 1, rt: Attribute | None = None) -> SSAValue:
        if group == 1:
            op = x.VBroadcastOp.create(operands=[base, b.c(off)], attributes={"group": i64_attr(1)},
                                       result_types=[self.vtype(elem)])
            b.op(op)
            v = op.result
            if rt is not None and TE.is_int_elem(rt):
                return TE.convert(b, v, TE.reg_vec(self, rt))
            if elem != self.reg:
                cv = x.VCvtOp.create(operands=[v], result_types=[self.vreg])
                b.op(cv)
                v = cv.result
            return v
        op = x.VBroadcastOp.create(operands=[base, b.c(off)], attributes={"group": i64_attr(group)},
                                   result_types=[self.vtype(elem, self.w * group)])
        b.op(op)
        return op.result

    def _count(self, b: Builder, cols, v: int):
        """Lanes of vector v inside a row of ``cols`` valid columns."""
        return b.max(b.min(b.sub(cols, v * self.w), self.w), 0)

    def _edge_counts(self, b: Builder, vv: ViewVal, R: int, nv: int):
        """For an edge tile: per row, whether it is valid and each vector's lane count (0 past
        the valid rows); the column counts are computed once for all rows."""
        valid = b.min(vv.cols, vv.shape[1])
        cols = [self._count(b, valid, v) for v in range(nv)]
        rows = []
        for i in range(R):
            ok = b.cmp("slt", i, vv.rows)
            rows.append((ok, [b.select(ok, b.c(c), b.c(0)) for c in cols]))
        return rows

    def _static_count(self, C: int, v: int) -> int | None:
        """Lanes of vector v inside a C-wide row (None: all W)."""
        return None if (v + 1) * self.w <= C else C - v * self.w

    def _full(self, b: Builder, vv: ViewVal) -> SSAValue | None:
        R, C = vv.shape
        rk, ck = _const_int(vv.rows), _const_int(vv.cols)
        if rk is not None and ck is not None and rk >= R and ck >= C:
            return None
        ok_r = b.cmp("sge", vv.rows, R)
        ok_c = b.cmp("sge", vv.cols, C)
        return b.op(arith.AndIOp(ok_r, ok_c)).results[0]

    # ------------------------------------------------------------------ loads / stores
    def _load_tile(self, b: Builder, vv: ViewVal, pad: float = 0.0, rt: Attribute | None = None) -> Regs:
        R, C = vv.shape
        cs = _const_int(vv.cs)
        typed = rt is not None and TE.is_int_elem(rt)
        rvt = TE.reg_vec(self, rt) if typed else self.vreg
        if C == 1:
            rows = []
            for i in range(R):
                if R == 1:
                    off = vv.off
                    rows.append([self._bcast(b, vv.base, off, vv.elem, rt=rt)])
                    continue
                ok = b.cmp("slt", i, vv.rows)
                off = b.select(ok, b.c(b.add(vv.off, b.mul(i, vv.rs))), b.c(vv.off))
                val = self._bcast(b, vv.base, off, vv.elem, rt=rt)
                sel = arith.SelectOp(ok, val, TE.int_const(b, 0, rvt) if typed else self.vconst(b, pad))
                b.op(sel)
                rows.append([sel.result])
            return Regs((R, C), rows)
        stride = None if cs == 1 else vv.cs  # columns apart in memory: lanes are gathered
        nv = self.nvec(C)
        full = self._full(b, vv)

        def vec_off(bb: Builder, roff, v: int):
            return bb.add(roff, v * self.w if stride is None else bb.mul(v * self.w, stride))

        def full_path(bb: Builder) -> list[SSAValue]:
            out = []
            for i in range(R):
                roff = bb.add(vv.off, bb.mul(i, vv.rs))
                for v in range(nv):
                    out.append(self._load_vec(bb, vv.base, vec_off(bb, roff, v), vv.elem,
                                              self._static_count(C, v), pad, stride, rt))
            return out

        def edge_path(bb: Builder) -> list[SSAValue]:
            out = []
            for i, (ok, cnts) in enumerate(self._edge_counts(bb, vv, R, nv)):
                roff = bb.select(ok, bb.c(bb.add(vv.off, bb.mul(i, vv.rs))), bb.c(vv.off))
                for v in range(nv):
                    out.append(self._load_vec(bb, vv.base, vec_off(bb, roff, v), vv.elem, cnts[v], pad, stride, rt))
            return out

        if full is None:
            vals = full_path(b)
        else:
            vals = b.if_(full, full_path, edge_path, [rvt] * (R * nv))
        return Regs((R, C), [vals[i * nv:(i + 1) * nv] for i in range(R)])

    def _store_tile(self, b: Builder, regs: Regs, vv: ViewVal, stream: SSAValue | None = None) -> None:
        R, C = vv.shape
        if _const_int(vv.cs) != 1 and C != 1:
            raise CodegenError(f"tile.store to a [{R}, {C}] view needs unit column stride")
        nv = self.nvec(C)
        full = self._full(b, vv)
        rows = self._expand(regs, R, C)

        def full_path(bb: Builder, nontemporal: bool = False):
            for i in range(R):
                roff = bb.add(vv.off, bb.mul(i, vv.rs))
                for v in range(nv):
                    self._store_vec(bb, rows[i][v], vv.base, bb.add(roff, v * self.w), vv.elem,
                                    self._static_count(C, v), nontemporal)
            return []

        if stream is not None and C % self.w == 0:
            plain = full_path
            vbytes = self.w * _elem_bytes(vv.elem)

            def full_path(bb: Builder):  # noqa: F811 - streaming when asked for and aligned
                al = x.AlignedOp.create(operands=[vv.base, bb.c(vv.off)], attributes={
                    "bytes": i64_attr(vbytes), "elem_bytes": i64_attr(_elem_bytes(vv.elem))}, result_types=[I1])
                bb.op(al)
                ok = bb.op(arith.AndIOp(stream, al.result)).results[0]
                if R > 1:
                    rs_ok = bb.cmp("eq", bb.rem(bb.mul(vv.rs, _elem_bytes(vv.elem)), vbytes), 0)
                    ok = bb.op(arith.AndIOp(ok, rs_ok)).results[0]
                self.used_nt = True
                bb.if_(ok, lambda b2: full_path_nt(b2), lambda b2: plain(b2))
                return []

            def full_path_nt(bb: Builder):
                return plain(bb, True)

        def edge_path(bb: Builder):
            for i, (ok, cnts) in enumerate(self._edge_counts(bb, vv, R, nv)):
                roff = bb.select(ok, bb.c(bb.add(vv.off, bb.mul(i, vv.rs))), bb.c(vv.off))
                for v in range(nv):
                    self._store_vec(bb, rows[i][v], vv.base, bb.add(roff, v * self.w), vv.elem, cnts[v])
            return []

        if full is None:
            full_path(b)
        else:
            b.if_(full, full_path, edge_path)

    def _expand(self, regs: Regs, R: int, C: int) -> list[list[SSAValue]]:
        """Broadcast a tile's registers to R x nvec(C)."""
        nv = self.nvec(C)
        out = []
        for i in range(R):
            row = regs.rows[0 if len(regs.rows) == 1 else i]
            out.append([row[0 if len(row) == 1 else v] for v in range(nv)])
        return out

    def op_tile_prefetch(self, op: t.PrefetchOp, b: Builder) -> None:
        vv: ViewVal = self.get(op.source)
        esize = _elem_bytes(vv.elem)
        per_line = max(1, 64 // esize)
        if _const_int(vv.cs) not in (0, 1):
            raise CodegenError("tile.prefetch needs a view with unit column stride")
        for j in range(-(-vv.shape[1] // per_line) if _const_int(vv.cs) == 1 else 1):
            b.op(x.PrefetchOp.create(operands=[vv.base, b.c(b.add(vv.off, j * per_line))],
                                     attributes={"elem_bytes": i64_attr(esize)}))

    def op_tile_load(self, op: t.LoadOp, b: Builder) -> None:
        pad = op.pad.value.data if op.pad is not None else 0.0
        self.vmap[op.result] = self._load_tile(b, self.get(op.source), pad, op.result.type.element_type)

    def op_tile_store(self, op: t.StoreOp, b: Builder) -> None:
        stream = self.scalar(op.stream) if op.stream is not None else None
        self._store_tile(b, self.get(op.value), self.get(op.dest), stream)

    def op_tile_constant(self, op: t.ConstantOp, b: Builder) -> None:
        R, C = op.result.type.dims
        if op.step is not None:   # column indices: value + j * step
            st, base = op.step.value.data, op.value.value.data
            regs = []
            for v in range(self.nvec(C)):
                c = x.VConstantOp.create(attributes={"value": FloatAttr(base + v * self.w * st, self.reg),
                                                     "step": FloatAttr(st, self.reg)}, result_types=[self.vreg])
                b.op(c)
                regs.append(c.result)
            self.vmap[op.result] = Regs((R, C), [regs] * R)
            return
        elem = op.result.type.element_type
        v = (TE.int_const(b, op.value.value.data, TE.reg_vec(self, elem)) if TE.is_int_elem(elem)
             else self.vconst(b, float(op.value.value.data)))
        self.vmap[op.result] = Regs((R, C), [[v] * self.nvec(C) for _ in range(R)])

    # ------------------------------------------------------------------ fragments
    def op_tile_fragment_zero(self, op: t.FragmentZeroOp, b: Builder) -> None:
        m, n = op.result.type.data_shape
        if op.result.type.family.data == "amx":
            self.vmap[op.result] = Regs((m, n), [[b.op(x.TZeroOp.create(result_types=[x.AmxTileType()])).result
                                                  for _ in range(n // x.AMX_ROWS)] for _ in range(m // x.AMX_ROWS)],
                                        "amx")
            return
        nv = self.nvec(n)
        rows = []
        for _ in range(m):
            row = []
            for _ in range(nv):
                z = x.VZeroOp.create(result_types=[self.vreg])
                b.op(z)
                row.append(z.result)
            rows.append(row)
        self.vmap[op.result] = Regs((m, n), rows)

    def op_tile_fragment_pack(self, op: t.FragmentPackOp, b: Builder) -> None:
        ft: t.FragmentType = op.result.type
        vv: ViewVal = self.get(op.source)
        role = ft.role.data
        m, n, k = ft.mnk
        if ft.family.data == "amx":
            self._amx_pack(op, vv, b)
            return
        if ft.family.data not in ("fma", "avx512_bf16"):
            raise MmaSelectorError(f"lower-tile-to-x86 has no lowering for fragment family {ft.family.data}")
        if role == "acc":
            self.vmap[op.result] = self._load_tile(b, vv)
            return
        if n % self.w:
            raise CodegenError(f"fragment n={n} is not a multiple of the vector width {self.w}")
        if role == "a":
            # MR broadcast registers: element (i, 0..k-1) repeated across the vector
            if k > 1 and _const_int(vv.cs) != 1:
                raise CodegenError("A fragment with k > 1 needs its k elements contiguous")
            rows = [[self._bcast(b, vv.base, b.add(vv.off, b.mul(i, vv.rs)), vv.elem, group=k)] for i in range(m)]
            self.vmap[op.result] = Regs((m, k), rows, "a")
            return
        # role b: k x n; k elements of one column are adjacent (stride 1), columns k apart
        if _const_int(vv.rs) != 1 and k > 1 or _const_int(vv.cs) != k:
            raise CodegenError(f"B fragment view must be packed (row stride 1, column stride {k})")
        vecs = []
        for v in range(n // self.w):
            ld = x.VLoadOp.create(operands=[vv.base, b.c(b.add(vv.off, v * self.w * k))],
                                  result_types=[self.vtype(vv.elem, self.w * k)])
            b.op(ld)
            vecs.append(ld.result)
        self.vmap[op.result] = Regs((k, n), [vecs], "b")

    def op_tile_mma(self, op: t.MmaOp, b: Builder) -> None:
        a: Regs = self.get(op.a)
        bb: Regs = self.get(op.b)
        c: Regs = self.get(op.c)
        fam = op.a.type.family.data
        if fam != "fma":   # vector FMA is the vector width's own instruction; the others are their record's
            rec = self._instruction(op.a.type)
        if fam == "amx":
            rows = [[b.op(x.TDpOp.create(operands=[ai, bj, acc], attributes={"instr": StringAttr(rec.mnemonic)},
                                         result_types=[x.AmxTileType()])).result
                     for bj, acc in zip(bb.rows[0], crow)] for ai, crow in zip((r[0] for r in a.rows), c.rows)]
            self.vmap[op.result] = Regs(c.shape, rows, "amx")
            return
        rows = []
        for i, crow in enumerate(c.rows):
            row = []
            for v, acc in enumerate(crow):
                if fam == "fma":
                    new = x.VFmaOp.create(operands=[a.rows[i][0], bb.rows[0][v], acc], result_types=[self.vreg])
                else:
                    new = x.VDpbf16psOp.create(operands=[a.rows[i][0], bb.rows[0][v], acc], result_types=[self.vreg])
                b.op(new)
                row.append(new.results[0])
            rows.append(row)
        self.vmap[op.result] = Regs(c.shape, rows)

    def _instruction(self, ft: t.FragmentType):
        """The record whose instruction ``tile.mma`` of this fragment family and element type becomes
        (one per pair in the table, lowered by this pass); refused, naming what is missing, where the
        arch lacks its features: LLVM would abort the process on the intrinsic."""
        elem = str(ft.elem)
        recs = [r for r in x86_records.RECORDS if r.family == ft.family.data and r.a_dtype == elem
                and r.lowered_by == self.lowering_name and r.widen is None]
        if len(recs) != 1:
            raise MmaSelectorError(f"{self.lowering_name} has no instruction for {ft.family.data} fragments of "
                                   f"{elem}")
        missing = sorted(set(recs[0].features) - self.features)
        if missing:
            raise MmaSelectorError(f"{recs[0].mnemonic} ({recs[0].id}) needs {', '.join(missing)}, which this arch "
                                   f"lacks")
        return recs[0]

    def op_tile_fragment_unpack(self, op, b: Builder) -> None:
        src: Regs = self.get(op.source)
        if src.kind == "amx":  # tile registers -> scratch -> vector registers
            m, n = src.shape
            base, pitch = self._amx_scratch(b, m, n)
            for i, row in enumerate(src.rows):
                for j, tile in enumerate(row):
                    b.op(x.TStoreOp.create(operands=[tile, base, b.c(i * x.AMX_ROWS * pitch + j * x.AMX_ROWS),
                                                     b.c(pitch * 4)], attributes={"elem_bytes": i64_attr(4)}))
            self.vmap[op.result] = self._load_tile(b, ViewVal(base, b.c(0), b.c(pitch), b.c(1), b.c(m), b.c(n),
                                                              (m, n), f32))
            return
        self.vmap[op.result] = src

    # ------------------------------------------------------------------ AMX tiles
    def _amx_scratch(self, b: Builder, m: int, n: int) -> tuple[SSAValue, int]:
        """The thread's m x n f32 scratch block (one per size, reserved in the workspace)."""
        key = (m, n)
        if key not in self.amx_scratch:
            self.amx_scratch[key] = self.ws_offset
            self.ws_offset += (m * n * 4 + 63) // 64 * 64
        ws = x.WorkspaceOp.create(operands=[self.ws], attributes={"offset": i64_attr(self.amx_scratch[key])},
                                  result_types=[PTR])
        b.op(ws)
        return ws.result, n

    def _amx_tile(self, b: Builder, base, off, stride_elems, esize: int) -> SSAValue:
        ld = x.TLoadOp.create(operands=[base, b.c(off), b.c(b.mul(stride_elems, esize))],
                              attributes={"elem_bytes": i64_attr(esize)}, result_types=[x.AmxTileType()])
        b.op(ld)
        return ld.result

    def _amx_pack(self, op: t.FragmentPackOp, vv: ViewVal, b: Builder) -> None:
        """A: MR tiles of 16 rows x 64 bytes from a row-major panel; B: NR tiles of 16 k groups
        x 16 columns from a VNNI panel (the view's row stride is the pitch of a k group, its
        column stride the group size); acc: the view's f32 values through the scratch block."""
        ft: t.FragmentType = op.result.type
        m, n, k = ft.mnk
        role = ft.role.data
        T = x.AMX_ROWS
        if m % T or n % T:
            raise CodegenError(f"AMX fragments are whole 16 x 16 tiles, not {m} x {n}")
        if role == "acc":
            regs = self._load_tile(b, vv)
            base, pitch = self._amx_scratch(b, m, n)
            self._store_tile(b, regs, ViewVal(base, b.c(0), b.c(pitch), b.c(1), b.c(m), b.c(n), (m, n), f32))
            tiles = [[self._amx_tile(b, base, i * T * pitch + j * T, pitch, 4) for j in range(n // T)]
                     for i in range(m // T)]
            self.vmap[op.result] = Regs((m, n), tiles, "amx")
            return
        esize = _elem_bytes(vv.elem)
        if k * esize != x.AMX_ROW_BYTES:
            raise CodegenError(f"an AMX fragment's k ({k} x {esize} bytes) must fill a 64-byte tile row")
        if role == "a":
            if _const_int(vv.cs) != 1:
                raise CodegenError("AMX A fragments need their k elements contiguous (column stride 1)")
            tiles = [[self._amx_tile(b, vv.base, b.add(vv.off, b.mul(i * T, vv.rs)), vv.rs, esize)]
                     for i in range(m // T)]
            self.vmap[op.result] = Regs((m, k), tiles, "amx")
            return
        group = 4 // esize
        if ft.layout.data != "vnni" or _const_int(vv.cs) != group:
            raise CodegenError(f"AMX B fragments read a VNNI panel (layout vnni, column stride {group})")
        tiles = [self._amx_tile(b, vv.base, b.add(vv.off, j * T * group), vv.rs, esize) for j in range(n // T)]
        self.vmap[op.result] = Regs((k, n), [tiles], "amx")

    # ------------------------------------------------------------------ compute
    def op_tile_elementwise(self, op: t.ElementwiseOp, b: Builder) -> None:
        if TE.needs_typed(op):
            TE.lower_elementwise(self, op, b)
            return
        fn = op.fn.data
        R, C = op.result.type.dims
        ins = [self._expand(self.get(v), R, C) for v in op.inputs]
        nv = self.nvec(C)
        rows = []
        for i in range(R):
            row = []
            for v in range(nv):
                if len(ins) == 1:
                    new = x.VUnaryOp.create(operands=[ins[0][i][v]], attributes={"fn": StringAttr(fn)},
                                            result_types=[self.vreg])
                else:
                    new = x.VBinaryOp.create(operands=[ins[0][i][v], ins[1][i][v]],
                                             attributes={"fn": StringAttr(fn)}, result_types=[self.vreg])
                b.op(new)
                row.append(new.results[0])
            rows.append(row)
        self.vmap[op.result] = Regs((R, C), rows)

    def op_tile_index(self, op, b: Builder) -> None:
        TE.lower_index(self, op, b)

    def op_tile_splat_index(self, op, b: Builder) -> None:
        i = b.op(arith.IndexCastOp(self.scalar(op.input), IntegerType(64))).results[0]
        fv = b.op(arith.SIToFPOp(i, self.reg)).results[0]
        sp = x.VSplatOp.create(operands=[fv], result_types=[self.vreg])
        b.op(sp)
        self.vmap[op.result] = Regs((1, 1), [[sp.result]])

    def op_tile_mask(self, op: t.MaskOp, b: Builder) -> None:
        R, C = op.input.type.dims
        nv = self.nvec(C)
        src = self._expand(self.get(op.input), R, C)
        cols = self.scalar(op.cols)
        padv = self.vconst(b, op.pad.value.data)
        diag = self.scalar(op.diag) if op.diag is not None else None

        def masked(bb: Builder):
            return self._mask_rows(bb, src, cols, diag, op.keep_side, padv, R, nv)
        if diag is None and _const_int(cols) is None:
            # a row loop's chunks keep every column but the last: the selects (and the lane
            # masks they compare out of the count, on AVX2 two 64-bit compares and shuffles per
            # vector) run only where some column is dropped (softmax's max and exp passes
            # spent about a seventh of their time on them)
            flat = b.if_(self._keeps_every_column(b, cols, C), lambda bb: [v for row in src for v in row],
                         lambda bb: [v for row in masked(bb) for v in row], [self.vreg] * (R * nv))
            rows = [flat[i * nv:(i + 1) * nv] for i in range(R)]
        else:
            rows = masked(b)
        self.vmap[op.result] = Regs((R, C), rows)

    @staticmethod
    def _keeps_every_column(b: Builder, cols, C: int) -> SSAValue:
        return b.cmp("sge", cols, C)

    def _mask_rows(self, b: Builder, src, cols, diag, keep_side: str, padv, R: int, nv: int):
        """``src`` with the columns past ``cols`` (and, with ``diag``, those on the dropped side
        of column row + diag) replaced by ``padv``."""
        def select(keep, drop, count):
            return b.op(x.VLaneSelectOp.create(operands=[keep, drop, b.c(count)],
                                               result_types=[self.vreg])).results[0]

        col_counts = [self._count(b, cols, v) for v in range(nv)]  # the same for every row
        rows = []
        for i in range(R):
            row = [select(src[i][v], padv, col_counts[v]) for v in range(nv)]
            if diag is not None:  # lane l of vector v is column v*W + l; the edge is column i + diag
                edge = b.add(diag, i)
                if keep_side == "le":   # keep columns <= edge: the first edge + 1 of them
                    row = [select(val, padv, self._count(b, b.add(edge, 1), v)) for v, val in enumerate(row)]
                else:                   # keep columns >= edge: drop the first edge of them
                    row = [select(padv, val, self._count(b, edge, v)) for v, val in enumerate(row)]
            rows.append(row)
        return rows

    def op_tile_reduce(self, op: t.ReduceOp, b: Builder) -> None:
        kind = op.kind.data
        src: Regs = self.get(op.input)
        R, C = op.input.type.dims
        rows = self._expand(src, R, C)
        fn = kind   # tile.reduce's kinds are elementwise fns of the same names

        def comb(x0, x1):
            new = x.VBinaryOp.create(operands=[x0, x1], attributes={"fn": StringAttr(fn)}, result_types=[self.vreg])
            b.op(new)
            return new.results[0]

        if ival(op.axis) == 1:
            out = []
            for i in range(R):
                acc = rows[i][0]
                for v in rows[i][1:]:
                    acc = comb(acc, v)
                if C > 1:
                    red = x.VReduceOp.create(operands=[acc], attributes={"kind": StringAttr(
                        "max" if kind == "select_max" else kind)},
                                             result_types=[self.vreg])
                    b.op(red)
                    acc = red.result
                out.append([acc])
            self.vmap[op.result] = Regs((R, 1), out)
        else:
            acc_row = list(rows[0])
            for i in range(1, R):
                acc_row = [comb(a0, a1) for a0, a1 in zip(acc_row, rows[i])]
            self.vmap[op.result] = Regs((1, C), [acc_row])

    # ------------------------------------------------------------------ packing copies
    def op_tile_async_copy(self, op: t.AsyncCopyOp, b: Builder) -> None:
        src: ViewVal = self.get(op.source)
        dst = self.scalar(op.dest)
        doff = self.scalar(op.dest_offset)
        self.pack_elem = op.dest.type.element_type  # packing converts (bf16 inputs into f32 staging)
        layout, panel, kp = op.layout.data, ival(op.panel), ival(op.kpack)
        kblock = ival(op.kblock) if op.kblock is not None else kp
        if layout == "b_panel":
            self._pack_b(b, src, dst, doff, panel, kp, kblock)
        elif layout == "a_panel":
            self._pack_a(b, src, dst, doff, panel, kp)
        else:
            self._copy_rows(b, src, dst, doff, panel)

    def _scalar_type(self, elem):
        return elem

    def _pack_b(self, b: Builder, src: ViewVal, dst, doff, nrw: int, kp: int, kblock: int) -> None:
        """dst[p*nrw*kcp + g*nrw*kp + c*kp + q] = src[(g*kp+q)*rs + (p*nrw+c)*cs], zero-padded
        (k up to kcp, the next multiple of ``kblock``)."""
        rows, cols = src.rows, src.cols
        if (_const_int(src.rs) == 1 and _const_int(src.cs) != 1 and kblock == kp
                and kp == (2 if _is_half(src.elem) else 1)):
            # k runs along memory (B is a transposed view, e.g. K^T in attention): this is the A
            # panel layout of the transposed view, packed by vector loads and register transposes
            self._pack_a(b, ViewVal(src.base, src.off, src.cs, src.rs, cols, rows, (src.shape[1], src.shape[0]),
                                    src.elem), dst, doff, nrw, kp)
            return
        kcp = b.mul(b.ceil_div(rows, kblock), kblock)
        npanel = b.ceil_div(cols, nrw)
        cs1 = _const_int(src.cs) == 1
        elem = src.elem
        W = self.w
        nv = nrw // W

        def panel(bp: Builder, p, _c):
            pbase = bp.add(doff, bp.mul(p, bp.mul(nrw, kcp)))
            col0 = bp.mul(p, nrw)
            if cs1:
                counts = [bp.max(bp.min(bp.sub(cols, bp.add(col0, v * W)), W), 0) for v in range(nv)]

                def group(bg: Builder, gidx, _c2, whole: bool = False):
                    dbase = bg.add(pbase, bg.mul(gidx, nrw * kp))
                    if kp == 1:
                        soff = bg.add(src.off, bg.add(bg.mul(gidx, src.rs), col0))
                        for v in range(nv):
                            ld = x.VLoadOp.create(operands=[src.base, bg.c(bg.add(soff, v * W))]
                                                  + ([] if whole else [bg.c(counts[v])]),
                                                  result_types=[self.vtype(elem)])
                            bg.op(ld)
                            val = self._convert_vec(bg, ld.result, elem)
                            bg.op(x.VStoreOp.create(operands=[val, dst, bg.c(bg.add(dbase, v * W))]))
                    else:
                        k0 = bg.mul(gidx, kp)
                        regs = []
                        for q in range(kp):
                            kq = bg.add(k0, q)
                            okq = bg.cmp("slt", kq, rows)
                            soff = bg.select(okq, bg.c(bg.add(src.off, bg.add(bg.mul(kq, src.rs), col0))),
                                             bg.c(bg.add(src.off, col0)))
                            rowv = []
                            for v in range(nv):
                                cnt = bg.select(okq, bg.c(counts[v]), bg.c(0))
                                ld = x.VLoadOp.create(operands=[src.base, bg.c(bg.add(soff, v * W)), bg.c(cnt)],
                                                      result_types=[self.vtype(elem)])
                                bg.op(ld)
                                rowv.append(ld.result)
                            regs.append(rowv)
                        if kp != 2:
                            raise CodegenError("b_panel packing supports kpack 1 or 2")
                        for v in range(nv):
                            il = x.VInterleaveOp.create(operands=[regs[0][v], regs[1][v]],
                                                        result_types=[self.vtype(elem, 2 * W)])
                            bg.op(il)
                            bg.op(x.VStoreOp.create(operands=[il.result, dst, bg.c(bg.add(dbase, v * W * 2))]))
                    return []

                if kp == 1:
                    # a panel whose columns are all in range loads whole vectors (no lane masks);
                    # rows past the last (k up to kcp) still load nothing
                    def whole_rows(bw: Builder):
                        bw.for_(0, rows, 1, lambda bg, gidx, c: group(bg, gidx, c, whole=True))
                        bw.for_(rows, kcp, 1, group)

                    def masked_rows(bm: Builder):
                        bm.for_(0, kcp, 1, group)
                    bp.if_(bp.cmp("sge", bp.sub(cols, col0), nrw), whole_rows, masked_rows)
                else:
                    bp.for_(0, bp.div(kcp, kp), 1, group)   # groups past the rows load nothing: zeros
            else:
                self._scalar_pack(bp, src, dst, pbase, col0, nrw, kp, kcp, transpose=False)
            return []

        b.for_(0, npanel, 1, panel)

    def _pack_a(self, b: Builder, src: ViewVal, dst, doff, mr: int, kp: int) -> None:
        """dst[p*mr*kcp + g*mr*kp + r*kp + q] = src[(p*mr+r)*rs + (g*kp+q)*cs], zero-padded."""
        kcp = b.mul(b.ceil_div(src.cols, kp), kp)
        npanel = b.ceil_div(src.rows, mr)

        W = self.w
        unit_elems = 2 if _is_half(src.elem) else 1  # k elements per 32-bit unit
        if (_const_int(src.cs) == 1 and kp * _elem_bytes(src.elem) == 4 * W
                and getattr(self, "pack_elem", src.elem) == src.elem):
            self._pack_a_rows(b, src, dst, doff, mr, kp, kcp, npanel)
            return
        vector_ok = _const_int(src.cs) == 1 and kp == unit_elems
        chunk = W * kp  # k elements per vector of W 32-bit units
        kfull = b.mul(b.div(src.cols, chunk), chunk) if vector_ok else 0

        def panel(bp: Builder, p, _c):
            pbase = bp.add(doff, bp.mul(p, bp.mul(mr, kcp)))
            row0 = bp.mul(p, mr)
            if not vector_ok:
                self._scalar_pack(bp, src, dst, pbase, row0, mr, kp, kcp, transpose=True)
                return []
            full = bp.cmp("sge", bp.sub(src.rows, row0), mr)

            def fast(bf: Builder):
                # mr rows x W units at a time, transposed in registers into k-major order
                def chunk_body(bc: Builder, kk, _c2):
                    vecs = []
                    for r in range(mr):
                        off = bc.add(src.off, bc.add(bc.mul(bc.add(row0, r), src.rs), kk))
                        ld = x.VLoadOp.create(operands=[src.base, bc.c(off)], result_types=[self.vtype(src.elem, chunk)])
                        bc.op(ld)
                        vecs.append(ld.result)
                    tr = x.VTransposeOp.create(operands=vecs, result_types=[vecs[0].type] * mr)
                    bc.op(tr)
                    for v, res in enumerate(tr.results):
                        bc.op(x.VStoreOp.create(operands=[res, dst, bc.c(bc.add(pbase, bc.add(bc.mul(kk, mr),
                                                                                               v * chunk)))]))
                    return []

                bf.for_(0, kfull, chunk, chunk_body)
                self._scalar_pack(bf, src, dst, pbase, row0, mr, kp, kcp, transpose=True, k_start=kfull)
                return []

            def slow(bs: Builder):
                self._scalar_pack(bs, src, dst, pbase, row0, mr, kp, kcp, transpose=True)
                return []

            bp.if_(full, fast, slow)
            return []

        b.for_(0, npanel, 1, panel)

    def _pack_a_rows(self, b: Builder, src: ViewVal, dst, doff, mr: int, kp: int, kcp, npanel) -> None:
        """A panel whose k groups are one vector each (AMX: 32 bf16 = 64 bytes): every row's
        group is one masked vector copy; rows and k past the view's extent become zeros."""
        vt = self.vtype(src.elem, kp)

        def panel(bp: Builder, p, _c):
            pbase = bp.add(doff, bp.mul(p, bp.mul(mr, kcp)))
            row0 = bp.mul(p, mr)
            valid = bp.max(bp.min(bp.sub(src.rows, row0), mr), 0)

            def group(bg: Builder, g, _c2):
                k0 = bg.mul(g, kp)
                kcount = bg.max(bg.min(bg.sub(src.cols, k0), kp), 0)
                dbase = bg.add(pbase, bg.mul(g, mr * kp))
                for r in range(mr):
                    ok = bg.cmp("slt", r, valid)
                    cnt = bg.select(ok, bg.c(kcount), bg.c(0))
                    soff = bg.select(ok, bg.c(bg.add(src.off, bg.add(bg.mul(bg.add(row0, r), src.rs), k0))),
                                     bg.c(src.off))
                    ld = x.VLoadOp.create(operands=[src.base, bg.c(soff), bg.c(cnt)], result_types=[vt])
                    bg.op(ld)
                    bg.op(x.VStoreOp.create(operands=[ld.result, dst, bg.c(bg.add(dbase, r * kp))]))
                return []

            bp.for_(0, bp.div(kcp, kp), 1, group)
            return []

        b.for_(0, npanel, 1, panel)

    def _scalar_pack(self, b: Builder, src: ViewVal, dst, pbase, start, width: int, kp: int, kcp,
                     transpose: bool, k_start=0) -> None:
        """Copy one sliver element by element.  For A (transpose): sliver rows are the
        view's rows and k runs along its columns; for B, k runs along the view's rows."""
        elem = src.elem
        if transpose:
            n_lines, k_len, line_stride, k_stride = src.rows, src.cols, src.rs, src.cs
        else:
            n_lines, k_len, line_stride, k_stride = src.cols, src.rows, src.cs, src.rs
        valid = b.max(b.min(b.sub(n_lines, start), width), 0)

        def line(bl: Builder, r, _c):
            src_line = bl.add(src.off, bl.mul(bl.add(start, r), line_stride))
            ok = bl.cmp("slt", r, valid)

            def copy(bc: Builder):
                def kloop(bk: Builder, kk, _c2):
                    g_ = bk.div(kk, kp) if kp > 1 else kk
                    q = bk.rem(kk, kp) if kp > 1 else 0
                    doff = bk.add(pbase, bk.add(bk.mul(g_, width * kp), bk.add(bk.mul(r, kp), q)))
                    ld = x.LoadOp.create(operands=[src.base, bk.c(bk.add(src_line, bk.mul(kk, k_stride)))],
                                         result_types=[elem])
                    bk.op(ld)
                    bk.op(x.StoreOp.create(operands=[self._convert_scalar(bk, ld.result, elem), dst, bk.c(doff)]))
                    return []
                bc.for_(k_start, k_len, 1, kloop)
                self._zero_tail(bc, dst, pbase, r, width, kp, k_len, kcp, elem)
                return []

            def zero(bz: Builder):
                self._zero_tail(bz, dst, pbase, r, width, kp, 0, kcp, elem)
                return []

            bl.if_(ok, copy, zero)
            return []

        b.for_(0, width, 1, line)

    def _convert_vec(self, b: Builder, v, elem):
        out = getattr(self, "pack_elem", elem)
        if out == elem:
            return v
        cv = x.VCvtOp.create(operands=[v], result_types=[VectorType(out, [v.type.get_shape()[0]])])
        b.op(cv)
        return cv.result

    def _convert_scalar(self, b: Builder, v, elem):
        out = getattr(self, "pack_elem", elem)
        if out == elem:
            return v
        cls = arith.ExtFOp if _elem_bytes(out) > _elem_bytes(elem) else arith.TruncFOp
        return b.op(cls(v, out)).results[0]

    def _zero_tail(self, b: Builder, dst, pbase, r, width, kp, k_from, kcp, elem) -> None:
        elem = getattr(self, "pack_elem", elem)
        def zl(bz: Builder, kk, _c):
            g_ = bz.div(kk, kp) if kp > 1 else kk
            q = bz.rem(kk, kp) if kp > 1 else 0
            doff = bz.add(pbase, bz.add(bz.mul(g_, width * kp), bz.add(bz.mul(r, kp), q)))
            zero = arith.ConstantOp(FloatAttr(0.0, elem), elem)
            bz.op(zero)
            bz.op(x.StoreOp.create(operands=[zero.result, dst, bz.c(doff)]))
            return []
        b.for_(k_from, kcp, 1, zl)

    def _copy_rows(self, b: Builder, src: ViewVal, dst, doff, pitch: int) -> None:
        """All R rows of the view, ``pitch`` elements apart; rows past the extent become zeros."""
        R, C = src.shape

        def row(br: Builder, i, _c):
            valid = br.select(br.cmp("slt", i, src.rows), br.c(1), br.c(0))
            regs = self._load_tile(br, ViewVal(src.base, br.c(br.add(src.off, br.mul(i, src.rs))), src.rs, src.cs,
                                               br.c(valid), src.cols, (1, C), src.elem))
            self._store_tile(br, regs, ViewVal(dst, br.c(br.add(doff, br.mul(i, pitch))), br.c(pitch), br.c(1),
                                               br.c(1), br.c(C), (1, C), self.pack_elem))
            return []

        b.for_(0, R, 1, row)


@register
@dataclass(frozen=True)
class LowerTileToX86(TesseraPass):
    """Tile IR -> tessera_x86 Target IR (register tiles, packing loops, masked edges)."""

    name = "lower-tile-to-x86"
    kind = "target-lowering"
    consumes = ("tile.alloc", "tile.view", "tile.async_copy", "tile.wait", "tile.barrier", "tile.claim", "tile.prefetch",
                "tile.fragment_zero",
                "tile.fragment_pack", "tile.mma", "tile.fragment_unpack", "tile.load", "tile.store",
                "tile.constant", "tile.splat_index", "tile.elementwise", "tile.mask", "tile.reduce", "tile.launch",
                "tile.load_index", "tile.index")
    produces = ("tessera_x86.vzero", "tessera_x86.vconstant", "tessera_x86.vbroadcast", "tessera_x86.vload",
                "tessera_x86.vstore", "tessera_x86.load", "tessera_x86.store", "tessera_x86.vfma", "tessera_x86.vsplat",
                "tessera_x86.vdpbf16ps", "tessera_x86.vbinary", "tessera_x86.vunary", "tessera_x86.vreduce",
                "tessera_x86.vcvt", "tessera_x86.vinterleave", "tessera_x86.vtranspose", "tessera_x86.vlaneselect", "tessera_x86.aligned",
                "tessera_x86.sfence", "tessera_x86.barrier", "tessera_x86.claim", "tessera_x86.prefetch", "tessera_x86.tzero", "tessera_x86.tload",
                "tessera_x86.tstore", "tessera_x86.tdp", "tessera_x86.velem",
                "tessera_x86.workspace", "tessera_x86.launch")
    arch: str = option(doc="x86 CPU name or ISA level (host resolved before lowering); required")
    threads: int = option(0, doc="most threads a launch may use (0: the CPUs this process may use)")
    deterministic: bool = option(False, doc="kernels run with FTZ/DAZ off whatever the caller's MXCSR holds "
                                            "(default: the caller's FTZ/DAZ, on every thread)")

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        try:
            isa = get_isa("x86", self.arch)
        except UnknownArchError as e:
            raise PassFailedError(f"lower-tile-to-x86: {e.message}") from None
        w = 16 if "avx512f" in isa.features else 8
        kernels: dict[str, func.FuncOp] = {}
        hosts: list[func.FuncOp] = []
        for op in list(module.body.block.ops):
            if not isinstance(op, func.FuncOp):
                continue
            if _is_kernel(op):
                reg = kernel_register_elem(op)
                lanes = w * 4 // _elem_bytes(reg)   # the arch's vector bits in lanes of the register type
                kw = ival(op.attributes["vector"]) if "vector" in op.attributes else lanes
                if kw > lanes or lanes % kw:
                    raise PassFailedError(f"lower-tile-to-x86: kernel @{op.sym_name.data} is laid out for {kw}-lane "
                                          f"{reg} vectors; {self.arch} has {lanes}")
                bounds.check_code_size(op, f"@{op.sym_name.data}")   # before the expansion, not after
                new = lower_kernel(op, kw, isa.features, reg)
                if self.deterministic:   # read by the entry's floating-point mode (codegen/x86.py)
                    new.attributes[x.DETERMINISTIC] = UnitAttr()
                module.body.block.insert_op_before(new, op)
                op.detach()
                op.erase()
                kernels[new.sym_name.data] = new
            else:
                hosts.append(op)
        for op in hosts:
            _lower_host(op, self.threads, kernels)


def _is_kernel(fn: func.FuncOp) -> bool:
    ins = fn.function_type.inputs.data
    return bool(ins) and isinstance(ins[-1], t.BufferType) and ins[-1].space.data == "team"


def kernel_register_elem(fn: func.FuncOp) -> Attribute:
    """The kernel's register type: f64 where its tiles are f64 (the generator's ``register_elem``),
    else f32 (every narrower tile widens into f32 registers).  A kernel with f64 tiles whose other
    register tiles are f32 is refused: its generator mixed the two."""
    regs = set()
    for op in fn.walk():
        for v in op.results:
            ty = v.type
            if isinstance(ty, t.TileType) or isinstance(ty, t.FragmentType) and ty.role.data == "acc":
                regs.add(ty.element_type if isinstance(ty, t.TileType) else ty.acc)
    if not any(isinstance(r, Float64Type) for r in regs):
        return f32
    mixed = sorted(str(r) for r in regs if isinstance(r, (Float32Type, BFloat16Type, Float16Type)))
    if mixed:
        raise CodegenError(f"kernel @{fn.sym_name.data} mixes f64 register tiles with {', '.join(mixed)} ones; a "
                           "kernel computes in one register type")
    return f64


def lower_kernel(fn: func.FuncOp, w: int, features: frozenset[str], reg: Attribute = f32) -> func.FuncOp:
    low = _Lowerer(w, features, reg=reg)
    src = fn.body.block
    arg_types = []
    for a in src.args:
        arg_types += low.flatten_types(a.type)
    block = Block(arg_types=arg_types)
    for a, n in zip(src.args, block.args):
        low.vmap[a] = n
    low.ws, low.team, low.nthreads = block.args[-2], block.args[-1], block.args[-3]
    b = Builder(block)
    low.lower_block(src, b)
    new = func.FuncOp(fn.sym_name.data, (arg_types, []), Region(block))
    new.attributes["workspace"] = i64_attr(low.ws_offset)
    new.attributes["team"] = i64_attr(low.team_offset)
    return new


def _lower_host(fn: func.FuncOp, threads: int, kernels: dict[str, func.FuncOp]) -> None:
    for op in list(fn.walk()):
        if isinstance(op, t.LaunchOp):
            name = op.callee.root_reference.data
            k = kernels.get(name)  # the lowering's own scratch sizes are authoritative
            if k is None:
                raise PassFailedError(f"lower-tile-to-x86: tile.launch of @{name}: the module has no tile kernel "
                                      f"@{name} (a func.func whose last argument is a team buffer)")
            new = x.LaunchOp.create(
                operands=list(op.args), result_types=[r.type for r in op.outs],
                attributes={"callee": op.callee, "dims": op.dims, "workspace": k.attributes["workspace"],
                            "team": k.attributes["team"], "threads": i64_attr(threads),
                            **({"parallel": op.parallel} if op.parallel else {}),
                            **({"limits": op.limits} if op.limits else {})})
            swap_op(op, new)
