"""The ROCm lane: @tessera.jit -> Graph -> Schedule -> Tile -> tessera_rocm -> AMDGPU code object,
numerics proven by the wave emulator, refusals, runtime honesty — each with teeth."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from gpu_common import SHAPES, batched, check_relu_propagates_nan, drop_c0, gemm_acc, gemm_epilogue, gelu64, inputs, oracle_acc, rel_err, rounding_model
from tessera.codegen import hsaco
from tessera.errors import (
    EmulatorRaceError,
    LaneUnavailableError,
    LLVMAbortError,
    MmaSelectorError,
    TesseraError,
    UnknownArchError,
    UnloweredOpsError,
)
from tessera.mma.selector import get_isa, select_mma
from tessera.toolchain import find_llvm_tool

ARCHS = ["gfx1100", "gfx1151", "gfx1201", "gfx90a", "gfx942", "gfx950"]
# the instruction each arch family runs (K per instruction, for the rounding model)
FAMILY = {"gfx1100": ("v_wmma_f32_16x16x16", 16), "gfx1151": ("v_wmma_f32_16x16x16", 16),
          "gfx1201": ("v_wmma_f32_16x16x16", 16), "gfx90a": ("v_mfma_f32_16x16x16", 16),
          "gfx942": ("v_mfma_f32_16x16x16", 16), "gfx950": ("v_mfma_f32_16x16x16", 16)}
MACH = {"gfx1100": 0x41, "gfx1151": 0x4A, "gfx1201": 0x4E, "gfx90a": 0x3F, "gfx942": 0x4C, "gfx950": 0x4F}
needs_lld = pytest.mark.skipif(find_llvm_tool("ld.lld") is None, reason="ld.lld >= 19 not installed")
pytestmark = needs_lld


def _compile(fn, args, arch, **schedule):
    return ts.compile(fn, *args, target="rocm", arch=arch, schedule=schedule or None)


# --------------------------------------------------------------------------- code objects
@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a == "gfx1100" else a for a in ARCHS])
def test_code_object_for_every_arch(arch, rng):
    a, b, c0 = inputs(rng, "f16", 70, 72, 48)
    art = _compile(gemm_acc, (a, b, c0), arch)
    blob = art.binary()
    info = hsaco.inspect(blob)
    assert blob[:4] == b"\x7fELF" and info.machine == 224
    assert info.e_flags & 0xFF == MACH[arch] and info.arch == arch
    k = info.kernels[0]
    assert f"{k.name}.kd" in info.descriptors and info.metadata       # kernel descriptor + metadata note
    mnemonic = FAMILY[arch][0]
    assert mnemonic in art.asm()                                         # LLVM's own assembly (all archs)
    abi = art.abi()[0]
    assert abi["symbol"] == k.name and abi["block"][0] == k.max_workgroup_size
    assert [p["offset"] for p in abi["params"]] == [x["offset"] for x in k.args]
    assert k.group_segment >= abi["shared_bytes"] > 0
    assert k.wavefront_size == (64 if arch.startswith("gfx9") else 32)
    # llvm-objdump's disassembly where a system LLVM new enough for the arch has one, else LLVM's
    # listing, matched against the object's metadata first
    text, _source = hsaco.disassembly(blob, arch, art.asm())
    assert re.search(mnemonic, text)


@pytest.mark.parametrize("arch", ["gfx1151", "gfx1201", "gfx942"])
def test_the_emitted_instruction_is_the_selected_records_for_each_dtype(arch, rng):
    """f16 and bf16 are different instructions of one shape: the code must hold the record's."""
    for dtype in ("f16", "bf16"):
        a, b, c0 = inputs(rng, dtype, 70, 72, 48)
        art = _compile(gemm_acc, (a, b, c0), arch)
        mnemonic = art.report().kernels[0]["mma"]["mnemonic"]
        assert mnemonic.endswith(f"_{dtype}")
        ops = set(re.findall(r"v_(?:wmma|mfma)_\w+", art.asm()))
        assert ops == {mnemonic}, ops


