"""ONNX Pad, ConvTranspose and Resize (mode ``nearest``) replayed through ``tessera.ops``.

- ``Pad`` (versions 13/18/19/21): ``constant``, ``reflect`` and ``edge`` of a float tensor are
  ``tessera.ops.pad``; ``wrap``, and integer tensors, are slices (flipped for ``reflect``) and
  constants concatenated along each padded axis; a negative pad crops first.
- ``ConvTranspose`` (2-D): the input with ``stride - 1`` zeros put between its elements, padded by
  ``dilation * (k - 1) - pad`` on each side, convolved with the kernel flipped and its channel
  axes swapped (per group) — the transposed convolution written as a forward one.
- ``Resize`` with ``mode='nearest'``: each resized axis' source indices computed with numpy as
  ONNX defines them (coordinate transform, then ``nearest_mode``); an axis whose indices repeat
  each source index ``k`` times is a broadcast and a reshape, ``k`` apart a strided slice, else a
  gather (``take``) of at most ``BUILD_LIMIT`` indices.  ``linear`` and ``cubic`` are refused.
"""
from __future__ import annotations

import math

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.trace import constant
from tessera.frontend.vjp_rules import broadcast_to, flip
from tessera.onnx.convert import BUILD_LIMIT, ints, norm_axis, op


# ---------------------------------------------------------------------------- Pad
def _pad_check(attrs, opset):
    mode = attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        return f"mode={mode!r} (legal: constant, reflect, edge, wrap)"
    return None


def _axis_slice(x, ax, start, stop):
    item = [slice(None)] * x.ndim
    item[ax] = slice(start, stop)
    return x[tuple(item)]


