"""GPU Target IR (``tessera_gpu`` + func/scf/arith) -> LLVM IR, shared by AMDGPU and NVPTX.

A kernel function becomes ``void @name(ptr addrspace(1) ..., i64 ...)`` — one
pointer per buffer, one 64-bit integer per size — with the target's kernel calling
convention.  The target subclass supplies the thread/workgroup index intrinsics,
the barrier and its matrix instructions; everything else is here.  The kernel ABI
(argument offsets, workgroup size, shared memory, grid) is returned as plain data
with the LLVM IR, so the artifact records it (``docs/abi.md``).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from xdsl.dialects import func
from xdsl.dialects.builtin import Float32Type, IndexType, IntegerType, ModuleOp

from tessera.codegen import gpu_typed as T
from tessera.codegen.llvm_common import F32, I8, I32, I64, FnCodegen, ModuleCodegen, fp8_format, llvm_type
from tessera.errors import CodegenError, UnloweredOpsError
from tessera.ir import tile as t
from tessera.ir.attrs import ival, strs
from tessera.ir.target import gpu as G

GPU_DIALECTS = ("tessera_gpu", "arith", "scf", "func", "builtin")
# the CPU lane's vector math library, reused (plain LLVM IR, always inlined; log, sin and cos widen to f64
# lanes and round once: slow on GPUs with few f64 units, exact to an ulp everywhere)
_MATH_LIB = ("exp", "exp_bounded", "tanh", "erf", "silu", "gelu_tanh", "gelu_erf", "sigmoid", "log", "sin", "cos")


class GpuFn(FnCodegen):
    """Translation of one GPU kernel; targets override the ``target_*`` hooks."""

    target_name = "GPU"
    index_bits = 32      # addresses are computed in 32 bits; the runtime refuses buffers of 2^31 elements

    def setup(self, fn: func.FuncOp) -> None:
        self.kernel = fn
        for a in self.f.args:
            if isinstance(a.type, ir.PointerType):
                a.add_attribute("noalias")   # outputs are fresh buffers; inputs are only read
        self.shared_bytes = ival(fn.attributes["gpu.shared"]) if "gpu.shared" in fn.attributes else 0
        self._lds = None

    def string_attributes(self, attrs: dict[str, str]) -> None:
        """LLVM string attributes ("key"="value"), which llvmlite's attribute set does not list."""
        fa = self.f.attributes
        spelled = {f'"{k}"="{v}"' for k, v in attrs.items()}
        fa._known = frozenset(fa._known) | spelled
        for a in sorted(spelled):
            fa.add(a)

    # ------------------------------------------------------------------ target hooks
    def target_thread_id(self) -> ir.Value:
        raise NotImplementedError

    def target_block_id(self, axis: int) -> ir.Value:
        raise NotImplementedError

    def target_barrier(self) -> None:
        raise NotImplementedError

    def target_shuffle_xor(self, value: ir.Value, mask: int, width: int) -> ir.Value:
        raise NotImplementedError

    def op_tessera_gpu_shuffle_xor(self, op: G.ShuffleXorOp):
        self.set(op, self.target_shuffle_xor(self.v(op.value), ival(op.mask), ival(op.width)))

    # ------------------------------------------------------------------ work distribution
    def op_tessera_gpu_thread_id(self, op):
        self.set(op, self.b.zext(self.target_thread_id(), ir.IntType(self.index_bits)) if self.index_bits > 32
                 else self.target_thread_id())

    def op_tessera_gpu_block_id(self, op):
        bid = self.target_block_id(ival(op.axis))
        self.set(op, self.b.zext(bid, ir.IntType(self.index_bits)) if self.index_bits > 32 else bid)

    def op_tessera_gpu_barrier(self, op):
        self.target_barrier()

    def shared_base(self) -> ir.Value:
        if self._lds is None:
            size = max(self.shared_bytes, 16)
            g = ir.GlobalVariable(self.gen.m, ir.ArrayType(ir.IntType(8), size), f"{self.f.name}.shared",
                                  addrspace=3)
            g.linkage = "internal"
            g.align = 16
            g.initializer = ir.Constant(g.value_type, ir.Undefined)
            g.type = ir.PointerType(addrspace=3)   # an opaque pointer, as LLVM's IR spells it
            self._lds = g
        return self._lds

    def op_tessera_gpu_shared(self, op: G.SharedOp):
        base = self.shared_base()
        self.set(op, self.b.gep(base, [ir.Constant(I64, ival(op.offset))], source_etype=ir.IntType(8),
                                inbounds=True))

    # ------------------------------------------------------------------ memory
    def _ptr(self, base, index, elem_ty):
        return self.b.gep(self.v(base), [self.v(index)], source_etype=elem_ty, inbounds=True)

    def op_tessera_gpu_load(self, op: G.LoadOp):
        ty = self.lt(op.result.type)
        if T.is_bool(ty):           # bools: one byte each in memory
            raw = self.b.load(self._ptr(op.base, op.index, I8), typ=T.byte_type(ty), align=ival(op.align))
            self.set(op, T.load_bool(self.b, raw))
            return
        elem = ty.element if isinstance(ty, ir.VectorType) else ty
        self.set(op, self.b.load(self._ptr(op.base, op.index, elem), typ=ty, align=ival(op.align)))

    def op_tessera_gpu_store(self, op: G.StoreOp):
        val = self.v(op.value)
        if T.is_bool(val.type):
            val = T.store_bool(self.b, val)
        elem = val.type.element if isinstance(val.type, ir.VectorType) else val.type
        self.b.store(val, self._ptr(op.base, op.index, elem), align=ival(op.align))

    # ------------------------------------------------------------------ values
    def op_tessera_gpu_pack(self, op: G.PackOp):
        vt = llvm_type(op.result.type)
        v = ir.Constant(vt, ir.Undefined)
        for i, e in enumerate(op.elements):
            v = self.b.insert_element(v, self.v(e), ir.Constant(I32, i))
        self.set(op, v)

    def op_tessera_gpu_extract(self, op: G.ExtractOp):
        self.set(op, self.b.extract_element(self.v(op.vector), ir.Constant(I32, ival(op.position))))

    def op_tessera_gpu_convert(self, op: G.ConvertOp):
        a = self.v(op.input)
        to = llvm_type(op.result.type)
        if isinstance(G.element_of(op.input.type), IntegerType):     # a bool mask read as 0.0 / 1.0
            self.set(op, self.b.uitofp(a, to))
            return
        if isinstance(op.input.type, IndexType):                     # a row length (sizes are >= 0)
            self.set(op, self.b.uitofp(a, to))
            return
        wide = isinstance(G.element_of(op.result.type), Float32Type)
        self.set(op, self.b.fpext(a, to) if wide else self.b.fptrunc(a, to))

    def op_arith_constant(self, op):
        ty = self.lt(op.result.type)
        val = op.value.value.data
        if fp8_format(op.result.type):       # an fp8 constant is its byte
            from tessera.dtypes import from_ir
            self.set(op, ir.Constant(ty, int(np.array(val, from_ir(op.result.type)).view(np.uint8))))
            return
        self.set(op, ir.Constant(ty, float(val) if not isinstance(op.result.type, IndexType) and
                                 not hasattr(ty, "width") else val))

    # ------------------------------------------------------------------ math
    def _intr(self, name: str, ty: ir.Type, n: int = 1) -> ir.Function:
        suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
        return self.gen.intrinsic(f"llvm.{name}.{suffix}", ty, [ty] * n)

    def op_tessera_gpu_math(self, op: G.MathOp):
        if op.is_typed():          # int / bool lanes, conversions, comparisons (codegen/gpu_typed.py)
            self.set(op, T.emit(self, op))
            return
        fn = op.fn.data
        args = [self.v(a) for a in op.inputs]
        ty = args[0].type
        b = self.b
        zero, one = _splat(ty, 0.0), _splat(ty, 1.0)
        if fn in ("add", "sub", "mul", "div"):
            r = getattr(b, {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}[fn])(*args)
        elif fn in ("max", "min"):
            r = self.numpy_max(args[0], args[1], fn == "max")
        elif fn == "select_max":            # a > b ? a : b
            r = b.select(b.fcmp_ordered(">", args[0], args[1]), args[0], args[1])
        elif fn == "neg":
            r = b.fneg(args[0])
        elif fn == "relu":
            r = self.numpy_max(args[0], zero)
        elif fn == "abs":
            r = b.call(self._intr("fabs", ty), args)
        elif fn == "sqrt":
            r = b.call(self._intr("sqrt", ty), args)
        elif fn == "rsqrt":
            r = b.fdiv(one, b.call(self._intr("sqrt", ty), args))
        elif fn == "recip":
            r = b.fdiv(one, args[0])
        elif fn == "copy":
            r = args[0]
        elif fn in ("floor", "ceil", "round"):
            r = b.call(self._intr({"floor": "floor", "ceil": "ceil", "round": "roundeven"}[fn], ty), args)
        elif fn == "square":
            r = b.fmul(args[0], args[0])
        elif fn == "sign":                  # -1 / 1, +0 for +-0 and NaN for NaN (x + 0 there)
            a = args[0]
            r = b.select(b.fcmp_ordered(">", a, zero), one, b.select(b.fcmp_ordered("<", a, zero), _splat(ty, -1.0), b.fadd(a, zero)))
        elif fn == "finite_or_zero":        # -inf (a fully masked row's maximum) -> 0
            fabs = b.call(self._intr("fabs", ty), args)
            r = b.select(b.fcmp_ordered("<", fabs, _splat(ty, float("inf"))), args[0], zero)
        elif fn == "safe_div":              # a / b, or 0 where b == 0
            r = b.select(b.fcmp_ordered("==", args[1], zero), zero, b.fdiv(*args))
        elif fn == "mask_select":           # a where b != 0, else -inf
            r = b.select(b.fcmp_unordered("!=", args[1], zero), args[0], _splat(ty, float("-inf")))
        elif fn in _MATH_LIB:
            vec_ty = ty if isinstance(ty, ir.VectorType) else ir.VectorType(F32, 1)
            x = args[0] if ty is vec_ty else b.insert_element(ir.Constant(vec_ty, ir.Undefined), args[0],
                                                              ir.Constant(I32, 0))
            r = self.gen.math(vec_ty.count).call(b, fn, x)
            if ty is not vec_ty:
                r = b.extract_element(r, ir.Constant(I32, 0))
        else:
            raise CodegenError(f"{self.target_name} codegen has no math function {fn!r}")
        self.set(op, r)