def test_lane_report_names_instruction_lds_and_vgprs(rng):
    a, b, c0 = inputs(rng, "f16", 64, 64, 32)
    rep = _compile(gemm_acc, (a, b, c0), "gfx1151").report()
    assert rep.lane == "rocm-gfx1151" and rep.layers == ["graph", "schedule", "tile", "target"]
    k = rep.kernels[0]
    assert k["mma"]["record"] == "rocm.wmma.16x16x16.f16.gfx11.w32"
    assert k["mma"]["lowered_by"] == "lower-tile-to-rocm"
    assert k["lds_bytes"] > 0 and k["vgprs"] > 0 and k["wavefront_size"] == 32
    assert "rocm.wmma" in str(rep)


# --------------------------------------------------------------------------- numerics (emulator)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_emulated_gemm_with_c0_matches_float64_and_the_rounding_model(arch, dtype, rng):
    art = None
    for m, n, k in SHAPES:
        a, b, c0 = inputs(rng, dtype, m, n, k)
        art = art or _compile(gemm_acc, (a, b, c0), arch)
        got = art.emulate(a, b, c0)
        assert got.dtype == np.float32 and got.shape == (m, n)
        assert rel_err(got, oracle_acc(a, b, c0)) < 1e-2
        model = rounding_model(a, b, c0, FAMILY[arch][1])
        ulps = np.abs(got.view(np.int32).astype(np.int64) - model.view(np.int32).astype(np.int64))
        assert ulps.max() <= 1 and (ulps == 0).mean() > 0.999, (m, n, k, ulps.max())


@pytest.mark.parametrize("arch", ["gfx1151", pytest.param("gfx1201", marks=pytest.mark.slow), "gfx942"])
def test_emulated_bias_gelu_epilogue_in_f16(arch, rng):
    m, n, k = 70, 50, 40
    a, b, _ = inputs(rng, "f16", m, n, k)
    bias = rng.standard_normal(n).astype(np.float16)
    art = _compile(gemm_epilogue, (a, b, bias), arch)
    got = art.emulate(a, b, bias)
    assert got.dtype == np.float16
    want = gelu64(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64))
    assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("arch", [pytest.param("gfx1100", marks=pytest.mark.slow), "gfx90a"])
def test_emulated_batched_gemm(arch, rng):
    a, b, c0 = inputs(rng, "bf16", 37, 29, 23, batch=(3,))
    got = _compile(batched, (a, b, c0), arch).emulate(a, b, c0)
    x = oracle_acc(a, b, c0)
    assert got.shape == (3, 37, 29) and rel_err(got, x / (1 + np.exp(-x))) < 1e-2


def test_mfma_32x32x8_through_the_selector_pin(rng):
    a, b, c0 = inputs(rng, "f16", 70, 72, 48)
    art = _compile(gemm_acc, (a, b, c0), "gfx942", mma_shape=(32, 32, 8), register_tile=(1, 1))
    assert "v_mfma_f32_32x32x8_f16" in art.asm()
    assert "tessera_rocm.mfma \"32x32x8\"" in art.ir("target")
    got = art.emulate(a, b, c0)
    model = rounding_model(a, b, c0, 8)
    assert rel_err(got, oracle_acc(a, b, c0)) < 1e-2 and np.abs(got - model).max() <= 1e-5 * np.abs(model).max()


def test_preferred_shape_changes_the_tile_ir(rng):
    a, b, c0 = inputs(rng, "f16", 64, 64, 32)
    t16 = _compile(gemm_acc, (a, b, c0), "gfx90a").ir("tile")
    t32 = _compile(gemm_acc, (a, b, c0), "gfx90a", mma_shape=(32, 32, 8), register_tile=(1, 1)).ir("tile")
    assert "!tile.fragment<16, 16, 16" in t16 and "!tile.fragment<32, 32, 8" in t32


def test_relu_epilogue_propagates_nan_like_numpy(rng):
    check_relu_propagates_nan(rng, lambda fn, args: _compile(fn, args, "gfx1151"))


