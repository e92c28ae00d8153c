"""LLVM IR for ``tessera_x86.velem``: typed lanes (int8/int32/int64, bool as i1) and the
elementwise functions whose operand and result types differ.

Semantics (numpy's, with its undefined corners defined):

- int add / sub / mul / neg / abs wrap around (two's complement), as numpy's; abs(INT_MIN) is
  INT_MIN.
- ``cvt`` float -> int truncates toward zero and saturates: NaN -> 0, beyond the range -> the
  int's min / max (``llvm.fptosi.sat``; numpy leaves both undefined, x86 gives INT_MIN); int ->
  narrower int keeps the low bits, -> wider sign-extends; -> bool is ``!= 0`` (NaN is true, as
  ``bool(nan)``); bool -> number is 0 / 1.
- comparisons are IEEE on floats (NaN: false, except ``!=``); signed on ints; False < True.
- floordiv / mod on ints: floor division, the remainder takes the divisor's sign; a zero divisor
  gives 0 for both (numpy gives 0 and warns), INT_MIN // -1 is INT_MIN (numpy's wraparound) and
  INT_MIN % -1 is 0 -- never the trap of x86's idiv.
- shl / shr: a count >= the width (or negative) gives 0 (shr of a negative value: -1), as numpy's
  ``npy_lshift`` / ``npy_rshift``; never LLVM's poison.
- uint8 (``ui8`` lanes; LLVM's i8 is signless, so the signedness is read from the Target IR types):
  widening is ``zext``, to float ``uitofp``, from float ``llvm.fptoui.sat`` (NaN -> 0, below 0 ->
  0, above 255 -> 255), compares / max / min unsigned, abs the identity, floordiv / mod ``udiv`` /
  ``urem`` (a zero divisor gives 0), shr logical; add / sub / mul / neg wrap modulo 256 as numpy's.
"""
from __future__ import annotations

from llvmlite import ir

from tessera.codegen.llvm_common import I1, I32, llvm_type
from tessera.dtypes import is_unsigned
from tessera.errors import CodegenError

_FCMP = {"cmp_eq": "==", "cmp_lt": "<", "cmp_le": "<=", "cmp_gt": ">", "cmp_ge": ">="}
_ICMP = {"cmp_eq": "==", "cmp_ne": "!=", "cmp_lt": "<", "cmp_le": "<=", "cmp_gt": ">", "cmp_ge": ">="}


def _is_int(t: ir.Type) -> bool:
    return isinstance(getattr(t, "element", t), ir.IntType)


def _width(t: ir.Type) -> int:
    return getattr(t, "element", t).width


def _splat(t: ir.VectorType, v) -> ir.Constant:
    return ir.Constant(t, [ir.Constant(t.element, v)] * t.count)


def _suffix(t: ir.VectorType) -> str:
    e = t.element
    name = f"i{e.width}" if isinstance(e, ir.IntType) else e.intrinsic_name
    return f"v{t.count}{name}"


def _unsigned(v) -> bool:
    """Whether an operand / result is uint8 (its Target IR type says; the GPU lanes' shim ops carry
    no types: they refuse uint8 before codegen)."""
    return is_unsigned(getattr(v, "type", None))


def emit(cg, op) -> ir.Value:
    """The value of one ``velem`` op; ``cg`` is the x86 function codegen (its builder, intrinsics)."""
    fn = op.fn.data
    args = [cg.v(v) for v in op.inputs]
    rt = llvm_type(op.result.type)
    b = cg.b
    a = args[0]
    if fn == "cvt":
        su, du = _unsigned(op.inputs[0]), _unsigned(op.result)
        return convert(cg, a, rt, su, du) if su or du else convert(cg, a, rt)
    if fn == "ramp":
        return b.add(a, ir.Constant(a.type, list(range(a.type.count))))
    if fn == "select":
        return b.select(args[0], args[1], args[2])
    if fn in ("isnan", "isinf", "isfinite"):
        if fn == "isnan":
            return b.fcmp_unordered("uno", a, a)
        fabs = b.call(cg.gen.intrinsic(f"llvm.fabs.{_suffix(a.type)}", a.type, [a.type]), [a])
        inf = _splat(a.type, float("inf"))
        return b.fcmp_ordered("==" if fn == "isinf" else "<", fabs, inf)
    if fn.startswith("cmp_"):
        c = args[1]
        if not _is_int(a.type):
            return b.fcmp_unordered("!=", a, c) if fn == "cmp_ne" else b.fcmp_ordered(_FCMP[fn], a, c)
        if _width(a.type) == 1 or _unsigned(op.inputs[0]):   # False < True; uint8
            return b.icmp_unsigned(_ICMP[fn], a, c)
        return b.icmp_signed(_ICMP[fn], a, c)
    if fn == "not":
        return b.xor(a, _splat(a.type, -1 if _width(a.type) > 1 else 1))
    if fn in ("and", "or", "xor"):
        return {"and": b.and_, "or": b.or_, "xor": b.xor}[fn](a, args[1])
    if not _is_int(a.type):
        if fn == "pow":
            from tessera.codegen.x86_pow import emit_pow
            return emit_pow(cg, a, args[1])
        if fn in ("floordiv", "mod"):
            from tessera.codegen.x86_pow import emit_float_divmod
            return emit_float_divmod(cg, a, args[1], fn)
        raise CodegenError(f"tessera_x86.velem {fn} has no float translation")
    if _unsigned(op.inputs[0]):
        return _uint_op(cg, fn, args)
    return _int_op(cg, fn, args)


