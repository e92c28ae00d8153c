"""fp8 (OCP e4m3 = ml_dtypes.float8_e4m3fn, e5m2 = float8_e5m2) GEMM with per-tensor scales in
the epilogue: the front door's dtype rules and coded errors, the CPU lane (fp8 decoded to f32
while packing), sm_90a ``wgmma m64nNk32`` (both operands K-major) and sm_89+ ``mma.sync
m16n8k32`` — PTX assembled by ptxas, SASS instructions, registers — and the emulated kernels
against float64 of the dequantised inputs, each with planted bugs that fail."""
from __future__ import annotations

import ctypes
import re

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.codegen import ptx_tools
from tessera.errors import Fp8OperandError, MmaSelectorError, ScaleError, TargetVerifyError
from tessera.frontend.scaled import reference
from tessera.mma.selector import get_isa, select_mma
from tessera.toolchain import find_nvdisasm, find_ptxas

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
FMT = {"e4m3": E4M3, "e5m2": E5M2}
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc)")
needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (./dev installs it)")


def _fp8(rng, shape, fmt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(FMT[fmt])


def _scaled(a, b, s, bias):
    """relu(scaled_matmul(a, b, s, 0.5, bias)): a runtime scale and a compiled-in one."""
    return ts.ops.relu(ts.ops.scaled_matmul(a, b, s, 0.5, bias=bias))


def _want(a, b, s, bias):
    return np.maximum(float(s) * 0.5 * (a.astype(np.float64) @ b.astype(np.float64)) + bias, 0)


def rel(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def _gpu(fn, args, arch, **schedule):
    return ts.compile(fn, *args, target="nvidia", arch=arch, schedule=schedule or None)


# --------------------------------------------------------------------------- selection
def test_fp8_records_are_selected_where_lowered_and_refused_elsewhere():
    low = "lower-tile-to-nvidia"
    for dt_ in ("f8e4m3fn", "f8e5m2"):
        sel = select_mma(get_isa("nvidia", "sm_90a"), dt_, out_dtype="f32", lowering=low)
        assert sel.record.family == "wgmma" and sel.record.k == 32 and sel.record.lowered_by == low
        for arch in ("sm_89", "sm_90", "sm_120"):
            rec = select_mma(get_isa("nvidia", arch), dt_, out_dtype="f32", lowering=low).record
            assert (rec.family, rec.shape, rec.lowered_by) == ("mma_sync", (16, 8, 32), low)
        with pytest.raises(MmaSelectorError):     # no fp8 matrix instruction before Ada
            select_mma(get_isa("nvidia", "sm_80"), dt_, out_dtype="f32", lowering=low)


# --------------------------------------------------------------------------- front door
def test_fp8_dtype_rules_and_coded_errors(rng):
    a, b = _fp8(rng, (8, 16), "e4m3"), _fp8(rng, (16, 4), "e5m2")
    f32 = rng.standard_normal((16, 4)).astype(np.float32)
    s = np.float32(2.0)
    cases = [
        (Fp8OperandError, lambda x, y: x @ y, (a, f32)),                                  # fp8 on one side
        (Fp8OperandError, lambda x, y: ts.ops.matmul(x, y, out_dtype=E4M3), (a, b)),      # fp8 output
        (Fp8OperandError, lambda x, y: ts.ops.scaled_matmul(x, y, 1.0, 1.0, out_dtype=E5M2), (a, b)),
        (Fp8OperandError, lambda x, y: x + x, (a, b)),                                    # not an fp8 op
        (Fp8OperandError, lambda x, y: x.astype(np.float32) @ y.astype(np.float32), (a, b)),
        (ScaleError, lambda x, y, v: ts.ops.scaled_matmul(x, y, v, 1.0), (a, b, np.ones(3, np.float32))),
        (ScaleError, lambda x, y, v: ts.ops.scaled_matmul(x, y, v, 1.0), (a, b, np.float64(2.0))),
        (ScaleError, lambda x, y: ts.ops.scaled_matmul(x, y, "2", 1.0), (a, b)),
    ]
    for cls, fn, args in cases:
        with pytest.raises(cls) as e:
            ts.compile(fn, *args)
        assert e.value.code == cls.code, fn
    assert Fp8OperandError.code == "FP8_OPERAND" and ScaleError.code == "SCALED_MATMUL_SCALE"
    # the accepted forms: f32 by default, bf16 / f16 on request; a 0-d f32 scale is a runtime argument
    assert ts.jit(lambda x, y: x @ y)(a, b).dtype == np.float32
    y = ts.jit(lambda x, y, v: ts.ops.scaled_matmul(x, y, v, 1.5, out_dtype=ml_dtypes.bfloat16))(a, b, s)
    assert y.dtype == ml_dtypes.bfloat16
    want = reference(a, b, s, 1.5, ml_dtypes.bfloat16)
    assert np.array_equal(y.astype(np.float64), want.astype(np.float64))


def test_scale_is_a_runtime_argument_and_fuses_into_the_gemm(rng):
    """One compiled kernel serves every scale; the scales and bias ride in the GEMM's epilogue."""
    a, b = _fp8(rng, (33, 70), "e4m3"), _fp8(rng, (70, 29), "e4m3")
    bias = rng.standard_normal(29).astype(np.float32)
    f = ts.jit(_scaled)
    for s in (np.float32(0.25), np.float32(3.0)):
        assert rel(f(a, b, s, bias), _want(a, b, s, bias)) < 1e-6
    rep = ts.compile(_scaled, a, b, np.float32(1.0), bias).report()
    assert len(rep.kernels) == 1 and rep.kernels[0]["kind"] == "gemm"


def test_the_reference_lane_and_the_oracle_agree(rng):
    """The registry's meaning of the traced composite (the numpy reference lane, float64) is
    scaled.reference, the oracle these tests use."""
    from tessera.frontend import reference as REF
    from tessera.frontend.trace import ARRAY, trace
    a, b = _fp8(rng, (9, 40), "e4m3"), _fp8(rng, (40, 7), "e5m2")
    bias = rng.standard_normal(7).astype(np.float32)
    s = np.float32(0.375)
    graph = trace(_scaled, [a, b, s, bias], [ARRAY] * 4)
    (got,) = REF.evaluate(graph, [a, b, s, bias])
    want = np.maximum(reference(a, b, s, 0.5, bias=bias).astype(np.float64), 0)
    assert np.allclose(got, want, rtol=1e-6, atol=0)
    assert got.dtype == np.float32 and np.allclose(got, _want(a, b, s, bias), rtol=1e-6, atol=0)


# --------------------------------------------------------------------------- the CPU lane
def test_the_pack_decoder_is_ml_dtypes_on_all_256_codes():
    """llvm_common.fp8_to_f32 (the x86 pack's conversion), JIT-compiled: every byte of both
    formats, NaN and inf included, is the f32 ml_dtypes gives; and a swapped format is caught."""
    from llvmlite import binding as llvm
    from llvmlite import ir
    from tessera.codegen.llvm_common import F32, I8, fp8_to_f32

    def decode(fmt: str) -> np.ndarray:
        m = ir.Module()
        fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ir.PointerType(), ir.PointerType()]), "dec")
        b = ir.IRBuilder(fn.append_basic_block())
        for i in range(16):
            p = b.gep(fn.args[0], [ir.Constant(ir.IntType(64), 16 * i)], source_etype=I8)
            r = fp8_to_f32(b, b.load(p, typ=ir.VectorType(I8, 16)), fmt)
            b.store(r, b.gep(fn.args[1], [ir.Constant(ir.IntType(64), 16 * i)], source_etype=F32))
        b.ret_void()
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        tm = llvm.Target.from_default_triple().create_target_machine()
        ee = llvm.create_mcjit_compiler(llvm.parse_assembly(str(m)), tm)
        ee.finalize_object()
        src, out = np.arange(256, dtype=np.uint8), np.zeros(256, np.float32)
        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(ee.get_function_address("dec"))(
            src.ctypes.data, out.ctypes.data)
        return out

    codes = np.arange(256, dtype=np.uint8)
    for fmt, other in (("e4m3", "e5m2"), ("e5m2", "e4m3")):
        want = codes.view(FMT[fmt]).astype(np.float32)
        got = decode(fmt)
        assert np.array_equal(got, want, equal_nan=True), fmt
        assert not np.array_equal(decode(other), want, equal_nan=True)     # teeth: the other format