# --------------------------------------------------------------------------- teeth
@pytest.mark.slow   # the warp/wave emulator: 7-15 s (CI runs -m slow)
def test_teeth_a_lane_swap_in_the_lowering_fails(rng, monkeypatch):
    from tessera.passes.target.gpu.simt import Item, OperandMap
    from tessera.passes.target.rocm import lower_tile_to_rocm as R
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b, c0 = inputs(rng, "f16", 32, 32, 16)
    good = _compile(gemm_acc, (a, b, c0), "gfx1151").emulate(a, b, c0)
    assert rel_err(good, oracle_acc(a, b, c0)) < 1e-2
    orig = R.Wmma11.build

    def swapped(self, b_, lane):
        orig(self, b_, lane)
        # lanes l and l^1 exchange their A rows: row = (l % 16) ^ 1
        l16 = self.a.items[0].rbase
        flipped = b_.sub(b_.add(l16, 1), b_.mul(b_.rem(l16, 2), 2))
        self.a = OperandMap([Item(flipped, it.rdelta, it.cbase, it.cdelta, it.calign) for it in self.a.items],
                            self.a.parts)
    monkeypatch.setattr(R.Wmma11, "build", swapped)
    bad = _compile(gemm_acc, (a, b, c0), "gfx1151").emulate(a, b, c0)
    assert rel_err(bad, oracle_acc(a, b, c0)) > 0.05


def test_teeth_dropping_c0_fails(rng, monkeypatch):
    drop_c0(monkeypatch)
    a, b, c0 = inputs(rng, "f16", 33, 29, 37)
    got = _compile(gemm_acc, (a, b, c0), "gfx942").emulate(a, b, c0)
    assert rel_err(got, oracle_acc(a, b, c0)) > 0.05


def test_teeth_a_missing_barrier_is_a_race(rng, monkeypatch):
    from tessera.passes.target.gpu import simt
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(simt.SimtLowerer, "op_tile_barrier", lambda self, op, b: None)
    a, b, c0 = inputs(rng, "f16", 64, 64, 64)
    with pytest.raises(EmulatorRaceError):
        _compile(gemm_acc, (a, b, c0), "gfx1201").emulate(a, b, c0)


def test_teeth_an_unmasked_edge_is_caught_out_of_bounds(rng, monkeypatch):
    from tessera.passes.target.gpu import simt
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    orig = simt.SimtLowerer.op_tile_view

    def unmasked(self, op, b):
        orig(self, op, b)
        v = self.vmap[op.result]
        if v.base.type.space.data == "global":
            v.full = True   # forget the valid extent
    monkeypatch.setattr(simt.SimtLowerer, "op_tile_view", unmasked)
    a, b, c0 = inputs(rng, "f16", 33, 29, 37)
    with pytest.raises(TesseraError) as e:
        _compile(gemm_acc, (a, b, c0), "gfx90a").emulate(a, b, c0)
    assert e.value.code == "EMULATE_OUT_OF_BOUNDS"


# --------------------------------------------------------------------------- refusals
def test_arch_is_required_and_wave_size_comes_from_the_arch():
    with pytest.raises(UnknownArchError, match="explicit arch"):
        ts.jit(lambda a, b: a @ b, target="rocm")
    with pytest.raises(MmaSelectorError, match="wave64"):
        select_mma(get_isa("rocm", "gfx942"), "f16", wave=32)
    assert select_mma(get_isa("rocm", "gfx1151"), "f16").record.lanes == 32
    assert select_mma(get_isa("rocm", "gfx942"), "f16").record.lanes == 64


@pytest.mark.parametrize("arch,family,legal", [("gfx1151", "mfma", "wmma"), ("gfx942", "wmma", "mfma")])
def test_illegal_family_is_refused_naming_arch_and_what_is_legal(arch, family, legal, rng):
    a, b, c0 = inputs(rng, "f16", 32, 32, 16)
    with pytest.raises(MmaSelectorError) as e:
        _compile(gemm_acc, (a, b, c0), arch, mma_family=family)
    assert arch in e.value.message and family in e.value.message and legal in e.value.message


def test_fp8_wmma_on_gfx1151_is_refused_and_f32_needs_a_math_mode(rng):
    with pytest.raises(MmaSelectorError, match="gfx1151.*f8e4m3fn.*legal dtypes"):
        select_mma(get_isa("rocm", "gfx1151"), "f8e4m3fn")
    assert select_mma(get_isa("rocm", "gfx1201"), "f8e4m3fn").record.family == "wmma"
    x = rng.standard_normal((16, 16)).astype(np.float32)
    with pytest.raises(MmaSelectorError, match="math_mode"):
        ts.compile(lambda a, b: a @ b, x, x, target="rocm", arch="gfx942")


