"""GPU Target IR -> the artifact: LLVM IR, code object / cubin, assembly, ABI records, resources.

ROCm: ``codegen.amdgpu`` (LLVM IR with ``llvm.amdgcn.*``; object code in a subprocess;
``ld.lld`` -> ``.hsaco``), whose metadata note is read back and checked against the
ABI we record (kernel symbol, argument offsets and sizes, LDS bytes, workgroup size).
NVIDIA: ``codegen.nvptx`` (PTX from LLVM's NVPTX backend; ``ptxas -v`` -> cubin and
the registers / shared memory / spills of every kernel).
"""
from __future__ import annotations

import time

from xdsl.dialects.builtin import ModuleOp

from tessera.errors import CodegenError


def build(module: ModuleOp, target: str, arch: str) -> dict:
    if target == "rocm":
        return _rocm(module, arch)
    if target == "nvidia":
        return _nvidia(module, arch)
    raise CodegenError(f"no GPU code generator for target {target!r}")


def _rocm(module: ModuleOp, arch: str) -> dict:
    from tessera.codegen import amdgpu
    t0 = time.perf_counter()
    llvm_ir, abis, records = amdgpu.translate(module, arch)
    t1 = time.perf_counter()
    co = amdgpu.build(llvm_ir, arch)
    t2 = time.perf_counter()
    meta = {k.name: k for k in co.info.kernels}
    resources = {}
    for abi in abis:
        k = meta.get(abi["symbol"])
        if k is None:
            raise CodegenError(f"the code object has no metadata for kernel {abi['symbol']}")
        got = [(a.get("offset"), a.get("size")) for a in k.args if a.get("value_kind") in ("global_buffer", "by_value")]
        want = [(p["offset"], p["size"]) for p in abi["params"]]
        if got != want:
            raise CodegenError(f"kernel {abi['symbol']}: the code object's arguments {got} differ from the recorded "
                               f"ABI {want}")
        if k.group_segment < abi["shared_bytes"]:
            raise CodegenError(f"kernel {abi['symbol']}: {k.group_segment} LDS bytes allocated, "
                               f"{abi['shared_bytes']} needed")
        abi["kernel_descriptor"] = f"{abi['symbol']}.kd"
        abi["wavefront_size"] = k.wavefront_size
        resources[abi["symbol"]] = {"lds_bytes": k.group_segment, "vgprs": k.vgpr_count, "sgprs": k.sgpr_count,
                                    "agprs": k.agpr_count, "wavefront_size": k.wavefront_size,
                                    "private_bytes": k.private_segment}
    return {"llvm_ir": llvm_ir, "binary": co.hsaco, "asm": co.asm, "abis": abis, "resources": resources,
            "records": records, "ms": {"translate": (t1 - t0) * 1e3, "llvm+link": (t2 - t1) * 1e3}}


def _nvidia(module: ModuleOp, arch: str) -> dict:
    from tessera.codegen import nvptx
    t0 = time.perf_counter()
    llvm_ir, abis, records = nvptx.translate(module, arch)
    t1 = time.perf_counter()
    out = nvptx.build(llvm_ir, arch, records, max_threads=max((a["block"][0] for a in abis), default=0))
    t2 = time.perf_counter()
    resources = {}
    for abi in abis:
        r = out.cubin.resources.get(abi["symbol"])
        if r is None:
            raise CodegenError(f"ptxas reported no kernel {abi['symbol']}")
        # shared memory is dynamic (sized by the launch): ptxas counts only static shared memory
        resources[abi["symbol"]] = {"registers": r.registers, "smem_bytes": abi["shared_bytes"],
                                    "static_smem_bytes": r.shared_bytes,
                                    "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
                                    "stack_bytes": r.stack_bytes}
        abi["ptx_version"] = out.ptx_version
    return {"llvm_ir": llvm_ir, "binary": out.cubin.data, "asm": out.ptx, "ptx": out.ptx, "abis": abis,
            "resources": resources, "records": records,
            "ms": {"translate": (t1 - t0) * 1e3, "llvm+ptxas": (t2 - t1) * 1e3}}
