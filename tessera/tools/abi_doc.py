"""``docs/abi.md``: the GPU kernel ABI, generated from real compiles (``tessera docs abi --write``).

The contract is stated once here and illustrated by the records of two compiled kernels, so
the document cannot drift from what the compiler emits (a test regenerates it).
"""
from __future__ import annotations

import numpy as np

CONTRACT = """\
Every GPU kernel Tessera emits (ROCm code object or NVIDIA cubin) has this contract; the
artifact records it (`tessera.compile(...).abi()`, one dict per kernel) and, on ROCm, the
compiler checks it against the code object's own AMDGPU metadata note before returning.

- **Symbol**: the kernel function's name (`k<n>_<kind>`); on ROCm the kernel descriptor is
  `<symbol>.kd`.
- **Parameters**, in order, each 8 bytes and 8-byte aligned (kernarg offsets 0, 8, 16, ...):
  1. one pointer per buffer — the kernel's inputs in the order of the traced function's
     array arguments as the fusion group uses them, then its output(s) — global memory,
     C-contiguous, at least 16-byte aligned (`hipMalloc` / `cuMemAlloc` give 256);
  2. one signed 64-bit integer per size expression (`expr`: symbols bound from the argument
     shapes, e.g. `d0_0` = argument 0 axis 0; products such as `d0_0*d0_1` for strides).
  Inside the kernel sizes are truncated to 32 bits: every buffer must have fewer than 2^31
  elements (the runtime refuses larger ones with `SHAPE_MISMATCH`).
- **Block**: `block` threads along x (waves of 32 on RDNA and NVIDIA, 64 on CDNA); the
  workgroup size is fixed (`amdgpu-flat-work-group-size` = block on ROCm).
- **Grid**: `grid` entries `D/b` mean ceil(D / b) workgroups (at least 1); x runs over
  column blocks of the output, y over row blocks, z over the batch.
- **Shared memory**: static (`shared_bytes`, the LDS / `.shared` the kernel declares); launch
  with 0 bytes of dynamic shared memory.
- **Outputs** are written completely (every element of the output buffers), so they need no
  initialisation; inputs are only read.
"""

LAUNCH = {
    "rocm": """```c++
// HIP, with the .hsaco from tessera.compile(...).binary() and the record above
hipModule_t mod; hipFunction_t fn;
hipModuleLoadData(&mod, hsaco_bytes);
hipModuleGetFunction(&fn, mod, "{symbol}");
struct {{ {fields} }} args = {{ {values} }};
size_t size = sizeof(args);
void* config[] = {{HIP_LAUNCH_PARAM_BUFFER_POINTER, &args, HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END}};
hipModuleLaunchKernel(fn, {gx}, {gy}, {gz}, {bx}, 1, 1, 0, nullptr, nullptr, config);
```""",
    "nvidia": """```c++
// CUDA driver API, with the cubin from tessera.compile(...).binary() and the record above
CUmodule mod; CUfunction fn;
cuModuleLoadData(&mod, cubin_bytes);
cuModuleGetFunction(&fn, mod, "{symbol}");
{decls}
void* params[] = {{ {ptrs} }};
cuLaunchKernel(fn, {gx}, {gy}, {gz}, {bx}, 1, 1, 0, nullptr, params, nullptr);
```""",
}


def _example(target: str, arch: str) -> tuple[dict, dict]:
    import tessera as ts
    a = np.zeros((200, 96), np.float16)
    b = np.zeros((96, 130), np.float16)
    c0 = np.zeros((200, 130), np.float32)
    art = ts.compile(lambda x, w, c: ts.ops.matmul(x, w, out_dtype=np.float32) + c, a, b, c0, target=target,
                     arch=arch)
    return art.abi()[0], art.report().kernels[0]


def _table(abi: dict) -> list[str]:
    rows = ["| # | kind | type | offset | size | role / size expression |", "|---:|---|---|---:|---:|---|"]
    for p in abi["params"]:
        ty = f"{p['dtype']}* ({p['space']})" if p["kind"] == "buffer" else "int64"
        rows.append(f"| {p['index']} | {p['kind']} | {ty} | {p['offset']} | {p['size']} | "
                    f"{p.get('role') or p.get('expr', '')} |")
    return rows


def _launch(target: str, abi: dict) -> str:
    grid = [g.replace("/", " / ") for g in abi["grid"]]
    names = [f"p{p['index']}" for p in abi["params"]]
    if target == "rocm":
        fields = " ".join(f"{'void*' if p['kind'] == 'buffer' else 'int64_t'} {n};" for p, n in zip(abi["params"], names))
        return LAUNCH["rocm"].format(symbol=abi["symbol"], fields=fields, values=", ".join(names),
                                     gx=f"ceil({grid[0]})", gy=f"ceil({grid[1]})", gz=f"ceil({grid[2]})",
                                     bx=abi["block"][0])
    decls = "\n".join(f"{'CUdeviceptr' if p['kind'] == 'buffer' else 'int64_t'} {n} = ...;"
                      for p, n in zip(abi["params"], names))
    return LAUNCH["nvidia"].format(symbol=abi["symbol"], decls=decls, ptrs=", ".join(f"&{n}" for n in names),
                                   gx=f"ceil({grid[0]})", gy=f"ceil({grid[1]})", gz=f"ceil({grid[2]})",
                                   bx=abi["block"][0])


def abi_md() -> str:
    from tessera.tools.docs import HEADER
    out = [HEADER.format(cmd="tessera docs abi --write").rstrip("\n"), "", "# GPU kernel ABI", "", CONTRACT]
    out.append("## Examples\n\nBoth compiled from `lambda x, w, c: ts.ops.matmul(x, w, out_dtype=np.float32) + c` "
               "with x f16 [200, 96], w f16 [96, 130], c f32 [200, 130] (the sizes stay symbolic).\n")
    for target, arch in (("rocm", "gfx1151"), ("nvidia", "sm_90")):
        abi, k = _example(target, arch)
        out.append(f"### `{target}` / `{arch}`: `{abi['symbol']}`\n")
        out += _table(abi)
        extra = (f"kernel descriptor `{abi.get('kernel_descriptor')}`, wavefront {abi.get('wavefront_size')}, "
                 f"{k.get('vgprs')} VGPRs, {k.get('lds_bytes')} LDS bytes" if target == "rocm" else
                 f"PTX {abi.get('ptx_version')}, {k.get('registers')} registers, {k.get('smem_bytes')} bytes of "
                 f"shared memory, {k.get('spill_stores')} spill bytes")
        out += ["", f"- block: {abi['block']}; grid: {abi['grid']}; kernarg bytes: {abi['kernarg_bytes']}; "
                    f"shared bytes: {abi['shared_bytes']}; waves per workgroup: {abi['waves']}",
                f"- {extra}", "", _launch(target, abi), ""]
    return "\n".join(out)
