#!/usr/bin/env bash
# One call on an NVIDIA GPU machine, from the repository root:
#   the device tests (tessera.jit(target="nvidia") launched on the GPU, checked against float64
#   and the warp emulator; the CUDA launcher), then nvidia_check.py over the prebuilt bundle
#   (numerics of every check cubin, GEMM timing against torch.matmul / cuBLAS), then
#   attention_bench.py (flash attention against torch's SDPA), attention_bwd_bench.py (its backward).  $OUT/commit.json records the commit
#   the run's code is (docs/gpu.md names it beside the figures).
# Prepare here first:  ./dev python benchmarks/gpu/build_nvidia_bundle.py --arch sm_90
# Where the machine lacks xDSL / llvmlite 0.50, carry them in .whl/ as wheels, or as an xz-packed
# site-packages tree (*.tar.xz; llvmlite's wheel alone nearly fills a 64 MiB transfer).
# --suite whole-models: only the model examples on target="nvidia" (benchmarks/gpu/models_bench.py; dry-run
# it here with --dry-run): checked against float64, timed against torch eager and torch.compile.
set -uo pipefail
SUITE=all
if [ "${1:-}" = "--suite" ]; then SUITE=${2:-all}; fi
OUT=${OUT:-/tmp/tessera-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
py=${PYTHON:-python3}
# the commit this run's code is: git's where the copy has .git, else the bundle's (built here, from this tree)
$py - "$OUT/commit.json" <<'PY'
import datetime, json, pathlib, subprocess, sys
rec = {"commit": "unknown", "dirty": None, "recorded": True,
       "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        rec.update(commit=head.stdout.strip(), dirty=bool(st.stdout.strip()), how="recorded by device_run.sh (git)")
except OSError:
    pass
m = pathlib.Path("benchmarks/gpu/bundle/manifest.json")
if rec["commit"] == "unknown" and m.exists():
    man = json.loads(m.read_text())
    rec.update(commit=man.get("commit", "unknown"), dirty=man.get("dirty"),
               how="recorded by device_run.sh from the bundle's manifest (build_nvidia_bundle.py, same tree)")
pathlib.Path(sys.argv[1]).write_text(json.dumps(rec, indent=1) + "\n")
print("commit", rec["commit"], "dirty" if rec["dirty"] else "")
PY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"
if [ -d .whl ]; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  for t in .whl/*.tar.xz; do [ -e "$t" ] && tar xJf "$t" -C /tmp/site; done   # a site-packages tree, xz-packed
  export PYTHONPATH="/tmp/site:$PWD"
fi
$py -c "import tessera, llvmlite, xdsl, numpy; from tessera.toolchain import find_ptxas; \
print('tessera imports; llvmlite', llvmlite.__version__, 'numpy', numpy.__version__, 'ptxas', find_ptxas())"
# --suite fp8: only the fp8 GEMM bundle (benchmarks/gpu/fp8_bench.py; dry-run it here with --dry-run)
if [ "$SUITE" = "fp8" ]; then
  timeout 280 $py benchmarks/gpu/fp8_bench.py --bundle benchmarks/gpu/fp8_bundle --out "$OUT" 2>&1 | tee "$OUT/fp8.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "$SUITE" = "whole-models" ]; then
  timeout 290 $py benchmarks/gpu/models_bench.py --out "$OUT" 2>&1 | tee "$OUT/models.log"
  exit "${PIPESTATUS[0]}"
fi
timeout 300 $py -m pytest -q -rs tests/test_nvidia_device.py tests/test_cuda_runtime.py 2>&1 | tee "$OUT/pytest.log"
timeout 200 $py benchmarks/gpu/nvidia_check.py --bundle benchmarks/gpu/bundle 2>&1 | tee "$OUT/check.log"
# device-resident calls (issue 30): torch CUDA tensors in and out of target="nvidia" (GEMM, graph replay, the
# demo block) against float64, zero copy (runtime copy counters, torch.profiler memcpy events, data_ptr
# identity), the caller's stream; writes $OUT/device_resident.json.  Dry-run here: --dry-run
timeout 240 $py benchmarks/gpu/device_resident.py --out "$OUT" 2>&1 | tee "$OUT/device_resident.log"
timeout 200 $py benchmarks/gpu/attention_bench.py 2>&1 | tee "$OUT/attention.log"
# the flash-attention backward kernel (dQ, dK, dV) against torch's SDPA backward; dry-run here: --dry-run
timeout 240 $py benchmarks/gpu/attention_bwd_bench.py 2>&1 | tee "$OUT/attention_bwd.log"
# the memory-bound kernels (rows, reductions, chains) when their bundle was carried
# (./dev python benchmarks/gpu/build_rows_bundle.py --arch sm_90 here): float64 / emulator checks, then
# 16384 x 8192 against torch and a device copy
if [ -f benchmarks/gpu/rows_bundle/manifest.json ]; then
  timeout 240 $py benchmarks/gpu/rows_bench.py --bundle benchmarks/gpu/rows_bundle 2>&1 | tee "$OUT/rows.log"
fi
# the Hopper lane (sm_90a wgmma GEMM) when its bundle was carried
# (./dev python benchmarks/gpu/build_hopper_bundle.py here): float64 / emulator checks of every
# wgmma cubin, then 4096^3, 8192^3 and 16384x1024x4096 against torch.matmul (cuBLAS), sm_90 mma.sync beside,
# and the copy_engine=tma rows (tensor maps encoded by the device's cuTensorMapEncodeTiled at launch)
if [ -f benchmarks/gpu/hopper_bundle/manifest.json ]; then
  timeout 280 $py benchmarks/gpu/nvidia_check.py --bundle benchmarks/gpu/hopper_bundle 2>&1 | tee "$OUT/hopper.log"
fi
# fp8 GEMM (scaled_matmul e4m3/e5m2, scales in the epilogue) when its bundle was carried
# (./dev python benchmarks/gpu/build_fp8_bundle.py here): float64 / emulator checks on sm_90a (wgmma
# m64nNk32) and sm_90 (mma.sync m16n8k32), then e4m3 4096^3, 8192^3, 16384x1024x4096 against torch._scaled_mm
if [ -f benchmarks/gpu/fp8_bundle/manifest.json ]; then
  timeout 240 $py benchmarks/gpu/fp8_bench.py --bundle benchmarks/gpu/fp8_bundle --out "$OUT" 2>&1 | tee "$OUT/fp8.log"
fi
