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
    UnitAttr,
    VectorType,
    f32,
    f64,
    i1 as I1,
)
from xdsl.ir import Attribute, Block, Region, SSAValue

from tessera.errors import CodegenError, PassFailedError, UnknownArchError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr, ival
from tessera.ir.builder import INDEX, Builder
from tessera.ir.target import x86 as x
from tessera.mma.selector import get_isa
from tessera.passes.base import TesseraPass, option, register
from tessera.passes.schedule import bounds
from tessera.passes.target.lowering import OpLowerer
from tessera.passes.target.x86 import lower_typed_elem as TE
from tessera.passes.target.x86.lower_elem import ElementwiseLowering
from tessera.passes.target.x86.lower_index import LoadIndexLowering
from tessera.passes.target.x86.lower_mma import MmaLowering
from tessera.passes.target.x86.lower_pack import PackLowering
from tessera.passes.target.x86.lower_values import (PTR, Regs, ViewVal, _const_int, _elem_bytes,  # noqa: F401
                                                   _is_half, _vector)
from tessera.passes.util import swap_op



@dataclass
class _Lowerer(MmaLowering, ElementwiseLowering, PackLowering, LoadIndexLowering, OpLowerer):
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
        if TE.is_int_elem(v.type.element_type) or TE.is_int_elem(elem):
            # int lanes, bool lanes -> bytes; float registers -> int memory (a cast ending a GEMM
            # epilogue): velem cvt, which truncates and saturates as tessera.cast does
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
                            **({"limits": op.limits} if op.limits else {}),
                            **({"inplace": op.inplace} if op.inplace else {})})
            swap_op(op, new)
