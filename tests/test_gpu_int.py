"""int32 / int64 / bool values on the GPU lanes (NVIDIA and ROCm share the SIMT layer).

Each typed op -- comparisons, where, logic, casts between int / float / bool, int arithmetic,
floordiv / mod with numpy's signs, shifts, isnan / isinf / isfinite -- is compiled for
``target="nvidia"`` (every kernel assembled by ptxas) and run in the warp emulator against numpy on
random data (negative ints and zero divisors for floordiv / mod, NaN and inf for the float tests);
int tensors travel as kernel inputs and outputs, and as GEMM-epilogue operands; the label kernels
(cross_entropy, one_hot) match a float64 oracle.  The LLVM translation of the typed lanes
(``codegen/gpu_typed.py``) is also run on the host through llvmlite's JIT, scalar and vector.
Planted bugs (a floordiv truncating toward zero, a select with swapped arms, a cvt that does not
saturate, one_hot's columns off by one, an x86 floordiv without the floor) make the checks fail.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import tessera as ts
from tessera.errors import PassFailedError, ScheduleIllegalError
from tessera.toolchain import find_llvm_tool, find_ptxas

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def _ints(rng, shape, dtype, lo=-60, hi=60):
    return rng.integers(lo, hi, shape).astype(dtype)


def _floats(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    x.flat[rng.choice(x.size, 6, replace=False)] = [np.nan, np.inf, -np.inf, 0.0, -0.0, np.nan]
    return x


def _np_floordiv(a, b):
    s = np.where(b == 0, 1, b)
    with np.errstate(all="ignore"):
        return np.where(b == 0, 0, np.floor_divide(a, s)).astype(a.dtype)


def _np_mod(a, b):
    s = np.where(b == 0, 1, b)
    with np.errstate(all="ignore"):
        return np.where(b == 0, 0, np.remainder(a, s)).astype(a.dtype)


def _np_shift(a, c, left):
    bits = a.dtype.itemsize * 8
    ok = (c >= 0) & (c < bits)
    cs = np.where(ok, c, 0).astype(a.dtype)
    if left:
        return np.where(ok, a << cs, 0).astype(a.dtype)
    return np.where(ok, a >> cs, np.where(a < 0, -1, 0)).astype(a.dtype)


def _np_f2i(x, dt):
    info = np.iinfo(dt)
    w = np.where(np.isnan(x), 0.0, np.trunc(x.astype(np.float64)))
    return np.clip(w, info.min, info.max).astype(dt)


# ----------------------------------------------------------------------------- programs and oracles
def int_program(a, b, c):
    """int32 / int64 arithmetic: wraps, floors, shifts (c: shift counts)."""
    return (a + b, a - b, a * b, a // b, a % b, ts.ops.maximum(a, b), -a, a << c, a >> c,
            (a.astype(np.int64) * 3) // b.astype(np.int64))


def int_oracle(a, b, c):
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    return (a + b, a - b, a * b, _np_floordiv(a, b), _np_mod(a, b), np.maximum(a, b), -a, _np_shift(a, c, True),
            _np_shift(a, c, False), _np_floordiv(a64 * 3, b64))


def logic_program(x, y, a, b):
    """comparisons, where, logic, float tests and casts (x, y: f32 with NaN / inf; a, b: int32)."""
    m = x > y
    return (m, x == y, x != y, x <= y, a < b, a >= b, ts.ops.where(m, a, b), ts.ops.where(a > b, x, y),
            m & (a > 0), m | (a > 0), m ^ (a > 0), ~m, a & b, a | b, a ^ b, ~a,
            ts.ops.isnan(x), ts.ops.isinf(x), ts.ops.isfinite(x),
            x.astype(np.int32), a.astype(np.float32) * y, m.astype(np.float32) + x, x.astype(bool),
            a.astype(bool), a.astype(np.int64) + 1, (m & (a > 0)).astype(np.int32))


def logic_oracle(x, y, a, b):
    m = x > y
    with np.errstate(all="ignore"):
        return (m, x == y, x != y, x <= y, a < b, a >= b, np.where(m, a, b), np.where(a > b, x, y),
                m & (a > 0), m | (a > 0), m ^ (a > 0), ~m, a & b, a | b, a ^ b, ~a,
                np.isnan(x), np.isinf(x), np.isfinite(x),
                _np_f2i(x, np.int32), a.astype(np.float32) * y, m.astype(np.float32) + x, x.astype(bool),
                a.astype(bool), a.astype(np.int64) + 1, (m & (a > 0)).astype(np.int32))


def _inputs(rng, which: str):
    shape = (6, 72)       # rows of 72: a tail past the chunk, masked
    if which == "int":
        a = _ints(rng, shape, np.int32)
        a.flat[:3] = [np.iinfo(np.int32).min, np.iinfo(np.int32).max, -1]
        b = _ints(rng, shape, np.int32, -7, 8)       # zero divisors and -1 among them
        b.flat[:3] = [-1, 3, -1]
        c = _ints(rng, shape, np.int32, -3, 36)      # shift counts past the width and negative ones
        return a, b, c
    x, y = _floats(rng, shape), _floats(rng, shape)
    x.flat[7:10] = [3e9, -3e9, 2.5e9]                # beyond int32: saturated
    return x, y, _ints(rng, shape, np.int32), _ints(rng, shape, np.int32)


def _check(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
        if w.dtype.kind == "f":
            assert np.allclose(g, w, rtol=1e-6, atol=0, equal_nan=True), i
        else:
            assert np.array_equal(g, w), (i, np.argwhere(g != w)[:4])


def _emulated(prog, args, target="nvidia", arch="sm_80"):
    art = ts.compile(prog, *args, target=target, arch=arch)
    rep = art.report()
    assert rep.lane == f"{target}-{arch}" and not rep.reason, (rep.lane, rep.reason)
    for k in rep.kernels:      # a real binary per kernel: ptxas's registers / the AMDGPU object's VGPRs
        assert k["registers" if target == "nvidia" else "vgprs"] > 0, k
    return art.emulate(*args)


@needs_ptxas
@pytest.mark.parametrize("which", ["int", "logic"])
def test_typed_ops_on_nvidia_match_numpy(rng, which):
    args = _inputs(rng, which)
    prog, oracle = (int_program, int_oracle) if which == "int" else (logic_program, logic_oracle)
    _check(_emulated(prog, args), oracle(*args))


@pytest.mark.skipif(find_llvm_tool("ld.lld") is None, reason="ld.lld >= 19 not installed")
@pytest.mark.parametrize("which", ["int", "logic"])
def test_typed_ops_on_rocm_match_numpy(rng, which):
    args = _inputs(rng, which)
    prog, oracle = (int_program, int_oracle) if which == "int" else (logic_program, logic_oracle)
    _check(_emulated(prog, args, "rocm", "gfx942"), oracle(*args))


def _plant(monkeypatch, fn_name, bad):
    """The emulator's semantics of one typed function replaced by ``bad(args, out)``."""
    from tessera.emulate import simt, typed
    real = typed.run

    def run(fn, args, out):
        return bad(args, out) if fn == fn_name else real(fn, args, out)
    monkeypatch.setattr(simt, "typed_run", run)


