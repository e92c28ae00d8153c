"""The model examples (examples/models/) on an NVIDIA GPU: device-resident calls on ``target="nvidia"``
checked against float64, then timed against torch eager and torch.compile (issue 30).

    python benchmarks/gpu/models_bench.py --out "$OUT"    # on the GPU machine (device_run.sh --suite whole-models)
    python benchmarks/gpu/models_bench.py --dry-run       # anywhere: tiny sizes, the fake driver
                                                          # (tests/fake_cuda.py) and the warp emulator

For each (model, dtype) the lane compiles (tests/test_gpu_models.py is the contract: the others are
refused with a coded error, recorded here with it): the example's ``make`` arguments at its
``small`` size (``--size``), floats cast to the dtype, copied to the device once; one call checked
against the model's float64 ``reference`` (f32: tf32 GEMMs, tolerance 5e-3 of the output's scale;
bf16: 5e-2); no host<->device copy inside the call (the runtime's copy counters); then (device only)
the median of 20 calls timed with CUDA events after warm-up, next to ``torch_forward`` eager and
torch.compile on the same device tensors.  Writes ``models.json`` under ``--out``.  Nothing here has
run on a GPU yet: no figure is claimed until a device run records one.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for p in (ROOT, ROOT / "tests", ROOT / "examples", HERE):
    sys.path.insert(0, str(p))

from cuda_events import median_ms  # noqa: E402
from device_resident import FakeBackend, commit, open_device, rel  # noqa: E402
from tessera.errors import TesseraError  # noqa: E402
from tessera.runtime import cuda  # noqa: E402

MODELS = ("gpt2_block", "llama_block", "bert_block", "decode_attention", "mlp_train_step", "sampler")
TOL = {"f32": 5e-3, "bf16": 5e-2}
DRY = {  # (model, dtype) -> sizes the emulator finishes in seconds (f32: the fake driver's arrays speak
    # __cuda_array_interface__, which has no bfloat16 typestr; a device run passes bf16 torch tensors by DLPack)
    ("decode_attention", "f32"): dict(batch=1, heads=4, kv_heads=2, head_dim=32, seq=64),
    ("gpt2_block", "f32"): dict(batch=1, seq=16, dim=64, heads=2),
    ("sampler", "f32"): dict(batch=2, seq=4, vocab=64, dim=32, k=5),
    ("mlp_train_step", "f32"): dict(batch=8, din=24, hidden=32, classes=10),
}
# programs with f32 GEMMs whatever the inputs' dtype (mlp_train_step: one_hot's f32 rows in the backward):
# they take the tf32 pin in bf16 too
F32_GEMMS = {"mlp_train_step"}


def _cast(args, dtype):
    import ml_dtypes
    dt = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}[dtype]
    return [a.astype(dt) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]


def _events_ms(torch, call, reps: int = 20) -> float:
    return round(median_ms(call, reps), 4)


def run_model(be, name: str, dtype: str, sizes: dict, arch: str, timed: bool) -> dict:
    m = importlib.import_module(f"models.{name}")
    rng = np.random.default_rng(hash((name, dtype, time.time())) % 2 ** 32)
    args, kw = m.make(rng, **sizes)
    args = _cast(args, dtype)
    res = {"model": name, "dtype": dtype, "sizes": sizes}
    # f32 runs on tf32 (asked for: the same trade as torch's allow_tf32, which the peers get too)
    tf32 = dtype == "f32" or name in F32_GEMMS
    f = m.forward.retarget("nvidia", arch, {"math_mode": "tf32"} if tf32 else None, "models_bench")
    try:
        art = f.compile(*args, **kw)
    except TesseraError as e:      # refused by name: recorded, never run elsewhere
        res.update(refused=f"{e.code}: {str(e).splitlines()[0][:200]}", ok=True)
        print(f"{name:16s} {dtype:4s} refused {res['refused']}")
        return res
    rep = art.report()
    res["kernels"] = [{"kernel": k["kernel"], "kind": k["kind"], "registers": k.get("registers"),
                       "mma": (k.get("mma") or {}).get("record")} for k in rep.kernels]
    res["lane"] = rep.lane
    if isinstance(be, FakeBackend):
        be.register(art)
    dev = [be.to_dev(a) if isinstance(a, np.ndarray) else a for a in args]
    copies = {k: cuda.copies(k) for k in ("HtoD", "DtoH")}
    out = f(*dev, **kw)
    res["runtime_host_copies"] = {k: cuda.copies(k) - v for k, v in copies.items()}
    outs = out if isinstance(out, tuple) else (out,)
    want = m.reference(*args, xp_dtype=np.float64, **kw)
    want = want if isinstance(want, tuple) else (want,)
    res["rel_err"] = max(rel(be.to_host(o), w) for o, w in zip(outs, want))
    res["ok"] = res["rel_err"] < TOL[dtype] and not any(res["runtime_host_copies"].values())
    if timed:
        torch = be.torch
        # the same math for the peers: f32 matmuls on tf32 (Tessera's f32 kernels run on it, asked for)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        res["ms"] = {"tessera": _events_ms(torch, lambda: f(*dev, **kw))}
        if hasattr(m, "torch_forward"):
            with torch.no_grad():
                res["ms"]["torch_eager"] = _events_ms(torch, lambda: m.torch_forward(*dev, **kw))
                try:
                    comp = torch.compile(lambda *a: m.torch_forward(*a, **kw))
                    res["ms"]["torch_compile"] = _events_ms(torch, lambda: comp(*dev))
                except Exception as e:     # torch.compile's own failure is recorded, not ours
                    res["ms"]["torch_compile"] = f"failed: {type(e).__name__}"
    print(f"{name:16s} {dtype:4s} {len(res['kernels'])} kernels on {rep.lane}, rel err {res['rel_err']:.2e}, "
          f"host copies {res['runtime_host_copies']}: {'OK' if res['ok'] else 'FAIL'}"
          + (f"; ms {res['ms']}" if timed else ""), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="no GPU: tiny sizes, the fake driver and the emulator")
    ap.add_argument("--out", default=None, help="write models.json here")
    ap.add_argument("--size", default="small", help="the examples' size name (device runs)")
    ap.add_argument("--only", default="", help="comma-separated model names")
    a = ap.parse_args(argv)
    record = {**commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    only = set(a.only.split(",")) - {""}
    if a.dry_run:
        be, arch = FakeBackend(), "sm_90"
        record["gpu"] = be.name
        for (name, dtype), sizes in DRY.items():
            if not only or name in only:
                record["runs"].append(run_model(be, name, dtype, sizes, arch, timed=False))
    else:
        opened = open_device(record)
        if opened is None:
            return 2
        be, arch = opened
        for name in MODELS:
            if only and name not in only:
                continue
            m = importlib.import_module(f"models.{name}")
            for dtype in ("f32", "bf16"):
                try:
                    record["runs"].append(run_model(be, name, dtype, m.SIZES[a.size], arch, timed=True))
                except Exception as e:   # one model's failure must not hide the others' figures
                    record["runs"].append({"model": name, "dtype": dtype, "ok": False,
                                           "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    print(f"{name:16s} {dtype:4s} FAIL {type(e).__name__}: {str(e)[:200]}", flush=True)
    record["ok"] = all(r.get("ok") for r in record["runs"])
    print(json.dumps({"commit": record["commit"], "gpu": record["gpu"], "ok": record["ok"]}))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "models.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
