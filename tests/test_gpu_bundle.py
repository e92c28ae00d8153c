"""The NVIDIA check bundle: built here, checked by the same script the GPU machine runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tessera.toolchain import find_ptxas

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle")
    subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/build_nvidia_bundle.py"), "--arch", "sm_90",
                    "--out", str(out), "--size", "256"], check=True, capture_output=True, timeout=600)
    return out


def _check(bundle: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/nvidia_check.py"), "--dry-run", "--bundle",
                           str(bundle)], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_bundle_is_complete_and_its_numerics_hold(bundle):
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["arch"] == "sm_90" and {c["kind"] for c in m["cases"]} == {"check", "bench"}
    for c in m["cases"]:
        assert (bundle / c["cubin"]).read_bytes()[:4] == b"\x7fELF"
        assert c["block"] == [256, 1, 1] and len(c["grid"]) == 3 and c["spill_bytes"] <= 32   # see test_nvidia
    r = _check(bundle)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok") == sum(c["kind"] == "check" for c in m["cases"])


@pytest.mark.slow   # the warp/wave emulator: 6-15 s (CI runs -m slow)
def test_teeth_a_wrong_emulator_output_fails_the_check(bundle, tmp_path):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    case = next(c for c in json.loads((bad / "manifest.json").read_text())["cases"] if c["kind"] == "check")
    e = np.load(bad / case["emulated"])
    e[0, 0] += 1.0
    np.save(bad / case["emulated"], e)
    r = _check(bad)
    assert r.returncode == 1 and "FAIL" in r.stdout
