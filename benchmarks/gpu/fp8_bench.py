"""On an H100/H200: check Tessera's fp8 GEMM cubins against float64 and time them against cuBLAS.

    ./dev python benchmarks/gpu/build_fp8_bundle.py                 # here (needs xDSL)
    python benchmarks/gpu/fp8_bench.py                              # there (numpy, torch, cuda-python)
    python benchmarks/gpu/fp8_bench.py --dry-run                    # anywhere: checks the bundle itself

``check`` cases: the device's output of ``scaled_matmul(a, w.T, sa, sb[, bias])`` against float64 of
the dequantised inputs (decoded here from the fp8 bytes by this file's own table, not by the
library that made them) and against the warp emulator's output from the build.  ``bench`` cases:
e4m3 x e4m3 -> bf16 with per-tensor scales, timed (CUDA events, warm-up, median of repeats) against
``torch._scaled_mm`` (cuBLASLt fp8, B column-major: the same K-major W) on the same random device
inputs; both results are compared.  Buffers are bound in the kernel's ABI order (its ``role``s),
which need not be the program's argument order.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def fp8_table(fmt: str) -> np.ndarray:
    """float64 value of every byte: OCP e4m3 (bias 7, no inf, S.1111.111 NaN) or e5m2 (bias 15, IEEE
    specials)."""
    ebits, bias = (4, 7) if fmt == "e4m3" else (5, 15)
    mbits = 7 - ebits
    out = np.empty(256)
    for b in range(256):
        s, e, m = b >> 7, (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
        if fmt == "e4m3" and e == 15 and m == 7 or fmt == "e5m2" and e == 31 and m:
            v = np.nan
        elif fmt == "e5m2" and e == 31:
            v = np.inf
        elif e == 0:
            v = m * 2.0 ** (1 - bias - mbits)
        else:
            v = (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
        out[b] = -v if s else v
    return out


def _bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def _load(bundle: Path, spec: dict) -> tuple[np.ndarray, np.ndarray]:
    """(device array, float64 value)"""
    arr = np.load(bundle / spec["file"])
    if spec["dtype"] in ("e4m3", "e5m2"):
        return arr, fp8_table(spec["dtype"])[arr]
    return arr, arr.astype(np.float64)


def bind(case: dict, inputs: list, out: np.ndarray) -> tuple[list, list[int]]:
    """Buffers in the kernel's parameter order, and which of them are outputs."""
    bufs, outs = [], []
    for p in case["abi"]["params"]:
        if p["kind"] != "buffer":
            continue
        role = p["role"]
        if role.startswith("input: argument "):
            bufs.append(np.ascontiguousarray(inputs[int(role.rsplit(" ", 1)[1])]))
        elif role == "output 0":
            outs.append(len(bufs))
            bufs.append(out)
        else:
            raise SystemExit(f"{case['name']}: unexpected kernel parameter {role!r}")
    return bufs, outs