@pytest.mark.parametrize("fa,fb", [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2")])
def test_cpu_scaled_matmul_matches_float64(fa, fb, rng):
    a, b = _fp8(rng, (37, 70), fa), _fp8(rng, (70, 45), fb)
    bias = rng.standard_normal(45).astype(np.float32)
    s = np.float32(0.75)
    got = ts.jit(_scaled)(a, b, s, bias)
    assert rel(got, _want(a, b, s, bias)) < 1e-6
    # a transposed B (k contiguous) and batch
    a3 = _fp8(rng, (2, 19, 40), fa)
    bt = _fp8(rng, (23, 40), fb)
    got = ts.jit(lambda x, w: ts.ops.scaled_matmul(x, w.T, 2.0, 0.125))(a3, bt)
    assert rel(got, 0.25 * (a3.astype(np.float64) @ bt.astype(np.float64).T)) < 1e-6


def test_teeth_cpu_swapped_format_decode(monkeypatch, rng):
    from tessera.codegen import x86 as X
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = X.fp8_to_f32
    monkeypatch.setattr(X, "fp8_to_f32", lambda b, a, fmt: real(b, a, {"e4m3": "e5m2", "e5m2": "e4m3"}[fmt]))
    a, b = _fp8(rng, (20, 64), "e4m3"), _fp8(rng, (64, 24), "e4m3")
    got = ts.jit(lambda x, y: x @ y)(a, b)
    assert not rel(got, a.astype(np.float64) @ b.astype(np.float64)) < 1e-2


def test_teeth_scale_applied_twice(monkeypatch, rng):
    from tessera.frontend import scaled as S
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = S._scale
    monkeypatch.setattr(S, "_scale", lambda s, like, name: ts.ops.mul(real(s, like, name), real(s, like, name)))
    a, b = _fp8(rng, (20, 64), "e5m2"), _fp8(rng, (64, 24), "e5m2")
    bias = rng.standard_normal(24).astype(np.float32)
    s = np.float32(3.0)
    assert not rel(ts.jit(_scaled)(a, b, s, bias), _want(a, b, s, bias)) < 1e-2


# --------------------------------------------------------------------------- PTX, SASS, resources
@needs_ptxas
@pytest.mark.parametrize("arch,fmt", [("sm_90a", "e4m3"), ("sm_90a", "e5m2"), ("sm_89", "e4m3"),
                                      ("sm_89", "e5m2")])
def test_fp8_ptx_assembles_with_the_fp8_instruction_and_no_spills(arch, fmt, rng):
    a, b = _fp8(rng, (256, 256), fmt), _fp8(rng, (256, 256), fmt)
    bias = rng.standard_normal(256).astype(np.float32)
    art = _gpu(_scaled, (a, b, np.float32(1.0), bias), arch)
    ptx = art.ptx()
    assert not re.search(r"\.extern\s+\.func", ptx)            # every LLVM intrinsic was lowered
    k = art.report().kernels[0]
    assert k["spill_stores"] == 0 and k["spill_loads"] == 0 and k["stack_bytes"] == 0
    cub = ptx_tools.assemble(ptx, arch)
    assert not re.search(r"C75\d\d|serializ", cub.log)
    if arch == "sm_90a":
        wg = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.{fmt}\.{fmt}[^;]*;", ptx)
        assert len(wg) == 4                                      # 128 / 32 per k-block
        # fp8 has no transpose immediates: descriptors then scale-d, imm-scale-a, imm-scale-b only
        assert all(re.search(r"\}, %rd\d+, %rd\d+, 1, 1, 1;$", w) for w in wg), wg[0][-60:]
        assert k["mma"]["record"] == f"nvidia.wgmma.m64n128k32.{fmt}" and k["threads"] == 256
        assert k["tiles"]["k"] == 128 and 64 < k["registers"] <= 255
    else:
        assert f"mma.sync.aligned.m16n8k32.row.col.f32.{fmt}.{fmt}.f32" in ptx
        assert k["mma"]["record"] == f"nvidia.mma_sync.m16n8k32.{fmt}" and k["registers"] <= 128
    if find_nvdisasm() is not None:
        sass = ptx_tools.sass(art.binary(), arch)
        name = fmt.upper()
        pat = rf"QGMMA\.64x128x32\.F32\.{name}\.{name}" if arch == "sm_90a" else rf"QMMA\.16832\.F32\.{name}\.{name}"
        assert re.search(pat, sass), sorted(set(re.findall(r"\b\w*MMA\.[\w.]+", sass)))
        assert not re.search(r"\b(LDL|STL)\b", sass)
        if arch == "sm_90a":
            # a row-major B staged as B^T: per k-block 4 16-byte loads of 16 n (and 64 byte stores
            # into the swizzled rows), not 64 byte loads; A by 4 cp.async
            from tessera.codegen.sass_stats import loop_counts
            c = loop_counts(sass, "QGMMA")["fast"]
            assert (c.get("LDG"), c.get("LDGSTS"), c.get("STS")) == (4, 4, 64), c


def test_fp8_wgmma_refuses_an_mn_major_b():
    from xdsl.dialects.builtin import StringAttr, UnitAttr, f32, i64
    from xdsl.dialects.test import TestOp
    from tessera.ir.target import nvidia as NV
    d = TestOp.create(result_types=[i64, i64] + [f32] * 4)
    op = NV.WgmmaOp.create(operands=[d.results[0], d.results[1], *d.results[2:]], result_types=[f32] * 4,
                           attributes={"shape": StringAttr("m64n8k32"), "atype": StringAttr("f8e4m3fn"),
                                       "trans_b": UnitAttr()})
    with pytest.raises(TargetVerifyError, match="K-major"):
        op.verify()
    op.attributes.pop("trans_b")
    op.verify()
    op.attributes["shape"] = StringAttr("m64n8k16")
    with pytest.raises(TargetVerifyError, match="K is 32"):
        op.verify()


def test_gpu_lanes_refuse_fp8_before_sm_89(rng):
    a = _fp8(rng, (64, 64), "e4m3")
    with pytest.raises(MmaSelectorError) as e:             # no fp8 matrix instruction before Ada
        _gpu(lambda x, y: x @ y, (a, a), "sm_80").ptx()
    assert e.value.code == "MMA_SELECTOR"


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_mixed_formats_take_the_mixed_instruction(arch, rng):
    """e4m3 x e5m2 (PTX ISA: either format on each side of mma.sync .kind f8 and wgmma): the
    mixed instruction, emulated against float64 — the emulator decodes each operand as the
    instruction's .atype / .btype declares."""
    a, w = _fp8(rng, (70, 200), "e5m2"), _fp8(rng, (131, 200), "e4m3")
    art = _gpu(lambda x, y, v: ts.ops.scaled_matmul(x, y.T, v, 2.0), (a, w, np.float32(0.5)), arch)
    ptx = art.ptx()
    want = "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e4m3" if arch == "sm_90a" else \
        "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32"
    assert want in ptx
    ptx_tools.assemble(ptx, arch)
    got = art.emulate(a, w, np.float32(0.5))
    assert rel(got, a.astype(np.float64) @ w.astype(np.float64).T) < 1e-6


def test_teeth_instruction_declares_the_other_format(monkeypatch, rng):
    """The wgmma emitted with .e5m2 for e4m3 bytes (data right, instruction type wrong): the
    emulator decodes as the instruction says, so the answer is wrong."""
    from tessera.passes.target.nvidia import wgmma as W
    real = W.WgmmaMap.emit_mma
    swap = {"f8e4m3fn": "f8e5m2", "f8e5m2": "f8e4m3fn"}

    def wrong(self, b, ft, a, bb, c, trans_b=False, btype=None):
        keep = self.ptx_type
        self.ptx_type = swap[keep]
        try:
            return real(self, b, ft, a, bb, c, trans_b=trans_b, btype=self.ptx_type)
        finally:
            self.ptx_type = keep
    monkeypatch.setattr(W.WgmmaMap, "emit_mma", wrong)
    got, want = _plant(monkeypatch, rng)
    assert not rel(got, want) < 1e-2


# --------------------------------------------------------------------------- emulator vs float64
@pytest.mark.parametrize("arch,fmt,shape,bt", [
    ("sm_90a", "e4m3", (70, 131, 200), False),      # edges everywhere; row-major B gathered into B^T
    ("sm_90a", "e5m2", (64, 128, 256), True),       # B given transposed: cp.async, K-major
    ("sm_89", "e5m2", (70, 45, 100), False),
    pytest.param("sm_89", "e4m3", (64, 128, 96), True, marks=pytest.mark.slow),
    pytest.param("sm_90a", "e4m3", (130, 64, 384), False, marks=pytest.mark.slow),   # 3 k-blocks in flight
])
def test_emulated_fp8_gemm_matches_float64(arch, fmt, shape, bt, rng):
    m, n, k = shape
    a, b = _fp8(rng, (m, k), fmt), _fp8(rng, (k, n), fmt)
    bias = rng.standard_normal(n).astype(np.float32)
    s = np.float32(0.75)
    if bt:
        args = (a, np.ascontiguousarray(b.T), s, bias)
        fn = lambda x, w, v, c: _scaled(x, w.T, v, c)      # noqa: E731
    else:
        args, fn = (a, b, s, bias), _scaled
    got = _gpu(fn, args, arch).emulate(*args)
    assert rel(got, _want(a, b, s, bias)) < 1e-6


@pytest.mark.parametrize("n", [8, 24])
def test_fp8_wgmma_record_widths_compile_and_emulate(n, rng):
    """The m64nNk32 records marked lowered are really produced: a tile-n pin selects m64nNk32,
    no spills, the emulated kernel matches float64.  (N = 256 compiles and emulates right but
    ptxas spills 60 bytes at 255 registers: docs/architecture.md, open.)"""
    a, b = _fp8(rng, (70, 130), "e5m2"), _fp8(rng, (130, n + 5), "e5m2")
    art = _gpu(lambda x, y: x @ y, (a, b), "sm_90a", tile_n=n)
    k = art.report().kernels[0]
    assert k["mma"]["record"] == f"nvidia.wgmma.m64n{n}k32.e5m2" and k["spill_stores"] == 0
    assert rel(art.emulate(a, b), a.astype(np.float64) @ b.astype(np.float64)) < 1e-6


def test_emulated_fp8_bf16_output(rng):
    a, b = _fp8(rng, (64, 72), "e4m3"), _fp8(rng, (72, 128), "e4m3")
    art = _gpu(lambda x, y, v: ts.ops.scaled_matmul(x, y, v, 2.0, out_dtype=ml_dtypes.bfloat16),
               (a, b, np.float32(0.5)), "sm_90a")
    got = art.emulate(a, b, np.float32(0.5))
    assert got.dtype == ml_dtypes.bfloat16
    assert rel(got, a.astype(np.float64) @ b.astype(np.float64)) < 8e-3     # one bf16 rounding


# teeth: each planted bug makes the emulated kernel fail
def _plant(monkeypatch, rng, arch="sm_90a", fmt="e4m3"):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    a, b = _fp8(rng, (64, 128), fmt), _fp8(rng, (128, 128), fmt)
    art = _gpu(lambda x, y: x @ y, (a, b), arch)
    return art.emulate(a, b), a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_teeth_emulated_swapped_format(monkeypatch, rng, arch):
    """The staged bytes read as the other format: the emulator's decode is the format's."""
    from tessera.emulate import simt
    real = simt.np_of
    swap = {np.dtype(E4M3): np.dtype(E5M2), np.dtype(E5M2): np.dtype(E4M3)}
    monkeypatch.setattr(simt, "np_of", lambda e: swap.get(real(e), real(e)))
    got, want = _plant(monkeypatch, rng, arch)
    assert not rel(got, want) < 1e-2


def test_teeth_wrong_k_step(monkeypatch, rng):
    """The 16-bit k-step (16) on fp8 k32 slices: descriptors advance by half a slice, the last
    slices reading past the row into a stage a copy is filling (a race) — or wrong sums."""
    from tessera.errors import EmulatorError
    from tessera.passes.tile.kernels import gpu_gemm_wgmma as G
    monkeypatch.setattr(G, "k_steps", lambda bk, ik: range(0, bk, 16))
    try:
        got, want = _plant(monkeypatch, rng)
    except EmulatorError as e:
        assert e.code in ("EMULATE_RACE", "EMULATE_OUT_OF_BOUNDS"), e
    else:
        assert not rel(got, want) < 1e-2


def test_teeth_k_step_skipping_slices(monkeypatch, rng):
    from tessera.passes.tile.kernels import gpu_gemm_wgmma as G
    monkeypatch.setattr(G, "k_steps", lambda bk, ik: range(0, bk, 2 * ik))     # every other k32 slice
    got, want = _plant(monkeypatch, rng)
    assert not rel(got, want) < 1e-2


def test_teeth_fp8_b_read_with_the_16_bit_row(monkeypatch, rng):
    """The swizzled copy placing fp8 chunks at 16-bit offsets (8 elements a chunk): caught."""
    from tessera.passes.target.nvidia import wgmma as W
    real = W.swizzled_index
    monkeypatch.setattr(W, "swizzled_index", lambda r, j, b=None, esize=2: real(r, j, b, 2))
    from tessera.errors import EmulatorError
    try:
        got, want = _plant(monkeypatch, rng)
    except EmulatorError as e:    # or the copy runs out of its buffer
        assert e.code.startswith("EMULATE"), e
    else:
        assert not rel(got, want) < 1e-2


# --------------------------------------------------------------------------- the device script, dry-run
@needs_ptxas
@pytest.mark.slow     # compiles and emulates four check kernels (~30-60 s)
def test_fp8_bundle_dry_run_and_its_teeth(tmp_path):
    """benchmarks/gpu/build_fp8_bundle.py --quick, then fp8_bench.py --dry-run (the device's own
    checks, its float64 from its own fp8 table); a tampered emulator output fails it."""
    import json
    import sys
    from pathlib import Path
    gpu = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"
    sys.path.insert(0, str(gpu))
    try:
        import build_fp8_bundle
        import fp8_bench
    finally:
        sys.path.remove(str(gpu))
    man = build_fp8_bundle.build(tmp_path, quick=True)
    kinds = [c["kind"] for c in man["cases"]]
    assert kinds.count("check") == 4 and kinds.count("bench") == 1
    for c in man["cases"]:
        assert c["mma"].startswith("nvidia.wgmma.m64n128k32.") and c["spill_bytes"] == 0
    assert fp8_bench.main(["--dry-run", "--bundle", str(tmp_path), "--out", str(tmp_path)]) == 0
    assert len(json.loads((tmp_path / "fp8.json").read_text())["results"]) == 4
    case = next(c for c in man["cases"] if c["kind"] == "check" and c["out_dtype"] == "f32")
    e = np.load(tmp_path / case["emulated"])
    e[3, 5] += 1e-3 * np.abs(e).max()
    np.save(tmp_path / case["emulated"], e)
    assert fp8_bench.main(["--dry-run", "--bundle", str(tmp_path)]) == 1
    codes = np.arange(256, dtype=np.uint8)
    for fmt in ("e4m3", "e5m2"):
        assert np.array_equal(fp8_bench.fp8_table(fmt), codes.view(FMT[fmt]).astype(np.float64), equal_nan=True)
