"""On an NVIDIA GPU machine: time Tessera's flash-attention kernel against torch's SDPA.

    python benchmarks/gpu/attention_bench.py [--arch sm_90] [--repeats 20]

Needs the tessera package with its dependencies (xDSL, llvmlite) and ptxas to compile, plus
torch and cuda-python.  For each case (batch*heads = 16, d = 64, f16; seq 1024 and 4096;
non-causal and causal) it compiles ``ts.ops.attention`` with ``target="nvidia"``, checks
the device output against torch's SDPA in float32 on the same inputs, then times the
kernel (CUDA events, warm-up, median) and ``torch.nn.functional.scaled_dot_product_attention``
(f16, whichever backend torch picks) on the same data, and prints TFLOP/s and the ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tessera as ts  # noqa: E402
from build_nvidia_bundle import launch_record  # noqa: E402
from tessera.runtime import cuda  # noqa: E402


def flops(b, h, sq, sk, d, causal) -> float:
    full = 4.0 * b * h * sq * sk * d
    return full / 2 if causal else full


def main(argv=None) -> int:
    import torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=None, help="default: the device's")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--key-blocks", type=int, nargs="*", default=[32, 128], help="key blocks (tile-n) also timed")
    args = ap.parse_args(argv)
    ok, why = cuda.device_available()
    if not ok:
        print(f"no usable GPU: {why}")
        return 2
    arch = args.arch or cuda.device_arch()
    print(f"device: {why} ({arch}); torch {torch.__version__}")
    print(f"{'case':28} {'tessera ms':>10} {'TFLOP/s':>8} {'torch ms':>9} {'TFLOP/s':>8} {'ratio':>6} {'rel err':>8}")
    failed = 0
    cases = [(seq, causal, None) for seq in (1024, 4096) for causal in (False, True)]
    cases += [(4096, False, {"tile_n": kv}) for kv in args.key_blocks]
    for seq, causal, pins in cases:
        if True:
            b, h, d = 1, 16, 64
            gen = torch.Generator(device="cuda").manual_seed(seq + causal)
            q, k, v = (torch.randn((b, h, seq, d), device="cuda", dtype=torch.float16, generator=gen)
                       for _ in range(3))
            hq, hk, hv = (x.cpu().numpy() for x in (q, k, v))
            art = ts.compile(lambda q, k, v: ts.ops.attention(q, k, v, causal=causal), hq, hk, hv,
                             target="nvidia", arch=arch, schedule=pins)
            rec = launch_record(art, [hq, hk, hv])
            out = np.zeros(rec["outputs"][0]["shape"], np.dtype(rec["outputs"][0]["dtype"]))
            with cuda.CudaModule(art.binary()) as mod:
                mod.launch(rec["kernel"], tuple(rec["grid"]), tuple(rec["block"]), rec["shared"], [hq, hk, hv, out],
                           rec["sizes"], [3])
                ms = statistics.median(mod.time(rec["kernel"], tuple(rec["grid"]), tuple(rec["block"]), rec["shared"],
                                                [hq, hk, hv, out], rec["sizes"], repeats=args.repeats, warmup=3))
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                   is_causal=causal).cpu().numpy()
            err = float(np.abs(out.astype(np.float32) - ref).max() / np.abs(ref).max())
            failed += not err < 5e-3
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.cuda.synchronize()
            tms = []
            for _ in range(args.repeats):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                e.record()
                torch.cuda.synchronize()
                tms.append(s.elapsed_time(e))
            tt = statistics.median(tms)
            fl = flops(b, h, seq, seq, d, causal)
            name = f"16x{seq}x{d} f16 {'causal' if causal else 'full'}" + (f" kv{pins['tile_n']}" if pins else "")
            print(f"{name:28} {ms:10.3f} {fl / ms / 1e9:8.1f} {tt:9.3f} {fl / tt / 1e9:8.1f} {tt / ms:6.3f} "
                  f"{err:8.1e}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
