"""Memory-bound kernels on the GPU lanes: elementwise chains, copies (transpose), softmax, layer_norm,
rms_norm and last-axis reductions -> schedule-gpu (schedule_gpu_rows.py) -> kernels/gpu_rows.py ->
simt_rows.py (16-byte vectors, warp shuffles) -> PTX / code objects; numerics from the SIMT
emulator against float64 on odd sizes, each family with a planted bug that fails."""
from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.errors import EmulatorError, ScheduleIllegalError
from tessera.toolchain import find_llvm_tool, find_ptxas

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}
TOL = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 2e-5}     # one rounding of the output (relative to the largest value)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


def _gelu(u):
    return 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))


# family -> (function, float64 oracle, operand shapes); rows are 5 (or 3 x 5), widths odd (75 is not a
# multiple of the 8-element vector; 2100 f32 columns are three chunks of 1024 and a tail of 52)
FAMILIES = {
    "elementwise": (lambda x, b: ts.ops.gelu(x * 2.0 + b) - x, lambda x, b: _gelu(x * 2 + b) - x, [(5, 75), (75,)]),
    "transpose": (lambda x: ts.ops.transpose(x, (1, 0, 2)) * 1.0, lambda x: np.transpose(x, (1, 0, 2)),
                  [(3, 5, 7)]),
    "softmax": (lambda x: ts.ops.softmax(x * 3.0), lambda x: _softmax(x * 3), [(5, 75)]),
    "log_softmax": (lambda x: ts.ops.log_softmax(x) * 0.5, lambda x: (x - x.max(-1, keepdims=True) - np.log(np.exp(
        x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))) * 0.5, [(5, 75)]),
    "layer_norm": (lambda x, g, b: ts.ops.layer_norm(x, g, b), _layer_norm, [(5, 75), (75,), (75,)]),
    "rms_norm": (lambda x, g: ts.ops.rms_norm(x, g), lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
                 * g, [(3, 5, 75), (75,)]),
    "sum": (lambda x: x.sum(-1), lambda x: x.sum(-1), [(5, 75)]),
    "mean": (lambda x: x.mean(-1), lambda x: x.mean(-1), [(3, 5, 75)]),
    "max": (lambda x: x.max(-1), lambda x: x.max(-1), [(5, 75)]),
    "sum_middle": (lambda x: x.sum(1), lambda x: x.sum(1), [(3, 5, 75)]),
}


def _inputs(rng, shapes, dtype):
    return [rng.standard_normal(s).astype(DT[dtype]) for s in shapes]


@functools.lru_cache(maxsize=None)
def _art(family: str, dtype: str, arch: str = "sm_90", target: str = "nvidia"):
    fn, _, shapes = FAMILIES[family]
    args = _inputs(np.random.default_rng(0), shapes, dtype)
    return ts.compile(fn, *args, target=target, arch=arch)


