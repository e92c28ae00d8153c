"""ONNX Resize (versions 13, 18, 19), modes ``nearest``, ``linear``, ``cubic``, replayed through ``tessera.ops``.

Resizing is separable: each resized axis is done alone.  Its source coordinates are computed with
numpy in float64 as ONNX's reference computes them (the coordinate transform with the float output
width ``scale * n``), so the trace holds only static index patterns and weights:

- ``nearest``: one source index per output index (``nearest_mode``, clamped into the axis);
- ``linear``: ``(1 - r) * x[i] + r * x[i + 1]`` with ``i = floor(x_ori)``, ``r = x_ori - i``;
- ``cubic``: four taps around ``x_ori`` weighted by Keys' kernel (``cubic_coeff_a``;
  ``exclude_outside`` zeroes and renormalises the taps outside the axis);

the input edge-padded so that the indices need no clamp (ONNX's reference clamps them).

An axis whose pattern is periodic — output index ``q + P j`` reads source ``u_q + S j`` with one
weight per phase ``q``: integer up- and down-sampling in every transform — is ``P`` strided slices
(an identity, a broadcast for nearest repeats) interleaved by a stack and a reshape, for ``P`` up
to ``MAX_PHASES``; otherwise a ``take`` of at most ``BUILD_LIMIT`` indices (and weights).
With ``antialias`` (linear, cubic) a downsampled axis gets the reference's stretched kernel: more
taps, normalised weights.  ``tf_crop_and_resize``, nearest ``antialias`` and linear
``exclude_outside`` are refused.
"""
from __future__ import annotations

import math

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.vjp_rules import broadcast_to
from tessera.onnx.convert import BUILD_LIMIT, ints, norm_axis, op
from tessera.onnx.ops_spatial import _concat_pad

COORD = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
MAX_PHASES = 16


def _check(attrs, opset):
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        return f"mode={mode!r}"
    ct = attrs.get("coordinate_transformation_mode", "half_pixel")
    if ct not in COORD:
        return f"coordinate_transformation_mode={ct!r}"
    if mode == "nearest" and attrs.get("nearest_mode", "round_prefer_floor") not in NEAREST:
        return f"nearest_mode={attrs['nearest_mode']!r}"
    if attrs.get("antialias", 0) and mode == "nearest":
        return "antialias=1 with mode='nearest' (ONNX defines it for linear and cubic)"
    if mode == "linear" and attrs.get("exclude_outside", 0):
        return "exclude_outside=1 with mode='linear'"
    return None


def source_coords(ct: str, n: int, out: int, scale: float) -> np.ndarray:
    """ONNX's source coordinate of each output index along one axis (float64, as its reference)."""
    i = np.arange(out, dtype=np.float64)
    width = scale * n                       # the float output width, not ``out``
    if ct == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if ct == "half_pixel_symmetric":
        return n / 2 * (1 - out / width) + (i + 0.5) / scale - 0.5
    if ct == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if width != 1 else np.full(out, -0.5)
    if ct == "align_corners":
        return i * (n - 1) / (width - 1) if width != 1 else np.zeros(out)
    return i / scale                        # asymmetric


def nearest_index(x: np.ndarray, mode: str, n: int) -> np.ndarray:
    tie = x == np.floor(x) + 0.5
    if mode == "round_prefer_floor":
        r = np.where(tie, np.floor(x), np.round(x))
    elif mode == "round_prefer_ceil":
        r = np.where(tie, np.ceil(x), np.round(x))
    else:
        r = np.floor(x) if mode == "floor" else np.ceil(x)
    return np.clip(r, 0, n - 1).astype(np.int64)


def cubic_taps(xo: np.ndarray, a: float, n: int, exclude_outside: bool):
    """The four source indices (unclamped) and weights of each output of cubic resizing, as ONNX's
    reference picks them: the two on each side of x_ori, or at an integer x_ori (ratio 1) the
    two below, the point and one above; weights from Keys' kernel with parameter ``a``."""
    xi = np.floor(xo)
    whole = xo == xi
    t = np.where(whole, 1.0, xo - xi)
    start = (xi - np.where(whole, 2, 1)).astype(np.int64)
    u = t + 1
    w = [((a * u - 5 * a) * u + 8 * a) * u - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
         ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1]
    v = 2 - t
    w.append(((a * v - 5 * a) * v + 8 * a) * v - 4 * a)
    taps = [start + k for k in range(4)]
    if exclude_outside:
        w = [np.where((tp < 0) | (tp >= n), 0.0, wk) for tp, wk in zip(taps, w)]
        total = sum(w)
        w = [wk / np.where(total == 0, 1.0, total) for wk in w]
    return taps, w


