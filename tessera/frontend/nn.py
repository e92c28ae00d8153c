"""Neural-network ops of ``tessera.ops``: ``pad``, ``conv2d``, ``max_pool2d``, ``avg_pool2d``.

``pad`` is one Graph IR op (``tessera.pad``, a ``pad`` kernel).  ``conv2d`` is an implicit
GEMM: ``tessera.conv_patches`` views the padded NHWC input as [N, Ho, Wo, Kh*Kw*C_in/groups]
without materialising it, and a matmul with the HWIO weights reshaped to [Kh*Kw*C_in/groups,
C_out/groups] takes it as its A operand: the GEMM kernel packs each A panel from one strided
view of the input per kernel tap (passes/tile/kernels/gemm.py), so no im2col buffer exists.
Bias and activations ride the GEMM's epilogue.  NCHW is transposed to NHWC inside the pad
kernel and back after the GEMM (canonicalize moves the elementwise ops that follow above that
transpose, into the epilogue).  Depthwise convolutions (C_in/groups == 1) are one elementwise
chain of multiply-adds over the taps' strided windows; pooling is a maximum / sum chain over
the windows (one elementwise kernel after the pad).

These run on the CPU lane; on a GPU lane (target ``nvidia`` / ``rocm``) they are refused by
name at trace time (``UNSUPPORTED_CONSTRUCT``).
"""
from __future__ import annotations

import numbers

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError, RankMismatchError, ShapeMismatchError, UnsupportedConstructError
from tessera.frontend import ops
from tessera.frontend.trace import Tensor, _err, add_node, current_lane, promote_pair, require_float

PAD_MODES = ("constant", "reflect", "edge")
LAYOUTS = ("NCHW", "NHWC")
GPU_TARGETS = ("nvidia", "rocm")


def _cpu_only(op: str) -> None:
    lane = current_lane()
    if lane is not None and lane[0] in GPU_TARGETS:
        raise _err(UnsupportedConstructError, f"tessera.ops.{op} has no {lane[0]} lowering yet (lane "
                                              f"{lane[0]}); it runs on the CPU lane (target='cpu')")


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, np.integer)):
        raise _err(ArgumentError, f"{what} must be an int, got {v!r}")
    return int(v)


def _widths(pad_width, rank: int) -> tuple[tuple[int, int], ...]:
    """numpy's pad_width forms: n, (n,), (lo, hi), ((lo, hi),), or one (lo, hi) per axis."""
    def flat(v):
        if isinstance(v, (tuple, list, np.ndarray)):
            return [flat(u) for u in v]
        return _int(v, "pad: a pad width")
    spec = flat(pad_width)
    try:
        arr = np.broadcast_to(np.asarray(spec, dtype=np.int64), (rank, 2))
    except ValueError:
        raise _err(ArgumentError, f"pad: pad_width {pad_width!r} does not fit rank {rank} (give n, (lo, hi) "
                                  "or one (lo, hi) per axis)") from None
    if (arr < 0).any():
        raise _err(ArgumentError, f"pad: pad widths must be >= 0, got {pad_width!r}")
    return tuple((int(lo), int(hi)) for lo, hi in arr)


def pad(x, pad_width, mode: str = "constant", constant_values=0) -> Tensor:
    """numpy's ``pad`` with modes ``constant`` (``constant_values``: one Python number),
    ``reflect`` (mirror without repeating the edge; each width smaller than its axis) and
    ``edge``.  Widths are static; a padded axis is compiled in (specialised on)."""
    x = ops._t(x, "pad")
    require_float(x, "pad")
    _cpu_only("pad")
    if mode not in PAD_MODES:
        raise _err(ArgumentError, f"pad: mode {mode!r}; legal: {', '.join(PAD_MODES)}")
    if isinstance(constant_values, bool) or not isinstance(constant_values, numbers.Real):
        raise _err(ArgumentError, f"pad: constant_values must be one Python number, got {constant_values!r}")
    if mode != "constant" and constant_values != 0:
        raise _err(ArgumentError, f"pad: constant_values applies to the constant mode only (got {mode!r})")
    widths = _widths(pad_width, x.ndim)
    shape = x._node.shape
    for ax, ((lo, hi), n) in enumerate(zip(widths, shape)):
        if lo == hi == 0:
            continue
        if mode == "reflect" and max(lo, hi) >= n:
            raise _err(ShapeMismatchError, f"pad: reflect widths ({lo}, {hi}) must be smaller than axis {ax} "
                                           f"(size {n})")
        if mode == "edge" and n == 0:
            raise _err(ShapeMismatchError, f"pad: mode 'edge' cannot pad the empty axis {ax}")
        x._node.observed.add(ax)
    if all(w == (0, 0) for w in widths):
        return x
    out = tuple(n + lo + hi for n, (lo, hi) in zip(shape, widths))
    return add_node("pad", [x._node], {"pads": widths, "mode": mode, "value": float(constant_values)}, out, x.dtype)


