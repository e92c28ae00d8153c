"""What every Target IR -> LLVM IR translation shares (x86, AMDGPU, NVPTX).

LLVM types of builtin and Tile IR types (``!tile.buffer`` -> a pointer in the memory
space's address space), a bfloat type for llvmlite, and :class:`FnCodegen`, which
turns ``func``/``scf`` structure into basic blocks with phi nodes (loop-carried
values stay in SSA registers) and translates ``arith`` index/float ops.  Each target
subclasses it with its own dialect's ops.
"""
from __future__ import annotations

from llvmlite import ir
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float8E4M3FNType,
    Float8E5M2Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerType,
    VectorType,
)
from xdsl.dialects.llvm import LLVMPointerType
from xdsl.ir import Attribute, Block, Operation, SSAValue

from tessera.codegen.x86_math import VectorMath
from tessera.errors import CodegenError
from tessera.ir.attrs import ival


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


class _X86Amx(ir.Type):  # nor an x86_amx (one AMX tile register) type
    def _to_string(self) -> str:
        return "x86_amx"

    def __eq__(self, other) -> bool:
        return isinstance(other, _X86Amx)

    def __hash__(self) -> int:
        return hash("x86_amx")


X86_AMX = _X86Amx()
F32, F16, F64 = ir.FloatType(), ir.HalfType(), ir.DoubleType()
I64, I32, I16, I8, I1 = ir.IntType(64), ir.IntType(32), ir.IntType(16), ir.IntType(8), ir.IntType(1)
PTR = ir.PointerType()
# GPU address spaces of Tile IR memory spaces (AMDGPU and NVPTX agree on these)
ADDRSPACE = {"global": 1, "lds": 3, "smem": 3}



def llvm_type(t: Attribute) -> ir.Type:
    from tessera.ir.target.x86 import AmxTileType
    from tessera.ir.tile import BufferType
    if isinstance(t, BufferType):
        return ir.PointerType(addrspace=ADDRSPACE.get(t.space.data, 0))
    if isinstance(t, AmxTileType):
        return X86_AMX
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
    if isinstance(t, (Float8E4M3FNType, Float8E5M2Type)):
        return I8     # LLVM has no fp8 type: the byte, decoded by fp8_to_f32
    if isinstance(t, VectorType):
        return ir.VectorType(llvm_type(t.element_type), t.get_shape()[0])
    if isinstance(t, LLVMPointerType):
        return PTR
    raise CodegenError(f"no LLVM type for {t}")


def fp8_format(t: Attribute) -> str | None:
    """'e4m3' / 'e5m2' for an fp8 element (or vector of them), else None."""
    e = t.element_type if isinstance(t, VectorType) else t
    return "e4m3" if isinstance(e, Float8E4M3FNType) else "e5m2" if isinstance(e, Float8E5M2Type) else None


def fp8_to_f32(b: ir.IRBuilder, a: ir.Value, fmt: str) -> ir.Value:
    """OCP fp8 bytes (scalar or vector i8) -> f32, exactly.  The magnitude bits shifted into f32's
    exponent/mantissa field read as 2^(e - 127) (1 + m) (or m 2^-149 when e = 0): times
    2^(127 - bias) that is the fp8 value, subnormals included (x86's default MXCSR keeps f32
    subnormals).  e4m3fn has no infinity, S.1111.111 is NaN; e5m2's all-ones exponent is inf
    (mantissa 0) or NaN, as in IEEE."""
    vec = isinstance(a.type, ir.VectorType)

    def ty(t):
        return ir.VectorType(t, a.type.count) if vec else t

    def c(t, v):
        return ir.Constant(t, [v] * a.type.count) if vec else ir.Constant(t, v)
    i32, f32 = ty(I32), ty(F32)
    x = b.zext(a, i32)
    mag = b.and_(x, c(i32, 0x7F))
    shift, bias = (20, 7) if fmt == "e4m3" else (21, 15)
    val = b.fmul(b.bitcast(b.shl(mag, c(i32, shift)), f32), c(f32, float(2.0 ** (127 - bias))))
    bits = b.bitcast(val, i32)
    if fmt == "e4m3":
        special = b.icmp_unsigned("==", mag, c(i32, 0x7F))
        bits = b.select(special, c(i32, 0x7FC00000), bits)
    else:
        special = b.icmp_unsigned(">=", mag, c(i32, 0x7C))
        bits = b.select(special, b.or_(c(i32, 0x7F800000), b.shl(b.and_(mag, c(i32, 3)), c(i32, 21))), bits)
    sign = b.shl(b.and_(x, c(i32, 0x80)), c(i32, 24))
    return b.bitcast(b.or_(bits, sign), f32)