def test_target_ir_with_an_illegal_instruction_is_refused_before_llvm():
    from tessera.codegen import amdgpu
    from tessera.ir.text import parse_module
    text = '''func.func @k(%a : vector<4xf16>, %c : vector<16xf32>) attributes {gpu.kernel = "lds", gpu.block = 64 : i64} {
  %d = tessera_rocm.mfma "32x32x8" %a, %a, %c {arch = "gfx1151"} : vector<4xf16>, vector<4xf16>, vector<16xf32> -> vector<16xf32>
  func.return
}'''
    with pytest.raises(MmaSelectorError, match="gfx1151 has no mfma"):
        amdgpu.translate(parse_module(text), "gfx1151")


def test_llvm_abort_becomes_an_error_not_a_dead_process():
    ir_text = ('declare <16 x float> @llvm.amdgcn.mfma.f32.32x32x8f16(<4 x half>, <4 x half>, <16 x float>, i32, '
               'i32, i32)\ndefine amdgpu_kernel void @k(<4 x half> %a, ptr addrspace(1) %o) {\n'
               '  %r = call <16 x float> @llvm.amdgcn.mfma.f32.32x32x8f16(<4 x half> %a, <4 x half> %a, '
               '<16 x float> zeroinitializer, i32 0, i32 0, i32 0)\n  store <16 x float> %r, ptr addrspace(1) %o\n'
               '  ret void\n}\n')
    with pytest.raises(LLVMAbortError):
        hsaco.compile_object(ir_text, "gfx1151")


def test_a_pipeline_missing_the_tile_lowering_fails_at_translation():
    from tessera.codegen import amdgpu
    from tessera.ir.text import parse_module
    from tessera.passes.pipeline import parse_pipeline, run_pipeline
    from tessera.passes.pipelines import NAMED
    from pathlib import Path
    spec = NAMED["tessera-rocm"].expand({"arch": "gfx1151"}).rsplit(",lower-tile-to-rocm", 1)[0]
    m = parse_module((Path(__file__).parent.parent / "examples" / "f16_mlp_accumulate.mlir").read_text())
    run_pipeline(m, parse_pipeline(spec))
    with pytest.raises(UnloweredOpsError) as e:
        amdgpu.translate(m, "gfx1151")
    assert "tile.mma" in e.value.message and "lower-tile-to-rocm" in e.value.message


# --------------------------------------------------------------------------- runtime honesty
def test_calling_without_a_rocm_device_raises_and_runs_no_other_lane(rng):
    from tessera.runtime.lanes import LOG
    a, b, c0 = inputs(rng, "f16", 32, 32, 16)
    f = ts.jit(gemm_acc, target="rocm", arch="gfx1151")
    before = len(LOG.entries)
    with pytest.raises(LaneUnavailableError, match="rocm-gfx1151"):
        f(a, b, c0)
    assert LOG.entries[before:] == []           # nothing ran: no lane is recorded as having run
    with pytest.raises(LaneUnavailableError):
        ts.jit(gemm_acc, target="rocm", arch="gfx1151", strict=False)(a, b, c0)


def test_tessera_opt_runs_the_rocm_pipeline():
    from pathlib import Path
    from tessera.tools.opt import main
    import contextlib
    import io
    src = Path(__file__).parent.parent / "examples" / "bf16_gemm.mlir"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(src), "--pass-pipeline", "tessera-rocm{arch=gfx1201}"])
    assert rc in (0, None) and "tessera_rocm.wmma" in out.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main([str(src), "--pass-pipeline", "tessera-rocm"])   # arch is required
    assert rc != 0 and "PIPELINE_MISSING_OPTION" in err.getvalue()


def test_hip_launcher_without_hip_python_and_its_argument_block():
    import struct
    from tessera.runtime import hip
    ok, why = hip.device_available()
    if ok:
        pytest.skip("a ROCm device is present")
    assert "hip" in why.lower() or "rocm" in why.lower()
    with pytest.raises(LaneUnavailableError, match="hip-python"):
        hip.HipModule(b"\x7fELF")
    blob = hip.pack_args([0x1000, 0x2000], [70, -1])
    assert len(blob) == 32 and struct.unpack("<QQqq", blob) == (0x1000, 0x2000, 70, -1)
