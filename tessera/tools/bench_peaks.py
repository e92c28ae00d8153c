"""Machine peaks for ``tessera bench cpu``: the FMA (and ``vdpbf16ps``) and AMX ``tdpbf16ps``
throughput of this CPU, measured by LLVM-compiled register-only loops on every thread, so the
benchmark document can say what fraction of the peak each row reaches."""
from __future__ import annotations

import time

import numpy as np

# the loops' iteration counts are divided by this (``--quick``: 10)
DIVISOR = 1


def _peak_loop(threads: int, decls: str, entry: str, phis: str, body: str, done: str, iters: int,
               flops_per_iter: int, out_floats: int, inp: np.ndarray) -> float:
    """GFLOP/s of ``void @peak(i64 iters, ptr out, ptr in)``: ``entry``, then a loop of ``body``
    (values carried by ``phis``), then ``done``; one call per thread, the fastest of three timed
    after a warm-up."""
    import ctypes
    from concurrent.futures import ThreadPoolExecutor

    from tessera.codegen import jit as cj
    from tessera.mma.x86 import host_cpu, llvm_feature_string
    cpu, feats = host_cpu()
    ir = f"""
{decls}
define void @peak(i64 %iters, ptr %out, ptr %in) {{
entry:
  {entry}
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  {phis}
  {body}
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %iters
  br i1 %c, label %loop, label %done
done:
  {done}
  ret void
}}
"""
    oc = cj.emit(ir, cpu, llvm_feature_string(feats))
    lo = cj.LoadedObject(oc.obj, ["peak"])
    fn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(lo.addresses["peak"])
    out = np.zeros((threads, out_floats), np.float32)

    def run(t):
        fn(iters, out[t].ctypes.data, inp.ctypes.data)

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(run, range(threads)))
        dts = []
        for _ in range(3):   # the fastest of three: a thread that starts late (a waking vCPU) is not the peak
            t0 = time.perf_counter()
            list(ex.map(run, range(threads)))
            dts.append(time.perf_counter() - t0)
    return iters * flops_per_iter * threads / min(dts) / 1e9


def fma_peak(threads: int, bf16: bool = False) -> float:
    """GFLOP/s of a loop of independent vector FMAs (or vdpbf16ps) per thread, in the host's widest
    vectors: 12 accumulators of 512 bits, or 10 of 256 bits where there is no AVX-512 (two FMA pipes
    of latency 4 need 8 in flight; 12 of 16 ymm registers would leave too few for the operands)."""
    from tessera.mma.x86 import host_cpu
    feats = host_cpu()[1]
    if bf16 and "avx512bf16" not in feats:
        return float("nan")
    w, n = (16, 12) if "avx512f" in feats else (8, 10)
    vt = f"<{w} x float>"
    if bf16:
        decl = "declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)"
        op = "call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %a{i}, <32 x bfloat> %x, <32 x bfloat> %y)"
        xs = "%x = bitcast <16 x float> %xf to <32 x bfloat>\n  %y = bitcast <16 x float> %yf to <32 x bfloat>"
        flops = 4 * w
    else:
        decl = f"declare {vt} @llvm.fma.v{w}f32({vt}, {vt}, {vt})"
        op = f"call {vt} @llvm.fma.v{w}f32({vt} %xf, {vt} %yf, {vt} %a{{i}})"
        xs = ""
        flops = 2 * w
    entry = f"%xf = load {vt}, ptr %in, align 4\n  %yf = load {vt}, ptr %in, align 4\n  {xs}"
    phis = "\n  ".join(f"%a{i} = phi {vt} [zeroinitializer, %entry], [%b{i}, %loop]" for i in range(n))
    body = "\n  ".join(f"%b{i} = " + op.format(i=i) for i in range(n))
    done = "\n  ".join([f"%s0 = fadd {vt} %b0, %b0"] +
                       [f"%s{i} = fadd {vt} %s{i - 1}, %b{i}" for i in range(1, n)] +
                       [f"store {vt} %s{n - 1}, ptr %out, align 4"])
    return _peak_loop(threads, decl, entry, phis, body, done, 20_000_000 // DIVISOR, n * flops, 16,
                      np.full(16, 1e-3, np.float32))


def amx_peak(threads: int) -> float:
    """GFLOP/s of a loop of tdpbf16ps on four independent accumulator tiles per thread
    (NaN where the host has no AMX or Linux refuses the tile state)."""
    from tessera import host
    from tessera.mma.x86 import host_cpu
    if not {"amx-tile", "amx-bf16"} <= host_cpu()[1] or host.amx_refusal():
        return float("nan")
    sh = "i16 16, i16 64"
    decls = "\n".join(["declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)",
                       "declare x86_amx @llvm.x86.tilezero.internal(i16, i16)",
                       "declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)",
                       "declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)"])
    entry = (f"%z = call x86_amx @llvm.x86.tilezero.internal({sh})\n"
             f"  %x = call x86_amx @llvm.x86.tileloadd64.internal({sh}, ptr %in, i64 64)\n"
             f"  %y = call x86_amx @llvm.x86.tileloadd64.internal({sh}, ptr %in, i64 64)")
    phis = "\n  ".join(f"%a{i} = phi x86_amx [%z, %entry], [%b{i}, %loop]" for i in range(4))
    body = "\n  ".join(f"%b{i} = call x86_amx @llvm.x86.tdpbf16ps.internal({sh}, i16 64, x86_amx %a{i}, "
                       f"x86_amx %x, x86_amx %y)" for i in range(4))
    done = "\n  ".join(f"call void @llvm.x86.tilestored64.internal({sh}, ptr %out, i64 64, x86_amx %b{i})"
                       for i in range(4))
    # inputs: bf16 0.0078125 (no overflow over the loop)
    return _peak_loop(threads, decls, entry, phis, body, done, 500_000 // DIVISOR, 4 * 2 * 16 * 16 * 32, 256,
                      np.full(512, 0x3C00, np.uint16))


def bf16_instruction() -> str:
    """The instruction the selector picks for a bf16 GEMM on this host."""
    from tessera.mma.selector import get_isa, select_mma
    return select_mma(get_isa("x86", None), "bf16", out_dtype="f32", lowering="lower-tile-to-x86").record.mnemonic.split()[0]


# --------------------------------------------------------------------------- peers
