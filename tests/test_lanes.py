"""The lane map's gates, each with teeth (a deliberately broken pipeline makes it fail)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from option_injection import inject
from tessera.errors import TesseraError
from tessera.ir.text import parse_module, print_ir
from tessera.passes import pipelines as P
from tessera.passes.pipeline import parse_pipeline, run_pipeline
from tessera.tools import lanes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))


@pytest.fixture(scope="module")
def runs():
    return lanes.run_map()


# what each lane may refuse (with a coded error) — and nothing else
# f32 GEMM / attention: both need a reduced-precision math mode asked for (nvidia: tf32 with
# schedule={"math_mode": "tf32"}, tests/test_gpu_tf32.py; rocm: xf32, not lowered)
GPU_REFUSED = {"attention.mlir", "mlp.mlir"}
REFUSED = {"tessera-cpu": set(), "tessera-rocm": GPU_REFUSED, "tessera-nvidia": GPU_REFUSED}


def test_every_production_pipeline_traverses_all_four_layers_on_every_program(runs):
    prod = [v.name for v in lanes.pipelines() if v.production]
    assert prod and len(runs) == len(prod) * len(EXAMPLES)
    for r in runs:
        if r.program in REFUSED[r.pipeline]:
            assert r.refused.split(":")[0] in ("SCHEDULE_ILLEGAL", "MMA_SELECTOR"), (r.pipeline, r.program)
            continue
        assert not r.refused, (r.pipeline, r.program, r.refused)
        assert r.layers == ["graph", "schedule", "tile", "target"], (r.pipeline, r.program, r.layers)
    for name in prod:
        assert sum(1 for r in runs if r.pipeline == name and not r.refused) >= 2


def test_no_graph_schedule_or_tile_op_reaches_translation(runs):
    assert not lanes.run_flags(runs)["untranslatable"]
    for r in runs:
        if r.refused:
            continue
        assert not [o for o in r.passes[-1]["survivors"] if o.startswith(("tile.", "schedule.", "tessera."))]


def test_static_gates_hold_and_the_run_agrees_with_declarations(runs):
    sm = lanes.static_map()
    assert lanes.gate_violations(sm, runs) == []
    flags = lanes.run_flags(runs)
    assert flags["undeclared"] == [] and flags["noop_on_corpus"] == []
    assert sm.unused_passes == [] and sm.unread_options == []


def _broken(name: str, spec_fn) -> dict:
    np_ = P.NAMED["tessera-cpu"]
    return {name: P.NamedPipeline(name, "deliberately broken", np_.options, spec_fn, True, "x86", "avx512_bf16",
                                  np_.translation)}


def test_counting_gate_catches_a_pipeline_without_the_tile_lowering():
    broken = _broken("broken-no-lowering", lambda o: P._cpu(o).rsplit(",lower-tile-to-x86", 1)[0])
    viol = lanes.gate_violations(lanes.static_map(broken))
    assert any("tile.mma" in v and "consumed by 0" in v for v in viol), viol
    # and the run shows the same defect: tile ops survive to translation
    runs = lanes.run_map(named=broken)
    assert lanes.run_flags(runs)["untranslatable"]


def test_counting_gate_catches_two_lowerings_of_one_op():
    broken = _broken("broken-twice", lambda o: P._cpu(o) + f",lower-tile-to-x86{{arch={o['arch']}}}")
    viol = lanes.gate_violations(lanes.static_map(broken))
    assert any("tile.mma" in v and "consumed by 2" in v for v in viol), viol


def test_run_view_flags_a_false_declaration(runs, monkeypatch):
    from tessera.passes.target.x86.lower_tile_to_x86 import LowerTileToX86
    monkeypatch.setattr(LowerTileToX86, "produces", tuple(p for p in LowerTileToX86.produces
                                                          if p != "tessera_x86.vfma"))
    flags = lanes.run_flags(lanes.run_map())
    assert ("tessera-cpu", "lower-tile-to-x86", "produces", "tessera_x86.vfma") in flags["undeclared"]


def _census_layers(run_record) -> set[str]:
    """The layers whose ops appear in any census of a run, read from the pass records' survivors
    (independent of layers_traversed)."""
    from tessera.ir.context import layer_of
    return {layer_of(o) for p in run_record.passes for o in p["survivors"]} - {None}


def check_a_skipped_layer_is_reported() -> None:
    """A real pipeline without the target lowering (Graph -> Schedule -> Tile, then stop): the
    layers computed from its census stop at tile, and the gate says so; and a real run entering
    at Tile IR traverses only tile and target. The normal compile path reports all four."""
    broken = _broken("broken-no-target", lambda o: P._cpu(o).rsplit(",lower-tile-to-x86", 1)[0])
    runs = [r for r in lanes.run_map(named=broken) if not r.refused]
    assert runs
    for r in runs:
        assert r.layers == ["graph", "schedule", "tile"], (r.program, r.layers)
        assert "target" not in _census_layers(r)
    assert any("broken-no-target" in v and "not all four layers" in v
               for v in lanes.gate_violations(lanes.static_map(broken), runs))
    # entering at Tile IR: the census never holds a graph or schedule op
    from tessera.frontend.compile import layers_traversed
    tile_text = {}
    run_pipeline(parse_module((ROOT / "examples" / "mlp.mlir").read_text()),
                 parse_pipeline("tessera-cpu{arch=avx512_bf16}"),
                 after_pass=lambda p, m, rec, t: tile_text.setdefault("t", t) if p.name == "lower-schedule-to-tile"
                 else None)
    records = []
    run_pipeline(parse_module(tile_text["t"]), parse_pipeline("tessera-cpu{arch=avx512_bf16 input=tile}"),
                 after_pass=lambda p, m, rec, t: records.append(rec))
    assert layers_traversed(records[0].census_before, records) == ["tile", "target"]


def test_a_pipeline_that_skips_a_layer_is_reported(rng):
    check_a_skipped_layer_is_reported()
    x = rng.standard_normal((5, 33)).astype(np.float32)
    jf = ts.jit(lambda v: ts.ops.softmax(v) * 2.0)
    assert ts.explain(jf, x).layers == ["graph", "schedule", "tile", "target"]


def test_a_constant_layer_list_is_caught(monkeypatch):
    """Planted: layers_traversed returns the four layers whatever the census holds."""
    from tessera.frontend import compile as C
    from tessera.ir.context import LAYERS
    monkeypatch.setattr(C, "layers_traversed", lambda initial, records: list(LAYERS))
    with pytest.raises(AssertionError):
        check_a_skipped_layer_is_reported()


def test_target_lowerings_need_an_explicit_arch():
    with pytest.raises(TesseraError) as e:
        parse_pipeline("lower-schedule-to-tile,lower-tile-to-x86")
    assert e.value.code == "PIPELINE_MISSING_OPTION"
    for v in lanes.pipelines():
        for p in v.passes:
            if p.kind == "target-lowering":
                assert p.arch


@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.name not in REFUSED["tessera-cpu"]], ids=lambda p: p.name)
def test_entering_at_tile_ir_gives_byte_identical_target_ir(path):
    arch = "avx512_bf16"
    full = parse_module(path.read_text())
    tile_text = {}

    def keep(p, mod, rec, text):
        if p.name == "lower-schedule-to-tile":
            tile_text["t"] = text

    run_pipeline(full, parse_pipeline(f"tessera-cpu{{arch={arch}}}"), after_pass=keep)
    entered = parse_module(tile_text["t"])
    run_pipeline(entered, parse_pipeline(f"tessera-cpu{{arch={arch} input=tile}}"))
    assert print_ir(entered) == print_ir(full)
    # entering at the target layer runs no pass at all
    assert parse_pipeline(f"tessera-cpu{{arch={arch} input=target}}") == []


def test_option_injection_control(rng):
    spec = "tessera-cpu{arch=avx512_bf16}"
    module_text = (ROOT / "examples" / "mlp.mlir").read_text()

    def build(s: str) -> str:
        m = parse_module(module_text)
        run_pipeline(m, parse_pipeline(s))
        return print_ir(m)

    changed = inject(spec, "schedule-cpu", "register-tile", "3,2")
    assert build(changed) != build(spec), "a real option change must change the output"
    with pytest.raises(AssertionError):
        inject(spec, "no-such-pass", "x", "1")  # the substitution must hit exactly once


def test_strict_dispatch_fails_when_the_compiled_kernel_is_unavailable(rng):
    f = ts.jit(lambda x: ts.ops.exp(x) * 2.0)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    f(x)
    exe = f.compile(x).compiled.executable
    saved = dict(exe.fns)
    exe.fns.clear()
    before = len(ts.lane_log.entries)
    try:
        with pytest.raises(TesseraError) as e:
            f(x)
        assert e.value.code == "LANE_UNAVAILABLE"
        assert not [d for d in ts.lane_log.entries[before:] if d.lane == "reference"]
    finally:
        exe.fns.update(saved)