# --------------------------------------------------------------------------- conv2d
def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise _err(ArgumentError, f"{what} must be an int or a pair, got {v!r}")
        return _int(v[0], what), _int(v[1], what)
    n = _int(v, what)
    return n, n


def _layout(layout, op: str) -> str:
    if layout not in LAYOUTS:
        raise _err(ArgumentError, f"{op}: layout {layout!r}; legal: {', '.join(LAYOUTS)}")
    return layout


def _same(n: int, k: int, s: int, d: int) -> tuple[int, int]:
    """TF/JAX 'SAME': ceil(n / s) outputs; the odd pad goes after (bottom / right)."""
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2


def _padding(padding, hw, khw, stride, dil) -> tuple[tuple[int, int], tuple[int, int]]:
    if isinstance(padding, str):
        p = padding.lower()
        if p == "valid":
            return (0, 0), (0, 0)
        if p == "same":
            return tuple(_same(n, k, s, d) for n, k, s, d in zip(hw, khw, stride, dil))
        raise _err(ArgumentError, f"conv2d: padding {padding!r}; legal: an int, (ph, pw), ((top, bottom), (left, right)), "
                                  "'same', 'valid'")
    if isinstance(padding, (tuple, list)) and len(padding) == 2 and all(isinstance(p, (tuple, list)) for p in padding):
        out = tuple(_pair(p, "conv2d: padding") for p in padding)
    else:
        ph, pw = _pair(padding, "conv2d: padding")
        out = ((ph, ph), (pw, pw))
    if any(v < 0 for p in out for v in p):
        raise _err(ArgumentError, f"conv2d: padding must be >= 0, got {padding!r}")
    return out


def _out_size(n: int, pads, k: int, s: int, d: int, what: str, axis: str) -> int:
    span = (k - 1) * d + 1
    padded = n + pads[0] + pads[1]
    if span > padded:
        raise _err(ShapeMismatchError, f"{what}: the kernel's extent {span} along {axis} (size {k}, dilation {d}) "
                                       f"is larger than the padded input ({padded})")
    return (padded - span) // s + 1


def _window(xp: Tensor, hax: int, h0: int, w0: int, ho: int, wo: int, s) -> Tensor:
    """The tap's strided window of the padded input: rows h0, h0 + s, ... (ho of them)."""
    item = [slice(None)] * xp.ndim
    item[hax] = slice(h0, h0 + (ho - 1) * s[0] + 1, s[0])
    item[hax + 1] = slice(w0, w0 + (wo - 1) * s[1] + 1, s[1])
    return xp[tuple(item)]


def conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups: int = 1, layout: str = "NCHW") -> Tensor:
    """2-D convolution (cross-correlation, as torch and JAX compute it).

    ``layout="NCHW"``: x is [N, C_in, H, W], w is OIHW [C_out, C_in/groups, Kh, Kw], the result
    [N, C_out, Ho, Wo] -- torch.nn.functional.conv2d.  ``layout="NHWC"``: x is [N, H, W, C_in],
    w is HWIO [Kh, Kw, C_in/groups, C_out], the result [N, Ho, Wo, C_out] --
    jax.lax.conv_general_dilated with dimension_numbers ("NHWC", "HWIO", "NHWC").
    ``bias``: [C_out] or None.  ``stride``, ``dilation``: an int or (sh, sw).  ``padding``: an
    int, (ph, pw), ((top, bottom), (left, right)), ``"valid"`` (none) or ``"same"`` (TF/JAX:
    ceil(H / stride) outputs, an odd total pad puts the extra row/column at the bottom/right).
    ``groups`` divides C_in and C_out (groups == C_in: depthwise).  Spatial sizes and channels
    are compiled in; the batch may vary.
    """
    x, w = ops._t(x, "conv2d"), ops._t(w, "conv2d")
    require_float(x, "conv2d")
    require_float(w, "conv2d")
    _cpu_only("conv2d")
    lay = _layout(layout, "conv2d")
    if x.ndim != 4 or w.ndim != 4:
        raise _err(RankMismatchError, f"conv2d: x and w must have rank 4, got {x.shape} and {w.shape}")
    x, w = promote_pair(x, w, "conv2d")
    g = _int(groups, "conv2d: groups")
    if lay == "NCHW":
        n, cin, H, W = x.shape
        cout, cig, kh, kw = w.shape
    else:
        n, H, W, cin = x.shape
        kh, kw, cig, cout = w.shape
    wname = "OIHW" if lay == "NCHW" else "HWIO"
    if g < 1 or cin % g or cout % g:
        raise _err(ShapeMismatchError, f"conv2d: groups={g} must divide C_in ({cin}) and C_out ({cout})")
    if cig * g != cin:
        raise _err(ShapeMismatchError, f"conv2d: x has {cin} channels but w ({wname} {w.shape}) expects "
                                       f"{cig} x groups {g} = {cig * g}")
    if kh < 1 or kw < 1:
        raise _err(ShapeMismatchError, f"conv2d: empty kernel {w.shape}")
    s = _pair(stride, "conv2d: stride")
    d = _pair(dilation, "conv2d: dilation")
    if min(s) < 1 or min(d) < 1:
        raise _err(ArgumentError, f"conv2d: stride {s} and dilation {d} must be >= 1")
    pads = _padding(padding, (H, W), (kh, kw), s, d)
    ho = _out_size(H, pads[0], kh, s[0], d[0], "conv2d", "H")
    wo = _out_size(W, pads[1], kw, s[1], d[1], "conv2d", "W")
    if bias is not None:
        bias = ops._t(bias, "conv2d")
        require_float(bias, "conv2d")
        if bias.shape != (cout,):
            raise _err(ShapeMismatchError, f"conv2d: bias must have shape ({cout},), got {bias.shape}")
        if bias.dtype != x.dtype:
            bias = ops.cast(bias, dt.promote(bias.dtype, x.dtype))
    cog = cout // g
    for ax in range(4):
        w._node.observed.add(ax)          # the kernel's shape and channels are compiled in
    if cig == 1:   # depthwise: one elementwise chain over the taps' windows, in the input's layout
        hax = 2 if lay == "NCHW" else 1
        spatial = [(0, 0)] * 4
        spatial[hax], spatial[hax + 1] = pads
        xp = pad(x, tuple(spatial)) if any(p != (0, 0) for p in pads) else x
        taps = [(i, j) for i in range(kh) for j in range(kw)]
        y = _depthwise(xp, w, lay, taps, hax, d, s, ho, wo, g, cog)
        if bias is not None:
            y = y + (ops.reshape(bias, (cout, 1, 1)) if lay == "NCHW" else bias)
        return y
    # implicit GEMM over NHWC: an NCHW input is transposed (by the pad kernel where there is padding)
    xh = ops.transpose(x, (0, 2, 3, 1)) if lay == "NCHW" else x
    xp = pad(xh, ((0, 0), pads[0], pads[1], (0, 0)))
    wh = ops.transpose(w, (2, 3, 1, 0)) if lay == "NCHW" else w          # HWIO
    for ax in (1, 2, 3):
        xp._node.observed.add(ax)                                        # H, W, C compiled in
    parts = []
    for gi in range(g):
        patches = add_node("conv_patches", [xp._node], {"kernel": (kh, kw), "stride": s, "dilation": d,
                                                        "channels": (gi * cig, cig)},
                           (n, ho, wo, kh * kw * cig), xp.dtype)
        wg = wh[..., gi * cog:(gi + 1) * cog] if g > 1 else wh
        parts.append(patches @ ops.reshape(wg, (kh * kw * cig, cog)))   # [N, Ho, Wo, C_out/groups]
    y = parts[0] if g == 1 else ops.concatenate(parts, axis=-1)
    if bias is not None:
        y = y + bias                                                     # the GEMM's epilogue
    return ops.transpose(y, (0, 3, 1, 2)) if lay == "NCHW" else y


