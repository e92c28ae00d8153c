"""Packaging (issue 29): ``python -m build`` makes an sdist and a wheel; the wheel installed into a fresh
virtual environment runs ``tessera doctor`` and ``tessera demo`` with no source tree on the path.

The build runs ``--no-isolation`` (offline: it uses this environment's setuptools and ``build``,
from the ``test`` extra) on a copy of the checkout's files.  The fresh environment gets the wheel
only (``pip --python <venv> install --no-deps``); the heavy dependencies (xdsl, llvmlite, numpy,
...) are made visible by a ``.pth`` line naming this environment's site-packages (a plain path:
the editable install's finder there is not run), so nothing is downloaded.  Teeth: the same build
without the ``package-data`` table ships no ``calibration.json`` (the register-tile calibration
the selector would then silently lack), which the wheel check refuses.
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _needs_build():
    pytest.importorskip("build")
    import setuptools
    if int(setuptools.__version__.split(".")[0]) < 68:
        pytest.skip(f"setuptools {setuptools.__version__} < 68 (pyproject's build requirement); pip install -e .[test]")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the test builds from the checkout's files")


def _copy_checkout(dest: Path) -> Path:
    """The checkout's tracked and untracked-but-not-ignored files (what a commit would hold)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    for rel in filter(None, out.split("\0")):
        src = ROOT / rel
        if rel.startswith(".venv") or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    return dest


def _build(src: Path, outdir: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir)], cwd=src,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(list(outdir.glob("tessera-*.tar.gz"))) == 1        # the sdist; the wheel is built from it
    wheels = list(outdir.glob("tessera-*-py3-none-any.whl"))
    assert len(wheels) == 1, list(outdir.iterdir())
    return wheels[0]


def _wheel_problems(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry = next((z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    problems = [f"{n} missing" for n in ("tessera/__init__.py", "tessera/aotlib/xla_ffi.py",
                                          "tessera/mma/calibration.json", "tessera/tools/cli.py") if n not in names]
    if "tessera = tessera.tools.cli:main" not in entry:
        problems.append("no `tessera` console script")
    if "[torch_dynamo_backends]" not in entry:
        problems.append("no torch_dynamo_backends entry point")
    if any(n.startswith(("tests/", "examples/")) for n in names):
        problems.append("tests or examples packaged")
    return problems


def test_wheel_installs_into_a_fresh_venv_and_runs_doctor_and_demo(tmp_path):
    _needs_build()
    src = _copy_checkout(tmp_path / "src")
    wheel = _build(src, tmp_path / "dist")
    assert _wheel_problems(wheel) == []

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "tessera_test_deps.pth").write_text("".join(p + "\n" for p in deps))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.pop("VIRTUAL_ENV", None)
    run = lambda *cmd: subprocess.run([str(c) for c in cmd], cwd=tmp_path, env=env, capture_output=True,  # noqa: E731
                                      text=True, timeout=600)
    probe = run(py, "-c", "import json, os, sys, tessera; from tessera.mma import selector; "
                "print(tessera.__file__); print(bool(selector._calibration())); "
                "print(json.dumps([os.path.abspath(p) for p in sys.path]))")
    assert probe.returncode == 0, probe.stderr[-3000:]
    where, calibrated, path = probe.stdout.splitlines()[:3]
    assert where.startswith(purelib), where              # the installed copy, not a source tree
    # no source tree on the path: the only folder with a tessera package is the venv's own
    assert [p for p in json.loads(path) if Path(p, "tessera", "__init__.py").exists()] == [purelib]
    assert calibrated == "True"                          # calibration.json shipped and read

    doctor = run(venv / "bin" / "tessera", "doctor")
    assert doctor.returncode == 0 and "cpu-x86" in doctor.stdout, doctor.stdout[-2000:] + doctor.stderr[-2000:]
    demo = run(venv / "bin" / "tessera", "demo")
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "(OK)" in demo.stdout and "lane: cpu-x86" in demo.stdout, demo.stdout[-2000:]


def test_planted_missing_package_data_is_caught(tmp_path):
    """Teeth: without pyproject's package-data table the wheel lacks calibration.json."""
    _needs_build()
    src = _copy_checkout(tmp_path / "src")
    text = (src / "pyproject.toml").read_text()
    cut = text.replace('[tool.setuptools.package-data]\ntessera = ["mma/calibration.json"]\n', "")
    assert cut != text
    (src / "pyproject.toml").write_text(cut)
    assert _wheel_problems(_build(src, tmp_path / "dist")) == ["tessera/mma/calibration.json missing"]
