"""Device-resident calls on an NVIDIA GPU (issue 30): torch CUDA tensors in, torch CUDA tensors out.

    python benchmarks/gpu/device_resident.py --out "$OUT"    # on the GPU machine (device_run.sh runs it)
    python benchmarks/gpu/device_resident.py --dry-run       # anywhere: the same checks against the fake
                                                             # driver (tests/fake_cuda.py) and the warp emulator

Checks, each against float64 on fresh random data:

1. GEMM ``a @ b + c0`` (f16 in, f32 out) with torch CUDA tensors: the result is a torch CUDA
   tensor on the same device; the GEMM kernel was handed the callers' ``data_ptr()``s and the
   result's ``data_ptr()`` is the pointer the kernel wrote; no host<->device copy inside the call
   (the runtime's copy counters, and ``torch.profiler``'s memcpy events); launched on torch's
   current stream (a side stream here).
2. The same with ``tessera.device_options(capture=True)``: two calls replayed as one CUDA graph.
3. The demo transformer block (``tessera.tools.demo``) entirely on ``target="nvidia"`` with torch
   CUDA tensors in and out.
4. (device only) median of 20 timed calls (CUDA events, after warm-up) of the block: device-resident,
   host numpy in/out, and torch eager on the same inputs.

Writes ``device_resident.json`` (the commit, the GPU, every figure) under ``--out``.  Nothing
here has run on a GPU yet: the first device run is what proves it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tessera as ts  # noqa: E402
from cuda_events import median_ms  # noqa: E402
from tessera.runtime import cuda  # noqa: E402
from tessera.runtime.cuda import CudaModule  # noqa: E402
from tessera.tools.demo import make_block, make_inputs  # noqa: E402


def gemm(a, b, c0):
    return ts.ops.matmul(a, b, out_dtype=np.float32) + c0


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


class Launches:
    """Every launch the runtime queues: kernel, stream and the pointer parameters it was handed."""

    def __init__(self):
        self.recs: list[dict] = []
        real = CudaModule.launch_on

        def spy(mod, fn, kernel, grid, block, shared, params, stream):
            self.recs.append({"kernel": kernel, "stream": int(stream), "params": [v.value for v in params.values]})
            return real(mod, fn, kernel, grid, block, shared, params, stream)
        CudaModule.launch_on = spy


class TorchBackend:
    """The real thing: torch CUDA tensors on device 0."""
    name = "torch-cuda"

    def __init__(self):
        import torch
        self.torch = torch
        self.side = torch.cuda.Stream()

    def to_dev(self, a):
        t = self.torch.from_numpy(np.ascontiguousarray(a)).cuda()
        self.torch.cuda.synchronize()
        return t

    def to_host(self, t):
        assert isinstance(t, self.torch.Tensor) and t.is_cuda, f"not a torch CUDA tensor: {type(t)}"
        self.torch.cuda.synchronize()
        return t.cpu().numpy()

    def ptr(self, t) -> int:
        return int(t.data_ptr())

    def stream(self):
        return self.torch.cuda.stream(self.side), int(self.side.cuda_stream)

    def memcpy_events(self, call):
        """(result, [names of memcpy events]) for one call under torch.profiler."""
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out = call()
            self.torch.cuda.synchronize()
        names = [e.name for e in prof.events() if "memcpy" in e.name.lower()]
        return out, names


class FakeBackend:
    """--dry-run: tests/fake_cuda.py's driver (host-backed memory) with the warp emulator running kernels."""
    name = "fake driver + warp emulator (dry run: no GPU)"

    def __init__(self):
        from fake_cuda import FakeCudaDriver
        self.drv = FakeCudaDriver()
        cuda._driver = lambda: self.drv
        self.runners = {}

        def run(rec, drv):
            self.runners[rec["kernel"]](rec, drv)
        self.drv.run = run

    def register(self, art):
        from fake_cuda import emulator_runner
        r = emulator_runner(art.compiled.executable)
        for abi in art.abi():
            self.drv.add_abi(abi)
            self.runners[abi["symbol"]] = r

    def to_dev(self, a):
        from fake_cuda import FakeCudaArray
        return FakeCudaArray(self.drv, np.ascontiguousarray(a))

    def to_host(self, t):
        return t.copy_to_host()

    def ptr(self, t) -> int:
        return int(t.ptr)

    def stream(self):
        import contextlib
        return contextlib.nullcontext(), 0

    def memcpy_events(self, call):
        n = len(self.drv.calls)
        out = call()
        return out, [c[0] for c in self.drv.calls[n:] if c[0].startswith("cuMemcpy")]


