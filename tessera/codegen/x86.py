"""Target IR (``tessera_x86`` + func/scf/arith) -> LLVM IR text, through llvmlite.ir.

Every kernel function becomes an LLVM function ``void @name(ptr..., i64..., ptr ws)``
with C calling convention.  ``scf.for``/``scf.if`` become basic blocks with phi
nodes (loop-carried register tiles stay in SSA registers); ``tessera_x86`` ops
map to LLVM instructions and intrinsics; math functions come from
:mod:`tessera.codegen.x86_math`.  Any op outside this set is refused (it means a
lowering is missing from the pipeline).
"""
from __future__ import annotations

from functools import lru_cache

from llvmlite import ir
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from tessera.codegen.llvm_common import (  # noqa: F401  (BF16, llvm_type: re-exported for users)
    BF16,
    fp8_format,
    fp8_to_f32,
    F16,
    F32,
    F64,
    I1,
    I8,
    I16,
    I32,
    I64,
    PTR,
    X86_AMX,
    FnCodegen,
    ModuleCodegen,
    _bytes,
    llvm_type,
)
from tessera.errors import CodegenError, UnloweredOpsError
from tessera.ir.attrs import ival
from tessera.ir.target import x86 as x


ALLOWED_DIALECTS = ("tessera_x86", "arith", "scf", "func", "builtin")


def check_translatable(module: ModuleOp) -> None:
    """Refuse a module that still holds ops of a higher layer (a lowering is missing)."""
    bad = sorted({op.name for op in module.walk() if op.dialect_name() not in ALLOWED_DIALECTS})
    if bad:
        raise UnloweredOpsError(
            f"ops survived to x86 translation: {', '.join(bad)} — the pipeline lacks their lowering "
            f"(tile.* ops are consumed by lower-tile-to-x86)")


# Constants shared by every instruction that uses them: llvmlite formats a constant once per
# object, and a vector constant's text is most of the cost of a splat or a lane mask
_I32_ZERO = ir.Constant(I32, 0)


@lru_cache(maxsize=64)
def _splat_constants(vt: ir.VectorType) -> tuple[ir.Constant, ir.Constant]:
    """``undef`` of ``vt`` and the all-zeros shuffle mask of its width."""
    return ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, vt.count), [0] * vt.count)


@lru_cache(maxsize=16)
def _lane_indices(w: int) -> tuple[ir.VectorType, ir.Constant]:
    iv = ir.VectorType(I32, w)
    return iv, ir.Constant(iv, list(range(w)))


