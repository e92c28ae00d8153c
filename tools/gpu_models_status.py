"""Which model examples compile onto a GPU lane, and what refuses the rest (issue 30's measure).

    ./dev python tools/gpu_models_status.py nvidia sm_80 [model ...]
    ./dev python tools/gpu_models_status.py rocm gfx942

Each example of examples/models/ at a tiny size, its float arguments cast to f32 and to bf16, is
compiled (not run) for the lane; a line per (model, dtype): the kernel count and each kernel's
registers as ptxas / the AMDGPU object reports them, or the coded error and its first line.
tests/test_gpu_models.py holds the same table as a contract.
"""
from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import tessera as ts  # noqa: E402
from tessera.errors import TesseraError  # noqa: E402

TINY = {"gpt2_block": dict(batch=1, seq=16, dim=64, heads=2),
        "llama_block": dict(batch=1, seq=16, dim=64, heads=2, kv_heads=1, hidden=96),
        "bert_block": dict(batch=1, seq=16, dim=64, heads=2),
        "mlp_train_step": dict(batch=8, din=24, hidden=32, classes=10),
        "sampler": dict(batch=2, seq=4, vocab=64, dim=32, k=5),
        "decode_attention": dict(batch=1, heads=4, kv_heads=2, head_dim=32, seq=64)}


def main(argv: list[str]) -> int:
    target = argv[0] if argv else "nvidia"
    arch = argv[1] if len(argv) > 1 else ("sm_80" if target == "nvidia" else "gfx942")
    only = set(argv[2:])
    for name, sizes in TINY.items():
        if only and name not in only:
            continue
        m = importlib.import_module(f"models.{name}")
        for dtype, dt in (("f32", np.float32), ("bf16", ml_dtypes.bfloat16)):
            args, kw = m.make(np.random.default_rng(0), **sizes)
            args = [a.astype(dt) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
            t = time.perf_counter()
            try:
                pins = {"math_mode": "tf32"} if (target, dtype) == ("nvidia", "f32") else None
                rep = ts.explain(m.forward, *args, target=target, arch=arch, schedule=pins, **kw)
            except TesseraError as e:
                print(f"{name:17s} {dtype:4s} refused {str(e).splitlines()[0][:160]}")
                continue
            regs = [k.get("registers", k.get("vgprs")) for k in rep.kernels]
            print(f"{name:17s} {dtype:4s} {rep.lane}: {len(rep.kernels)} kernels, registers {regs} "
                  f"({time.perf_counter() - t:.1f} s loaded)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