def _splat(ty: ir.Type, value: float) -> ir.Constant:
    return ir.Constant(ty, [value] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, value)


def check_translatable(module: ModuleOp, target_dialect: str, lowering: str) -> None:
    """Refuse a module in which ops of a higher layer survived (a lowering is missing)."""
    allowed = GPU_DIALECTS + (target_dialect,)
    bad = sorted({op.name for op in module.walk() if op.dialect_name() not in allowed})
    if bad:
        raise UnloweredOpsError(f"ops survived to {target_dialect} translation: {', '.join(bad)} — the pipeline "
                                f"lacks their lowering (tile.* ops are consumed by {lowering})")


def kernel_abi(module: ModuleOp, fn: func.FuncOp) -> dict:
    """The launch contract of one kernel: parameters with byte offsets, block, shared, grid."""
    launch = next((op for op in module.walk() if isinstance(op, G.LaunchOp)
                   and op.callee.root_reference.data == fn.sym_name.data), None)
    from xdsl.ir import BlockArgument
    params, off = [], 0
    dims = strs(launch.dims) if launch is not None else []
    nbuf = sum(1 for ty in fn.function_type.inputs.data if isinstance(ty, t.BufferType))
    nin = len(launch.args) if launch is not None else nbuf
    for i, ty in enumerate(fn.function_type.inputs.data):
        if isinstance(ty, t.BufferType):
            if i < nin:
                src = launch.args[i] if launch is not None else None
                role = (f"input: argument {src.index}" if isinstance(src, BlockArgument)
                        else "input: an earlier kernel's result")
            else:
                role = f"output {i - nin}"
            params.append({"index": i, "kind": "buffer", "dtype": str(ty.element_type), "role": role,
                           "space": ty.space.data, "offset": off, "size": 8})
        else:
            params.append({"index": i, "kind": "size", "expr": dims[i - nbuf] if i - nbuf < len(dims) else "?",
                           "dtype": "i64", "offset": off, "size": 8})
        off += 8
    if "tma.maps" in fn.attributes:     # tensor maps by value after the sizes (nvptx_tma.py)
        from tessera.ir import tensor_map as TM
        for j, a in enumerate(fn.attributes["tma.maps"].data):
            rec = TM.parse(a.data)
            off = -(-off // TM.MAP_ALIGN) * TM.MAP_ALIGN
            params.append({"index": len(params), "kind": "tensormap", "map": j, "buffer": rec["arg"], "record": rec,
                           "dtype": rec["elem"], "offset": off, "size": TM.MAP_BYTES, "align": TM.MAP_ALIGN})
            off += TM.MAP_BYTES
    return {"symbol": fn.sym_name.data, "params": params, "kernarg_bytes": off,
            "block": [ival(fn.attributes["gpu.block"]), 1, 1],
            "shared_bytes": ival(fn.attributes["gpu.shared"]) if "gpu.shared" in fn.attributes else 0,
            "grid": strs(launch.grid) if launch is not None else [],
            "waves": [ival(a) for a in fn.attributes["gpu.waves"].data] if "gpu.waves" in fn.attributes else []}


class GpuModuleCodegen(ModuleCodegen):
    """One GPU module for one arch; ``used`` collects the MMA records its kernels issue."""

    def __init__(self, triple: str, arch: str):
        super().__init__(triple, avx512=False)
        self.arch = arch
        self.used: set[str] = set()


def translate_kernels(module: ModuleOp, triple: str, arch: str, fn_cls, dialect: str,
                      lowering: str) -> tuple[str, list[dict], list[str]]:
    """LLVM IR text of every kernel of ``module``, their ABI records and the MMA records used."""
    check_translatable(module, dialect, lowering)
    gen = GpuModuleCodegen(triple, arch)
    abis = []
    for fn in kernels_of(module):
        fn_cls(gen, fn)
        abis.append(kernel_abi(module, fn))
    if not abis:
        raise CodegenError("the module holds no GPU kernel")
    return gen.text(), abis, sorted(gen.used)


def kernels_of(module: ModuleOp) -> list[func.FuncOp]:
    return [op for op in module.body.block.ops if isinstance(op, func.FuncOp) and "gpu.kernel" in op.attributes]


__all__ = ["GpuFn", "ModuleCodegen", "check_translatable", "kernel_abi", "kernels_of"]