def _uint_op(cg, fn: str, args) -> ir.Value:
    """The int ops whose meaning differs on unsigned lanes; the others are the signed ones'."""
    b = cg.b
    a = args[0]
    t = a.type
    zero, one = _splat(t, 0), _splat(t, 1)
    if fn == "abs":
        return a
    if fn in ("max", "min"):
        c = args[1]
        return b.select(b.icmp_unsigned(">" if fn == "max" else "<", a, c), a, c)
    if fn == "shr":
        c = args[1]   # a count >= the width gives 0 (a negative count cannot occur on unsigned lanes)
        ok = b.icmp_unsigned("<", c, _splat(t, _width(t)))
        return b.select(ok, b.lshr(a, b.select(ok, c, zero)), zero)
    if fn in ("floordiv", "mod"):
        c = args[1]
        bad = b.icmp_unsigned("==", c, zero)
        safe = b.select(bad, one, c)
        out = b.udiv(a, safe) if fn == "floordiv" else b.urem(a, safe)
        return b.select(bad, zero, out)
    return _int_op(cg, fn, args)


def _int_op(cg, fn: str, args) -> ir.Value:
    b = cg.b
    a = args[0]
    t = a.type
    zero, one, mone = _splat(t, 0), _splat(t, 1), _splat(t, -1)
    if fn == "neg":
        return b.sub(zero, a)
    if fn == "abs":
        return b.select(b.icmp_signed("<", a, zero), b.sub(zero, a), a)
    c = args[1]
    if fn in ("add", "sub", "mul"):
        return {"add": b.add, "sub": b.sub, "mul": b.mul}[fn](a, c)
    if fn in ("max", "min"):
        return b.select(b.icmp_signed(">" if fn == "max" else "<", a, c), a, c)
    w = _width(t)
    if fn == "shl":
        ok = b.icmp_unsigned("<", c, _splat(t, w))   # a negative count is a huge unsigned one
        return b.select(ok, b.shl(a, b.select(ok, c, zero)), zero)
    if fn == "shr":
        ok = b.icmp_unsigned("<", c, _splat(t, w))
        return b.ashr(a, b.select(ok, c, _splat(t, w - 1)))
    if fn in ("floordiv", "mod"):
        bad = b.or_(b.icmp_signed("==", c, zero), b.icmp_signed("==", c, mone))
        safe = b.select(bad, one, c)
        q = b.sdiv(a, safe)
        r = b.srem(a, safe)
        # floor: where the remainder is nonzero and its sign differs from the divisor's
        adj = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, c), zero))
        if fn == "floordiv":
            out = b.select(adj, b.sub(q, one), q)
            return b.select(b.icmp_signed("==", c, zero), zero, b.select(b.icmp_signed("==", c, mone),
                                                                         b.sub(zero, a), out))
        out = b.select(adj, b.add(r, c), r)
        return b.select(bad, zero, out)
    raise CodegenError(f"tessera_x86.velem {fn} has no int translation")


def convert(cg, a: ir.Value, rt: ir.Type, src_unsigned: bool = False, dst_unsigned: bool = False) -> ir.Value:
    """``a`` as type ``rt``; the flags say an int side is unsigned (uint8)."""
    b = cg.b
    st = a.type
    if st == rt:
        return a
    if _is_int(st) and _is_int(rt):
        ws, wd = _width(st), _width(rt)
        if wd == 1:
            return b.icmp_signed("!=", a, _splat(st, 0))
        if ws == 1 or src_unsigned:
            return b.trunc(a, rt) if ws > wd else b.zext(a, rt)
        return b.trunc(a, rt) if ws > wd else b.sext(a, rt)
    if _is_int(st):
        return b.uitofp(a, rt) if _width(st) == 1 or src_unsigned else b.sitofp(a, rt)
    if _is_int(rt):
        if _width(rt) == 1:   # nonzero (NaN included) is true
            return b.fcmp_unordered("!=", a, ir.Constant(st, None))
        sat = "fptoui" if dst_unsigned else "fptosi"
        f = cg.gen.intrinsic(f"llvm.{sat}.sat.{_suffix(rt)}.{_suffix(st)}", rt, [st])
        return b.call(f, [a])
    raise CodegenError(f"velem cvt {st} -> {rt}: float conversions go through tessera_x86.vcvt")


__all__ = ["emit", "convert", "I1", "I32"]