def _keys(x, a):
    x = np.abs(x)
    return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))


def antialias_taps(xo: np.ndarray, mode: str, scale: float, a: float, n: int, exclude_outside: bool):
    """Antialiased linear / cubic taps as ONNX's reference: when downsampling the kernel is
    stretched by 1 / scale (a wider footprint of taps), its weights normalised to sum 1; the
    footprint's taps are the ones nearest x_ori (ties to the smaller index)."""
    s = min(scale, 1.0)
    xi = np.floor(xo)
    ratio = np.where(xo == xi, 1.0, xo - xi)
    first = int(np.floor((-1 if mode == "linear" else -2) / s) + 1)
    k = np.arange(first, 2 - first)                # the footprint's offsets from floor(x_ori)
    if mode == "linear":
        w = np.clip(1 - np.abs((k[None, :] - ratio[:, None]) * s), 0, 1)
    else:
        w = _keys(s * (k[None, :] - ratio[:, None]), a)
    w = w / w.sum(axis=1, keepdims=True)
    taps = len(k)
    pad = -(-taps // 2)
    xp = xo + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if taps % 2 == 0:
        off = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        base = -((taps - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    idx = (p + off - pad)[:, None] + np.arange(taps)[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= n), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return [idx[:, j] for j in range(taps)], [w[:, j] for j in range(taps)]


def _phases(taps, weights, out):
    """The smallest period P of the pattern (each tap's source index steps by one S per period,
    each weight repeats), as (P, S), or None."""
    for p in range(1, min(out, MAX_PHASES) + 1):
        if out % p:
            continue
        j = out // p
        if j == 1:
            return p, 1
        rows = [t.reshape(j, p) for t in taps]
        step = rows[0][1, 0] - rows[0][0, 0]
        if step < 1:
            continue
        ok = all((np.diff(r, axis=0) == step).all() for r in rows)
        if ok and all((w.reshape(j, p) == w.reshape(j, p)[0]).all() for w in weights):
            return p, int(step)
    return None


def _slice(x, ax, start, count, step):
    item = [slice(None)] * x.ndim
    item[ax] = slice(start, start + step * (count - 1) + 1, step)
    return x[tuple(item)]


def _interleave(parts, ax):
    """``parts`` (each J long on ``ax``) interleaved: output index q + P j is parts[q][j]."""
    if len(parts) == 1:
        return parts[0]
    y = ops.stack(parts, axis=ax + 1)
    s = y.shape
    return ops.reshape(y, s[:ax] + (s[ax] * s[ax + 1],) + s[ax + 2:])


def _axis(ctx, x, ax, taps, weights):
    """Output index i along ``ax`` = sum over k of weights[k][i] * x[taps[k][i]] (weights None: one
    tap, copied).  Taps are in range."""
    n, out = x.shape[ax], len(taps[0])
    if weights is None and np.array_equal(taps[0], np.arange(n)):
        return x
    found = _phases(taps, weights or [], out)
    if found is not None:
        p, s = found
        j = out // p
        parts = []
        for q in range(p):
            src = [_slice(x, ax, int(t[q]), j, s) for t in taps]
            if weights is None:
                parts.append(src[0])
            else:
                ws = [float(w[q]) for w in weights]
                acc = None
                for v, w in zip(src, ws):
                    if w != 0.0:
                        acc = v * w if acc is None else acc + v * w
                parts.append(acc if acc is not None else src[0] * 0.0)
        return _interleave(parts, ax)
    if weights is None:      # nearest: each source index repeated k times is a broadcast
        for k in range(2, out + 1):
            if out == n * k and np.array_equal(taps[0], np.repeat(np.arange(n), k)):
                shp = x.shape[: ax + 1] + (1,) + x.shape[ax + 1:]
                y = broadcast_to(ops.reshape(x, shp), x.shape[: ax + 1] + (k,) + x.shape[ax + 1:])
                return ops.reshape(y, x.shape[:ax] + (out,) + x.shape[ax + 1:])
    if out > BUILD_LIMIT:
        raise ctx.refuse(f"axis {ax}: {out} output indices in no pattern of up to {MAX_PHASES} phases "
                         f"(at most {BUILD_LIMIT} are gathered one by one)")
    shape = (1,) * ax + (out,) + (1,) * (x.ndim - ax - 1)
    acc = None
    for k, t in enumerate(taps):
        v = ops.take(x, ctx.t(t.astype(np.int32)), axis=ax)
        if weights is not None:
            v = v * ops.reshape(ctx.t(weights[k].astype(x.dtype)), shape)
        acc = v if acc is None else acc + v
    return acc


@op("Resize", inputs=(1, 4), attrs=("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
                                    "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
                                    "nearest_mode"), static=(1, 2, 3), check=_check)
def _resize(ctx, ins):
    x = ctx.t(ins[0])
    rank = x.ndim
    axes = [norm_axis(ctx, int(a), rank, "axes") for a in ctx.a("axes", range(rank))]
    scales = (np.asarray(ctx.const(ins[2], "scales"), np.float64).reshape(-1)
              if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size else None)
    sizes = (ints(ctx.const(ins[3], "sizes")) if len(ins) > 3 and ins[3] is not None and np.asarray(ins[3]).size
             else None)
    if (scales is None) == (sizes is None):
        raise ctx.refuse("exactly one of scales and sizes must be given")
    if len(scales if sizes is None else sizes) != len(axes):
        raise ctx.refuse(f"{len(scales if sizes is None else sizes)} scales/sizes for {len(axes)} axes")
    n = [x.shape[a] for a in axes]
    if sizes is not None:
        scales = np.asarray([o / m for o, m in zip(sizes, n)], np.float64)
        policy = ctx.a("keep_aspect_ratio_policy", "stretch")
        if policy in ("not_larger", "not_smaller"):
            f = scales.min() if policy == "not_larger" else scales.max()
            scales = np.full(len(axes), f)
            sizes = [int(f * m + 0.5) for m in n]
        elif policy != "stretch":
            raise ctx.refuse(f"keep_aspect_ratio_policy={policy!r}")
        out = list(sizes)
    else:
        if (scales <= 0).any():
            raise ctx.refuse(f"scales {list(scales)} must be positive")
        out = [int(m * s) for m, s in zip(n, scales)]
    if min(out) < 1:
        raise ctx.refuse(f"an output size of 0 ({out})")
    mode, ct = ctx.a("mode", "nearest"), ctx.a("coordinate_transformation_mode", "half_pixel")
    if mode != "nearest" and dt.kind(x.dtype) != "f":
        raise ctx.refuse(f"{mode} resizing takes a float tensor, got {dt.name(x.dtype)}")
    for ax, m, o, s in zip(axes, n, out, scales):
        if math.isclose(float(s), 1.0) and o == m:
            continue                                       # ONNX's reference skips an identity axis
        xo = source_coords(ct, m, o, float(s))
        if mode == "nearest":
            x = _axis(ctx, x, ax, [nearest_index(xo, ctx.a("nearest_mode", "round_prefer_floor"), m)], None)
            continue
        if ctx.a("antialias", 0):
            taps, weights = antialias_taps(xo, mode, float(s), float(ctx.a("cubic_coeff_a", -0.75)), m,
                                           bool(ctx.a("exclude_outside", 0)))
        elif mode == "linear":
            i0 = np.floor(xo).astype(np.int64)
            taps, weights = [i0, i0 + 1], [1.0 - (xo - i0), xo - i0]
        else:
            taps, weights = cubic_taps(xo, float(ctx.a("cubic_coeff_a", -0.75)), m, bool(ctx.a("exclude_outside", 0)))
        lo, hi = max(0, -int(min(t.min() for t in taps))), max(0, int(max(t.max() for t in taps)) + 1 - m)
        if lo or hi:        # edge-pad so that every tap is in range: slices concatenated (ops.pad's edge
            # mode fails to compile on a leading axis when the batch is dynamic: PASS_FAILED, a TypeError in
            # passes/tile/kernels/pad.py; reported, not fixed here)
            x = _concat_pad(x, ax, lo, hi, "edge", 0)
        x = _axis(ctx, x, ax, [t + lo for t in taps], weights)
    return [x]
