"""Target IR (``tessera_x86`` + func/scf/arith) -> LLVM IR text, through llvmlite.ir.

Every kernel function becomes an LLVM function ``void @name(ptr..., i64..., ptr ws)``
with C calling convention.  ``scf.for``/``scf.if`` become basic blocks with phi
nodes (loop-carried register tiles stay in SSA registers); ``tessera_x86`` ops
map to LLVM instructions and intrinsics; math functions come from
:mod:`tessera.codegen.x86_math`.  Any op outside this set is refused (it means a
lowering is missing from the pipeline).
"""
from __future__ import annotations

from llvmlite import ir
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerType,
    ModuleOp,
    VectorType,
)
from xdsl.dialects.llvm import LLVMPointerType
from xdsl.ir import Attribute, Block, Operation, SSAValue

from tessera.codegen.x86_math import VectorMath
from tessera.errors import CodegenError, UnloweredOpsError
from tessera.ir.attrs import ival
from tessera.ir.target import x86 as x


class _BFloat(ir.types._BaseFloatType):  # llvmlite.ir has no bfloat type
    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def format_constant(self, value) -> str:
        import struct
        bits = struct.unpack("<I", struct.pack("<f", float(value)))[0] >> 16
        return f"0xR{bits:04X}"


_BFloat._create_instance()
BF16 = _BFloat()
F32, F16, F64 = ir.FloatType(), ir.HalfType(), ir.DoubleType()
I64, I32, I16, I8, I1 = ir.IntType(64), ir.IntType(32), ir.IntType(16), ir.IntType(8), ir.IntType(1)
PTR = ir.PointerType()

ALLOWED_DIALECTS = ("tessera_x86", "arith", "scf", "func", "builtin")


def llvm_type(t: Attribute) -> ir.Type:
    if isinstance(t, IndexType):
        return I64
    if isinstance(t, IntegerType):
        return ir.IntType(t.width.data)
    if isinstance(t, Float32Type):
        return F32
    if isinstance(t, BFloat16Type):
        return BF16
    if isinstance(t, Float16Type):
        return F16
    if isinstance(t, Float64Type):
        return F64
    if isinstance(t, VectorType):
        return ir.VectorType(llvm_type(t.element_type), t.get_shape()[0])
    if isinstance(t, LLVMPointerType):
        return PTR
    raise CodegenError(f"no LLVM type for {t}")


def _bytes(t: ir.Type) -> int:
    return {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}.get(getattr(t, "intrinsic_name", ""), 4)


def check_translatable(module: ModuleOp) -> None:
    """Refuse a module that still holds ops of a higher layer (a lowering is missing)."""
    bad = sorted({op.name for op in module.walk() if op.dialect_name() not in ALLOWED_DIALECTS})
    if bad:
        raise UnloweredOpsError(
            f"ops survived to x86 translation: {', '.join(bad)} — the pipeline lacks their lowering "
            f"(tile.* ops are consumed by lower-tile-to-x86)")


