"""Bit-reproducibility across thread counts and runs, the floating-point mode kernels run in
(FTZ/DAZ), subnormals against float64, and NaN / inf propagation per op family
(docs/numerics.md).

The cases are ``tessera.tools.numerics.cases()``: the programs the doc's measured table is
made from.  Each thread-count pin is a separate compile; the process is allowed three threads
here (``host.usable_cpus`` patched where a launch's thread count is capped) so that 1, 2 and 3
threads split the work three different ways.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import tessera as ts
from tessera import host
from tessera.errors import ScheduleIllegalError
from tessera.mma.selector import record_by_id
from tessera.runtime import workers
from tessera.tools import numerics as N

import oracle as O

CASES = N.cases()
FTZ_DAZ = workers.MXCSR_DEFAULT | workers.MXCSR_FTZ | workers.MXCSR_DAZ
TINY = 2.0 ** -149           # the smallest float32 subnormal


@pytest.fixture(autouse=True)
def workers_always_share(monkeypatch):
    """Every planned worker takes its share of a launch.  A launch leaves out a worker that is not
    running (runtime/workers.py: ready) and does not wake a sleeping one for a short launch: the
    small programs here would then run on one thread whatever they were compiled for, and a
    1-thread vs 2-thread comparison would pass without comparing anything."""
    monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: wanted)


@pytest.fixture
def three_threads(monkeypatch):
    real = host.usable_cpus()
    monkeypatch.setattr(host, "usable_cpus", lambda: max(3, real))


@contextlib.contextmanager
def caller_ftz_daz():
    """This thread flushes subnormals (as after ``torch.set_flush_denormal(True)``) inside the block.
    numpy follows the thread's mode too (DAZ reads a subnormal float32 as 0 even when widening it), so
    every oracle and check runs outside the block."""
    workers.pool(2)          # the workers exist before the caller changes its mode (they kept the old one)
    saved = workers.get_mxcsr()
    workers.set_mxcsr(FTZ_DAZ)
    try:
        yield
    finally:
        workers.set_mxcsr(saved)


def _has_subnormal(a) -> bool:
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return bool(np.any((u & 0x7F800000 == 0) & (u & 0x7FFFFF != 0)))


def _same_bits(results) -> bool:
    first = N.bits(results[0])
    return all(N.bits(r) == first for r in results)


# ---------------------------------------------------------------------------- thread counts and runs

@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_bits_identical_across_thread_counts_and_runs(case, rng, three_threads):
    args = N.inputs(case, rng)
    res = N.run_threads(case, args, threads=(1, 2, 3), runs=2)
    used = [res[n][0] for n in (1, 2, 3)]
    if case.label.startswith("reduce_sum, all"):
        assert used == [1, 1, 1]       # a full reduction is one row: one thread (docs/numerics.md)
    else:
        assert used == [1, 2, 3], "the launch must really split the work"
    results = [r for _, runs in res.values() for r in runs]
    assert _same_bits(results), f"{case.label}: results differ between thread counts or runs"
    O.assert_close(results[0], case.ref(*[O.f64(a) for a in args]), case.bound, case.label)


@pytest.mark.parametrize("case", [c for c in CASES if c.family != "attention"][:4], ids=lambda c: c.label)
def test_deterministic_results_equal_default_ones(case, rng):
    """deterministic=True changes only the floating-point mode: with the default mode in the caller the
    bits are those of the default compile."""
    args = N.inputs(case, rng)
    a = ts.jit(case.fn)(*args)
    b = ts.jit(case.fn, deterministic=True)(*args)
    assert N.bits(a) == N.bits(b)


# ---------------------------------------------------------------------------- the floating-point mode

def _subnormal_program():
    x_scale = 2.0 ** -130      # x * tanh(y) lands in the subnormal range for most elements

    def make(rng):   # large enough, and with enough math per element, that the worker takes rows
        x = (rng.standard_normal((6000, 500)) * x_scale).astype(np.float32)
        y = rng.standard_normal((6000, 500)).astype(np.float32)
        return x, y
    return (lambda x, y: x * ts.ops.tanh(y) + x * 0.5), (lambda x, y: x * np.tanh(y) + x * 0.5), make


def _subnormal_error(got, ref) -> float:
    """The error in units of TINY beyond a float32 relative rounding of the result."""
    got, ref = O.f64(got), O.f64(ref)
    return float(np.max(np.maximum(np.abs(got - ref) - 2 * np.finfo(np.float32).eps * np.abs(ref), 0)) / TINY)


def test_subnormals_are_kept_elementwise(rng):
    fn, ref, make = _subnormal_program()
    x, y = make(rng)
    r = ref(O.f64(x), O.f64(y))
    assert np.mean((np.abs(r) < np.finfo(np.float32).tiny) & (r != 0)) > 0.5   # mostly subnormal results
    for n in (1, 2):
        got = ts.jit(fn, schedule={"threads": n})(x, y)
        assert _subnormal_error(got, r) <= 2, "subnormal results must be kept (no FTZ/DAZ)"


def test_subnormals_are_kept_in_f32_gemm(rng):
    a = (rng.standard_normal((300, 257)) * 2.0 ** -133).astype(np.float32)   # mostly subnormal inputs
    b = rng.standard_normal((257, 130)).astype(np.float32)
    assert np.mean(np.abs(a) < np.finfo(np.float32).tiny) > 0.5
    ref = O.f64(a) @ O.f64(b)
    got = O.f64(ts.jit(lambda p, q: p @ q)(a, b))
    bound = 257 * np.finfo(np.float32).eps * (np.abs(O.f64(a)) @ np.abs(O.f64(b))) + 257 * TINY
    assert np.all(np.abs(got - ref) <= bound)


def test_bf16_gemm_subnormals_follow_the_record(rng):
    """The widening records keep subnormals; vdpbf16ps / AMX flush them (their records say so)."""
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    a = (rng.standard_normal((64, 96)) * 2.0 ** -133).astype(bf)   # bf16 subnormals: below 2^-126
    b = rng.standard_normal((96, 48)).astype(bf)
    jf = ts.jit(lambda p, q: p @ q)
    got = O.f64(jf(a, b))
    rec = record_by_id(next(k["mma"]["record"] for k in jf.compile(a, b).compiled.meta["kernels"] if "mma" in k))
    ref = O.f64(a) @ O.f64(b)
    if "flushed" in rec.semantics:
        assert np.all(got == 0), f"{rec.id} flushes subnormal inputs"
    else:
        assert "subnormals kept" in rec.semantics
        assert np.any(got != 0)
        # the bf16 result: spacing 2^-133 among subnormals, 2^-8 relative above
        bound = 2.0 ** -133 + 2.0 ** -8 * np.abs(ref) + 96 * 2.0 ** -24 * (np.abs(O.f64(a)) @ np.abs(O.f64(b)))
        assert np.all(np.abs(got - ref) <= bound), rec.id


def test_caller_ftz_applies_on_every_thread(rng):
    """A caller that flushes subnormals gets flushed results from every thread of a launch, whichever
    rows a thread claims: the same bits for 1 and 2 threads and on every run (numpy, which also follows
    the calling thread's mode, flushes them too)."""
    fn, ref, make = _subnormal_program()
    x, y = make(rng)
    jfs = [ts.jit(fn, schedule={"threads": n}) for n in (1, 2)]
    for jf in jfs:
        jf(x, y)             # compiled outside the block
    with caller_ftz_daz():
        outs = [jf(x, y) for jf in jfs for _ in range(3)]
        in_numpy = x * np.tanh(y) + x * np.float32(0.5)
    assert _same_bits(outs)
    assert not _has_subnormal(outs[0]) and not _has_subnormal(in_numpy)
    assert _subnormal_error(outs[0], ref(O.f64(x), O.f64(y))) > 2   # the subnormal check fails on these


def test_deterministic_ignores_the_callers_ftz(rng):
    fn, ref, make = _subnormal_program()
    x, y = make(rng)
    a = (rng.standard_normal((300, 257)) * 2.0 ** -133).astype(np.float32)
    b = rng.standard_normal((257, 130)).astype(np.float32)
    jfs = [ts.jit(fn, schedule={"threads": n}, deterministic=True) for n in (1, 2)]
    mm = ts.jit(lambda p, q: p @ q, deterministic=True)
    ieee = [jf(x, y) for jf in jfs] + [mm(a, b)]
    with caller_ftz_daz():
        outs = [jf(x, y) for jf in jfs for _ in range(2)]
        got = mm(a, b)
        mode = workers.get_mxcsr()
    assert mode & FTZ_DAZ == FTZ_DAZ, "the caller's mode is restored after each call"
    assert _same_bits(outs + ieee[:2]) and N.bits(got) == N.bits(ieee[2])
    assert _subnormal_error(outs[0], ref(O.f64(x), O.f64(y))) <= 2
    bound = 257 * np.finfo(np.float32).eps * (np.abs(O.f64(a)) @ np.abs(O.f64(b))) + 257 * TINY
    assert np.all(np.abs(O.f64(got) - O.f64(a) @ O.f64(b)) <= bound)


def test_planted_worker_that_keeps_its_own_mode_is_caught(rng, monkeypatch):
    """Teeth: workers that do not take the caller's MXCSR (the state before this fix) give flushed rows
    from thread 0 and unflushed rows from the worker, and the thread-count comparison fails."""
    planted = workers._IR.replace("call void @llvm.x86.sse.ldmxcsr(ptr %mxp)", "")
    assert planted != workers._IR
    monkeypatch.setattr(workers, "_IR", planted)
    monkeypatch.setattr(workers, "_pool", None)
    monkeypatch.setattr(workers, "_native", None)   # the helpers outlive a pool: rebuild them planted
    fn, _, make = _subnormal_program()
    x, y = make(rng)
    jfs = [ts.jit(fn, schedule={"threads": n}) for n in (1, 2)]
    for jf in jfs:
        jf(x, y)
    with caller_ftz_daz():   # the planted pool was made above, in the default mode
        first = jfs[0](x, y)
        # the worker must take rows for its mode to show; under a loaded machine thread 0 may take them
        # all in one call, so call until it does (bounded): a correct pool never differs
        caught = any(not _same_bits([first, jfs[1](x, y)]) for _ in range(200))
    assert caught


def test_planted_entry_that_ignores_deterministic_is_caught(rng, monkeypatch):
    from tessera.codegen import x86 as cg
    real = cg.X86Codegen.add_entry
    monkeypatch.setattr(cg.X86Codegen, "add_entry", lambda self, kernel, deterministic=False: real(self, kernel))
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    fn, ref, make = _subnormal_program()
    x, y = make(rng)
    jf = ts.jit(fn, deterministic=True)
    jf(x, y)
    with caller_ftz_daz():
        got = jf(x, y)
    assert _subnormal_error(got, ref(O.f64(x), O.f64(y))) > 2


# ---------------------------------------------------------------------------- NaN and infinities

@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_nan_and_inf_land_where_numpy_puts_them(case, rng):
    args = N.inputs(case, rng)
    jf = ts.jit(case.fn)
    with np.errstate(all="ignore"):
        for v in (np.nan, np.inf, -np.inf):
            pa = N.poisoned(case, args, v)
            got = jf(*pa)
            ref = case.ref(*[O.f64(a) for a in pa])
            assert N.special_pattern_matches(got, ref), f"{case.label} with {v}"
            finite = np.isfinite(ref)   # the rest still matches float64 (a full reduction has no rest)
            if finite.any():
                np.testing.assert_allclose(O.f64(got)[finite], ref[finite], rtol=0,
                                           atol=case.bound * 10 * float(np.abs(ref[finite]).max()))


def test_reduce_max_nan_at_every_column(rng):
    x = rng.standard_normal((3, 77)).astype(np.float32)
    f0, f1 = ts.jit(lambda a: ts.ops.reduce_max(a, axis=-1)), ts.jit(lambda a: ts.ops.reduce_max(a, axis=0))
    for col in range(77):
        p = x.copy()
        p[1, col] = np.nan
        assert N.special_pattern_matches(f0(p), p.max(-1)), col
        assert N.special_pattern_matches(f1(p), p.max(0)), col
        np.testing.assert_array_equal(f0(p)[[0, 2]], x.max(-1)[[0, 2]])


def test_planted_nan_dropping_max_is_caught(rng, monkeypatch):
    """Teeth: max as a bare vmaxps (drops a NaN in its second operand) fails the NaN check."""
    from tessera.codegen import x86 as cg
    monkeypatch.setattr(cg._Fn, "numpy_max", lambda self, a, c, is_max=True: self._vmaxps(a, c))
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.standard_normal((3, 77)).astype(np.float32)
    f = ts.jit(lambda a: ts.ops.reduce_max(a, axis=-1))
    caught = 0
    for col in range(77):
        p = x.copy()
        p[1, col] = np.nan
        caught += not N.special_pattern_matches(f(p), p.max(-1))
    assert caught


# ---------------------------------------------------------------------------- the setting itself

def test_deterministic_is_a_pipeline_option(rng):
    x = rng.standard_normal((8, 40)).astype(np.float32)
    fn = lambda a: ts.ops.softmax(a)   # noqa: E731
    plain = ts.jit(fn).compile(x).compiled
    det = ts.jit(fn, deterministic=True).compile(x).compiled
    assert "deterministic=true" in det.spec and "deterministic" not in plain.spec
    assert det.key != plain.key
    assert ts.jit(fn, schedule={"deterministic": False}).compile(x).compiled.key == plain.key
    assert ts.compile(ts.jit(fn), x, deterministic=True).compiled.spec == det.spec
    # the entry sets the mode: FTZ/DAZ kept from the caller (0x8040) or not
    assert "32832" in plain.llvm_ir and "32832" not in det.llvm_ir   # 0x8040 = 32832
    with pytest.raises(ScheduleIllegalError, match="deterministic"):
        ts.jit(fn, schedule={"deterministic": 1})
    # the GPU lanes have no such option yet: refused with a coded error, never dropped
    with pytest.raises(ScheduleIllegalError, match="deterministic"):
        ts.jit(fn, target="nvidia", arch="sm_90", deterministic=True)
