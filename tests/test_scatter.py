"""scatter_add / index_add (take's adjoint): the CPU kernel against a float64 numpy oracle
(duplicates, negative and out-of-range indices, odd sizes, every float dtype), the same bits for
any thread count, coded refusals, GPU lanes refusing it by name, the embedding gradient through it,
and planted bugs (duplicates dropped, determinism broken) that the checks catch."""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera import host
from tessera.errors import DtypeError, RankMismatchError, ScheduleIllegalError, ShapeMismatchError
from tessera.frontend import reference
from tessera.frontend.trace import ARRAY, trace
from tessera.passes.tile.kernels import scatter
from tessera.runtime import workers
from tessera.tools import numerics as N

O = ts.ops


def oracle(target_shape, base, idx, upd, axis):
    """float64 numpy: base (or zeros) with upd added at idx along axis; indices bounded as take
    bounds them (numpy's meaning in [-n, n), clamped outside); duplicates summed."""
    n = target_shape[axis]
    i = np.asarray(idx, np.int64).reshape(-1)
    i = np.clip(np.where(i < 0, i + n, i), 0, n - 1)
    out = np.zeros(target_shape) if base is None else np.asarray(base, np.float64).copy()
    u = np.asarray(upd, np.float64).reshape(target_shape[:axis] + (i.size,) + tuple(target_shape[axis + 1:]))
    np.add.at(out, (slice(None),) * axis + (i,), u)
    return out


def _bound(upd, idx, dtype, base=None):
    """|error| bound: one rounding of the result's dtype per add, over the sum of magnitudes."""
    eps = {np.float64: 2.0 ** -52, np.float32: 2.0 ** -23}.get(dtype, 2.0 ** -7)
    k = np.asarray(idx).size + 1
    mag = np.abs(np.asarray(upd, np.float64)).sum() + (0 if base is None else np.abs(np.asarray(base, np.float64)).max())
    return 2 * k * eps * mag


