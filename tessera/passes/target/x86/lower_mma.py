"""Matrix fragments and tile.mma: FMA / dot-product vector fragments and AMX tiles"""
from __future__ import annotations


from xdsl.dialects.builtin import (
    StringAttr,
    f32,
)
from xdsl.ir import SSAValue

from tessera.errors import CodegenError, MmaSelectorError
from tessera.ir import tile as t
from tessera.ir.attrs import i64_attr
from tessera.ir.builder import Builder
from tessera.ir.target import x86 as x
from tessera.mma import x86 as x86_records

from tessera.passes.target.x86.lower_values import PTR, Regs, ViewVal, _const_int, _elem_bytes, _is_half  # noqa: F401


class MmaLowering:
    """Methods of the x86 Tile IR lowering (``lower_tile_to_x86._Lowerer``) for matrix fragments and tile.mma."""

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