def check_gemm(be, rng, m, n, k, record: dict) -> None:
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c0 = (rng.standard_normal((m, n)) * 4).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64) + c0
    f = ts.jit(gemm, target="nvidia", arch=ARCH)
    if isinstance(be, FakeBackend):
        be.register(f.compile(a, b, c0))
    da, db, dc = be.to_dev(a), be.to_dev(b), be.to_dev(c0)
    spy = Launches()
    ctx, stream = be.stream()
    copies = {k: cuda.copies(k) for k in ("HtoD", "DtoH")}
    with ctx:
        out, memcpys = be.memcpy_events(lambda: f(da, db, dc))
    host_copies = {k: cuda.copies(k) - v for k, v in copies.items()}   # before the check's own copy out
    got = be.to_host(out)
    k0 = spy.recs[0]
    res = {"shape": [m, n, k], "rel_err": rel(got, want), "launches": len(spy.recs),
           "inputs_in_place": k0["params"][:3] == [be.ptr(da), be.ptr(db), be.ptr(dc)],
           "result_is_kernel_output": be.ptr(out) in spy.recs[-1]["params"],
           "runtime_host_copies": host_copies, "memcpy_events": memcpys, "stream_expected": stream,
           "streams_used": sorted({r["stream"] for r in spy.recs}),
           "lane_log": ts.lane_log.entries[-1].inputs[0]}
    res["ok"] = (res["rel_err"] < 1e-5 and res["inputs_in_place"] and res["result_is_kernel_output"]
                 and not any(res["runtime_host_copies"].values()) and not memcpys
                 and res["streams_used"] == [stream])
    # graph replay: two calls, each against float64
    with ts.device_options(capture=True, stream=stream), ctx:
        outs = [f(da, db, dc) for _ in range(2)]
    res["graph_rel_err"] = max(rel(be.to_host(o), want) for o in outs)
    res["ok"] = res["ok"] and res["graph_rel_err"] < 1e-5
    record["gemm"] = res
    print(f"gemm {m}x{n}x{k}: rel err {res['rel_err']:.2e} (graph {res['graph_rel_err']:.2e}); inputs in place "
          f"{res['inputs_in_place']}; result in place {res['result_is_kernel_output']}; host copies "
          f"{res['runtime_host_copies']}; memcpy events {memcpys}; streams {res['streams_used']} (want {stream}): "
          f"{'OK' if res['ok'] else 'FAIL'}")


def check_block(be, rng, seq, dim, heads, record: dict, pins=None, timed=False) -> None:
    block, numpy_block = make_block(seq, dim, heads)
    args = [a.astype(np.float16) for a in make_inputs(rng, seq, dim)]
    want = numpy_block(*[a.astype(np.float64) for a in args])
    f = ts.jit(block, target="nvidia", arch=ARCH, schedule=pins)
    art = f.compile(*args)
    if isinstance(be, FakeBackend):
        be.register(art)
    dev = [be.to_dev(a) for a in args]
    copies = {k: cuda.copies(k) for k in ("HtoD", "DtoH")}
    out, memcpys = be.memcpy_events(lambda: f(*dev))
    host_copies = {k: cuda.copies(k) - v for k, v in copies.items()}
    got = be.to_host(out)
    res = {"seq": seq, "dim": dim, "heads": heads, "kernels": [k["kind"] for k in art.report().kernels],
           "rel_err": rel(got, want), "runtime_host_copies": host_copies,
           "memcpy_events": memcpys, "lane_log": ts.lane_log.entries[-1].inputs[0]}
    res["ok"] = res["rel_err"] < 2e-2 and not any(res["runtime_host_copies"].values()) and not memcpys
    if timed:
        res["ms"] = time_block(be, f, args, dev, heads)
    record["block"] = res
    print(f"block seq={seq} dim={dim} heads={heads}: {len(res['kernels'])} kernels, rel err {res['rel_err']:.2e}, "
          f"host copies {res['runtime_host_copies']}, memcpy events {memcpys}: {'OK' if res['ok'] else 'FAIL'}"
          + (f"; ms {res['ms']}" if timed else ""))


