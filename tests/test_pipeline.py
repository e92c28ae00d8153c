"""Pipeline strings are checked when parsed; the runner instruments and verifies every pass."""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from ir_samples import SAMPLES
from tessera.errors import IRVerifyError, TesseraError
from tessera.ir.text import parse_module, print_ir
from tessera.passes.base import TesseraPass
from tessera.passes.pipeline import parse_pipeline, run_pipeline

NEG_NEG = """func.func @f(%x : !tessera.tensor<[M, N], f32>) -> !tessera.tensor<[M, N], f32> {
  %a = tessera.neg %x : (!tessera.tensor<[M, N], f32>) -> !tessera.tensor<[M, N], f32>
  %b = tessera.neg %a : (!tessera.tensor<[M, N], f32>) -> !tessera.tensor<[M, N], f32>
  %c = tessera.exp %b : (!tessera.tensor<[M, N], f32>) -> !tessera.tensor<[M, N], f32>
  func.return %c : !tessera.tensor<[M, N], f32>
}
"""


@pytest.mark.parametrize("spec, code, words", [
    ("canonicalize{bogus=1}", "PIPELINE_UNKNOWN_OPTION", ["canonicalize", "bogus"]),
    ("lower-tile-to-x86{arch=znver4 threads=abc}", "PIPELINE_OPTION_TYPE", ["lower-tile-to-x86", "threads", "int"]),
    ("lower-tile-to-x86", "PIPELINE_MISSING_OPTION", ["lower-tile-to-x86", "arch"]),
    ("schedule-cpu{threads=2}", "PIPELINE_MISSING_OPTION", ["schedule-cpu", "arch"]),
    ("tessera-cpu", "PIPELINE_MISSING_OPTION", ["tessera-cpu", "arch"]),
    ("tessera-cpu{arch=znver4 register-tile=a,b}", "PIPELINE_OPTION_TYPE", ["register-tile"]),
    ("canonicalise", "PIPELINE_UNKNOWN_PASS", ["canonicalise", "canonicalize"]),
    ("canonicalize,fuse-rowwize", "PIPELINE_UNKNOWN_PASS", ["fuse-rowwise"]),
    ("canonicalize{", "PIPELINE_SYNTAX", ["malformed"]),
])
def test_bad_pipeline_fails_at_parse_time_with_ir_untouched(spec, code, words):
    module = parse_module(NEG_NEG)
    before = print_ir(module)
    with pytest.raises(TesseraError) as info:
        run_pipeline(module, parse_pipeline(spec))
    assert info.value.code == code, str(info.value)
    for w in words:
        assert w in str(info.value)
    assert print_ir(module) == before


def test_every_target_lowering_requires_arch():
    from tessera.passes.base import PASSES
    parse_pipeline("canonicalize")  # registers everything
    lowerings = [c for c in PASSES.values() if c.kind == "target-lowering"]
    assert lowerings
    for cls in lowerings:
        arch = next(o for o in cls.options() if o.field == "arch")
        assert arch.required and arch.default is None, cls.name


def test_instrumentation_changed_flag_and_census():
    unchanged = run_pipeline(parse_module(SAMPLES["tessera.exp"]), parse_pipeline("canonicalize"))
    assert [r.changed for r in unchanged.records] == [False]
    module = parse_module(NEG_NEG)
    run = run_pipeline(module, parse_pipeline("canonicalize"))
    rec = run.records[0]
    assert rec.changed
    assert rec.consumed == ["tessera.neg"] and rec.produced == []
    assert rec.census_before["tessera.neg"] == 2 and "tessera.neg" not in rec.census_after
    assert rec.ops_out == rec.ops_in - 2


@dataclass(frozen=True)
class _BreakTypes(TesseraPass):
    """A deliberately broken pass: makes a Graph IR op's declared result type wrong."""
    name = "test-break-types"

    def apply(self, ctx, module):
        from tessera.ir import graph as g
        for op in module.walk():
            if isinstance(op, g.ExpOp):
                op.results[0]._type = g.TensorType.of(["Q"], op.results[0].type.element_type)


def test_verification_runs_after_every_pass_by_default():
    with pytest.raises(IRVerifyError):
        run_pipeline(parse_module(NEG_NEG), [_BreakTypes()])
    run_pipeline(parse_module(NEG_NEG), [_BreakTypes()], verify_each=False)  # opt-out honoured


def test_dump_ir_writes_one_numbered_file_per_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_DUMP_IR", str(tmp_path))
    run_pipeline(parse_module(NEG_NEG), parse_pipeline("canonicalize,fuse-elementwise"))
    names = sorted(os.listdir(tmp_path))
    assert names == ["00-input.mlir", "01-canonicalize.mlir", "02-fuse-elementwise.mlir"]
    assert "tessera.fusion" in (tmp_path / "02-fuse-elementwise.mlir").read_text()


def test_named_pipeline_expands_to_real_passes():
    names = [p.name for p in parse_pipeline("tessera-cpu{arch=znver4}")]
    assert names == ["canonicalize", "fuse-attention", "fuse-dual-gemm", "fuse-matmul-epilogue", "fuse-row-reductions", "fuse-rowwise", "fuse-elementwise", "outline-kernels",
                     "fuse-multi-tensor", "schedule-cpu", "lower-schedule-to-tile", "lower-tile-to-x86"]


def test_string_options_that_are_not_bare_words_are_quoted_through_the_api(rng):
    """Regression: a pinned parallel='b*m' used to reach the pipeline parser unquoted."""
    import numpy as np
    import tessera as ts
    a = rng.standard_normal((3, 40, 30)).astype(np.float32)
    b = rng.standard_normal((30, 20)).astype(np.float32)
    f = ts.jit(lambda x, y: x @ y, schedule={"parallel": "b*m"})
    got = f(a, b)
    assert np.abs(got - a.astype(np.float64) @ b).max() < 1e-4
    assert ts.explain(f, a, b).kernels[0]["parallel"] == "b*m"
    assert 'parallel="b*m"' in ts.explain(f, a, b).pipeline
