"""Cold compile time of an example model, split by phase, in CPU and wall seconds.

Each round runs in a fresh Python process with an empty ``TESSERA_CACHE_DIR``: it imports
tessera and the model (not timed), builds the model's inputs, and times the first call, which
traces, builds the Graph IR, runs the passes, translates to LLVM IR, runs LLVM and loads the
object.  CPU seconds (this process and its children, all threads) are less disturbed than wall
seconds by other processes on a shared machine; the load average is printed with each figure.

  ./dev python tools/compile_time.py llama                 # examples/models/llama_block.py, small
  ./dev python tools/compile_time.py gpt2 --rounds 3       # minimum over 3 fresh processes
  ./dev python tools/compile_time.py llama --profile out.prof   # cProfile of the first call
  ./dev python tools/compile_time.py llama --dump-ir DIR   # write the LLVM IR (compare before/after)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"llama": "llama_block", "gpt2": "gpt2_block", "bert": "bert_block", "conv": "conv_block",
          "sampler": "sampler", "mlp": "mlp_train_step"}
PHASES = ("trace", "graphgen", "passes", "translate", "llvm", "load")


def _cpu() -> float:
    """CPU seconds of this process (all threads) and of its waited-for children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class _Clock:
    """Wraps module functions so that each call adds its CPU and wall seconds to a phase.  CPU is
    the calling thread's (LLVM runs on a thread of its own), for LLVM plus its helper process; a
    wrapped call inside another is taken out of the outer phase."""

    def __init__(self):
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.stack = threading.local()

    def wrap(self, module, attr: str, phase: str) -> None:
        fn = getattr(module, attr)

        def timed(*a, **k):
            stack = self.stack.__dict__.setdefault("s", [])
            # children (LLVM's helper process) count in the phase that waits for them only
            kids = _children if phase == "llvm" else (lambda: 0.0)
            c0, w0 = time.thread_time() + kids(), time.perf_counter()
            stack.append(phase)
            try:
                return fn(*a, **k)
            finally:
                stack.pop()
                c, w = time.thread_time() + kids() - c0, time.perf_counter() - w0
                self.cpu[phase] += c
                self.wall[phase] += w
                if stack:
                    self.cpu[stack[-1]] -= c
                    self.wall[stack[-1]] -= w
        setattr(module, attr, timed)


def _children() -> float:
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime


def child(model: str, size: str, profile: str | None, dump_ir: str | None) -> dict:
    """One cold measurement (run in a fresh process with an empty cache directory)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import importlib

    import numpy as np

    from tessera.codegen import jit as cj
    from tessera.codegen import x86 as cg
    from tessera.frontend import compile as fc
    from tessera.frontend import graphgen
    from tessera.frontend import jit as fj
    import tessera.passes.pipelines  # noqa: F401 - imports are not timed: the pass registry too
    mod = importlib.import_module(f"models.{MODELS[model]}")
    assert os.path.dirname(os.path.dirname(fc.__file__)) == os.path.join(ROOT, "tessera"), fc.__file__
    clock = _Clock()
    clock.wrap(fj, "trace", "trace")
    clock.wrap(graphgen, "build", "graphgen")
    clock.wrap(fc, "_run_passes", "passes")
    clock.wrap(cg, "translate", "translate")
    try:                             # LLVM on a thread, and on two cores (codegen/llvm_parallel.py)
        from tessera.frontend import cpu_codegen
        clock.wrap(cpu_codegen, "objects", "llvm")
    except ImportError:
        clock.wrap(cj, "emit_cpu", "llvm")
    clock.wrap(fc, "_materialize", "load")
    args, kwargs = mod.make(np.random.default_rng(0), **mod.SIZES[size])
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    c0, w0 = _cpu(), time.perf_counter()
    mod.forward(*args, **kwargs)
    cpu, wall = _cpu() - c0, time.perf_counter() - w0
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    if dump_ir:
        art = mod.forward.compile(*args, **kwargs)
        os.makedirs(dump_ir, exist_ok=True)
        with open(os.path.join(dump_ir, f"{model}-{size}.ll"), "w") as f:
            f.write(art.ir("llvm"))
        for layer, text in art.compiled.layer_ir.items():
            with open(os.path.join(dump_ir, f"{model}-{size}.{layer}.mlir"), "w") as f:
                f.write(text)
    other = cpu - sum(clock.cpu.values())
    return {"model": model, "size": size, "cpu": cpu, "wall": wall, "phases_cpu": clock.cpu,
            "compile_ms": mod.forward.compile(*args, **kwargs).compiled.meta["compile_ms"],
            "phases_wall": clock.wall, "other_cpu": other, "load_avg": os.getloadavg()}


def measure(model: str, size: str, profile: str | None = None, dump_ir: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="tessera-ctime-") as d:
        # this checkout's tessera (an installed one elsewhere would shadow it)
        path = os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH")) if x)
        env = dict(os.environ, TESSERA_CACHE_DIR=d, TESSERA_QUIET="1", PYTHONPATH=path)
        env.pop("TESSERA_NO_CACHE", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", model, "--size", size]
        if profile:
            cmd += ["--profile", profile]
        if dump_ir:
            cmd += ["--dump-ir", dump_ir]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"measurement of {model} failed:\n{p.stderr[-4000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])


def show(r: dict) -> str:
    la = "/".join(f"{x:.2f}" for x in r["load_avg"])
    parts = "  ".join(f"{k} {r['phases_cpu'][k]:.2f}/{r['phases_wall'][k]:.2f}" for k in PHASES)
    return (f"{r['model']} {r['size']}: first call cpu {r['cpu']:.2f} s, wall {r['wall']:.2f} s (load {la})\n"
            f"  per phase cpu/wall s: {parts}  other cpu {r['other_cpu']:.2f}\n"
            f"  compile_ms (wall; translate and llvm overlap the passes): {r.get('compile_ms')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="+", choices=sorted(MODELS))
    ap.add_argument("--size", default="small")
    ap.add_argument("--rounds", type=int, default=1, help="fresh processes per model; the minimum CPU is shown")
    ap.add_argument("--profile", help="write a cProfile of the first call here (one model, one round)")
    ap.add_argument("--dump-ir", help="write the generated LLVM IR into this folder")
    ap.add_argument("--json", action="store_true", help="print every round as a JSON line")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.model[0], a.size, a.profile, a.dump_ir)))
        return 0
    for m in a.model:
        rounds = [measure(m, a.size, a.profile, a.dump_ir) for _ in range(max(1, a.rounds))]
        for r in rounds:
            print(json.dumps(r) if a.json else show(r), flush=True)
        if len(rounds) > 1:
            best = min(rounds, key=lambda r: r["cpu"])
            print(f"  min over {len(rounds)}: cpu {best['cpu']:.2f} s, wall {min(r['wall'] for r in rounds):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
