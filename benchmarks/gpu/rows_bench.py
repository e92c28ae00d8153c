"""On an NVIDIA GPU machine, one call: check the memory-bound kernels' cubins numerically and time
them against torch and a device-to-device copy.

    ./dev python benchmarks/gpu/build_rows_bundle.py --arch sm_90      # here (needs xDSL)
    python benchmarks/gpu/rows_bench.py                                 # there (numpy, torch, cuda-python)
    python benchmarks/gpu/rows_bench.py --dry-run                       # anywhere: checks the bundle itself

For every case (softmax, layer_norm, rms_norm, gelu(x + b), a row sum; f16 and bf16) it launches the
cubin on the bundle's check inputs (37 x 1000) and compares the device's output with float64 numpy
and with the SIMT emulator's output computed when the bundle was built; then it times the kernel on
16384 x 8192 random data (CUDA events, 5 warm-up launches, median of ``--repeats``) against the same
torch expression on the same data and against a device-to-device copy of the input (the bandwidth
a memory-bound kernel aims at: bytes read + written / time).  Only numpy, torch and cuda-python are
imported: the launcher is Tessera's ``tessera/runtime/cuda.py`` loaded by path (nvidia_check.py).
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

from cuda_events import median_ms  # noqa: E402
from nvidia_check import _bf16_to_f32, _load_launcher  # noqa: E402

BYTES = {"f16": 2, "bf16": 2}


def _np(bundle: Path, spec: dict) -> np.ndarray:
    return np.load(bundle / spec["file"])


def _f64(a: np.ndarray, dtype: str) -> np.ndarray:
    return _bf16_to_f32(a).astype(np.float64) if dtype == "bf16" else a.astype(np.float64)


def oracle(name: str, args: list[np.ndarray]) -> np.ndarray:
    x = args[0]
    if name == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if name == "layer_norm":
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * args[1] + args[2]
    if name == "rms_norm":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * args[1]
    if name == "gelu_bias":
        u = x + args[1]
        return 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
    if name == "row_sum":
        return x.sum(-1)
    raise SystemExit(f"no oracle for {name}")


def _out(shape, dtype: str) -> np.ndarray:
    return np.zeros(shape, np.uint16 if dtype == "bf16" else np.float16)


def check(bundle: Path, case: dict, cuda, dry: bool) -> dict:
    c = case["check"]
    raw = [_np(bundle, s) for s in c["inputs"]]
    want = oracle(case["kernel_name"], [_f64(a, case["dtype"]) for a in raw])
    emulated = np.load(bundle / c["emulated"])
    if dry:
        got = emulated
    else:
        out = _out(c["outputs"][0]["shape"], case["dtype"])
        bufs = [np.ascontiguousarray(a) for a in raw] + [out]
        with cuda.CudaModule((bundle / case["cubin"]).read_bytes()) as mod:
            mod.launch(c["kernel"], tuple(c["grid"]), tuple(c["block"]), c["shared"], bufs, c["sizes"],
                       [len(raw)])
        got = _f64(out, case["dtype"])
    scale = max(np.abs(want).max(), 1e-30)
    return {"rel_err_vs_f64": float(np.abs(got - want).max() / scale),
            "vs_emulator": float(np.abs(got - emulated).max() / scale)}


def _events_ms(fn, repeats: int) -> float:
    return median_ms(fn, repeats, warmup=5)


def bench(bundle: Path, case: dict, cuda, repeats: int) -> dict:
    import torch
    import torch.nn.functional  # noqa: F401  (the torch expressions name it)
    bc = case["bench"]
    rows, cols = bc["shape"]
    tdt = torch.float16 if case["dtype"] == "f16" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn((rows, cols), device="cuda", dtype=tdt, generator=gen)
    g = (1 + 0.1 * torch.randn((cols,), device="cuda", generator=gen)).to(tdt)
    b = (0.1 * torch.randn((cols,), device="cuda", generator=gen)).to(tdt)
    args = [x, g, b][:case["nargs"]] if case["kernel_name"] != "gelu_bias" else [x, b]

    def host(t):
        a = t.float().cpu().numpy() if case["dtype"] == "bf16" else t.cpu().numpy()
        if case["dtype"] == "bf16":
            u = a.view(np.uint32)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return a
    bufs = [host(t) for t in args] + [_out(bc["outputs"][0]["shape"], case["dtype"])]
    with cuda.CudaModule((bundle / case["cubin"]).read_bytes()) as mod:
        ms = statistics.median(mod.time(bc["kernel"], tuple(bc["grid"]), tuple(bc["block"]), bc["shared"], bufs,
                                        bc["sizes"], repeats=repeats, warmup=5))
    expr = case["torch"]
    t_ms = _events_ms(lambda: eval(expr, {"torch": torch, "x": x, "g": g, "b": b}), repeats)
    y = torch.empty_like(x)
    copy_ms = _events_ms(lambda: y.copy_(x), repeats)
    moved = sum(a.numel() * a.element_size() for a in args) + int(np.prod(bc["outputs"][0]["shape"])) * 2
    return {"tessera_ms": ms, "torch_ms": t_ms, "copy_ms": copy_ms, "GB/s": moved / ms / 1e6,
            "copy GB/s": 2 * x.numel() * x.element_size() / copy_ms / 1e6, "registers": case["check"]["registers"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=HERE / "rows_bundle")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--dry-run", action="store_true", help="no GPU: check the bundle's emulator outputs only")
    a = p.parse_args(argv)
    man = json.loads((a.bundle / "manifest.json").read_text())
    cuda = None if a.dry_run else _load_launcher()
    if cuda is not None:
        dev = cuda.device_arch()
        print(f"device arch {dev}; bundle built for {man['arch']} at {man['commit'][:12]}"
              f"{' (dirty)' if man.get('dirty') else ''}")
    print(f"{'case':16s} {'rel err vs f64':>14s} {'vs emulator':>12s}")
    ok = True
    for case in man["cases"]:
        r = check(a.bundle, case, cuda, a.dry_run)
        good = r["rel_err_vs_f64"] < 2e-2 and r["vs_emulator"] < 2e-2
        ok &= good
        print(f"{case['name']:16s} {r['rel_err_vs_f64']:14.2e} {r['vs_emulator']:12.2e} {'ok' if good else 'FAIL'}")
    if a.dry_run:
        return 0 if ok else 1
    print(f"\n{'case':16s} {'tessera ms':>10s} {'GB/s':>7s} {'torch ms':>9s} {'vs torch':>8s} {'copy GB/s':>9s} "
          f"{'of copy':>7s} regs")
    for case in man["cases"]:
        r = bench(a.bundle, case, cuda, a.repeats)
        print(f"{case['name']:16s} {r['tessera_ms']:10.3f} {r['GB/s']:7.0f} {r['torch_ms']:9.3f} "
              f"{r['torch_ms'] / r['tessera_ms']:8.2f} {r['copy GB/s']:9.0f} {r['GB/s'] / r['copy GB/s']:7.2f} "
              f"{r['registers']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