@needs_ptxas
@pytest.mark.parametrize("bug", ["floordiv_truncates", "select_swapped", "cvt_wraps", "shr_logical"])
def test_planted_typed_bugs_fail(rng, monkeypatch, bug):
    if bug == "floordiv_truncates":
        _plant(monkeypatch, "floordiv", lambda a, out: np.where(a[1] == 0, 0, np.fix(
            a[0] / np.where(a[1] == 0, 1, a[1]).astype(np.float64))).astype(np.int64).astype(out))
        which = "int"
    elif bug == "select_swapped":
        _plant(monkeypatch, "select", lambda a, out: np.where(a[0], a[2], a[1]).astype(out))
        which = "logic"
    elif bug == "cvt_wraps":
        from tessera.emulate import typed
        _plant(monkeypatch, "cvt", lambda a, out: np.nan_to_num(a[0]).astype(np.int64).astype(out)
               if out.kind == "i" and a[0].dtype.kind == "f" else typed.cvt(a[0], out))
        which = "logic"
    else:
        _plant(monkeypatch, "shr", lambda a, out: (a[0].astype(np.uint32) >> np.clip(a[1], 0, 31).astype(
            np.uint32)).astype(out))
        which = "int"
    args = _inputs(rng, which)
    prog, oracle = (int_program, int_oracle) if which == "int" else (logic_program, logic_oracle)
    with pytest.raises(AssertionError):
        _check(_emulated(prog, args), oracle(*args))