def _rel(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def _check(art, family, dtype, rng, shapes=None):
    fn, oracle, default = FAMILIES[family]
    args = _inputs(rng, shapes or default, dtype)
    got = art.emulate(*args)
    return _rel(got, oracle(*[a.astype(np.float64) for a in args]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_is_lowered_assembled_and_matches_float64(family, rng):
    dtype = "f32" if family in ("sum", "mean", "max", "sum_middle") else "f16"
    art = _art(family, dtype)
    rep = art.report()
    assert rep.layers == ["graph", "schedule", "tile", "target"]
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    assert k["registers"] > 0 and k["spill_stores"] == 0 and k["spill_loads"] == 0   # ptxas -v
    assert _rel(0, 1) == 1 and _check(art, family, dtype, rng) < TOL[dtype]


def test_rows_longer_than_a_chunk(rng):
    """256 threads x 4 f32 = 1024 columns per chunk: 1500 columns are two chunks held in registers,
    2100 are past the two held and loop over three chunks in every pass (a tail of 52); 3000 f16
    columns are two held chunks of 2048."""
    assert _check(_art("softmax", "f32"), "softmax", "f32", rng, [(4, 1500)]) < TOL["f32"]
    assert _check(_art("layer_norm", "f32"), "layer_norm", "f32", rng, [(3, 2100), (2100,), (2100,)]) < TOL["f32"]
    assert _check(_art("rms_norm", "f16"), "rms_norm", "f16", rng, [(2, 1, 3000), (3000,)]) < TOL["f16"]


@pytest.mark.slow
def test_bf16_rows(rng):
    assert _check(_art("layer_norm", "bf16"), "layer_norm", "bf16", rng) < TOL["bf16"]
    assert _check(_art("softmax", "bf16"), "softmax", "bf16", rng) < TOL["bf16"]


def test_sixteen_byte_accesses_and_warp_shuffles_in_the_ptx():
    ptx = _art("softmax", "f16").ptx()
    assert re.search(r"ld\.global(\.nc)?\.v4\.(b32|u32|f32)", ptx)      # 8 halves = 16 bytes
    assert re.search(r"st\.global\.v4\.(b32|u32|f32)", ptx)
    assert "shfl.sync.bfly.b32" in ptx
    ptx32 = _art("sum", "f32").ptx()
    assert re.search(r"ld\.global(\.nc)?\.v4\.(b32|f32)", ptx32)


def test_sm_80_assembles_the_same_kernels(rng):
    def prog(x, g, b):
        return ts.ops.softmax(ts.ops.layer_norm(x, g, b)).sum(-1)
    args = _inputs(rng, [(5, 75), (75,), (75,)], "f16")
    art = ts.compile(prog, *args, target="nvidia", arch="sm_80")
    assert re.search(r"\.target sm_80\b", art.ptx())
    assert all(k["spill_stores"] == 0 for k in art.report().kernels)
    want = _softmax(_layer_norm(*[a.astype(np.float64) for a in args])).sum(-1)
    assert _rel(art.emulate(*args), want) < 2e-3


@pytest.mark.skipif(find_llvm_tool("ld.lld") is None, reason="ld.lld >= 19 not installed")
@pytest.mark.parametrize("arch", ["gfx942", pytest.param("gfx1151", marks=pytest.mark.slow)])   # wave64, wave32
def test_rocm_lowers_the_same_tile_ir(arch, rng):
    assert _check(_art("softmax", "f16", arch, "rocm"), "softmax", "f16", rng) < TOL["f16"]
    assert _check(_art("layer_norm", "f16", arch, "rocm"), "layer_norm", "f16", rng) < TOL["f16"]


# --------------------------------------------------------------------------- planted bugs
@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    return monkeypatch


def _fresh_check(family, dtype, rng, shapes=None, scale=1.0):
    fn, oracle, default = FAMILIES[family]
    args = [a * DT[dtype](scale) for a in _inputs(rng, shapes or default, dtype)]
    art = ts.compile(fn, *args, target="nvidia", arch="sm_90")
    return _rel(art.emulate(*args), oracle(*[a.astype(np.float64) for a in args]))


@pytest.mark.parametrize("family", ["softmax", pytest.param("log_softmax", marks=pytest.mark.slow)])
def test_teeth_softmax_without_the_max_subtraction_overflows(family, fresh, rng):
    from tessera.passes.tile.kernels import gpu_rows
    assert _fresh_check(family, "f32", rng, scale=40.0) < TOL["f32"]        # logits past exp's range
    fresh.setattr(gpu_rows, "shift", lambda b, x, mx: x)
    assert not _fresh_check(family, "f32", rng, scale=40.0) < TOL["f32"]


@pytest.mark.parametrize("family", ["layer_norm", "max"])
def test_teeth_an_unmasked_tail_fails(family, fresh, rng):
    """The row's tail past its end must read the pad (0 for sums, -inf for max): a lowering that
    fills the tail with something else (10) and a generator without tail masks fail."""
    from tessera.passes.target.gpu import simt_rows
    from tessera.passes.tile.kernels import gpu_rows
    fresh.setattr(gpu_rows, "mask_cols", lambda b, x, cols, pad: x)
    orig = simt_rows.RowsLowerer.load_row
    fresh.setattr(simt_rows.RowsLowerer, "load_row", lambda self, b, vv, pad, *to: orig(self, b, vv, 10.0, *to))
    shapes = [(5, 75), (75,), (75,)] if family == "layer_norm" else [(5, 75)]
    assert not _fresh_check(family, "f32", rng, shapes) < TOL["f32"]


@pytest.mark.parametrize("family", ["rms_norm", "sum"])
def test_teeth_a_butterfly_missing_a_step_fails(family, fresh, rng):
    from xdsl.dialects.builtin import f32
    from tessera.ir.attrs import i64_attr
    from tessera.ir.target import gpu as G
    from tessera.passes.target.gpu import simt_rows

    def short(self, b, fn, v):      # folds lanes 16 apart, 8, 4, 2: never lane 1 with lane 0
        m = self.wave // 2
        while m >= 2:
            o = b.op(G.ShuffleXorOp.create(operands=[v], attributes={"mask": i64_attr(m), "width": i64_attr(self.wave)},
                                           result_types=[f32])).results[0]
            v = self.combine(b, fn, v, o)
            m //= 2
        return v
    fresh.setattr(simt_rows.RowsLowerer, "butterfly", short)
    shapes = [(3, 5, 75), (75,)] if family == "rms_norm" else [(5, 75)]
    assert not _fresh_check(family, "f32", rng, shapes) < TOL["f32"]


@pytest.mark.parametrize("family", ["elementwise", "transpose"])
def test_teeth_vector_accesses_past_the_end_or_misaligned_are_caught(family, fresh, rng):
    """A 16-byte access must lie inside the row and be aligned: the emulator faults otherwise."""
    from xdsl.dialects import arith
    from tessera.passes.target.gpu import simt_rows

    def careless(self, b, vv, c0, V):          # no bounds or alignment test: always the vector path
        return b.op(arith.ConstantOp.from_int_and_width(1, 1)).results[0]
    fresh.setattr(simt_rows.RowsLowerer, "_fast", careless)
    with pytest.raises(EmulatorError):
        _fresh_check(family, "f16", rng)


# --------------------------------------------------------------------------- refusals and the demo block
@pytest.mark.parametrize("fn,what", [
    (lambda x: ts.ops.logsumexp(x), "tessera.logsumexp"),   # argmax / argmin / top_k / scans: test_gpu_int.py,
    # test_gpu_topk.py, test_gpu_scan.py
    (lambda x: ts.ops.prod(x, 1), "tessera.reduce_prod"),
])
def test_uncovered_ops_keep_their_coded_refusal(fn, what, rng):
    x = rng.standard_normal((5, 75)).astype(np.float16)
    with pytest.raises(ScheduleIllegalError, match=re.escape(what)) as e:
        ts.compile(fn, x, target="nvidia", arch="sm_90")
    assert "nvidia" in str(e.value)


def test_float64_rows_are_refused_naming_the_op_and_lane(rng):
    x = rng.standard_normal((5, 75))
    with pytest.raises(ScheduleIllegalError, match=r"tessera\.softmax\).*rocm lane.*float64"):
        ts.compile(lambda a: ts.ops.softmax(a), x, target="rocm", arch="gfx942")


# small GEMM tiles keep the emulator quick (the default 128 x 128 tiles take minutes there); the row
# kernels are what this file tests
DEMO_PINS = {"nvidia": {"tile_m": 32, "tile_n": 32, "tile_k": 32, "register_tile": (1, 2), "staging": 1},
             "rocm": None}


@pytest.mark.parametrize("target,arch", [("nvidia", "sm_90"), pytest.param("rocm", "gfx942", marks=pytest.mark.slow)])
def test_demo_block_compiles_entirely_for_the_gpu_and_matches_float64(target, arch, rng):
    from tessera.tools.demo import make_block, make_inputs
    if target == "rocm" and find_llvm_tool("ld.lld") is None:
        pytest.skip("ld.lld >= 19 not installed")
    seq, dim = 24, 64
    block, numpy_block = make_block(seq, dim, 4)
    args = [a.astype(np.float16) for a in make_inputs(rng, seq, dim)]
    art = ts.compile(block, *args, target=target, arch=arch, schedule=DEMO_PINS[target])
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and rep.layers == ["graph", "schedule", "tile", "target"]
    kinds = [k["kind"] for k in rep.kernels]
    assert {"rowwise", "gemm", "transpose"} == set(kinds) and kinds.count("rowwise") == 3   # 2 layer_norms, softmax
    want = numpy_block(*[a.astype(np.float64) for a in args])
    assert _rel(art.emulate(*args), want) < 2e-2          # f16 between kernels, as the CPU lane in f16


def test_shuffle_xor_verifies_its_mask_and_wave():
    from xdsl.dialects import arith
    from xdsl.dialects.builtin import FloatAttr, f32
    from tessera.errors import TargetVerifyError
    from tessera.ir.attrs import i64_attr
    from tessera.ir.target import gpu as G
    v = arith.ConstantOp(FloatAttr(1.0, f32), f32).result
    for mask, width, ok in ((16, 32, True), (32, 64, True), (32, 32, False), (0, 32, False), (4, 16, False)):
        op = G.ShuffleXorOp.create(operands=[v], attributes={"mask": i64_attr(mask), "width": i64_attr(width)},
                                   result_types=[f32])
        if ok:
            op.verify()
        else:
            with pytest.raises(TargetVerifyError):
                op.verify()


def test_a_static_short_row_takes_one_wave_without_the_shared_exchange(rng):
    """A reshape makes the row length static (25): the schedule sizes the workgroup to one warp, whose
    reduction is the shuffle butterfly alone."""
    x = rng.standard_normal((6, 75)).astype(np.float16)
    art = ts.compile(lambda a: ts.ops.softmax(a.reshape(6, 3, 25)), x, target="nvidia", arch="sm_90")
    rows = next(a for a in art.abi() if a["symbol"].endswith("_rowwise"))
    assert rows["block"] == [32, 1, 1] and rows["shared_bytes"] == 0
    want = _softmax(x.astype(np.float64).reshape(6, 3, 25))
    assert _rel(art.emulate(x), want) < TOL["f16"]
