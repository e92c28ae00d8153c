"""ROCm Target IR (``tessera_gpu`` + ``tessera_rocm``) -> LLVM IR -> AMDGPU object -> ``.hsaco``.

Kernels use the ``amdgpu_kernel`` calling convention with a fixed workgroup size;
``tessera_rocm.wmma`` / ``mfma`` become the ``llvm.amdgcn.*`` intrinsic of the
selector's record for (family, shape, input type, arch, wave) — operands are
bitcast to the intrinsic's declared types (bf16 goes as i16 on gfx11 and gfx9).
Before LLVM sees anything every matrix op is checked against the selector's table
for the arch: an illegal pair (MFMA on gfx1151, WMMA on gfx942) is a
``MmaSelectorError`` here, never an LLVM abort.  Object code is produced in a
subprocess anyway (``hsaco.compile_object``) and linked with ``ld.lld`` >= 19.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir
from xdsl.dialects.builtin import ModuleOp

from tessera.codegen import hsaco
from tessera.codegen.gpu import GpuFn, translate_kernels
from tessera.codegen.llvm_common import I32
from tessera.errors import CodegenError, MmaSelectorError
from tessera.ir.attrs import ival
from tessera.ir.target import rocm as R
from tessera.mma.records import MmaRecord
from tessera.mma.selector import get_isa

TRIPLE = "amdgcn-amd-amdhsa"


def _parse_llvm_type(text: str) -> ir.Type:
    text = text.strip()
    scalars = {"half": ir.HalfType(), "float": ir.FloatType(), "i16": ir.IntType(16), "i32": ir.IntType(32),
               "i64": ir.IntType(64)}
    if text in scalars:
        return scalars[text]
    if text.startswith("<") and text.endswith(">"):
        n, _, elem = text[1:-1].partition(" x ")
        if elem.strip() == "bfloat":
            from tessera.codegen.llvm_common import BF16
            return ir.VectorType(BF16, int(n))
        return ir.VectorType(_parse_llvm_type(elem), int(n))
    raise CodegenError(f"cannot parse LLVM type {text!r}")


def record_for(op, arch: str) -> MmaRecord:
    """The selector's record a ``tessera_rocm`` op stands for on ``arch`` (or a refusal)."""
    family = "wmma" if isinstance(op, R.WmmaOp) else "mfma"
    shape = tuple(int(x) for x in op.shape.data.split("x"))
    elem = str(op.a.type.element_type)
    wave = None
    isa = get_isa("rocm", arch)
    if op.arch.data != arch:
        raise MmaSelectorError(f"{op.name} was lowered for {op.arch.data} but the code object is for {arch}")
    cands = [r for r in isa.records if r.family == family and r.shape == shape and r.a_dtype == elem]
    n_a, n_c = op.a.type.get_shape()[0], op.c.type.get_shape()[0]
    for r in cands:
        if (_parse_llvm_type(r.llvm_args[0]).count, _parse_llvm_type(r.llvm_args[2]).count) == (n_a, n_c):
            wave = r
    if wave is None:
        legal = sorted({f"{r.family} {'x'.join(map(str, r.shape))} {r.a_dtype}" for r in isa.records})
        raise MmaSelectorError(f"rocm:{arch} has no {family} {op.shape.data} instruction on {elem} with {n_a}-element "
                               f"operands; legal there: {', '.join(legal)}")
    return wave


class AmdgpuFn(GpuFn):
    target_name = "AMDGPU"

    def setup(self, fn) -> None:
        super().setup(fn)
        self.f.calling_convention = "amdgpu_kernel"
        block = ival(fn.attributes["gpu.block"])
        self.string_attributes({"amdgpu-flat-work-group-size": f"{block},{block}",
                                "uniform-work-group-size": "true"})

    def target_thread_id(self):
        return self.b.call(self.gen.intrinsic("llvm.amdgcn.workitem.id.x", I32, []), [])

    def target_block_id(self, axis: int):
        return self.b.call(self.gen.intrinsic(f"llvm.amdgcn.workgroup.id.{'xyz'[axis]}", I32, []), [])

    def target_barrier(self) -> None:
        self.b.fence("release", "workgroup")
        self.b.call(self.gen.intrinsic("llvm.amdgcn.s.barrier", ir.VoidType(), []), [])
        self.b.fence("acquire", "workgroup")

    def target_shuffle_xor(self, value, mask: int, width: int):
        """``ds_bpermute_b32``: each lane reads lane (lane ^ mask)'s value (a byte address, lane * 4)."""
        lane = self.b.urem(self.target_thread_id(), ir.Constant(I32, width))
        addr = self.b.shl(self.b.xor(lane, ir.Constant(I32, mask)), ir.Constant(I32, 2))
        fn = self.gen.intrinsic("llvm.amdgcn.ds.bpermute", I32, [I32, I32])
        got = self.b.call(fn, [addr, self.b.bitcast(value, I32)])
        return self.b.bitcast(got, ir.FloatType())

    def _matrix(self, op):
        rec = record_for(op, self.gen.arch)
        types = [_parse_llvm_type(a) for a in rec.llvm_args]
        ret = _parse_llvm_type(rec.llvm_ret)
        args = []
        for v, ty in zip((op.a, op.b, op.c), types):
            x = self.v(v)
            args.append(x if x.type == ty else self.b.bitcast(x, ty))
        imms = [ir.Constant(ir.IntType(32), i) for i in rec.llvm_imms]
        fn = self.gen.intrinsic(rec.intrinsic, ret, types + [ir.IntType(32)] * len(imms))
        self.set(op, self.b.call(fn, args + imms))
        self.gen.used.add(rec.id)

    op_tessera_rocm_wmma = op_tessera_rocm_mfma = _matrix


def translate(module: ModuleOp, arch: str) -> tuple[str, list[dict], list[str]]:
    """LLVM IR text of every kernel, their ABI records and the MMA records they use."""
    return translate_kernels(module, TRIPLE, arch, AmdgpuFn, "tessera_rocm", "lower-tile-to-rocm")


@dataclass
class CodeObject:
    arch: str
    hsaco: bytes
    asm: str
    info: hsaco.HsacoInfo


def build(llvm_ir: str, arch: str) -> CodeObject:
    """Object code (in a subprocess) linked into a code object; its metadata read back."""
    oc = hsaco.compile_object(llvm_ir, arch, want_asm=True)
    blob = hsaco.link(oc.obj, arch)
    return CodeObject(arch, blob, oc.asm or "", hsaco.inspect(blob))