class _Fn:
    def __init__(self, gen: "X86Codegen", fn: func.FuncOp):
        self.gen = gen
        ins = [llvm_type(t) for t in fn.function_type.inputs.data]
        self.f = ir.Function(gen.m, ir.FunctionType(ir.VoidType(), ins), fn.sym_name.data)
        self.f.attributes.add("nounwind")
        for a in self.f.args:
            if a.type == PTR:
                a.add_attribute("noalias") if False else None
        self.vals: dict[SSAValue, ir.Value] = {}
        for a, la in zip(fn.body.block.args, self.f.args):
            self.vals[a] = la
        self.b = ir.IRBuilder(self.f.append_basic_block("entry"))
        self.block(fn.body.block)

    def v(self, s: SSAValue) -> ir.Value:
        return self.vals[s]

    def block(self, blk: Block) -> list[ir.Value] | None:
        out = None
        for op in blk.ops:
            out = self.op(op)
        return out

    # ------------------------------------------------------------------ dispatch
    def op(self, op: Operation):
        name = op.name.replace(".", "_")
        h = getattr(self, "op_" + name, None)
        if h is None:
            raise CodegenError(f"x86 codegen has no translation for {op.name}")
        return h(op)

    def set(self, op: Operation, *vals: ir.Value) -> None:
        for r, v in zip(op.results, vals):
            self.vals[r] = v

    # ------------------------------------------------------------------ structure
    def op_func_return(self, op):
        self.b.ret_void()

    def op_scf_yield(self, op):
        return [self.v(o) for o in op.operands]

    def op_scf_for(self, op: scf.ForOp):
        b = self.b
        lb, ub, step = self.v(op.lb), self.v(op.ub), self.v(op.step)
        inits = [self.v(a) for a in op.iter_args]
        pre = b.block
        header = self.f.append_basic_block("for.head")
        body = self.f.append_basic_block("for.body")
        exit_ = self.f.append_basic_block("for.exit")
        b.branch(header)
        b.position_at_end(header)
        iv = b.phi(I64)
        iv.add_incoming(lb, pre)
        phis = []
        for a, init in zip(op.body.block.args[1:], inits):
            p = b.phi(init.type)
            p.add_incoming(init, pre)
            phis.append(p)
        cond = b.icmp_signed("<", iv, ub)
        b.cbranch(cond, body, exit_)
        b.position_at_end(body)
        self.vals[op.body.block.args[0]] = iv
        for a, p in zip(op.body.block.args[1:], phis):
            self.vals[a] = p
        yielded = self.block(op.body.block) or []
        nxt = b.add(iv, step)
        latch = b.block
        iv.add_incoming(nxt, latch)
        for p, y in zip(phis, yielded):
            p.add_incoming(y, latch)
        b.branch(header)
        b.position_at_end(exit_)
        self.set(op, *phis)

    def op_scf_if(self, op: scf.IfOp):
        b = self.b
        cond = self.v(op.cond)
        then_bb = self.f.append_basic_block("if.then")
        else_bb = self.f.append_basic_block("if.else")
        merge = self.f.append_basic_block("if.end")
        b.cbranch(cond, then_bb, else_bb)
        b.position_at_end(then_bb)
        tv = self.block(op.true_region.block) or []
        t_end = b.block
        b.branch(merge)
        b.position_at_end(else_bb)
        ev = self.block(op.false_region.block) if op.false_region.blocks else []
        ev = ev or []
        e_end = b.block
        b.branch(merge)
        b.position_at_end(merge)
        res = []
        for r, a, c in zip(op.results, tv, ev):
            p = b.phi(a.type)
            p.add_incoming(a, t_end)
            p.add_incoming(c, e_end)
            res.append(p)
        self.set(op, *res)

    # ------------------------------------------------------------------ arith (index / i1)
    def op_arith_constant(self, op: arith.ConstantOp):
        ty = llvm_type(op.result.type)
        val = op.value.value.data
        self.set(op, ir.Constant(ty, val))

    def _bin(self, op, fn):
        self.set(op, fn(self.v(op.lhs), self.v(op.rhs)))

    def op_arith_addi(self, op):
        self._bin(op, self.b.add)

    def op_arith_subi(self, op):
        self._bin(op, self.b.sub)

    def op_arith_muli(self, op):
        self._bin(op, self.b.mul)

    def op_arith_divui(self, op):
        self._bin(op, self.b.udiv)

    def op_arith_remui(self, op):
        self._bin(op, self.b.urem)

    def op_arith_ceildivui(self, op):
        a, c = self.v(op.lhs), self.v(op.rhs)
        one = ir.Constant(a.type, 1)
        self.set(op, self.b.udiv(self.b.sub(self.b.add(a, c), one), c))

    def op_arith_minsi(self, op):
        a, c = self.v(op.lhs), self.v(op.rhs)
        self.set(op, self.b.select(self.b.icmp_signed("<", a, c), a, c))

    def op_arith_maxsi(self, op):
        a, c = self.v(op.lhs), self.v(op.rhs)
        self.set(op, self.b.select(self.b.icmp_signed(">", a, c), a, c))

    def op_arith_andi(self, op):
        self._bin(op, self.b.and_)

    def op_arith_ori(self, op):
        self._bin(op, self.b.or_)

    _PRED = {0: ("==", True), 1: ("!=", True), 2: ("<", True), 3: ("<=", True), 4: (">", True), 5: (">=", True),
             6: ("<", False), 7: ("<=", False), 8: (">", False), 9: (">=", False)}

    def op_arith_cmpi(self, op):
        pred, signed = self._PRED[ival(op.predicate)]
        fn = self.b.icmp_signed if signed else self.b.icmp_unsigned
        self.set(op, fn(pred, self.v(op.lhs), self.v(op.rhs)))

    def op_arith_index_cast(self, op):
        a = self.v(op.input)
        ty = llvm_type(op.result.type)
        self.set(op, a if a.type == ty else self.b.sext(a, ty) if ty.width > a.type.width else self.b.trunc(a, ty))

    def op_arith_sitofp(self, op):
        self.set(op, self.b.sitofp(self.v(op.input), llvm_type(op.result.type)))

    def op_arith_extf(self, op):
        self.set(op, self.b.fpext(self.v(op.input), llvm_type(op.result.type)))

    def op_arith_truncf(self, op):
        self.set(op, self.b.fptrunc(self.v(op.input), llvm_type(op.result.type)))

    def op_arith_select(self, op):
        self.set(op, self.b.select(self.v(op.cond), self.v(op.lhs), self.v(op.rhs)))

    # ------------------------------------------------------------------ memory
    def _addr(self, base, off, elem_ty):
        return self.b.gep(base, [off], source_etype=elem_ty)

    def _mask(self, count, w: int):
        lanes = ir.Constant(ir.VectorType(I64, w), list(range(w)))
        cnt = self.b.insert_element(ir.Constant(ir.VectorType(I64, w), ir.Undefined), count,
                                    ir.Constant(I32, 0))
        cnt = self.b.shuffle_vector(cnt, ir.Constant(ir.VectorType(I64, w), ir.Undefined),
                                    ir.Constant(ir.VectorType(I32, w), [0] * w))
        return self.b.icmp_signed("<", lanes, cnt)

    def _vec_suffix(self, vt: ir.VectorType) -> str:
        return f"v{vt.count}{vt.element.intrinsic_name}"

    def op_tessera_x86_vload(self, op: x.VLoadOp):
        vt = llvm_type(op.result.type)
        addr = self._addr(self.v(op.base), self.v(op.offset), vt.element)
        if op.count is None:
            self.set(op, self.b.load(addr, typ=vt, align=1))
            return
        fn = self.gen.intrinsic(f"llvm.masked.load.{self._vec_suffix(vt)}.p0", vt,
                                [PTR, I32, ir.VectorType(I1, vt.count), vt])
        mask = self._mask(self.v(op.count), vt.count)
        self.set(op, self.b.call(fn, [addr, ir.Constant(I32, 1), mask, ir.Constant(vt, None)]))

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
        fn = self.gen.intrinsic(f"llvm.masked.store.{self._vec_suffix(vt)}.p0", ir.VoidType(),
                                [vt, PTR, I32, ir.VectorType(I1, vt.count)])
        self.b.call(fn, [val, addr, ir.Constant(I32, 1), self._mask(self.v(op.count), vt.count)])

    def op_tessera_x86_load(self, op):
        ty = llvm_type(op.result.type)
        self.set(op, self.b.load(self._addr(self.v(op.base), self.v(op.offset), ty), typ=ty, align=1))

    def op_tessera_x86_store(self, op):
        val = self.v(op.value)
        self.b.store(val, self._addr(self.v(op.base), self.v(op.offset), val.type), align=1)

    def _splat(self, scalar, vt: ir.VectorType):
        v = self.b.insert_element(ir.Constant(vt, ir.Undefined), scalar, ir.Constant(I32, 0))
        return self.b.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, vt.count),
                                                                                     [0] * vt.count))

    def op_tessera_x86_vbroadcast(self, op: x.VBroadcastOp):
        vt = llvm_type(op.result.type)
        group = ival(op.group)
        if group == 1:
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

    def op_tessera_x86_sfence(self, op):
        self.b.call(self.gen.intrinsic("llvm.x86.sse.sfence", ir.VoidType(), []), [])

    def op_tessera_x86_workspace(self, op):
        self.set(op, self.b.gep(self.v(op.base), [ir.Constant(I64, ival(op.offset))], source_etype=I8))

    # ------------------------------------------------------------------ compute
    def op_tessera_x86_vzero(self, op):
        self.set(op, ir.Constant(llvm_type(op.result.type), None))

    def op_tessera_x86_vconstant(self, op):
        vt = llvm_type(op.result.type)
        self.set(op, ir.Constant(vt, [ir.Constant(vt.element, op.value.value.data)] * vt.count))

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
        else:  # max / min propagate NaN like numpy.maximum / numpy.minimum
            name = "maximum" if fn == "max" else "minimum"
            f = self.gen.intrinsic(f"llvm.{name}.{self._vec_suffix(a.type)}", a.type, [a.type, a.type])
            r = b.call(f, [a, c])
        self.set(op, r)

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
        elif fn == "abs":
            r = b.call(self.gen.intrinsic(f"llvm.fabs.{self._vec_suffix(vt)}", vt, [vt]), [a])
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
        else:
            r = self.gen.math(vt.count).call(b, fn, a)
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
            else:
                f = self.gen.intrinsic(f"llvm.maximum.{self._vec_suffix(vt)}", vt, [vt, vt])
                cur = b.call(f, [cur, hi])
            n = half
        s = b.extract_element(cur, ir.Constant(I32, 0))
        self.set(op, self._splat(s, vt))

    def op_tessera_x86_vlaneselect(self, op):
        vt = llvm_type(op.result.type)
        mask = self._mask(self.v(op.count), vt.count)
        self.set(op, self.b.select(mask, self.v(op.value), self.v(op.other)))

    def op_tessera_x86_vcvt(self, op):
        src, dst = llvm_type(op.input.type), llvm_type(op.result.type)
        a = self.v(op.input)
        if isinstance(src.element, ir.IntType):
            self.set(op, self.b.uitofp(a, dst))  # bool masks (one byte each) -> 0.0 / 1.0
        elif isinstance(dst.element, ir.FloatType) and not isinstance(src.element, ir.FloatType):
            self.set(op, self.b.fpext(a, dst))
        else:
            self.set(op, self.b.fptrunc(a, dst))

    def op_tessera_x86_vtranspose(self, op):
        vt = llvm_type(op.inputs[0].type)
        bits = vt.count * _bytes(vt.element) * 8
        units = bits // 32
        ut = ir.VectorType(I32, units)
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


class X86Codegen:
    def __init__(self, triple: str, name: str = "tessera"):
        self.m = ir.Module(name)
        self.m.triple = triple
        self._math: dict[int, VectorMath] = {}

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        if name in self.m.globals:
            return self.m.globals[name]
        return ir.Function(self.m, ir.FunctionType(ret, args), name)

    def math(self, w: int) -> VectorMath:
        if w not in self._math:
            self._math[w] = VectorMath(self.m, w)
        return self._math[w]

    def add_kernel(self, fn: func.FuncOp) -> None:
        _Fn(self, fn)

    def text(self) -> str:
        return str(self.m)


def translate(module: ModuleOp, triple: str) -> tuple[str, list[str]]:
    """LLVM IR text for every kernel function of a Target IR module, and the kernel names."""
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
    return gen.text(), names