def check(bundle: Path, case: dict, cuda, dry: bool) -> dict:
    ins = [_load(bundle, s) for s in case["inputs"]]
    emulated = np.load(bundle / case["emulated"]).astype(np.float64)
    a, w, sa, sb = (x[1] for x in ins[:4])
    want = float(sa) * float(sb) * (a @ w.T)
    if len(ins) > 4:
        want = want + ins[4][1]
    if dry:
        got = emulated
    else:
        bf16 = case["out_dtype"] == "bf16"
        out = np.zeros(case["outputs"][0]["shape"], np.uint16 if bf16 else np.float32)
        bufs, outs = bind(case, [x[0] for x in ins], out)
        with cuda.CudaModule((bundle / case["cubin"]).read_bytes()) as mod:
            mod.launch(case["kernel"], tuple(case["grid"]), tuple(case["block"]), case["shared"], bufs,
                       case["sizes"], outs)
        got = (_bf16_to_f32(out) if bf16 else out).astype(np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    tol = 8e-3 if case["out_dtype"] == "bf16" else 1e-5
    r = {"case": case["name"], "rel_err_vs_f64": float(np.abs(got - want).max() / scale),
         "max_diff_vs_emulator": float(np.abs(got - emulated).max() / scale)}
    r["ok"] = r["rel_err_vs_f64"] < tol and r["max_diff_vs_emulator"] < max(tol, 1e-5)
    return r


def bench(bundle: Path, case: dict, cuda, repeats: int) -> dict:
    import torch
    from cuda_events import median_ms
    m, n, k = case["m"], case["n"], case["k"]
    gen = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn((m, k), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn((n, k), device="cuda", generator=gen).to(torch.float8_e4m3fn)
    sa = torch.tensor(0.75, device="cuda")
    sb = torch.tensor(1.25, device="cuda")
    peer = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    out = np.zeros((m, n), np.uint16)
    wb = w.view(torch.uint8).cpu().numpy()
    if case.get("b_layout") == "kn":           # the kernel takes B row-major [K, N]
        wb = np.ascontiguousarray(wb.T)
    host = [a.view(torch.uint8).cpu().numpy(), wb,
            np.array(0.75, np.float32), np.array(1.25, np.float32)]
    bufs, outs = bind(case, host, out)
    with cuda.CudaModule((bundle / case["cubin"]).read_bytes()) as mod:
        mod.launch(case["kernel"], tuple(case["grid"]), tuple(case["block"]), case["shared"], bufs, case["sizes"], outs)
        ms = mod.time(case["kernel"], tuple(case["grid"]), tuple(case["block"]), case["shared"], bufs, case["sizes"],
                      repeats=repeats, warmup=5)
    ref = peer.float().cpu().numpy()
    err = float(np.abs(_bf16_to_f32(out) - ref).max() / np.abs(ref).max())
    t_peer = median_ms(lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), repeats,
                       warmup=5)
    t_ours = statistics.median(ms)
    tf, tp = case["flops"] / (t_ours * 1e-3) / 1e12, case["flops"] / (t_peer * 1e-3) / 1e12
    return {"case": case["name"], "tessera_tflops": round(tf, 1), "cublas_fp8_tflops": round(tp, 1),
            "ratio": round(tf / tp, 3), "rel_err_vs_cublas": err, "registers": case.get("registers")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="fp8 GEMM numerics and timing of Tessera cubins on an NVIDIA GPU")
    ap.add_argument("--bundle", default=str(HERE / "fp8_bundle"))
    ap.add_argument("--dry-run", action="store_true", help="no GPU: check the bundle with the emulator's outputs")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the results here as fp8.json")
    args = ap.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    cuda = None
    if not args.dry_run:
        from nvidia_check import _load_launcher
        cuda = _load_launcher()
        ok, why = cuda.device_available()
        if not ok:
            print(f"no usable GPU: {why}")
            return 2
        print(f"device: {why} ({cuda.device_arch()}); bundle built for {manifest['arch']}")
    failed, results = 0, []
    print(f"{'case':44} {'rel err vs f64':>15} {'vs emulator':>12}")
    for case in manifest["cases"]:
        if case["kind"] == "check":
            if cuda is not None and case["arch"] == "sm_90a" and cuda.device_arch() != "sm_90":
                continue          # an sm_90a cubin loads on Hopper only
            r = check(bundle, case, cuda, args.dry_run)
            failed += not r["ok"]
            results.append(r)
            print(f"{r['case']:44} {r['rel_err_vs_f64']:15.2e} {r['max_diff_vs_emulator']:12.2e} "
                  f"{'ok' if r['ok'] else 'FAIL'}")
    if not args.dry_run:
        print(f"\n{'fp8 GEMM':36} {'Tessera TFLOP/s':>16} {'cuBLAS fp8':>11} {'ratio':>6} {'err':>8} {'regs':>5}")
        for case in manifest["cases"]:
            if case["kind"] == "bench":
                r = bench(bundle, case, cuda, args.repeats)
                failed += not r["rel_err_vs_cublas"] < 1e-2
                results.append(r)
                print(f"{r['case']:36} {r['tessera_tflops']:16} {r['cublas_fp8_tflops']:11} {r['ratio']:6} "
                      f"{r['rel_err_vs_cublas']:8.1e} {r['registers']:5}")
    else:
        print(f"{sum(c['kind'] == 'bench' for c in manifest['cases'])} bench cases prepared (timed on a device only)")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "fp8.json").write_text(json.dumps({"commit": manifest.get("commit"), "results": results},
                                                             indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
