"""Time Tessera's GPU flash-attention backward kernel against torch's SDPA backward (NVIDIA).

    python benchmarks/gpu/attention_bwd_bench.py [--arch sm_90] [--repeats 20]   # on the GPU machine
    python benchmarks/gpu/attention_bwd_bench.py --dry-run                        # here: no GPU

For each case (batch 1 x 16 heads, d 64, f16; seq 1024 and 4096; full and causal) it compiles
``ts.ops.attention_backward(q, k, v, o, dO, lse=lse)`` for ``target="nvidia"`` (the same
``attention_grad`` kernel ``tessera.grad`` of an attention builds), takes that program's
backward kernel launch (``kernels/gpu_attention_backward.py``: dQ, dK, dV, f32), launches it on
the device with o and lse from torch (float32 softmax of the same data), checks dQ, dK, dV
against torch.autograd of SDPA in float32, and times the kernel (CUDA events, warm-up, median)
beside ``torch.autograd.grad`` of f16 SDPA (whichever backend torch picks; its forward not timed).
FLOPs counted as 2.5x the forward's (five S x D products; half when causal).

``--dry-run`` (no GPU): compiles a small case for sm_90, builds the same launch record and runs
it in the warp emulator against a float64 oracle (so the device run's plumbing is tested here).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tessera as ts  # noqa: E402
from tessera.ir import dims as D  # noqa: E402
from tessera.runtime.cpu import _eval, bind_symbols  # noqa: E402


def flops(b, h, s, d, causal) -> float:
    full = 2.5 * 4.0 * b * h * s * s * d
    return full / 2 if causal else full


def backward_fn(causal: bool):
    def f(q, k, v, o, g, lse):
        return ts.ops.attention_backward(q, k, v, o, g, causal=causal, lse=lse)
    return f


def launch_record(art, arrays) -> dict:
    """The backward kernel's launch in the compiled program: its kernel, grid, block, shared bytes,
    size arguments, which program inputs it reads and the outputs (dQ, dK, dV parts) it writes."""
    exe = art.compiled.executable
    prog = exe.program
    steps = [s for s in prog.steps if s.kernel.endswith("attention_bwd")]
    if len(steps) != 1:
        raise SystemExit(f"expected one attention_bwd launch, got {[s.kernel for s in prog.steps]}")
    s = steps[0]
    env = bind_symbols(prog.inputs, arrays)
    if any(a not in prog.input_ids for a in s.args):
        raise SystemExit("the backward kernel reads a value another kernel makes (f16 / bf16 inputs expected)")
    kern = next(k for k in art.report().kernels if k["kernel"] == s.kernel)
    return {"kernel": s.kernel, "grid": [D.evaluate_extent(e, env) for e in s.grid], "block": [s.block, 1, 1],
            "shared": kern["smem_bytes"], "sizes": [_eval(d, env) for d in s.dims],
            "inputs": [prog.input_ids.index(a) for a in s.args],
            "outputs": [([_eval(d, env) for d in t.dims], t.np_dtype) for t in s.out_types],
            "registers": kern.get("registers"), "spill_bytes": kern.get("spill_stores", 0)}


def unpack(rec, outs, b, h, hk, s, d):
    """dQ [b, h, s, d], dK, dV [b, hk, s, d] from the kernel's parts ([B, HKV, slots, S, D] each)."""
    g = h // hk
    packed = np.concatenate([o.reshape(b, hk, -1, s, d) for o in outs], axis=2)
    return packed[:, :, :g].reshape(b, h, s, d), packed[:, :, g], packed[:, :, g + 1]


def oracle(q, k, v, w, causal):
    """float64 (o, lse, dq, dk, dv) of attention(q, k, v) with cotangent w (grouped heads summed)."""
    q, k, v, w = (x.astype(np.float64) for x in (q, k, v, w))
    b, h, s, d = q.shape
    hk = k.shape[1]
    g = h // hk
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    sc = 1 / np.sqrt(d)
    x = q @ np.swapaxes(kk, -1, -2) * sc
    if causal:
        x = np.where(np.tril(np.ones((s, s), bool)), x, -np.inf)
    m = x.max(-1, keepdims=True)
    p = np.exp(x - m)
    lse = (m + np.log(p.sum(-1, keepdims=True)))[..., 0]
    p /= p.sum(-1, keepdims=True)
    o = p @ vv
    ds = p * (w @ np.swapaxes(vv, -1, -2) - (w * o).sum(-1, keepdims=True))
    dq = ds @ kk * sc
    dk = (np.swapaxes(ds, -1, -2) @ q * sc).reshape(b, hk, g, s, d).sum(2)
    dv = (np.swapaxes(p, -1, -2) @ w).reshape(b, hk, g, s, d).sum(2)
    return o, lse, dq, dk, dv


def rel_err(got, want) -> float:
    return max(float(np.abs(a.astype(np.float64) - w).max() / np.abs(w).max()) for a, w in zip(got, want))


