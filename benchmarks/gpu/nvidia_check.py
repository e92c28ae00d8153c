"""On an NVIDIA GPU machine: check Tessera's cubins numerically and time GEMM against cuBLAS.

    python benchmarks/gpu/build_nvidia_bundle.py --arch sm_90     # here (needs xDSL)
    python benchmarks/gpu/nvidia_check.py                          # there (numpy, torch, cuda-python)
    python benchmarks/gpu/nvidia_check.py --dry-run                # anywhere: checks the bundle itself

For every ``check`` case it launches the kernel on the bundle's inputs and compares the
device's output with float64 numpy (relative error < 1e-2) and with the warp emulator's
output computed when the bundle was built (the emulator's lane-layout table against the
hardware: a layout misreading shows up as a large difference).  For every ``bench`` case it
times the kernel (CUDA events, warm-up, median of repeats) against ``torch.matmul`` on the
same random inputs and prints TFLOP/s and the ratio.  Only numpy, torch and cuda-python are
imported: the CUDA launcher is Tessera's own ``tessera/runtime/cuda.py`` loaded by path.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PKG = HERE.parents[1] / "tessera"


def _load_launcher():
    """tessera.runtime.cuda without importing the tessera package (which needs xDSL)."""
    for name, path in (("tessera", PKG), ("tessera.runtime", PKG / "runtime"), ("tessera.ir", PKG / "ir")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        sys.modules.setdefault(name, mod)
    for name, file in (("tessera.errors", PKG / "errors.py"), ("tessera.ir.tensor_map", PKG / "ir" / "tensor_map.py"),
                       ("tessera.runtime.cuda_tensor_map", PKG / "runtime" / "cuda_tensor_map.py"),
                       ("tessera.runtime.cuda", PKG / "runtime" / "cuda.py")):
        spec = importlib.util.spec_from_file_location(name, file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["tessera.runtime.cuda"]


def _bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)    # round to nearest even


def _load_input(bundle: Path, spec: dict) -> tuple[np.ndarray, np.ndarray]:
    """(device array, float64 value)"""
    arr = np.load(bundle / spec["file"])
    if spec["dtype"] == "bf16":
        return arr, _bf16_to_f32(arr).astype(np.float64)
    return arr, arr.astype(np.float64)


def _maps(case: dict) -> list[dict]:
    """The kernel's by-value tensor maps (copy-engine cubins), encoded by the driver at launch."""
    return [p for p in case.get("abi", {}).get("params", []) if p["kind"] == "tensormap"]


def check(bundle: Path, case: dict, cuda, dry: bool) -> dict:
    ins = [_load_input(bundle, s) for s in case["inputs"]]
    emulated = np.load(bundle / case["emulated"])
    a, b, c0 = (x[1] for x in ins)
    want = a @ b + c0
    if dry:
        got = emulated
    else:
        out = [np.zeros(o["shape"], np.dtype(o["dtype"])) for o in case["outputs"]]
        bufs = [np.ascontiguousarray(x[0]) for x in ins] + out
        with cuda.CudaModule((bundle / case["cubin"]).read_bytes()) as mod:
            mod.launch(case["kernel"], tuple(case["grid"]), tuple(case["block"]), case["shared"], bufs,
                       case["sizes"], list(range(len(ins), len(bufs))), tensor_maps=_maps(case))
        got = out[0]
    scale = max(np.abs(want).max(), 1e-30)
    return {"case": case["name"], "rel_err_vs_f64": float(np.abs(got - want).max() / scale),
            "max_diff_vs_emulator": float(np.abs(got.astype(np.float64) - emulated).max() / scale)}


def bench(bundle: Path, case: dict, cuda, repeats: int) -> dict:
    import torch
    m, n, k = case["m"], case["n"], case["k"]
    tdt = torch.float16 if case["dtype"] == "f16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn((m, k), device="cuda", dtype=tdt, generator=gen)
    b = torch.randn((k, n), device="cuda", dtype=tdt, generator=gen)
    # the same inputs on the host for the Tessera launcher (it uploads them itself)
    if case["dtype"] == "f16":
        ha, hb = a.cpu().numpy(), b.cpu().numpy()
    else:
        ha, hb = (x.float().cpu().numpy() for x in (a, b))
        ha, hb = _f32_to_bf16_bits(ha), _f32_to_bf16_bits(hb)
    out = np.zeros((m, n), np.uint16 if case["dtype"] == "bf16" else np.float16)
    with cuda.CudaModule((bundle / case["cubin"]).read_bytes()) as mod:
        mod.launch(case["kernel"], tuple(case["grid"]), tuple(case["block"]), case["shared"], [ha, hb, out],
                   case["sizes"], [2], tensor_maps=_maps(case))
        ms = mod.time(case["kernel"], tuple(case["grid"]), tuple(case["block"]), case["shared"], [ha, hb, out],
                      case["sizes"], repeats=repeats, warmup=5, tensor_maps=_maps(case))
    ref = (a.float() @ b.float()).cpu().numpy()
    got = _bf16_to_f32(out) if case["dtype"] == "bf16" else out.astype(np.float32)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    tms = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b)
        e.record()
        torch.cuda.synchronize()
        tms.append(s.elapsed_time(e))
    t_ours, t_peer = statistics.median(ms), statistics.median(tms)
    tf = case["flops"] / (t_ours * 1e-3) / 1e12
    tp = case["flops"] / (t_peer * 1e-3) / 1e12
    return {"case": case["name"], "tessera_tflops": round(tf, 1), "cublas_tflops": round(tp, 1),
            "ratio": round(tf / tp, 3), "rel_err": err, "registers": case.get("registers")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="numerics and GEMM timing of Tessera cubins on an NVIDIA GPU")
    ap.add_argument("--bundle", default=str(HERE / "bundle"))
    ap.add_argument("--dry-run", action="store_true", help="no GPU: check the bundle with the emulator's outputs")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    cuda = None if args.dry_run else _load_launcher()
    if cuda is not None:
        ok, why = cuda.device_available()
        if not ok:
            print(f"no usable GPU: {why}")
            return 2
        print(f"device: {why} ({cuda.device_arch()}); bundle built for {manifest['arch']}")
    failed = 0
    print(f"{'case':28} {'rel err vs f64':>15} {'vs emulator':>12}")
    for case in manifest["cases"]:
        if case["kind"] == "check":
            r = check(bundle, case, cuda, args.dry_run)
            ok = r["rel_err_vs_f64"] < 1e-2 and r["max_diff_vs_emulator"] < 1e-3
            failed += not ok
            print(f"{r['case']:28} {r['rel_err_vs_f64']:15.2e} {r['max_diff_vs_emulator']:12.2e} "
                  f"{'ok' if ok else 'FAIL'}")
    if not args.dry_run:
        print(f"\n{'GEMM':20} {'Tessera TFLOP/s':>16} {'cuBLAS TFLOP/s':>15} {'ratio':>6} {'rel err':>8} {'regs':>5}")
        for case in manifest["cases"]:
            if case["kind"] == "bench":
                r = bench(bundle, case, cuda, args.repeats)
                failed += not r["rel_err"] < 1e-2
                print(f"{r['case']:20} {r['tessera_tflops']:16} {r['cublas_tflops']:15} {r['ratio']:6} "
                      f"{r['rel_err']:8.1e} {r['registers']:5}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
