"""layer_norm and rms_norm on the rows where eps matters: constant rows (variance exactly 0),
low-variance rows (variance ~1e-6, below layer_norm's eps of 1e-5) and tiny / all-zero rows
for rms_norm (mean square ~1e-8 or 0, below its eps of 1e-6).

Rows of variance ~4 (the other norm tests) cannot tell eps = 1e-5 from eps = 0: the
difference is ~1e-6 relative. Here it is a factor of ~3 (or a NaN), and
test_eps_zero_in_the_row_kernel_is_caught plants eps = 0 in the row kernel generator to show it.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import oracle as O
import tessera as ts

TOL32 = 1e-5


def _rows(rng, C: int, *, offset: bool) -> dict[str, np.ndarray]:
    """Groups of rows, float32: ordinary, constant, low-variance (std 1e-3), tiny (std 1e-4);
    offset moves the ordinary and constant rows' mean to ~3 and the low-variance rows' to ~1e-2."""
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    base = 3.0 if offset else 0.0
    return {
        "ordinary": (n(3, C) * 2.0 + base).astype(np.float32),
        "constant": np.repeat((n(3, 1) * 2.0 + base), C, axis=1).astype(np.float32),
        # a mean ~10 standard deviations off 0 (so the mean is subtracted; further off, float32's
        # rounding of the mean alone exceeds 1e-5 of the deviations)
        "low-variance": (n(3, 1) * 1e-2 * offset + n(3, C) * 1e-3).astype(np.float32),
        "tiny": (n(3, C) * 1e-4).astype(np.float32),
    }


def _check_rows(got, want, groups: dict[str, np.ndarray], what: str, const_bound=None) -> None:
    """Each group of rows on its own (a whole-matrix norm would let the ordinary rows hide the
    others). layer_norm's constant rows (const_bound given) are held to an absolute bound per
    element instead: float32's mean of a constant row c may be a few ULPs off, and that
    difference is scaled by 1/sqrt(eps), so the result is bias + O(ulp(c) / sqrt(eps)) * scale
    where the float64 result is exactly bias (see _ln_const_bound)."""
    assert np.isfinite(got).all(), f"{what}: non-finite output {got[~np.isfinite(got)][:4]}"
    i = 0
    for name, rows in groups.items():
        g, w = got[i:i + len(rows)], want[i:i + len(rows)]
        i += len(rows)
        if name == "constant" and const_bound is not None:
            err, bound = np.abs(O.f64(g) - w), const_bound(rows)
            assert (err <= bound).all(), f"{what} {name} rows: error {err.max():.3e} > {bound.max():.3e}"
        elif not np.any(w):
            assert np.abs(g).max() == 0, f"{what} {name} rows: {np.abs(g).max():.3e} where 0 is exact"
        else:
            O.assert_close(g, w, TOL32, f"{what} {name} rows")


def _ln_const_bound(scale, eps: float = 1e-5):
    """|mean - c| <= (C + 2) u |c| (summation's worst case, Higham's gamma_n, plus the scaling by
    1/C), so |result - bias| <= (C + 2) u |c| / sqrt(eps) |scale|: ~0.06 |scale| at C = 1023 and
    c ~ 3. With eps = 0 the same rows give NaN (var = 0) or (x - mean) / |x - mean| = +-1 scale."""
    s = np.abs(O.f64(scale)) if scale is not None else 1.0
    u = 2.0 ** -24
    return lambda rows: (rows.shape[1] + 2) * u * np.abs(O.f64(rows[:, :1])) / np.sqrt(eps) * s + 1e-6


def _only(groups: dict, only) -> dict:
    return {k: v for k, v in groups.items() if only is None or k in only}


def check_layer_norm_edges(rng, C: int, only=None) -> None:
    for offset in (False, True):
        groups = _only(_rows(rng, C, offset=offset), only)
        x = np.concatenate(list(groups.values()))
        sc, bi = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
        _check_rows(ts.jit(ts.ops.layer_norm)(x), O.layer_norm(x), groups, f"layer_norm(offset={offset})",
                    _ln_const_bound(None))
        got = ts.jit(lambda a, s, b: ts.ops.layer_norm(a, s, b))(x, sc, bi)
        _check_rows(got, O.layer_norm(x, sc, bi), groups, f"layer_norm+scale+bias(offset={offset})",
                    _ln_const_bound(sc))


def check_rms_norm_edges(rng, C: int, only=None) -> None:
    groups = _rows(rng, C, offset=False)
    groups["zero"] = np.zeros((2, C), np.float32)   # mean square exactly 0: only eps keeps it finite
    groups = _only(groups, only)
    x = np.concatenate(list(groups.values()))
    sc = rng.standard_normal(C).astype(np.float32)
    _check_rows(ts.jit(ts.ops.rms_norm)(x), O.rms_norm(x), groups, "rms_norm")
    _check_rows(ts.jit(lambda a, s: ts.ops.rms_norm(a, s))(x, sc), O.rms_norm(x, sc), groups, "rms_norm+scale")


@pytest.mark.parametrize("C", [13, 127, 1023])
def test_layer_norm_constant_and_low_variance_rows(rng, C):
    check_layer_norm_edges(rng, C)


@pytest.mark.parametrize("C", [13, 127, 1025])
def test_rms_norm_tiny_and_zero_rows(rng, C):
    check_rms_norm_edges(rng, C)


def test_the_edge_rows_are_where_eps_matters(rng):
    """The oracle itself: eps = 0 moves the low-variance and tiny rows by 30 % or more (rms_norm's
    low-variance rows, mean square ~ eps: sqrt 2) and makes constant / zero rows non-finite,
    while ordinary rows move by < 1e-4."""
    g = _rows(rng, 64, offset=False)
    for op, eps in ((O.layer_norm, 1e-5), (O.rms_norm, 1e-6)):
        for name in ("low-variance", "tiny"):
            a, b = op(g[name], eps=eps), op(g[name], eps=0.0)
            assert O.rel_err(b, a) > 0.3, (op.__name__, name)
        assert O.rel_err(op(g["ordinary"], eps=eps), op(g["ordinary"], eps=0.0)) < 1e-4
    with np.errstate(invalid="ignore", divide="ignore"):
        assert not np.isfinite(O.layer_norm(g["constant"].astype(np.float64), eps=0.0)).all()
        assert not np.isfinite(O.rms_norm(np.zeros((1, 8)), eps=0.0)).all()


def _plant_eps_zero(monkeypatch) -> None:
    """Replace rowwise.generate with one compiled from its own source with the line that reads
    the op's eps replaced by ``eps = 0.0`` (the kernel then computes rsqrt(var))."""
    from tessera.passes.tile.kernels import rowwise
    src = inspect.getsource(rowwise)
    line = 'eps = norm.eps.value.data if hasattr(norm, "eps") else 0.0'
    assert src.count(line) == 1, "the row kernel's eps read moved: update this plant"
    ns: dict = {"__name__": rowwise.__name__}
    exec(compile(src.replace(line, "eps = 0.0"), rowwise.__file__, "exec"), ns)
    monkeypatch.setattr(rowwise, "generate", ns["generate"])
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")   # the planted kernels must be compiled, not looked up


@pytest.mark.parametrize("check, only", [
    (check_layer_norm_edges, None), (check_layer_norm_edges, ["constant"]),
    (check_layer_norm_edges, ["low-variance"]), (check_layer_norm_edges, ["tiny"]),
    (check_rms_norm_edges, None), (check_rms_norm_edges, ["zero"]), (check_rms_norm_edges, ["tiny"])])
def test_eps_zero_in_the_row_kernel_is_caught(rng, monkeypatch, check, only):
    """Each kind of edge row on its own catches the plant (constant / zero rows by a NaN, the
    low-variance and tiny ones by the size of the result); ordinary rows alone do not."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    check(rng, 127, only)   # the real compiler passes
    _plant_eps_zero(monkeypatch)
    check(rng, 127, ["ordinary"])   # rows of variance ~4 cannot see eps
    with pytest.raises(AssertionError):
        check(rng, 127, only)