def dry_run() -> int:
    """No GPU: the launch record of a small case run in the warp emulator against float64."""
    from tessera.emulate.simt import Emulator
    from tessera.ir.text import parse_module
    rng = np.random.default_rng(7)
    failed = 0
    for causal in (False, True):
        b, h, hk, s, d = 1, 2, 1, 96, 64
        q, w = (rng.standard_normal((b, h, s, d)).astype(np.float16) for _ in range(2))
        k, v = (rng.standard_normal((b, hk, s, d)).astype(np.float16) for _ in range(2))
        o, lse, *want = oracle(q, k, v, w, causal)
        arrays = [q, k, v, o.astype(np.float16), w, lse.astype(np.float32)]
        art = ts.compile(backward_fn(causal), *arrays, target="nvidia", arch="sm_90")
        rec = launch_record(art, arrays)
        outs = [np.full(shape, np.nan, dt) for shape, dt in rec["outputs"]]
        emu = Emulator(parse_module(art.compiled.executable.target_ir), "nvidia", "sm_90")
        emu.launch(rec["kernel"], tuple(rec["grid"]), [arrays[i] for i in rec["inputs"]] + outs, rec["sizes"])
        err = rel_err(unpack(rec, outs, b, h, hk, s, d), want)
        failed += not err < 4e-3
        print(f"dry run {'causal' if causal else 'full'} 1x2/1x{s}x{d} f16 sm_90: grid {rec['grid']} block "
              f"{rec['block'][0]} shared {rec['shared']} registers {rec['registers']} spill {rec['spill_bytes']}; "
              f"emulated vs float64 rel err {err:.1e}")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=None, help="default: the device's")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: emulate a small case's launch record")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run()
    import torch
    from tessera.runtime import cuda
    ok, why = cuda.device_available()
    if not ok:
        print(f"no usable GPU: {why}")
        return 2
    arch = args.arch or cuda.device_arch()
    print(f"device: {why} ({arch}); torch {torch.__version__}")
    print(f"{'case':28} {'tessera ms':>10} {'TFLOP/s':>8} {'torch ms':>9} {'TFLOP/s':>8} {'ratio':>6} {'rel err':>8} "
          f"{'regs':>4}")
    failed = 0
    for seq in (1024, 4096):
        for causal in (False, True):
            b, h, d = 1, 16, 64
            gen = torch.Generator(device="cuda").manual_seed(seq + causal)
            q, k, v, g = (torch.randn((b, h, seq, d), device="cuda", dtype=torch.float16, generator=gen)
                          for _ in range(4))
            qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
            of = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
            ref = torch.autograd.grad(of, (qf, kf, vf), g.float())
            with torch.no_grad():
                sc = q.float() @ k.float().transpose(-1, -2) / d ** 0.5
                if causal:
                    sc = sc.masked_fill(~torch.ones(seq, seq, device="cuda", dtype=torch.bool).tril(), float("-inf"))
                lse = torch.logsumexp(sc, -1)
                del sc
            arrays = [x.cpu().numpy() for x in (q, k, v, of.detach().half(), g)] + [lse.cpu().numpy()]
            art = ts.compile(backward_fn(causal), *arrays, target="nvidia", arch=arch)
            rec = launch_record(art, arrays)
            outs = [np.zeros(shape, dt) for shape, dt in rec["outputs"]]
            bufs = [arrays[i] for i in rec["inputs"]] + outs
            with cuda.CudaModule(art.binary()) as mod:
                mod.launch(rec["kernel"], tuple(rec["grid"]), tuple(rec["block"]), rec["shared"], bufs, rec["sizes"],
                           list(range(len(rec["inputs"]), len(bufs))))
                ms = statistics.median(mod.time(rec["kernel"], tuple(rec["grid"]), tuple(rec["block"]), rec["shared"],
                                                bufs, rec["sizes"], repeats=args.repeats, warmup=3))
            err = rel_err(unpack(rec, outs, b, h, h, seq, d), [x.detach().cpu().numpy() for x in ref])
            failed += not err < 1e-2
            qh, kh, vh = (x.clone().requires_grad_() for x in (q, k, v))
            oh = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
            for _ in range(3):
                torch.autograd.grad(oh, (qh, kh, vh), g, retain_graph=True)
            torch.cuda.synchronize()
            tms = []
            for _ in range(args.repeats):
                s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s0.record()
                torch.autograd.grad(oh, (qh, kh, vh), g, retain_graph=True)
                e0.record()
                torch.cuda.synchronize()
                tms.append(s0.elapsed_time(e0))
            tt = statistics.median(tms)
            fl = flops(b, h, seq, d, causal)
            name = f"bwd 16x{seq}x{d} f16 {'causal' if causal else 'full'}"
            print(f"{name:28} {ms:10.3f} {fl / ms / 1e9:8.1f} {tt:9.3f} {fl / tt / 1e9:8.1f} {tt / ms:6.3f} "
                  f"{err:8.1e} {rec['registers']!s:>4}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