def time_block(be, f, args, dev, heads) -> dict:
    torch = be.torch
    seq, dim = args[0].shape
    block_t = torch_block(torch, seq, dim, heads)

    def timed(call, reps=20):
        return round(median_ms(call, reps), 4)
    out = {"device_resident": timed(lambda: f(*dev))}
    with ts.device_options(capture=True):
        out["device_resident_graph"] = timed(lambda: f(*dev))
    t0 = time.perf_counter()
    f(*args)
    out["host_copy_in_out_wall"] = round((time.perf_counter() - t0) * 1e3, 4)
    out["torch_eager"] = timed(lambda: block_t(*dev))
    return out


def torch_block(torch, seq, dim, heads):
    import math
    dh = dim // heads

    def block(x, g1, b1, wq, wk, wv, wo, g2, b2, w1, c1, w2, c2):
        h = torch.nn.functional.layer_norm(x, (dim,), g1, b1)
        q = (h @ wq).reshape(seq, heads, dh).transpose(0, 1)
        k = (h @ wk).reshape(seq, heads, dh).transpose(0, 1)
        v = (h @ wv).reshape(seq, heads, dh).transpose(0, 1)
        p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(dh), -1)
        a = (p @ v).transpose(0, 1).reshape(seq, dim)
        x = x + a @ wo
        h = torch.nn.functional.layer_norm(x, (dim,), g2, b2)
        return x + torch.nn.functional.gelu(h @ w1 + c1, approximate="tanh") @ w2 + c2
    return block


def commit() -> dict:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)
        if head.returncode == 0:
            return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except OSError:
        pass
    m = ROOT / "benchmarks/gpu/bundle/manifest.json"
    return {"commit": json.loads(m.read_text()).get("commit", "unknown") if m.exists() else "unknown", "dirty": None}


def open_device(record: dict):
    """The CUDA device's backend and arch, named in ``record``; None (and a line saying to use
    --dry-run) where there is no device."""
    ok, name = cuda.device_available()
    if not ok:
        print(f"no CUDA device: {name} (use --dry-run)")
        return None
    arch = cuda.device_arch()
    record["gpu"], record["arch"] = name, arch
    return TorchBackend(), arch


def main(argv=None) -> int:
    global ARCH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="no GPU: the fake driver and the warp emulator")
    ap.add_argument("--out", default=None, help="write device_resident.json here")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = np.random.default_rng(seed)
    record = {**commit(), "seed": seed, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.dry_run:
        be, ARCH = FakeBackend(), "sm_90"
        record["gpu"] = be.name
        check_gemm(be, rng, 64, 48, 32, record)
        check_block(be, rng, 24, 64, 4, record,
                    pins={"tile_m": 32, "tile_n": 32, "tile_k": 32, "register_tile": (1, 2), "staging": 1})
    else:
        opened = open_device(record)
        if opened is None:
            return 2
        be, ARCH = opened
        check_gemm(be, rng, 1024, 1024, 1024, record)
        check_gemm(be, rng, 520, 384, 272, record.setdefault("edges", {}))
        check_block(be, rng, 256, 512, 8, record, timed=True)
    record["ok"] = all(r.get("ok") for r in (record.get("gemm", {}), record.get("block", {}),
                                              record.get("edges", {}).get("gemm", {"ok": True})))
    print(json.dumps({"commit": record["commit"], "gpu": record["gpu"], "ok": record["ok"]}))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "device_resident.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return 0 if record["ok"] else 1


ARCH = "sm_90"

if __name__ == "__main__":
    sys.exit(main())
