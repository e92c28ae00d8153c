"""ONNX Pad and ConvTranspose replayed through ``tessera.ops`` (Resize: ``ops_resize.py``).

- ``Pad`` (versions 13/18/19/21): ``constant``, ``reflect`` and ``edge`` of a float tensor are
  ``tessera.ops.pad``; ``wrap``, integer tensors, and ``reflect``/``edge`` with the last axis
  unpadded are slices (flipped for ``reflect``) and constants concatenated along each padded
  axis; a negative pad crops first.
- ``ConvTranspose`` (2-D): the input with ``stride - 1`` zeros put between its elements, padded by
  ``dilation * (k - 1) - pad`` on each side, convolved with the kernel flipped and its channel
  axes swapped (per group) — the transposed convolution written as a forward one.
"""
from __future__ import annotations

import numpy as np

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.frontend.trace import constant
from tessera.frontend.vjp_rules import broadcast_to, flip
from tessera.onnx.convert import ints, norm_axis, op


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
    # ops.pad's edge/reflect kernel fails to compile (PASS_FAILED, a TypeError in passes/tile/kernels/pad.py)
    # when the last axis is unpadded and a dim is dynamic: those pads are concatenated slices too
    if mode != "wrap" and dt.kind(x.dtype) == "f" and (mode == "constant" or widths[-1] != (0, 0)):
        return [ops.pad(x, tuple(widths), mode=mode, constant_values=value if mode == "constant" else 0)]
    for ax, (lo, hi) in enumerate(widths):      # wrap, integer tensors, the case above: slices concatenated
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