def _bytes(t: ir.Type) -> int:
    if isinstance(t, ir.IntType):
        return max(1, t.width // 8)
    return {"f32": 4, "bf16": 2, "f16": 2, "f64": 8}.get(getattr(t, "intrinsic_name", ""), 4)


class FnCodegen:
    """One Target IR function -> one LLVM function: structure (scf, func) and index
    arithmetic (arith) here; a target's subclass adds its own ops as ``op_<dialect>_<op>``."""

    target_name = "LLVM"
    index_bits = 64        # width of ``index`` inside the function (parameters are always 64-bit)

    def __init__(self, gen: "ModuleCodegen", fn: func.FuncOp):
        self.gen = gen
        ins = [llvm_type(t) for t in fn.function_type.inputs.data] + self.extra_params(fn)
        self.f = ir.Function(gen.m, ir.FunctionType(ir.VoidType(), ins), fn.sym_name.data)
        self.f.attributes.add("nounwind")
        self.setup(fn)
        self.vals: dict[SSAValue, ir.Value] = {}
        self.b = ir.IRBuilder(self.f.append_basic_block("entry"))
        for a, la in zip(fn.body.block.args, self.f.args):
            self.vals[a] = la if not isinstance(a.type, IndexType) or self.index_bits == 64 else \
                self.b.trunc(la, self.lt(a.type))
        self.block(fn.body.block)

    def lt(self, t: Attribute) -> ir.Type:
        """The LLVM type of a value inside this function (``index`` is ``index_bits`` wide)."""
        return ir.IntType(self.index_bits) if isinstance(t, IndexType) else llvm_type(t)

    def setup(self, fn: func.FuncOp) -> None:
        """Attributes and calling convention of the LLVM function (targets override)."""

    def extra_params(self, fn: func.FuncOp) -> list[ir.Type]:
        """LLVM parameters after the function's own (NVPTX: tensor maps passed by value)."""
        return []

    def v(self, s: SSAValue) -> ir.Value:
        return self.vals[s]

    def numpy_max(self, a: ir.Value, c: ir.Value, is_max: bool = True) -> ir.Value:
        """numpy.maximum / numpy.minimum of floats (scalars or vectors): (a > c or a is NaN) ?
        a : c.  A NaN in either operand comes through (llvm.maxnum returns the other one), and
        equal operands give c (llvm.maximum orders -0 below +0; numpy does not).  On x86 the
        first select is one vmaxps/vminps, which returns its second operand when either is NaN."""
        b = self.b
        r = b.select(b.fcmp_ordered(">" if is_max else "<", a, c), a, c)
        return b.select(b.fcmp_unordered("uno", a, a), a, r)

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
            raise CodegenError(f"{self.target_name} codegen has no translation for {op.name}")
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
        iv = b.phi(lb.type)
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
        ty = self.lt(op.result.type)
        val = op.value.value.data
        if fp8_format(op.result.type):       # an fp8 constant is its byte
            import numpy as np
            from tessera.dtypes import from_ir
            self.set(op, ir.Constant(ty, int(np.array(val, from_ir(op.result.type)).view(np.uint8))))
            return
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

    def op_arith_xori(self, op):
        self._bin(op, self.b.xor)

    def op_arith_shrui(self, op):
        self._bin(op, self.b.lshr)

    def op_arith_shli(self, op):
        self._bin(op, self.b.shl)

    _PRED = {0: ("==", True), 1: ("!=", True), 2: ("<", True), 3: ("<=", True), 4: (">", True), 5: (">=", True),
             6: ("<", False), 7: ("<=", False), 8: (">", False), 9: (">=", False)}

    def op_arith_cmpi(self, op):
        pred, signed = self._PRED[ival(op.predicate)]
        fn = self.b.icmp_signed if signed else self.b.icmp_unsigned
        self.set(op, fn(pred, self.v(op.lhs), self.v(op.rhs)))

    def op_arith_index_cast(self, op):
        a = self.v(op.input)
        ty = self.lt(op.result.type)
        self.set(op, a if a.type == ty else self.b.sext(a, ty) if ty.width > a.type.width else self.b.trunc(a, ty))

    def op_arith_sitofp(self, op):
        self.set(op, self.b.sitofp(self.v(op.input), self.lt(op.result.type)))

    def op_arith_extf(self, op):
        self.set(op, self.b.fpext(self.v(op.input), self.lt(op.result.type)))

    def op_arith_truncf(self, op):
        self.set(op, self.b.fptrunc(self.v(op.input), self.lt(op.result.type)))

    def op_arith_select(self, op):
        self.set(op, self.b.select(self.v(op.cond), self.v(op.lhs), self.v(op.rhs)))


class ModuleCodegen:
    """One LLVM module: intrinsic declarations and the vector math library, declared once."""

    def __init__(self, triple: str, name: str = "tessera", avx512: bool = True):
        self.m = ir.Module(name)
        self.m.triple = triple
        self.avx512 = avx512
        self._math: dict[tuple[int, str], object] = {}

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        if name in self.m.globals:
            return self.m.globals[name]
        return ir.Function(self.m, ir.FunctionType(ret, args), name)

    def math(self, w: int, elem: ir.Type = F32):
        """The vector math library for ``<w x elem>`` (f32, or f64 from :mod:`x86_math64`)."""
        key = (w, str(elem))
        if key not in self._math:
            if elem == F64:
                from tessera.codegen.x86_math64 import VectorMath64
                self._math[key] = VectorMath64(self.m, w, self.avx512)
            else:
                self._math[key] = VectorMath(self.m, w, self.avx512)
                self._math[key].wide_lib = self.math(w, F64)   # one f64 library per module and width
        return self._math[key]

    def text(self) -> str:
        return str(self.m)