def _wrap(x, ax, lo, hi):
    n = x.shape[ax]
    before, after = -(-lo // n), -(-hi // n)
    whole = ops.concatenate([x] * (before + 1 + after), axis=ax)
    start = before * n - lo
    return _axis_slice(whole, ax, start, start + n + lo + hi)


@op("Pad", inputs=(2, 4), attrs=("mode",), static=(1, 2, 3), check=_pad_check)
def _pad(ctx, ins):
    x = ctx.t(ins[0])
    mode = ctx.a("mode", "constant")
    pads = ints(ctx.const(ins[1], "pads"))
    axes = (ints(ctx.const(ins[3], "axes")) if len(ins) > 3 and ins[3] is not None else list(range(x.ndim)))
    if len(pads) != 2 * len(axes):
        raise ctx.refuse(f"{len(pads)} pads for {len(axes)} axes (two per axis)")
    axes = [norm_axis(ctx, a, x.ndim, "axes") for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.refuse(f"repeated axes {axes}")
    value = 0.0
    if len(ins) > 2 and ins[2] is not None:
        cv = np.asarray(ctx.const(ins[2], "constant_value"))
        if cv.size != 1:
            raise ctx.refuse(f"constant_value has {cv.size} elements (one scalar)")
        value = cv.reshape(-1)[0].item()
    widths = [(0, 0)] * x.ndim
    for i, ax in enumerate(axes):
        lo, hi = pads[i], pads[i + len(axes)]
        if lo < 0 or hi < 0:        # a negative pad removes elements
            x = _axis_slice(x, ax, max(-lo, 0), x.shape[ax] - max(-hi, 0))
        widths[ax] = (max(lo, 0), max(hi, 0))
    if all(w == (0, 0) for w in widths):
        return [x]
    if mode != "wrap" and dt.kind(x.dtype) == "f":
        return [ops.pad(x, tuple(widths), mode=mode, constant_values=value if mode == "constant" else 0)]
    for ax, (lo, hi) in enumerate(widths):      # wrap, and integer tensors: slices concatenated
        if lo or hi:
            n = x.shape[ax]
            if n == 0 and mode != "constant":
                raise ctx.refuse(f"mode {mode!r} cannot pad the empty axis {ax}")
            if mode == "reflect" and max(lo, hi) >= n:
                raise ctx.refuse(f"reflect pads ({lo}, {hi}) must be smaller than axis {ax} (size {n})")
            x = _wrap(x, ax, lo, hi) if mode == "wrap" else _concat_pad(x, ax, lo, hi, mode, value)
    return [x]


def _concat_pad(x, ax, lo, hi, mode, value):
    n = x.shape[ax]

    def block(w, at_end):
        if mode == "constant":
            return broadcast_to(constant(value, x.dtype), x.shape[:ax] + (w,) + x.shape[ax + 1:])
        if mode == "edge":
            one = _axis_slice(x, ax, n - 1, n) if at_end else _axis_slice(x, ax, 0, 1)
            return ops.concatenate([one] * w, axis=ax)
        return flip(_axis_slice(x, ax, n - 1 - w, n - 1) if at_end else _axis_slice(x, ax, 1, w + 1), ax)
    parts = ([block(lo, False)] if lo else []) + [x] + ([block(hi, True)] if hi else [])
    return ops.concatenate(parts, axis=ax)


# ---------------------------------------------------------------------------- ConvTranspose
def _convt_check(attrs, opset):
    ks = attrs.get("kernel_shape")
    if ks is not None and len(ks) != 2:
        return f"a {len(ks)}-D kernel (kernel_shape={list(ks)}); only 2-D ConvTranspose is mapped"
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        return f"auto_pad={attrs['auto_pad']!r}"
    for k, n in (("strides", 2), ("dilations", 2), ("pads", 4), ("output_padding", 2), ("output_shape", 2)):
        if k in attrs and len(attrs[k]) != n:
            return f"{k}={list(attrs[k])} (2-D: {n} values)"
    return None


def _zeros_between(x, s):
    """Along axes 2 and 3 of NCHW x: ``s - 1`` zeros after each element but the last."""
    n, c, h, w = x.shape
    if s == (1, 1):
        return x
    y = ops.reshape(x, (n, c, h, 1, w, 1))
    y = ops.pad(y, ((0, 0), (0, 0), (0, 0), (0, s[0] - 1), (0, 0), (0, s[1] - 1)))
    y = ops.reshape(y, (n, c, h * s[0], w * s[1]))
    return y[:, :, : (h - 1) * s[0] + 1, : (w - 1) * s[1] + 1]


@op("ConvTranspose", inputs=(2, 3), attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                                           "output_shape", "pads", "strides"), check=_convt_check)
def _conv_transpose(ctx, ins):
    x, w = ctx.t(ins[0]), ctx.t(ins[1])
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.refuse(f"only 2-D ConvTranspose (rank-4 X and W) is mapped, got X {x.shape} and W {w.shape}")
    g = int(ctx.a("group", 1))
    c_in, c_per, kh, kw = w.shape
    if g < 1 or c_in != x.shape[1] or c_in % g:
        raise ctx.refuse(f"W {w.shape} does not fit X {x.shape} with group={g}")
    ks = ctx.a("kernel_shape")
    if ks is not None and tuple(int(k) for k in ks) != (kh, kw):
        raise ctx.refuse(f"kernel_shape {list(ks)} differs from W's spatial shape {(kh, kw)}")
    s = tuple(int(v) for v in ctx.a("strides", [1, 1]))
    d = tuple(int(v) for v in ctx.a("dilations", [1, 1]))
    op_ = [int(v) for v in ctx.a("output_padding", [0, 0])]
    keff = [d[i] * (k - 1) + 1 for i, k in enumerate((kh, kw))]
    hw = x.shape[2:]
    mode = ctx.a("auto_pad", "NOTSET")
    if ctx.a("output_shape") is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
        want = ([int(v) for v in ctx.a("output_shape")] if ctx.a("output_shape") is not None
                else [n * si for n, si in zip(hw, s)])
        # a negative total (output_shape beyond the full result) extends the result as output_padding does
        total = [s[i] * (hw[i] - 1) + op_[i] + keff[i] - want[i] for i in range(2)]
        upper = mode == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        pads = begin + [t - b for t, b in zip(total, begin)]
    elif mode == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = [int(v) for v in ctx.a("pads", [0, 0, 0, 0])]
        if min(pads) < 0:
            raise ctx.refuse(f"negative pads {pads}")
    # the forward convolution: kernel flipped, (C_in/g, C_out/g) swapped per group
    wf = flip(flip(w, 2), 3)
    wf = ops.transpose(ops.reshape(wf, (g, c_in // g, c_per, kh, kw)), (0, 2, 1, 3, 4))
    wf = ops.reshape(wf, (g * c_per, c_in // g, kh, kw))
    u = _zeros_between(x, s)
    lo = [keff[i] - 1 - pads[i] for i in range(2)]
    hi = [keff[i] - 1 - pads[i + 2] + op_[i] for i in range(2)]
    crop = [(max(-lo[i], 0), max(-hi[i], 0)) for i in range(2)]
    b = ctx.t(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    y = ops.conv2d(u, wf, b, stride=1, padding=tuple((max(lo[i], 0), max(hi[i], 0)) for i in range(2)),
                   dilation=d, groups=g)
    if any(c != (0, 0) for c in crop):
        y = y[:, :, crop[0][0]: y.shape[2] - crop[0][1], crop[1][0]: y.shape[3] - crop[1][1]]
    return [y]


# ---------------------------------------------------------------------------- Resize (nearest)
COORD = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
         "tf_crop_and_resize")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_check(attrs, opset):
    if attrs.get("mode", "nearest") != "nearest":
        return f"mode={attrs['mode']!r} (only 'nearest' is mapped)"
    ct = attrs.get("coordinate_transformation_mode", "half_pixel")
    if ct not in COORD or ct == "tf_crop_and_resize":
        return f"coordinate_transformation_mode={ct!r}"
    if attrs.get("nearest_mode", "round_prefer_floor") not in NEAREST:
        return f"nearest_mode={attrs['nearest_mode']!r}"
    if attrs.get("antialias", 0):
        return "antialias=1 (nearest resizing has no antialiasing to do only when it is 0)"
    return None


def _source(ct, nearest, n, out, scale):
    """ONNX's source index of each output index along one axis (float64, as its reference)."""
    i = np.arange(out, dtype=np.float64)
    if ct == "half_pixel":
        xo = (i + 0.5) / scale - 0.5
    elif ct == "half_pixel_symmetric":
        adj = out / (scale * n)
        xo = n / 2 * (1 - adj) + (i + 0.5) / scale - 0.5
    elif ct == "pytorch_half_pixel":
        xo = (i + 0.5) / scale - 0.5 if out > 1 else np.zeros_like(i)
    elif ct == "align_corners":
        xo = i * (n - 1) / (out - 1) if out > 1 else np.zeros_like(i)
    else:
        xo = i / scale
    if nearest == "round_prefer_floor":
        r = np.where(xo == np.floor(xo) + 0.5, np.floor(xo), np.round(xo))
    elif nearest == "round_prefer_ceil":
        r = np.where(xo == np.floor(xo) + 0.5, np.ceil(xo), np.round(xo))
    elif nearest == "floor":
        r = np.floor(xo)
    else:
        r = np.ceil(xo)
    return np.clip(r, 0, n - 1).astype(np.int64)


def _gather_axis(ctx, x, ax, idx):
    n = x.shape[ax]
    if np.array_equal(idx, np.arange(n)):
        return x
    for k in range(2, len(idx) + 1):            # each source index k times: broadcast + reshape
        if len(idx) == n * k and np.array_equal(idx, np.repeat(np.arange(n), k)):
            shp = x.shape[: ax + 1] + (1,) + x.shape[ax + 1:]
            y = broadcast_to(ops.reshape(x, shp), x.shape[: ax + 1] + (k,) + x.shape[ax + 1:])
            return ops.reshape(y, x.shape[:ax] + (n * k,) + x.shape[ax + 1:])
    step = int(idx[1] - idx[0]) if len(idx) > 1 else 1
    if step > 0 and np.array_equal(idx, idx[0] + step * np.arange(len(idx))):   # k apart: a strided slice
        item = [slice(None)] * x.ndim
        item[ax] = slice(int(idx[0]), int(idx[-1]) + 1, step)
        return x[tuple(item)]
    if len(idx) > BUILD_LIMIT:
        raise ctx.refuse(f"axis {ax}: {len(idx)} source indices in no regular pattern (at most {BUILD_LIMIT})")
    return ops.take(x, ctx.t(idx.astype(np.int32)), axis=ax)


@op("Resize", inputs=(1, 4), attrs=("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
                                    "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
                                    "nearest_mode"), static=(1, 2, 3), check=_resize_check)
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
        policy = ctx.a("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            sc = [o / m for o, m in zip(sizes, n)]
            f = min(sc) if policy == "not_larger" else max(sc) if policy == "not_smaller" else None
            if f is None:
                raise ctx.refuse(f"keep_aspect_ratio_policy={policy!r}")
            sizes = [int(math.floor(f * m + 0.5)) for m in n]
            scales = np.full(len(axes), f)
        else:
            scales = np.asarray([o / m for o, m in zip(sizes, n)], np.float64)
        out = list(sizes)
    else:
        if (scales <= 0).any():
            raise ctx.refuse(f"scales {list(scales)} must be positive")
        out = [int(math.floor(m * s)) for m, s in zip(n, scales)]
    if min(out) < 1:
        raise ctx.refuse(f"an output size of 0 ({out})")
    ct, nearest = ctx.a("coordinate_transformation_mode", "half_pixel"), ctx.a("nearest_mode", "round_prefer_floor")
    for ax, m, o, s in zip(axes, n, out, scales):
        x = _gather_axis(ctx, x, ax, _source(ct, nearest, m, o, float(s)))
    return [x]