def _indices(rng, n, shape):
    """Indices with duplicates, negatives and out-of-range values (both sides)."""
    i = rng.integers(-n, n, shape)
    flat = i.reshape(-1)
    flat[: max(1, flat.size // 4)] = flat[0]          # a run of one duplicated index
    if flat.size > 3:
        flat[1], flat[2] = n + 3, -n - 2             # clamped to the last / the first row
    return i


# module-level jitted functions: one compile per distinct shape
zeros_axis0 = ts.jit(lambda i, u: O.scatter_add((13, 37), i, u, axis=0))
based_axis1 = ts.jit(lambda x, i, u: O.scatter_add(x, i, u, axis=1))
index_add = ts.jit(lambda x, i, u: O.index_add(x, -1, i, u))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bfloat16"])
def test_zeros_target_axis0(rng, dtype):
    dt = np.dtype(ts.dtypes.as_dtype(dtype)) if isinstance(dtype, str) else np.dtype(dtype)
    idx = _indices(rng, 13, (5, 7)).astype(np.int32)
    upd = rng.standard_normal((5, 7, 37)).astype(dt)
    got = np.asarray(zeros_axis0(idx, upd), np.float64)
    want = oracle((13, 37), None, idx, upd, 0)
    assert np.abs(got - want).max() <= _bound(upd, idx, dt.type if dt.kind == "f" and dt.itemsize >= 4 else None)


def test_target_axis1_rank3_odd_sizes(rng):
    x = rng.standard_normal((3, 11, 5))
    idx = _indices(rng, 11, (9,))
    upd = rng.standard_normal((3, 9, 5))
    got = based_axis1(x, idx, upd)
    np.testing.assert_allclose(got, oracle(x.shape, x, idx, upd, 1), rtol=1e-13, atol=1e-13)


def test_index_add_last_axis_matches_torch_order(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    idx = np.array([5, 0, 5, 5, 2], np.int64)
    upd = rng.standard_normal((4, 5)).astype(np.float32)
    got = index_add(x, idx, upd)
    want = oracle(x.shape, x, idx, upd, 1)
    assert np.abs(got - want).max() <= _bound(upd, idx, np.float32, x)


def test_all_indices_equal_sum_every_update(rng):
    idx = np.full((5, 7), 4, np.int32)
    upd = rng.standard_normal((5, 7, 37))
    got = zeros_axis0(idx, upd)
    np.testing.assert_allclose(got[4], upd.reshape(35, 37).sum(0), rtol=1e-12, atol=1e-12)
    assert not np.delete(got, 4, axis=0).any()


def test_reference_lane_agrees(rng):
    f = lambda x, i, u: O.scatter_add(x, i, u, axis=1)   # noqa: E731
    x, idx, upd = rng.standard_normal((3, 11, 5)), _indices(rng, 11, (9,)), rng.standard_normal((3, 9, 5))
    graph = trace(f, [x, idx, upd], [ARRAY] * 3)
    np.testing.assert_allclose(reference.evaluate(graph, [x, idx, upd])[0], oracle(x.shape, x, idx, upd, 1),
                               rtol=1e-13, atol=1e-13)


def test_plant_dropped_duplicates_is_caught(rng, monkeypatch):
    """Teeth: a kernel that stores each update instead of adding it (duplicates dropped: the last
    one wins) fails the oracle."""
    monkeypatch.setattr(scatter, "elementwise", lambda b, fn, operands: operands[1])
    f = ts.jit(lambda i, u: O.scatter_add((7, 19), i, u))   # a size no other test compiles
    idx = _indices(rng, 7, (10,))
    upd = rng.standard_normal((10, 19)).astype(np.float32)
    assert np.abs(np.asarray(f(idx, upd), np.float64) - oracle((7, 19), None, idx, upd, 0)).max() > 1e-2


# ---------------------------------------------------------------------------- determinism

@pytest.fixture
def three_threads(monkeypatch):
    real = host.usable_cpus()
    monkeypatch.setattr(host, "usable_cpus", lambda: max(3, real))
    monkeypatch.setattr(workers.WorkerPool, "ready", lambda self, wanted, wake: wanted)


def _runs(fn, args, threads=(1, 2, 3)):
    out = {}
    for n in threads:
        jf = ts.jit(fn, schedule={"threads": n})
        out[n] = (N.threads_used(jf, args), [N.bits(jf(*args)) for _ in range(2)])
    return out


def _embedding_grad(i, u):
    return O.scatter_add((50, 96), i, u)


def test_same_bits_for_any_thread_count(rng, three_threads):
    idx = rng.integers(0, 6, (400,))            # heavy duplication: 400 rows into 6
    upd = rng.standard_normal((400, 96)).astype(np.float32) * np.float32(1e3)
    res = _runs(_embedding_grad, [idx, upd])
    assert [res[n][0] for n in (1, 2, 3)] == [1, 2, 3], "the launch must really split the work"
    bits = {b for _, runs in res.values() for b in runs}
    assert len(bits) == 1
    got = np.frombuffer(next(iter(bits))[3:], np.float32).reshape(50, 96)
    assert np.abs(got - oracle((50, 96), None, idx, upd, 0)).max() <= _bound(upd, idx, np.float32)


def test_determinism_check_has_teeth(rng, three_threads, monkeypatch):
    """Teeth: a kernel whose summation order depends on the thread count (here: multi-thread
    compiles walk the indices backwards) gives other bits, which the check sees."""
    real_gen, real_walk = scatter.generate, scatter.walk_indices
    backwards = {"on": False}

    def walk(b, count, body):
        if not backwards["on"]:
            return real_walk(b, count, body)
        b.for_(0, count, 1, lambda bk, k, c: body(bk, bk.sub(bk.sub(count, 1), k), c))

    def gen(kop):
        backwards["on"] = kop.threads.value.data > 1
        return real_gen(kop)
    monkeypatch.setattr(scatter, "walk_indices", walk)
    monkeypatch.setattr(scatter, "generate", gen)
    idx = rng.integers(0, 6, (400,))
    upd = rng.standard_normal((400, 40)).astype(np.float32) * np.float32(1e3)
    # (a target size no other test compiles: the widths are symbolic, so a (50, *) program of another
    # test would be the same compiled kernel, unplanted)
    res = _runs(lambda i, u: O.scatter_add((47, 40), i, u), [idx, upd], threads=(1, 2))
    assert len({b for _, runs in res.values() for b in runs}) > 1


# ---------------------------------------------------------------------------- refusals

def _raises(cls, code, fn, *args):
    with pytest.raises(cls) as e:
        ts.jit(fn)(*args)
    assert e.value.code == code


def test_bad_input_is_refused_with_codes(rng):
    u = rng.standard_normal((4, 3)).astype(np.float32)
    i = np.array([0, 1, 2, 1])
    _raises(DtypeError, "DTYPE_UNSUPPORTED", lambda i, u: O.scatter_add((5, 3), i, u), i.astype(np.float32), u)
    _raises(RankMismatchError, "RANK_MISMATCH", lambda i, u: O.scatter_add((5, 3), i, u), i, u[None])
    _raises(RankMismatchError, "RANK_MISMATCH", lambda i, u: O.scatter_add((5, 3), i, u, axis=2), i, u)
    _raises(ShapeMismatchError, "SHAPE_MISMATCH", lambda i, u: O.scatter_add((5, 4), i, u), i, u)
    _raises(DtypeError, "DTYPE_UNSUPPORTED", lambda x, i, u: O.scatter_add(x, i, u), np.zeros((5, 3)), i, u)
    _raises(DtypeError, "DTYPE_UNSUPPORTED", lambda i, u: O.scatter_add((5, 3), i, u), i, u.astype(np.int32))


@pytest.mark.parametrize("target,arch", [("nvidia", "sm_90"), ("rocm", "gfx942")])
def test_gpu_lanes_refuse_it_by_name(rng, target, arch):
    u = rng.standard_normal((4, 16)).astype(np.float16)
    with pytest.raises(ScheduleIllegalError) as e:
        ts.compile(lambda i, u: O.scatter_add((8, 16), i, u), np.array([0, 1, 1, 7]), u, target=target, arch=arch)
    assert "scatter_add" in str(e.value) and target in str(e.value)


# ---------------------------------------------------------------------------- the embedding gradient

emb_grad = ts.jit(ts.grad(lambda t, i, r: O.reduce_sum(O.mul(O.take(t, i, 0), r))))


def test_embedding_table_gradient_is_a_scatter_and_matches_torch(rng):
    t = rng.standard_normal((11, 6))
    i = _indices(rng, 11, (3, 8))
    r = rng.standard_normal((3, 8, 6))
    got = emb_grad(t, i, r)
    assert "scatter_add" in str(ts.explain(emb_grad, t, i, r))
    np.testing.assert_allclose(got, oracle(t.shape, None, i, r, 0), rtol=1e-12, atol=1e-12)
    torch = pytest.importorskip("torch")
    tt = torch.tensor(t, requires_grad=True)
    ib = torch.tensor(np.clip(np.where(i < 0, i + 11, i), 0, 10))
    (tt[ib] * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(got, tt.grad.numpy(), rtol=1e-12, atol=1e-12)