class _Fn(FnCodegen):
    target_name = "x86"

    # ------------------------------------------------------------------ memory
    def _addr(self, base, off, elem_ty):
        return self.b.gep(base, [off], source_etype=elem_ty)

    def _mask(self, count, w: int):
        """The first ``count`` of ``w`` lanes (none for count <= 0, all for count >= w), built
        as a scalar bit mask and reinterpreted as <w x i1>.  A vector compare of lane indices
        would do, but LLVM's CodeGenPrepare sinks compares into the blocks that use them, so a
        mask whose count is loop-invariant was recomputed on every iteration (two 8-lane
        compares and a merge per 16-lane mask in every packing loop); scalar arithmetic
        stays hoisted, and the loop keeps one move into a mask register (AVX-512)."""
        b = self.b
        zero, full = ir.Constant(I64, 0), ir.Constant(I64, w)
        c = b.select(b.icmp_signed("<", count, zero), zero, b.select(b.icmp_signed(">", count, full), full, count))
        if w < 16:
            # AVX2 vectors: no mask registers; a compare of 32-bit lane indices with the clamped
            # count makes the lane mask in one vpcmpgtd (with 64-bit lanes, as before, the compare
            # that CodeGenPrepare sinks into the loop was two compares, packs and shuffles: 14
            # instructions per 16-lane mask in every packing loop, 6.6 % of attention on Zen 1)
            iv, lanes = _lane_indices(w)
            return b.icmp_signed("<", lanes, self._splat(b.trunc(c, I32), iv))
        if w == 64:
            bits = b.select(b.icmp_signed("==", c, full), ir.Constant(I64, -1),
                            b.sub(b.shl(ir.Constant(I64, 1), c), ir.Constant(I64, 1)))
        else:
            bits = b.sub(b.shl(ir.Constant(I64, 1), c), ir.Constant(I64, 1))
        return b.bitcast(b.trunc(bits, ir.IntType(w)) if w < 64 else bits, ir.VectorType(I1, w))

    def _vec_suffix(self, vt: ir.VectorType) -> str:
        return f"v{vt.count}{vt.element.intrinsic_name}"

    def op_tessera_x86_vload(self, op: x.VLoadOp):
        vt = llvm_type(op.result.type)
        addr = self._addr(self.v(op.base), self.v(op.offset), vt.element)
        if op.count is None:
            self.set(op, self.b.load(addr, typ=vt, align=1))
            return
        mt = self._memory_type(vt)
        fn = self.gen.intrinsic(f"llvm.masked.load.{self._vec_suffix(mt)}.p0", mt,
                                [PTR, I32, ir.VectorType(I1, vt.count), mt])
        mask = self._mask(self.v(op.count), vt.count)
        v = self.b.call(fn, [addr, ir.Constant(I32, 1), mask, ir.Constant(mt, None)])
        self.set(op, v if mt is vt else self.b.bitcast(v, vt))

    @staticmethod
    def _memory_type(vt: ir.VectorType) -> ir.VectorType:
        """The vector type masked loads, stores and gathers move: bf16 lanes as i16.  Without
        AVX512-BF16, LLVM legalises a scalarised bfloat lane through f32 and back, and the way
        back is a call of ``__truncsfbf2`` (which no object here can resolve)."""
        return ir.VectorType(I16, vt.count) if vt.element is BF16 else vt

    def op_tessera_x86_vgather(self, op: x.VGatherOp):
        vt = llvm_type(op.result.type)
        w = vt.count
        iv = ir.VectorType(I64, w)
        size = ir.Constant(iv, [_bytes(vt.element)] * w)
        idx = self.b.add(self._splat(self.v(op.offset), iv),
                         self.b.mul(self._splat(self.v(op.stride), iv), ir.Constant(iv, list(range(w)))))
        base = self._splat(self.b.ptrtoint(self.v(op.base), I64), iv)
        pv = ir.VectorType(PTR, w)
        ptrs = self.b.inttoptr(self.b.add(base, self.b.mul(idx, size)), pv)
        mask = (self._mask(self.v(op.count), w) if op.count is not None
                else ir.Constant(ir.VectorType(I1, w), [1] * w))
        mt = self._memory_type(vt)
        fn = self.gen.intrinsic(f"llvm.masked.gather.{self._vec_suffix(mt)}.v{w}p0", mt,
                                [pv, I32, ir.VectorType(I1, w), mt])
        v = self.b.call(fn, [ptrs, ir.Constant(I32, _bytes(vt.element)), mask, ir.Constant(mt, None)])
        self.set(op, v if mt is vt else self.b.bitcast(v, vt))

    def op_tessera_x86_vstore(self, op: x.VStoreOp):
        val = self.v(op.value)
        vt = val.type
        addr = self._addr(self.v(op.base), self.v(op.offset), vt.element)
        if op.count is None:
            if op.nontemporal is not None:
                st = self.b.store(val, addr, align=vt.count * _bytes(vt.element))
                st.set_metadata("nontemporal", self.gen.m.add_metadata([ir.Constant(I32, 1)]))
            else:
                self.b.store(val, addr, align=1)
            return
        mt = self._memory_type(vt)
        fn = self.gen.intrinsic(f"llvm.masked.store.{self._vec_suffix(mt)}.p0", ir.VoidType(),
                                [mt, PTR, I32, ir.VectorType(I1, vt.count)])
        count = self.v(op.count)
        if self.gen.avx512 and isinstance(mt.element, ir.IntType) and mt.element.width < 32:
            count = self._opaque(count)
        self.b.call(fn, [val if mt is vt else self.b.bitcast(val, mt), addr, ir.Constant(I32, 1),
                         self._mask(count, vt.count)])

    def _opaque(self, value):
        """``value`` through an empty inline-asm move, so LLVM cannot fold it to a constant.

        LLVM 22's X86 backend miscompiles a masked store of 8- or 16-bit lanes whose mask it has
        folded to one constant lane when the value is a truncation from 32-bit lanes (a bf16
        rounding, an int8 result): with AVX-512 it becomes a 32-bit scalar store, writing two or
        three bytes past the lane (``pad(mode="edge")`` on bf16 lost the element after each
        edge).  Kept opaque, the count gives a real mask and a ``vpmovdw`` with a mask register.
        ``tests/test_x86_codegen_bugs.py`` shows the miscompile and the guard."""
        fty = ir.FunctionType(value.type, [value.type])
        return self.b.call(ir.InlineAsm(fty, "", "=r,0"), [value])

    def op_tessera_x86_load(self, op):
        ty = llvm_type(op.result.type)
        self.set(op, self.b.load(self._addr(self.v(op.base), self.v(op.offset), ty), typ=ty, align=1))

    def op_tessera_x86_store(self, op):
        val = self.v(op.value)
        self.b.store(val, self._addr(self.v(op.base), self.v(op.offset), val.type), align=1)

    def _splat(self, scalar, vt: ir.VectorType):
        undef, zeros = _splat_constants(vt)
        v = self.b.insert_element(undef, scalar, _I32_ZERO)
        return self.b.shuffle_vector(v, undef, zeros)

    def op_tessera_x86_vbroadcast(self, op: x.VBroadcastOp):
        vt = llvm_type(op.result.type)
        group = ival(op.group)
        if group == 1 and vt.element is not BF16:   # a bfloat scalar goes as i16 (see _memory_type)
            s = self.b.load(self._addr(self.v(op.base), self.v(op.offset), vt.element), typ=vt.element, align=1)
            self.set(op, self._splat(s, vt))
            return
        bits = vt.element.intrinsic_name
        width = {"bf16": 16, "f16": 16, "f32": 32}[bits] * group
        it = ir.IntType(width)
        s = self.b.load(self._addr(self.v(op.base), self.v(op.offset), vt.element), typ=it, align=1)
        iv = self._splat(s, ir.VectorType(it, vt.count // group))
        self.set(op, self.b.bitcast(iv, vt))

    def op_tessera_x86_aligned(self, op):
        ty = {1: I8, 2: I16, 4: I32, 8: I64}[ival(op.elem_bytes)]
        addr = self.b.ptrtoint(self._addr(self.v(op.base), self.v(op.offset), ty), I64)
        low = self.b.and_(addr, ir.Constant(I64, ival(op.bytes) - 1))
        self.set(op, self.b.icmp_unsigned("==", low, ir.Constant(I64, 0)))

    def op_tessera_x86_barrier(self, op):
        """Sense-reversing barrier: word 0 counts arrivals, word 8 (another cache line) is the generation."""
        b = self.b
        team, n = self.v(op.team), self.v(op.nthreads)
        count = team
        gen_ptr = b.gep(team, [ir.Constant(I64, 64)], source_etype=I8)
        gen = b.load_atomic(gen_ptr, "acquire", 8, typ=I64)
        old = b.atomic_rmw("add", count, ir.Constant(I64, 1), "acq_rel")
        last = b.icmp_signed("==", old, b.sub(n, ir.Constant(I64, 1)))
        last_bb = self.f.append_basic_block("barrier.last")
        wait_bb = self.f.append_basic_block("barrier.wait")
        spin_bb = self.f.append_basic_block("barrier.spin")
        done_bb = self.f.append_basic_block("barrier.done")
        pre = b.block
        b.cbranch(last, last_bb, wait_bb)
        b.position_at_end(last_bb)
        b.atomic_rmw("xchg", count, ir.Constant(I64, 0), "monotonic")
        b.atomic_rmw("add", gen_ptr, ir.Constant(I64, 1), "release")
        b.branch(done_bb)
        b.position_at_end(wait_bb)
        spins = b.phi(I64)
        spins.add_incoming(ir.Constant(I64, 0), pre)
        now = b.load_atomic(gen_ptr, "acquire", 8, typ=I64)
        b.cbranch(b.icmp_signed("==", now, gen), spin_bb, done_bb)
        b.position_at_end(spin_bb)
        b.call(self.gen.intrinsic("llvm.x86.sse2.pause", ir.VoidType(), []), [])
        nxt = b.add(spins, ir.Constant(I64, 1))
        yield_bb = self.f.append_basic_block("barrier.yield")
        back_bb = self.f.append_basic_block("barrier.back")
        b.cbranch(b.icmp_unsigned("==", b.and_(nxt, ir.Constant(I64, 1023)), ir.Constant(I64, 0)), yield_bb, back_bb)
        b.position_at_end(yield_bb)
        sy = self.gen.m.globals.get("sched_yield") or ir.Function(self.gen.m, ir.FunctionType(I32, []), "sched_yield")
        b.call(sy, [])
        b.branch(back_bb)
        b.position_at_end(back_bb)
        spins.add_incoming(nxt, back_bb)
        b.branch(wait_bb)
        b.position_at_end(done_bb)

    def op_tessera_x86_claim(self, op):
        ctr = self.b.gep(self.v(op.team), [ir.Constant(I64, x.WORK_COUNTER)], source_etype=I8)
        self.set(op, self.b.atomic_rmw("add", ctr, ir.Constant(I64, 1), "monotonic"))

    def op_tessera_x86_prefetch(self, op):
        fn = self.gen.intrinsic("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        addr = self._addr(self.v(op.base), self.v(op.offset), ir.IntType(8 * ival(op.elem_bytes)))
        self.b.call(fn, [addr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])

    def op_tessera_x86_sfence(self, op):
        self.b.call(self.gen.intrinsic("llvm.x86.sse.sfence", ir.VoidType(), []), [])

    def op_tessera_x86_workspace(self, op):
        self.set(op, self.b.gep(self.v(op.base), [ir.Constant(I64, ival(op.offset))], source_etype=I8))

    # ------------------------------------------------------------------ compute
    def op_tessera_x86_vzero(self, op):
        self.set(op, ir.Constant(llvm_type(op.result.type), None))

    def op_tessera_x86_vconstant(self, op):
        vt = llvm_type(op.result.type)
        v = op.value.value.data
        if isinstance(vt.element, ir.IntType) and vt.element.width == 1:
            v = int(v != 0)   # an i1 IntegerAttr reads true as -1
        step = op.step.value.data if op.step is not None else 0   # lane l holds value + l * step
        self.set(op, ir.Constant(vt, [ir.Constant(vt.element, v + lane * step) for lane in range(vt.count)]))

    def op_tessera_x86_vsplat(self, op):
        self.set(op, self._splat(self.v(op.scalar), llvm_type(op.result.type)))

    def op_tessera_x86_vfma(self, op):
        vt = llvm_type(op.result.type)
        fn = self.gen.intrinsic(f"llvm.fma.{self._vec_suffix(vt)}", vt, [vt, vt, vt])
        self.set(op, self.b.call(fn, [self.v(op.a), self.v(op.b), self.v(op.acc)]))

    def op_tessera_x86_vdpbf16ps(self, op):
        vt = llvm_type(op.result.type)
        at = llvm_type(op.a.type)
        if vt.count != 16:
            raise CodegenError("vdpbf16ps is emitted for 512-bit vectors only")
        fn = self.gen.intrinsic("llvm.x86.avx512bf16.dpbf16ps.512", vt, [vt, at, at])
        self.set(op, self.b.call(fn, [self.v(op.acc), self.v(op.a), self.v(op.b)]))

    # ------------------------------------------------------------------ AMX tiles (LLVM configures the tiles)
    _TILE = (ir.Constant(I16, x.AMX_ROWS), ir.Constant(I16, x.AMX_ROW_BYTES))

    def op_tessera_x86_tzero(self, op):
        fn = self.gen.intrinsic("llvm.x86.tilezero.internal", X86_AMX, [I16, I16])
        self.set(op, self.b.call(fn, list(self._TILE)))

    def _tile_addr(self, op):
        elem = ir.IntType(8 * ival(op.elem_bytes))
        return self._addr(self.v(op.base), self.v(op.offset), elem)

    def op_tessera_x86_tload(self, op):
        fn = self.gen.intrinsic("llvm.x86.tileloadd64.internal", X86_AMX, [I16, I16, PTR, I64])
        self.set(op, self.b.call(fn, [*self._TILE, self._tile_addr(op), self.v(op.stride)]))

    def op_tessera_x86_tstore(self, op):
        fn = self.gen.intrinsic("llvm.x86.tilestored64.internal", ir.VoidType(), [I16, I16, PTR, I64, X86_AMX])
        self.b.call(fn, [*self._TILE, self._tile_addr(op), self.v(op.stride), self.v(op.value)])

    def op_tessera_x86_tdp(self, op):
        # M rows, N bytes of the accumulator row, K bytes of the A row: one full 16 x 64-byte tile each
        fn = self.gen.intrinsic(f"llvm.x86.{op.instr.data}.internal", X86_AMX, [I16, I16, I16] + [X86_AMX] * 3)
        self.set(op, self.b.call(fn, [*self._TILE, self._TILE[1], self.v(op.acc), self.v(op.a), self.v(op.b)]))

    def op_tessera_x86_vbinary(self, op):
        a, c = self.v(op.lhs), self.v(op.rhs)
        fn = op.fn.data
        b = self.b
        if fn == "add":
            r = b.fadd(a, c)
        elif fn == "sub":
            r = b.fsub(a, c)
        elif fn == "mul":
            r = b.fmul(a, c)
        elif fn == "div":
            r = b.fdiv(a, c)
        elif fn == "safe_div":
            zero = ir.Constant(a.type, None)
            r = b.select(b.fcmp_ordered("==", c, zero), zero, b.fdiv(a, c))
        elif fn == "mask_select":
            ninf = ir.Constant(a.type, [ir.Constant(a.type.element, float("-inf"))] * a.type.count)
            r = b.select(b.fcmp_unordered("!=", c, ir.Constant(a.type, None)), a, ninf)
        elif fn == "select_max":   # a > c ? a : c: one vmaxps (see tile.BINARY_FNS)
            r = self._vmaxps(a, c)
        elif fn == "same":         # 1 where a == c or both are NaN
            hit = b.or_(b.fcmp_ordered("==", a, c), b.and_(b.fcmp_unordered("uno", a, a),
                                                           b.fcmp_unordered("uno", c, c)))
            r = b.select(hit, ir.Constant(a.type, [ir.Constant(a.type.element, 1.0)] * a.type.count),
                         ir.Constant(a.type, None))
        else:  # max / min as numpy's: one vmaxps and a NaN select (llvm.maximum costs two more)
            r = self.numpy_max(a, c, fn == "max")
        self.set(op, r)

    def _vmaxps(self, a, c):
        """a > c ? a : c as the vmaxps intrinsic: written as a select, LLVM turned
        ``store(select(a > c, a, c), p)`` with c loaded from p into a compare and a masked store,
        which AMD cores before Zen 3 run in microcode."""
        vt = a.type
        names = {F32: {8: "llvm.x86.avx.max.ps.256", 16: "llvm.x86.avx512.max.ps.512"},
                 F64: {4: "llvm.x86.avx.max.pd.256", 8: "llvm.x86.avx512.max.pd.512"}}
        name = names.get(getattr(vt, "element", None), {}).get(getattr(vt, "count", 0))
        if name is None:
            return self.b.select(self.b.fcmp_ordered(">", a, c), a, c)
        if "avx512" in name:
            return self.b.call(self.gen.intrinsic(name, vt, [vt, vt, I32]), [a, c, ir.Constant(I32, 4)])
        return self.b.call(self.gen.intrinsic(name, vt, [vt, vt]), [a, c])

    def op_tessera_x86_vunary(self, op):
        a = self.v(op.input)
        vt = a.type
        fn = op.fn.data
        b = self.b
        one = ir.Constant(vt, [ir.Constant(vt.element, 1.0)] * vt.count)
        if fn == "neg":
            r = b.fneg(a)
        elif fn == "copy":
            r = a
        elif fn == "abs":   # behind an empty asm: a bf16 load, fabs and bf16 store alone simplified to
            # integer ops whose NaN select LLVM then rewrote on bfloat vectors, legalised through a
            # __truncsfbf2 libcall on AVX2 (the opaque value keeps the store's rounding as written)
            r = b.call(self.gen.intrinsic(f"llvm.fabs.{self._vec_suffix(vt)}", vt, [vt]), [a])
            r = b.asm(ir.FunctionType(vt, [vt]), "", "=v,0", [r], side_effect=False)
        elif fn == "sqrt":
            r = b.call(self.gen.intrinsic(f"llvm.sqrt.{self._vec_suffix(vt)}", vt, [vt]), [a])
        elif fn == "rsqrt":
            r = b.fdiv(one, b.call(self.gen.intrinsic(f"llvm.sqrt.{self._vec_suffix(vt)}", vt, [vt]), [a]))
        elif fn == "recip":
            r = b.fdiv(one, a)
        elif fn == "finite_or_zero":
            fabs = b.call(self.gen.intrinsic(f"llvm.fabs.{self._vec_suffix(vt)}", vt, [vt]), [a])
            inf = ir.Constant(vt, [ir.Constant(vt.element, float("inf"))] * vt.count)
            r = b.select(b.fcmp_ordered("<", fabs, inf), a, ir.Constant(vt, None))
        elif fn == "relu":
            f = self.gen.intrinsic(f"llvm.maximum.{self._vec_suffix(vt)}", vt, [vt, vt])
            r = b.call(f, [a, ir.Constant(vt, None)])
        elif fn in ("floor", "ceil", "round"):
            name = {"floor": "floor", "ceil": "ceil", "round": "roundeven"}[fn]
            r = b.call(self.gen.intrinsic(f"llvm.{name}.{self._vec_suffix(vt)}", vt, [vt]), [a])
        elif fn == "square":
            r = b.fmul(a, a)
        elif fn == "sign":   # -1 / 1, +0 for +-0 and NaN for NaN (numpy's sign): x + 0 there
            zero = ir.Constant(vt, None)
            mone = ir.Constant(vt, [ir.Constant(vt.element, -1.0)] * vt.count)
            r = b.select(b.fcmp_ordered(">", a, zero), one, b.select(b.fcmp_ordered("<", a, zero), mone, b.fadd(a, zero)))
        elif fn.startswith("round_"):   # to the narrower type (one rounding) and back, exactly
            narrow = {"round_f32": F32, "round_bf16": BF16, "round_f16": F16}[fn]
            r = a if narrow == vt.element else self._extf(self._truncf(a, ir.VectorType(narrow, vt.count)), vt)
        else:
            r = self.gen.math(vt.count, vt.element).call(b, fn, a)
        self.set(op, r)

    def op_tessera_x86_vreduce(self, op):
        a = self.v(op.input)
        vt = a.type
        kind = op.kind.data
        b = self.b
        # a fixed tree (halves, quarters, ...): deterministic, no reassociation flags
        n = vt.count
        cur = a
        while n > 1:
            half = n // 2
            hi = b.shuffle_vector(cur, cur, ir.Constant(ir.VectorType(I32, vt.count),
                                                        [(i + half) % vt.count for i in range(vt.count)]))
            if kind == "add":
                cur = b.fadd(cur, hi)
            elif kind == "mul":
                cur = b.fmul(cur, hi)
            elif kind == "min":
                f = self.gen.intrinsic(f"llvm.minimum.{self._vec_suffix(vt)}", vt, [vt, vt])
                cur = b.call(f, [cur, hi])
            else:
                f = self.gen.intrinsic(f"llvm.maximum.{self._vec_suffix(vt)}", vt, [vt, vt])
                cur = b.call(f, [cur, hi])
            n = half
        s = b.extract_element(cur, ir.Constant(I32, 0))
        self.set(op, self._splat(s, vt))

    def op_tessera_x86_velem(self, op):   # typed lanes: int / bool, comparisons, conversions
        from tessera.codegen.x86_int_elem import emit
        self.set(op, emit(self, op))

    def op_tessera_x86_vlaneselect(self, op):
        vt = llvm_type(op.result.type)
        mask = self._mask(self.v(op.count), vt.count)
        self.set(op, self.b.select(mask, self.v(op.value), self.v(op.other)))

    def op_tessera_x86_vcvt(self, op):
        src, dst = llvm_type(op.input.type), llvm_type(op.result.type)
        a = self.v(op.input)
        if fp8_format(op.input.type):      # fp8 bytes -> f32 (the GEMM pack widens them)
            w = fp8_to_f32(self.b, a, fp8_format(op.input.type))
            self.set(op, w if dst.element == F32 else self.b.fpext(w, dst))
        elif isinstance(src.element, ir.IntType):
            self.set(op, self.b.uitofp(a, dst))  # bool masks (one byte each) -> 0.0 / 1.0
        elif isinstance(dst.element, ir.IntType):  # -> bool bytes: nonzero is true (numpy's astype(bool))
            self.set(op, self.b.zext(self.b.fcmp_unordered("une", a, ir.Constant(src, None)), dst))
        elif _bytes(dst.element) > _bytes(src.element):
            self.set(op, self._extf(a, dst))
        else:
            self.set(op, self._truncf(a, dst))

    def op_arith_extf(self, op):
        if fp8_format(op.input.type):
            w = fp8_to_f32(self.b, self.v(op.input), fp8_format(op.input.type))
            dst = self.lt(op.result.type)
            self.set(op, w if getattr(dst, "element", dst) == F32 else self.b.fpext(w, dst))
            return
        self.set(op, self._extf(self.v(op.input), self.lt(op.result.type)))

    @staticmethod
    def _ints(like, ty: ir.IntType):
        """``ty`` with the shape of ``like`` (a scalar or a vector type)."""
        return ir.VectorType(ty, like.count) if isinstance(like, ir.VectorType) else ty

    @staticmethod
    def _ic(ty, v: int) -> ir.Constant:
        return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)

    def _extf(self, a, dst):
        """bf16 -> f32 as the integer shift it is (bits << 16), other widenings by ``fpext``: a
        bfloat ``fpext`` lets LLVM's legaliser keep bf16 lanes in f32 registers and round them
        back with ``__truncsfbf2`` calls where the chip has no bf16 conversion (AVX2)."""
        b = self.b
        if getattr(a.type, "element", a.type) is not BF16:
            return b.fpext(a, dst)
        f32 = self._ints(dst, F32) if isinstance(dst, ir.VectorType) else F32
        i32 = self._ints(dst, I32)
        wide = b.bitcast(b.shl(b.zext(b.bitcast(a, self._ints(dst, I16)), i32), self._ic(i32, 16)), f32)
        return wide if getattr(dst, "element", dst) == F32 else b.fpext(wide, dst)   # bf16 -> f64: exact

    def op_arith_truncf(self, op):
        self.set(op, self._truncf(self.v(op.input), self.lt(op.result.type)))

    def _truncf(self, a, dst):
        """f32 -> bf16 by integer round to nearest even; other narrowings by ``fptrunc``.  LLVM
        turns a bfloat ``fptrunc`` into a call of ``__truncsfbf2`` on chips without AVX512-BF16
        (a libcall no object here can resolve), and ``vcvtneps2bf16`` where it exists flushes
        subnormal inputs; this form is ml_dtypes' conversion bit for bit on every chip: NaN
        becomes the quiet NaN of its sign (0x7fc0 / 0xffc0)."""
        b = self.b
        if getattr(a.type, "element", a.type) == F64 and getattr(dst, "element", dst) != F32:
            a = self._round_to_odd_f32(a)   # f64 -> bf16 / f16 through f32, rounded once
        if getattr(dst, "element", dst) is not BF16:
            return b.fptrunc(a, dst)
        i32 = self._ints(dst, I32)
        bits = b.bitcast(a, i32)
        hi = b.lshr(bits, self._ic(i32, 16))
        rounded = b.lshr(b.add(b.add(bits, self._ic(i32, 0x7FFF)), b.and_(hi, self._ic(i32, 1))), self._ic(i32, 16))
        qnan = b.or_(b.and_(hi, self._ic(i32, 0x8000)), self._ic(i32, 0x7FC0))
        out = b.select(b.fcmp_unordered("uno", a, a), qnan, rounded)
        return b.bitcast(b.trunc(out, self._ints(dst, I16)), dst)

    def _round_to_odd_f32(self, a):
        """f64 -> f32 rounded to odd (truncated, the lowest bit set where any bit was dropped): a
        second rounding of that to bf16 or f16 (8 or 11 bits, far fewer than f32's 24) is the
        single correct rounding of the f64 value, as numpy's and ml_dtypes' direct conversions
        give.  A direct ``fptrunc`` from double to half would be a libcall (``__truncdfhf2``)
        on chips without AVX512-FP16, and a two-step round to nearest rounds twice."""
        b = self.b
        f32 = self._ints(a.type, F32) if isinstance(a.type, ir.VectorType) else F32
        i32 = self._ints(a.type, I32)
        r = b.fptrunc(a, f32)                                    # round to nearest even
        back = b.fpext(r, a.type)
        inexact = b.fcmp_ordered("!=", back, a)                  # false for NaN: kept as is
        fabs = self.gen.intrinsic(f"llvm.fabs.{self._vec_suffix(a.type)}" if isinstance(a.type, ir.VectorType)
                                  else "llvm.fabs.f64", a.type, [a.type])
        away = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [a]))   # rounded up in magnitude
        bits = b.bitcast(r, i32)
        bits = b.select(b.and_(inexact, away), b.sub(bits, self._ic(i32, 1)), bits)   # toward zero
        bits = b.select(inexact, b.or_(bits, self._ic(i32, 1)), bits)                  # sticky bit
        return b.bitcast(bits, f32)

    def op_tessera_x86_vtranspose(self, op):
        vt = llvm_type(op.inputs[0].type)
        bits = vt.count * _bytes(vt.element) * 8
        ubits = max(32, _bytes(vt.element) * 8)   # 32-bit units (bf16 pairs), or whole f64 elements
        units = bits // ubits
        ut = ir.VectorType(ir.IntType(ubits), units)
        vecs = [self.b.bitcast(self.v(v), ut) for v in op.inputs]
        r = len(vecs)
        width = 1
        while width < r:
            width *= 2
        vecs += [ir.Constant(ut, ir.Undefined)] * (width - r)
        n = units
        while len(vecs) > 1:  # concatenate pairwise
            pairs = []
            for i in range(0, len(vecs), 2):
                pairs.append(self.b.shuffle_vector(vecs[i], vecs[i + 1],
                                                   ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))))
            vecs, n = pairs, 2 * n
        whole = vecs[0]
        perm = [(k % r) * units + (k // r) for k in range(r * units)]
        outs = []
        for j in range(r):
            idx = perm[j * units:(j + 1) * units]
            sel = self.b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined),
                                        ir.Constant(ir.VectorType(I32, units), idx))
            outs.append(self.b.bitcast(sel, vt))
        self.set(op, *outs)

    def op_tessera_x86_vinterleave(self, op):
        a, c = self.v(op.lhs), self.v(op.rhs)
        n = a.type.count
        idx = [j for i in range(n) for j in (i, i + n)]
        self.set(op, self.b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, 2 * n), idx)))