# ----------------------------------------------------------------------------- GEMM epilogues
@needs_ptxas
def test_gemm_epilogue_reads_bool_operands_and_int_chains_feed_it(rng):
    """where(mask & (k > 0), x @ w, 0) + k // 2: the bool mask read in the GEMM's epilogue, the int32
    chains (compare, and, floor division, cast) in row kernels around it."""
    x = rng.standard_normal((48, 64)).astype(np.float16)
    w = rng.standard_normal((64, 40)).astype(np.float16)
    mask = rng.random((48, 40)) < 0.5
    k = _ints(rng, (48, 40), np.int32, -9, 9)

    def prog(x, w, mask, k):
        return ts.ops.where(mask & (k > 0), x @ w, 0.0) + k // 2
    art = ts.compile(prog, x, w, mask, k, target="nvidia", arch="sm_80")
    gemm = next(r for r in art.report().kernels if r["kind"] == "gemm")
    assert "tessera.where" in gemm["ops"], gemm["ops"]
    got = np.asarray(art.emulate(x, w, mask, k), np.float64)
    want = np.where(mask & (k > 0), x.astype(np.float64) @ w.astype(np.float64), 0.0) + k // 2
    assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max()
    off = ~(mask & (k > 0))
    assert np.array_equal(got[off], (k // 2)[off])


# ----------------------------------------------------------------------------- label kernels
def _xent_oracle(z, labels, ignore=-100):
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(-1))
    inside = (labels >= 0) & (labels < z.shape[1])
    picked = np.where(inside, z[np.arange(len(z)), np.clip(labels, 0, z.shape[1] - 1)], -np.inf)
    return np.where(labels == ignore, 0.0, lse - picked)


@needs_ptxas
@pytest.mark.parametrize("C", [10, 300])          # one chunk; several chunks with a masked tail
def test_cross_entropy_and_one_hot_on_nvidia_match_float64(rng, C):
    z = (rng.standard_normal((7, C)) * 4).astype(np.float32)
    labels = rng.integers(0, C, 7).astype(np.int64)
    labels[2], labels[5] = -100, C + 3            # an ignored row; a label outside [0, C): loss +inf

    def prog(z, labels):
        return ts.ops.cross_entropy(z, labels, reduction="none"), ts.ops.one_hot(labels, C)
    loss, oh = _emulated(prog, (z, labels))
    want = _xent_oracle(z, labels)
    assert np.isinf(loss[5]) and loss[2] == 0.0
    fin = np.isfinite(want)
    assert np.abs(np.asarray(loss, np.float64)[fin] - want[fin]).max() < 1e-5 * max(1.0, np.abs(want[fin]).max())
    assert np.array_equal(oh, (labels[:, None] == np.arange(C)).astype(np.float32))


@needs_ptxas
def test_planted_label_bug_fails(rng, monkeypatch):
    """one_hot / cross_entropy's column indices off by one: both disagree with the oracle."""
    from tessera.passes.tile.kernels import gpu_labels
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    real = gpu_labels._columns
    monkeypatch.setattr(gpu_labels, "_columns", lambda b, c, chunk, elem: real(b, b.add(c, 1), chunk, elem))
    z = (rng.standard_normal((5, 12)) * 4).astype(np.float32)
    labels = rng.integers(0, 11, 5).astype(np.int64)

    def prog(z, labels):
        return ts.ops.cross_entropy(z, labels, reduction="none"), ts.ops.one_hot(labels, 12)
    loss, oh = _emulated(prog, (z, labels))
    assert not np.array_equal(oh, (labels[:, None] == np.arange(12)).astype(np.float32))
    assert np.abs(np.asarray(loss, np.float64) - _xent_oracle(z, labels)).max() > 1e-2


def _np_take_rows(table, idx):
    n = table.shape[0]
    j = np.where(idx < 0, idx + n, idx)
    return table[np.clip(j, 0, n - 1)]


@needs_ptxas
@pytest.mark.parametrize("dtype, idx_dtype", [(np.float32, np.int64), ("bf16", np.int32)])
def test_int_slice_and_take_on_nvidia_match_numpy(rng, dtype, idx_dtype):
    """The sampler's lookup: ids[:, -1] (an int copy) then take(table, ..., axis=0): negative indices
    count from the end, ones outside [-n, n) are clamped (no read leaves the table); an int64 index
    past 2**32 is not wrapped into range."""
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dtype == "bf16" else dtype
    table = rng.standard_normal((40, 24)).astype(dt)
    ids = rng.integers(-40, 40, (5, 3)).astype(idx_dtype)
    ids[0, -1], ids[1, -1] = 57, -41                     # clamped to 39 and 0
    if idx_dtype == np.int64:
        ids[2, -1] = 2 ** 32 + 1                         # clamped to 39, not read as 1

    def prog(ids, table):
        last = ids[:, -1]
        return last, ts.ops.take(table, last, axis=0)
    last, rows = _emulated(prog, (ids, table))
    assert last.dtype == ids.dtype and np.array_equal(last, ids[:, -1])
    assert rows.dtype == table.dtype and np.array_equal(rows, _np_take_rows(table, ids[:, -1]))


def _arg_rows(rng, C):
    x = rng.integers(-3, 4, (8, C)).astype(np.float32)      # small ints: ties in every row
    x[1, C // 2:] = np.nan
    x[1, C // 3] = np.nan                                      # the first NaN wins
    x[2] = -np.inf
    x[3, -1] = 9.0                                             # the maximum in the masked tail's chunk
    x[4, 0] = -9.0
    return x


@needs_ptxas
@pytest.mark.parametrize("C", [12, 700])
def test_argmax_argmin_on_nvidia_match_numpy(rng, C):
    """numpy's first index of the row's maximum (minimum); a NaN row gives its first NaN."""
    x = _arg_rows(rng, C)
    amax, amin = _emulated(lambda a: (ts.ops.argmax(a, axis=-1), ts.ops.argmin(a, axis=-1)), (x,))
    assert amax.dtype == np.int64 and np.array_equal(amax, np.argmax(x, -1))
    assert np.array_equal(amin, np.argmin(x, -1))


@needs_ptxas
def test_planted_argmax_last_match_fails(rng, monkeypatch):
    from tessera.passes.tile.kernels import gpu_labels
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(gpu_labels, "FIRST", False)
    x = _arg_rows(rng, 12)
    (amax,) = _emulated(lambda a: (ts.ops.argmax(a, axis=-1),), (x,))
    assert not np.array_equal(amax, np.argmax(x, -1))


# ----------------------------------------------------------------------------- the LLVM translation, on the host
def _jit_typed(fn: str, in_dtypes, out_dtype, lanes: int):
    """``codegen.gpu_typed.emit`` in a host function ``void f(ptr a, ptr b, ptr c, ptr out)`` that
    loads ``lanes`` elements of each operand (bools as bytes), applies ``fn`` and stores the result."""
    from types import SimpleNamespace

    from llvmlite import binding as llvm
    from llvmlite import ir
    from xdsl.dialects.builtin import IntegerType, StringAttr, VectorType, f32

    from tessera.codegen import gpu_typed as T
    from tessera.codegen.jit import host_triple
    from tessera.codegen.llvm_common import ModuleCodegen
    xd = {np.dtype(np.int32): IntegerType(32), np.dtype(np.int64): IntegerType(64), np.dtype(bool): IntegerType(1),
          np.dtype(np.float32): f32}
    ll = {np.dtype(np.int32): ir.IntType(32), np.dtype(np.int64): ir.IntType(64), np.dtype(bool): ir.IntType(1),
          np.dtype(np.float32): ir.FloatType()}
    gen = ModuleCodegen(host_triple(), avx512=False)
    f = ir.Function(gen.m, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 4), "f")
    b = ir.IRBuilder(f.append_basic_block())

    def ty(dt):
        e = ll[np.dtype(dt)]
        return e if lanes == 1 else ir.VectorType(e, lanes)
    vals, keys = {}, []
    for i, dt in enumerate(in_dtypes):
        t_ = ty(dt)
        if T.is_bool(t_):
            v = T.load_bool(b, b.load(f.args[i], typ=T.byte_type(t_)))
        else:
            v = b.load(f.args[i], typ=t_)
        k = object()
        vals[k] = v
        keys.append(k)
    rt = xd[np.dtype(out_dtype)]
    op = SimpleNamespace(fn=StringAttr(fn), inputs=keys,
                         result=SimpleNamespace(type=rt if lanes == 1 else VectorType(rt, [lanes])))
    r = T.emit(SimpleNamespace(b=b, gen=gen, v=lambda k: vals[k]), op)
    b.store(T.store_bool(b, r) if T.is_bool(r.type) else r, f.args[3])
    b.ret_void()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(str(gen.m))
    tm = llvm.Target.from_triple(host_triple()).create_target_machine()
    ee = llvm.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4)
    return proto(ee.get_function_address("f")), ee


CASES = [   # fn, operand dtypes, result dtype, numpy oracle
    ("floordiv", (np.int32, np.int32), np.int32, _np_floordiv),
    ("mod", (np.int64, np.int64), np.int64, _np_mod),
    ("shr", (np.int32, np.int32), np.int32, lambda a, c: _np_shift(a, c, False)),
    ("shl", (np.int64, np.int64), np.int64, lambda a, c: _np_shift(a, c, True)),
    ("select", (bool, np.int32, np.int32), np.int32, lambda m, a, b: np.where(m, a, b)),
    ("cmp_lt", (np.float32, np.float32), bool, lambda x, y: x < y),
    ("cmp_ne", (np.float32, np.float32), bool, lambda x, y: x != y),
    ("cvt", (np.float32,), np.int32, lambda x: _np_f2i(x, np.int32)),
    ("cvt", (np.float32,), bool, lambda x: x != 0),
    ("cvt", (np.int64,), np.float32, lambda a: a.astype(np.float32)),
    ("isnan", (np.float32,), bool, np.isnan),
    ("isfinite", (np.float32,), bool, np.isfinite),
    ("xor", (bool, bool), bool, np.bitwise_xor),
    ("not", (np.int32,), np.int32, np.invert),
]


def _operand(rng, dt, i, n):
    dt = np.dtype(dt)
    if dt == bool:
        return rng.random(n) < 0.5
    if dt.kind == "f":
        x = (rng.standard_normal(n) * 4).astype(dt)
        x[:4] = [np.nan, np.inf, -3e9, 0.0]
        return x
    v = rng.integers(-40, 40, n).astype(dt)
    if i == 1:
        v[:3] = [0, -1, 70]       # a zero divisor, -1, a shift count past the width
    return v


@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{np.dtype(c[2]).name}" for c in CASES])
def test_typed_llvm_translation_runs_on_the_host_like_numpy(rng, case, lanes):
    fn, ins, out, oracle = case
    f, _ee = _jit_typed(fn, ins, out, lanes)
    n = 64
    args = [_operand(rng, dt, i, n) for i, dt in enumerate(ins)]
    got = np.zeros(n, out)
    for s in range(0, n, lanes):
        chunk = [np.ascontiguousarray(a[s:s + lanes]) for a in args] + [None] * (3 - len(args))
        res = np.zeros(lanes, out)
        f(*[c.ctypes.data if c is not None else None for c in chunk], res.ctypes.data)
        got[s:s + lanes] = res
    with np.errstate(all="ignore"):
        want = np.asarray(oracle(*args)).astype(out)
    assert np.array_equal(got, want), (fn, args[0][got != want][:4], got[got != want][:4], want[got != want][:4])


def test_planted_x86_floordiv_without_floor_fails_on_the_host(rng, monkeypatch):
    """The GPU lanes share the CPU lane's int translation: a floordiv that truncates is caught."""
    from tessera.codegen import x86_int_elem as X
    real = X._int_op

    def trunc(cg, fn, args):
        return cg.b.sdiv(args[0], args[1]) if fn == "floordiv" else real(cg, fn, args)
    monkeypatch.setattr(X, "_int_op", trunc)
    with pytest.raises(AssertionError):
        a = rng.integers(-40, 40, 32).astype(np.int32)
        b = rng.integers(1, 9, 32).astype(np.int32) * np.where(rng.random(32) < 0.5, -1, 1).astype(np.int32)
        f, _ee = _jit_typed("floordiv", (np.int32, np.int32), np.int32, 1)
        got = np.zeros(32, np.int32)
        for i in range(32):
            ai, bi, r = a[i:i + 1].copy(), b[i:i + 1].copy(), np.zeros(1, np.int32)
            f(ai.ctypes.data, bi.ctypes.data, None, r.ctypes.data)
            got[i] = r[0]
        assert np.array_equal(got, _np_floordiv(a, b))


# ----------------------------------------------------------------------------- what stays refused
def test_gpu_refusals_name_the_op_and_the_cpu_target(rng):
    x = rng.standard_normal((32, 32)).astype(np.float16)
    with pytest.raises(PassFailedError, match=r'tile.elementwise log1p has no lowering on this GPU lane.*'
                                              r'target="cpu" compiles tessera.ops.log1p') as ei:
        ts.compile(lambda a, b: ts.ops.log1p(a @ b), x, x, target="nvidia", arch="sm_80")   # pow: test_gpu_pow.py
    assert ei.value.code == "PASS_FAILED" and "cpu-x86" not in str(ei.value)
    z = rng.standard_normal((4, 200)).astype(np.float32)
    with pytest.raises(ScheduleIllegalError, match=r"tessera.top_k with k = 129 \(the GPU kernel takes k <= 128\); "
                                                   r"target=\"cpu\" compiles it"):
        ts.compile(lambda a: ts.ops.top_k(a, 129), z, target="nvidia", arch="sm_80")   # over the GPU kernel's k
