"""AMX (tdpbf16ps) on the CPU lane: selection, Target IR and machine code everywhere;
numerics against float64 where the host has AMX and Linux grants the tile state.

Inputs are bf16, so float64 products of the bf16 values are the oracle: with an f32
result only the f32 summation rounds (< 1e-5), with a bf16 result the final rounding
dominates (< 1e-2).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera import host
from tessera.errors import TesseraError
from tessera.mma.selector import get_isa, register_tile, select_mma
from tessera.mma.x86 import host_cpu
from tessera.passes.target.x86.lower_tile_to_x86 import _Lowerer
from tessera.passes.tile.kernels import gemm

BF16 = ml_dtypes.bfloat16
HAS_AMX = {"amx-tile", "amx-bf16"} <= host_cpu()[1] and host.amx_refusal() is None
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="host has no AMX (or Linux refuses the tile state)")


def rnd(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def mm32(x, w):
    return ts.ops.matmul(x, w, out_dtype=np.float32)


def test_selector_prefers_amx_where_the_chip_has_it():
    for arch in ("sapphirerapids", "graniterapids", "amx"):
        isa = get_isa("x86", arch)
        sel = select_mma(isa, "bf16", out_dtype="f32", lowering="lower-tile-to-x86")
        assert sel.record.id == "x86.amx.bf16"
        rt = register_tile(isa, sel)
        assert (rt.mr, rt.nr, rt.registers) == (2, 2, 8)   # 4 accumulators + 2 A + 2 B = the 8 tmm registers
    for arch in ("znver4", "cooperlake", "avx512_bf16"):
        assert select_mma(get_isa("x86", arch), "bf16", out_dtype="f32").record.id == "x86.avx512_bf16.dpbf16ps"
    # f32 is unaffected: the vector FMA
    assert select_mma(get_isa("x86", "sapphirerapids"), "f32").record.family == "fma"


def test_register_tiles_outside_the_tile_file_are_refused():
    isa = get_isa("x86", "sapphirerapids")
    sel = select_mma(isa, "bf16", out_dtype="f32")
    with pytest.raises(TesseraError) as e:
        register_tile(isa, sel, prefer_tile=(3, 2))
    assert "11 tile registers" in str(e.value) and "2x2" in str(e.value)


def test_amx_lowering_compiles_on_any_host(rng):
    # compiling for an AMX chip needs no AMX here: nothing runs
    a, b = rnd(rng, 70, 100), rnd(rng, 100, 40)
    art = ts.compile(lambda x, w: x @ w, a, b, arch="sapphirerapids")
    assert "acc, row_major, amx>" in art.ir("tile") and "b, vnni, amx>" in art.ir("tile")
    assert "kblock = 32" in art.ir("tile")      # B packed in pairs, padded to the instruction's k
    target = art.ir("target")
    for op in ("tessera_x86.tzero", "tessera_x86.tload", "tessera_x86.tdp", "tessera_x86.tstore"):
        assert op in target
    asm = art.asm()
    for ins in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored"):
        assert ins in asm, ins
    report = ts.explain(ts.jit(lambda x, w: x @ w, arch="sapphirerapids"), a, b) if HAS_AMX else None
    if report is not None:
        assert report.kernels[0]["mma"]["mnemonic"] == "tdpbf16ps"


@needs_amx
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 13, 31), (31, 127, 7), (127, 1000, 33), (1025, 31, 129),
                                   (33, 1025, 1023)])
def test_amx_matmul_matches_float64(rng, m, k, n):
    a, b = rnd(rng, m, k), rnd(rng, k, n)
    ref = O.f64(a) @ O.f64(b)
    y32 = ts.jit(mm32)(a, b)
    assert y32.dtype == np.float32
    O.assert_close(y32, ref, 1e-5)
    y = ts.jit(lambda x, w: x @ w)(a, b)
    assert y.dtype == BF16
    O.assert_close(y, ref, 1e-2)


@needs_amx
def test_one_compile_serves_every_shape(rng):
    jf = ts.jit(mm32)
    seen = set()
    for m, k, n in [(5, 40, 17), (300, 77, 64), (64, 64, 1000)]:
        a, b = rnd(rng, m, k), rnd(rng, k, n)
        O.assert_close(jf(a, b), O.f64(a) @ O.f64(b), 1e-5)
        seen.add(id(jf.compile(a, b).compiled))
    assert len(seen) == 1, "one compiled AMX kernel serves every size"


@needs_amx
def test_amx_epilogue_batch_and_incoming_accumulator(rng):
    x, w, bias = rnd(rng, 3, 50, 96), rnd(rng, 96, 70), rng.standard_normal(70).astype(np.float32)
    y = ts.jit(lambda x, w, b: ts.ops.gelu(mm32(x, w) + b))(x, w, bias)
    O.assert_close(y, O.gelu_tanh(O.f64(x) @ O.f64(w) + bias), 1e-5)
    c0 = rng.standard_normal((50, 70)).astype(np.float32) * 10
    y = ts.jit(lambda x, w, c: mm32(x, w) + c)(x[0], w, c0)
    O.assert_close(y, O.f64(x[0]) @ O.f64(w) + c0, 1e-5)


@needs_amx
def test_amx_agrees_with_the_vector_dot_product(rng):
    # same k order, same pairwise rounding: the two bf16 instructions give the same bits
    a, b = rnd(rng, 45, 300), rnd(rng, 300, 50)
    amx = ts.jit(mm32)(a, b)
    vec = ts.jit(mm32, schedule={"mma_shape": (1, 16, 2)})(a, b)
    O.assert_close(amx, vec, 1e-6)


@needs_amx
def test_misplaced_b_tiles_are_caught(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b = rnd(rng, 40, 64), rnd(rng, 64, 48)
    ref = O.f64(a) @ O.f64(b)
    O.assert_close(ts.jit(mm32)(a, b), ref, 1e-5)
    orig = _Lowerer._amx_pack

    def planted(self, op, vv, bld):  # B tiles in the wrong column order
        orig(self, op, vv, bld)
        r = self.vmap[op.result]
        if op.result.type.role.data == "b":
            r.rows[0].reverse()

    monkeypatch.setattr(_Lowerer, "_amx_pack", planted)
    assert not O.gate(ts.jit(mm32)(a, b), ref, 1e-5)


@needs_amx
def test_unpadded_k_panels_are_caught(rng, monkeypatch):
    # K = 40 is not a multiple of the instruction's 32: B must be zero-padded to 64 in every panel
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b = rnd(rng, 64, 40), rnd(rng, 40, 80)
    ref = O.f64(a) @ O.f64(b)
    O.assert_close(ts.jit(mm32)(a, b), ref, 1e-5)
    orig = gemm.generate

    def planted(kop, plan, cfg):
        fn, *rest = orig(kop, plan, cfg)
        for op in fn.walk():
            if op.name == "tile.async_copy" and "kblock" in op.attributes:
                del op.attributes["kblock"]  # pack B only to whole pairs
        return (fn, *rest)

    monkeypatch.setattr(gemm, "generate", planted)
    assert not O.gate(ts.jit(mm32)(a, b), ref, 1e-5)


def test_refused_tile_state_is_a_coded_error_not_sigill(rng, monkeypatch):
    a, b = rnd(rng, 32, 32), rnd(rng, 32, 32)
    jf = ts.jit(mm32, arch="sapphirerapids")
    # a CPU that has AMX but whose Linux refuses the tile state (a CPU without AMX is refused
    # earlier, for its missing features: test_cpu_edges)
    monkeypatch.setattr(host, "missing_features", lambda wanted: ())
    monkeypatch.setattr(host, "amx_refusal", lambda: "planted: no tile state")
    with pytest.raises(TesseraError) as e:
        jf(a, b)
    assert e.value.code == "LANE_UNAVAILABLE" and "AMX" in str(e.value)


@needs_amx
def test_amx_transposed_operands(rng):
    # transposed views fold into the packing (A and B panels from strided reads)
    a, b = rnd(rng, 70, 45), rnd(rng, 33, 70)        # (a^T) @ (b^T): 45 x 70 @ 70 x 33
    y = ts.jit(lambda x, w: mm32(x.T, w.T))(a, b)
    O.assert_close(y, O.f64(a).T @ O.f64(b).T, 1e-5)


@pytest.mark.parametrize("made_for, family, arch, mnemonic, missing", [
    ("znver4", "avx512_bf16", "x86-64-v4", "vdpbf16ps", "avx512bf16"),
    ("sapphirerapids", "amx", "znver4", "tdpbf16ps", "amx-bf16, amx-tile")])
def test_tile_ir_for_an_instruction_the_arch_lacks_is_refused(rng, made_for, family, arch, mnemonic, missing):
    """lower-tile-to-x86 takes tile.mma's instruction and its required features from the selected
    record: Tile IR made for a chip with the instruction (Sapphire Rapids: AMX; Zen 4: vdpbf16ps),
    lowered for one without, is refused with the record's mnemonic and the missing features,
    before LLVM (which aborts the process on such an intrinsic) sees it."""
    from tessera.errors import MmaSelectorError
    from tessera.ir.text import parse_module
    from tessera.passes.pipeline import parse_pipeline, run_pipeline
    x, w = rnd(rng, 64, 64), rnd(rng, 64, 64)
    tile_ir = ts.compile(mm32, x, w, arch=made_for).ir("tile")
    assert f", {family}>" in tile_ir
    with pytest.raises(MmaSelectorError, match=f"{mnemonic} .* needs {missing}, which this arch lacks"):
        run_pipeline(parse_module(tile_ir), parse_pipeline(f"lower-tile-to-x86{{arch={arch}}}"))
    run_pipeline(parse_module(tile_ir), parse_pipeline(f"lower-tile-to-x86{{arch={made_for}}}"))   # the right arch
