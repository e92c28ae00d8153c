"""tessera-opt end to end, as a user runs it (a subprocess)."""
from __future__ import annotations

import subprocess
import sys

from ir_samples import SAMPLES
from test_pipeline import NEG_NEG


def opt(*args, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "tessera.tools.opt", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def test_good_file_through_a_pipeline(tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(NEG_NEG)
    out = tmp_path / "out.mlir"
    p = opt(str(src), "--pass-pipeline=canonicalize", "-o", str(out), "--print-ir-after-change")
    assert p.returncode == 0, p.stderr
    assert "tessera.neg" not in out.read_text() and "tessera.exp" in out.read_text()
    assert "IR Dump After canonicalize" in p.stderr


def test_full_cpu_pipeline_reaches_target_ir(tmp_path):
    src = tmp_path / "mm.mlir"
    src.write_text(SAMPLES["tessera.matmul"])
    p = opt(str(src), "--pass-pipeline=tessera-cpu{arch=znver4}")
    assert p.returncode == 0, p.stderr
    assert "tessera_x86.vfma" in p.stdout and "tile." not in p.stdout


def test_malformed_file_reports_position_without_traceback(tmp_path):
    src = tmp_path / "bad.mlir"
    src.write_text("func.func @f(%y : !tessera.tensor<[M], f32>) {\n  %x = tessera.exp %y %y : "
                   "(!tessera.tensor<[M], f32>) -> !tessera.tensor<[M], f32>\n}\n")
    p = opt(str(src))
    assert p.returncode == 1
    assert p.stderr.startswith(f"{src}:2:") and "error[IR_PARSE]" in p.stderr
    assert "Traceback" not in p.stderr


def test_verifier_failure_reports_the_op_location(tmp_path):
    src = tmp_path / "v.mlir"
    src.write_text(SAMPLES["tessera.softmax"].replace("axis = -1", "axis = 5"))
    p = opt(str(src))
    assert p.returncode == 1
    assert p.stderr.startswith(f"{src}:2:3: error[GRAPH_ATTRIBUTE]"), p.stderr
    assert "Traceback" not in p.stderr


def test_unknown_op_and_bad_pipeline():
    p = opt(stdin='func.func @f() {\n  %z = foo.bar : i32\n}\n')
    assert p.returncode == 1 and "<stdin>:2:" in p.stderr and "foo.bar" in p.stderr
    p = opt("--pass-pipeline=lower-tile-to-x86", stdin=NEG_NEG)
    assert p.returncode == 1 and "error[PIPELINE_MISSING_OPTION]" in p.stderr and "arch" in p.stderr
    assert "Traceback" not in p.stderr


def test_list_passes_shows_options_types_and_defaults():
    p = opt("--list-passes")
    assert p.returncode == 0
    assert "lower-tile-to-x86" in p.stdout and "arch: str (required)" in p.stdout
    assert "threads: int (default=0)" in p.stdout
    assert "tessera-cpu" in p.stdout and "expands to:" in p.stdout