class X86Codegen(ModuleCodegen):
    def add_kernel(self, fn: func.FuncOp) -> None:
        kernel = _Fn(self, fn).f
        self.add_entry(kernel, deterministic=x.DETERMINISTIC in fn.attributes)

    def add_entry(self, kernel: ir.Function, deterministic: bool = False) -> None:
        """``<kernel>.entry(args, tid)``: the kernel called from a worker thread's native loop
        (runtime/workers.py) without Python.  ``args`` holds 64-bit words: the kernel's leading
        parameters (buffers, sizes), then the thread count, the team buffer and one workspace
        per thread; the kernel's own tail is (tid, nthreads, workspace[tid], team).

        The kernel runs with MXCSR = round to nearest, exceptions masked (its exp/tanh round
        by adding 1.5 * 2^23), and the FTZ/DAZ bits of the thread's mode (a worker holds its
        caller's: runtime/workers.py) — or, for a ``deterministic`` kernel, with FTZ and DAZ
        off whatever the caller set; the thread's own MXCSR is restored on return."""
        entry = ir.Function(self.m, ir.FunctionType(ir.VoidType(), [PTR, I64]), kernel.name + x.ENTRY_SUFFIX)
        entry.attributes.add("nounwind")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        args, tid = entry.args
        st = self.intrinsic("llvm.x86.sse.stmxcsr", ir.VoidType(), [PTR])
        ld = self.intrinsic("llvm.x86.sse.ldmxcsr", ir.VoidType(), [PTR])
        saved, mode = b.alloca(I32), b.alloca(I32)
        b.call(st, [saved])
        keep = 0 if deterministic else x.MXCSR_FTZ | x.MXCSR_DAZ
        b.store(b.or_(b.and_(b.load(saved, typ=I32), ir.Constant(I32, keep)), ir.Constant(I32, x.MXCSR_DEFAULT)),
                mode)
        b.call(ld, [mode])
        types = [a.type for a in kernel.args]
        lead = len(types) - 4

        def word(i, ty):
            w = b.load(b.gep(args, [i if isinstance(i, ir.Value) else ir.Constant(I64, i)], source_etype=I64), typ=I64)
            return b.inttoptr(w, ty) if isinstance(ty, ir.PointerType) else w

        vals = [word(i, ty) for i, ty in enumerate(types[:lead])]
        vals += [tid, word(lead, types[lead + 1]), word(b.add(tid, ir.Constant(I64, lead + 2)), types[lead + 2]),
                 word(lead + 1, types[lead + 3])]
        b.call(kernel, vals)
        b.call(ld, [saved])
        b.ret_void()


def translate(module: ModuleOp, triple: str, on_kernel=None) -> tuple[str, list[str]]:
    """LLVM IR text for every kernel function of a Target IR module, and the kernel names.
    ``on_kernel(gen, names)`` is called after each kernel (and its entry) is complete, with the
    names translated so far (``gen.text()`` is then a module of those kernels)."""
    gen = X86Codegen(triple)
    names = []
    for op in module.body.block.ops:
        if isinstance(op, func.FuncOp) and "workspace" in op.attributes:
            for inner in op.walk():
                if inner.dialect_name() not in ALLOWED_DIALECTS:
                    raise UnloweredOpsError(f"{inner.name} survived to x86 translation in @{op.sym_name.data}: "
                                            "the pipeline lacks its lowering")
            gen.add_kernel(op)
            names.append(op.sym_name.data)
            if on_kernel is not None:
                on_kernel(gen, list(names))
    return gen.text(), names