def _depthwise(xp, w, lay, taps, hax, d, s, ho, wo, g, cog) -> Tensor:
    """C_in/groups == 1: output channel c*cog + j is sum over taps of x[c]-window * w[c*cog + j]."""
    n = xp.shape[0]
    acc = None
    for i, j in taps:
        win = _window(xp, hax, i * d[0], j * d[1], ho, wo, s)
        if lay == "NHWC":
            wt = w[i, j, 0, :]                                    # [C_out]
            term = win * wt if cog == 1 else ops.reshape(win, (n, ho, wo, g, 1)) * ops.reshape(wt, (g, cog))
        else:
            wt = w[:, 0, i, j]                                    # [C_out]
            term = (win * ops.reshape(wt, (g, 1, 1)) if cog == 1 else
                    ops.reshape(win, (n, g, 1, ho, wo)) * ops.reshape(wt, (g, cog, 1, 1)))
        acc = term if acc is None else acc + term
    return ops.reshape(acc, (n, g * cog, ho, wo) if lay == "NCHW" else (n, ho, wo, g * cog))


# --------------------------------------------------------------------------- pooling
def _pool(op: str, x, kernel_size, stride, padding, layout):
    x = ops._t(x, op)
    require_float(x, op)
    _cpu_only(op)
    lay = _layout(layout, op)
    if x.ndim != 4:
        raise _err(RankMismatchError, f"{op}: x must have rank 4 ({lay}), got {x.shape}")
    k = _pair(kernel_size, f"{op}: kernel_size")
    s = k if stride is None else _pair(stride, f"{op}: stride")
    p = _pair(padding, f"{op}: padding")
    if min(k) < 1 or min(s) < 1 or min(p) < 0:
        raise _err(ArgumentError, f"{op}: kernel_size {k} and stride {s} must be >= 1, padding {p} >= 0")
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise _err(ArgumentError, f"{op}: padding {p} must be at most half the kernel {k} (as torch)")
    hax = 2 if lay == "NCHW" else 1
    H, W = x.shape[hax], x.shape[hax + 1]
    ho = _out_size(H, (p[0], p[0]), k[0], s[0], 1, op, "H")
    wo = _out_size(W, (p[1], p[1]), k[1], s[1], 1, op, "W")
    return x, lay, k, s, p, hax, ho, wo


def _pool_windows(x, k, s, p, hax, ho, wo, fill):
    widths = [(0, 0)] * 4
    widths[hax], widths[hax + 1] = (p[0], p[0]), (p[1], p[1])
    xp = pad(x, tuple(widths), constant_values=fill) if any(p) else x
    return [_window(xp, hax, i, j, ho, wo, s) for i in range(k[0]) for j in range(k[1])]


def max_pool2d(x, kernel_size, stride=None, padding=0, layout: str = "NCHW") -> Tensor:
    """torch's ``max_pool2d`` (dilation 1, floor mode): the maximum of each window; ``stride``
    defaults to ``kernel_size``; ``padding`` (at most half the kernel) reads as -inf.  A NaN
    in a window gives NaN.  ``layout``: "NCHW" or "NHWC"."""
    x, lay, k, s, p, hax, ho, wo = _pool("max_pool2d", x, kernel_size, stride, padding, layout)
    wins = _pool_windows(x, k, s, p, hax, ho, wo, -np.inf)
    y = wins[0]
    for v in wins[1:]:
        y = ops.maximum(y, v)
    return y


def avg_pool2d(x, kernel_size, stride=None, padding=0, layout: str = "NCHW",
               count_include_pad: bool = True) -> Tensor:
    """torch's ``avg_pool2d`` with its defaults (floor mode, ``count_include_pad=True``): the
    sum of each window, padding read as zeros, divided by kh * kw everywhere (also at the
    edges).  ``count_include_pad=False`` is refused (not implemented)."""
    x, lay, k, s, p, hax, ho, wo = _pool("avg_pool2d", x, kernel_size, stride, padding, layout)
    if count_include_pad is not True:
        raise _err(ArgumentError, "avg_pool2d: only count_include_pad=True (torch's default) is implemented")
    wins = _pool_windows(x, k, s, p, hax, ho, wo, 0.0)
    y = wins[0]
    for v in wins[1:]:
        y = y + v
    return y / float(k[0] * k[1])


__all__ = ["pad", "conv2d", "max_pool2d", "avg_pool2d"]
