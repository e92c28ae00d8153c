"""The reference lane: the traced graph evaluated with numpy (float64 internally).

It runs only when a caller passes ``strict=False`` and compilation failed; the
lane log records ``lane="reference"`` with the reason.  It is also the meaning of
every op, written plainly.
"""
from __future__ import annotations

import math

import numpy as np

from tessera.frontend import reference_ints as R
from tessera.frontend import rowops
from tessera.errors import InternalError
from tessera.frontend.trace import TraceGraph

_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _erf64(x: np.ndarray) -> np.ndarray:
    return _erf(x).astype(np.float64)


def sigmoid64(y: np.ndarray) -> np.ndarray:
    """float64 sigmoid without cancellation or overflow (also the ULP sweep's reference)."""
    e = np.exp(-np.abs(y))
    return np.where(y >= 0, 1 / (1 + e), e / (1 + e))


def _scores64(q, k, mask, scale, causal):
    """The scaled scores q k^T with grouped-query heads expanded (query head h reads kv head
    h // (hq / hk)), an additive mask added and masked keys (causal, a bool mask) at -inf."""
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        k = np.repeat(k, hq // hk, axis=1)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    allowed = np.ones(s.shape, bool)
    if causal:
        allowed &= np.tril(np.ones(s.shape[-2:], bool))
    if mask is not None:
        if mask.dtype == np.bool_:
            allowed &= np.broadcast_to(mask, s.shape)
        else:
            s = s + mask
    return np.where(allowed, s, -np.inf)


def attention64(q, k, v, mask, scale, causal, masked_rows="zero"):
    """float64 scaled dot-product attention with Tessera's semantics (the oracle the tests use)."""
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        v = np.repeat(v, hq // hk, axis=1)
    s = _scores64(q, k, mask, scale, causal)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.exp(s - np.where(np.isfinite(m), m, 0))
        out = np.matmul(e, v) / e.sum(-1, keepdims=True)
    dead = np.isneginf(m[..., 0]) | (e.sum(-1) == 0)   # every key masked (a NaN or +inf score is no mask)
    out[dead] = 0.0 if masked_rows == "zero" else np.nan
    return out


def attention_grad64(q, k, v, o, do, mask, scale, causal):
    """float64 dQ, dK, dV of ``attention64`` (o: its output) packed as tessera.attention_grad packs
    them, [B, HKV, G + 2, S, D]; a fully-masked query row contributes nothing."""
    b, hq, s, d = q.shape
    hk = k.shape[1]
    g = hq // hk
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    sc = _scores64(q, k, mask, scale, causal)
    m = sc.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = np.exp(sc - np.where(np.isfinite(m), m, 0))
        p = np.nan_to_num(e / e.sum(-1, keepdims=True))
    dp = np.matmul(do, np.swapaxes(vr, -1, -2))
    ds = p * (dp - (do * o).sum(-1, keepdims=True))
    dq = np.matmul(ds, kr) * scale
    dk = (np.matmul(np.swapaxes(ds, -1, -2), q) * scale).reshape(b, hk, g, s, d).sum(2)
    dv = np.matmul(np.swapaxes(p, -1, -2), do).reshape(b, hk, g, s, d).sum(2)
    return np.concatenate([dq.reshape(b, hk, g, s, d), dk[:, :, None], dv[:, :, None]], axis=2)


def attention_lse64(q, k, v, mask, scale, causal):
    """float64 log-sum-exp per query row of ``attention64``'s scaled, masked scores ([B, H, SQ]):
    ``tessera.attention``'s second result; +inf for a row with every key masked."""
    s = _scores64(q, k, mask, scale, causal)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mf = np.where(np.isfinite(m), m, 0)
        lse = (mf + np.log(np.exp(s - mf).sum(-1, keepdims=True)))[..., 0]
    return np.where(np.isneginf(lse), np.inf, lse)


def bounded_indices(i, n: int) -> np.ndarray:
    """The gathers' index policy (ir/graph_index.py): numpy's meaning in [-n, n), clamped outside."""
    i = np.asarray(i).astype(np.int64)
    return np.clip(np.where(i < 0, i + n, i), 0, n - 1)


def gather64(op: str, x: list, attrs: dict, shape) -> np.ndarray:
    """take / take_along_axis / one_hot on float64 values (indices arrive as float64 here)."""
    if op == "one_hot":
        lab = np.asarray(x[0]).astype(np.int64)
        return (lab[..., None] == np.arange(shape[-1])).astype(np.float64)
    ax = attrs["axis"]
    i = bounded_indices(x[1], x[0].shape[ax])
    if op == "take":
        return np.take(x[0], i, axis=ax)
    return _along(x[0], i, ax)


def scatter_add64(x: list, attrs: dict, shape) -> np.ndarray:
    """scatter_add on float64 values: the target (or zeros) plus the updates added at the bounded
    indices along the axis, duplicates summed (``np.add.at``)."""
    ax = attrs["axis"]
    out = np.array(x[2], np.float64) if attrs["based"] else np.zeros(shape, np.float64)
    i = bounded_indices(x[0], shape[ax]).reshape(-1)
    u = np.asarray(x[1], np.float64).reshape(shape[:ax] + (i.size,) + tuple(shape[ax + 1:]))
    np.add.at(out, (slice(None),) * ax + (i,), u)
    return out


def _along(a, i, ax):
    """take_along_axis with the off-axis dims broadcast both ways (numpy broadcasts them too)."""
    sa, si = list(a.shape), list(i.shape)
    out = [max(p, q) if k != ax else si[k] for k, (p, q) in enumerate(zip(sa, si))]
    a = np.broadcast_to(a, [out[k] if k != ax else sa[k] for k in range(len(sa))])
    return np.take_along_axis(a, np.broadcast_to(i, out), ax)


def _sigmoid_np(v):
    return sigmoid64(v)


# float64 numpy oracles of tessera.ops's elementwise math (round: half to even, as np.rint)
_NUMPY_UNARY = {"log": np.log, "log1p": np.log1p, "exp2": np.exp2, "expm1": np.expm1, "sin": np.sin,
                "cos": np.cos, "sigmoid": _sigmoid_np, "abs": np.abs, "sign": np.sign,
                "rsqrt": lambda v: 1.0 / np.sqrt(v), "reciprocal": lambda v: 1.0 / v, "floor": np.floor,
                "ceil": np.ceil, "round": np.rint, "square": np.square}


def evaluate(graph: TraceGraph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The graph in float64 numpy (ints in their own dtypes).  IEEE results (inf * 0, 0 / 0, the
    log of a negative) are values here, as in the kernels: numpy's warnings about them are off."""
    with np.errstate(all="ignore"):
        return _evaluate(graph, arrays)


def _gelu(n, x):
    # 0.5 v (1 + tanh(y)) = v sigmoid(2 y) and 0.5 v (1 + erf(z)) = 0.5 v erfc(-z): the same
    # functions without the cancellation of 1 + tanh / 1 + erf for v << 0
    v = x[0]
    if n.attrs["approximate"] == "tanh":
        return v * sigmoid64(2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))
    return 0.5 * v * _erfc(-v / math.sqrt(2)).astype(np.float64)


def _softmax(n, x):
    ax = n.attrs["axis"]
    e = np.exp(x[0] - x[0].max(axis=ax, keepdims=True))
    return e / e.sum(axis=ax, keepdims=True)


def _norm(n, x):
    v, rest = x[0], iter(x[1:])
    if n.op == "layer_norm":
        mu = v.mean(-1, keepdims=True)
        r = (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + n.attrs["eps"])
    else:
        r = v / np.sqrt((v * v).mean(-1, keepdims=True) + n.attrs["eps"])
    present = n.attrs["present"]
    if present[0]:
        r = r * next(rest)
    if len(present) > 1 and present[1]:
        r = r + next(rest)
    return r


def _pad(n, x):
    kw = {"constant_values": n.attrs["value"]} if n.attrs["mode"] == "constant" else {}
    return np.pad(x[0], n.attrs["pads"], mode=n.attrs["mode"], **kw)


def _conv_patches(n, x):
    (kh, kw), (sh, sw), (dh, dw), (c0, cg) = (n.attrs[k] for k in ("kernel", "stride", "dilation", "channels"))
    _, ho, wo, _ = n.shape
    return np.concatenate([x[0][:, a * dh:a * dh + (ho - 1) * sh + 1:sh, b * dw:b * dw + (wo - 1) * sw + 1:sw,
                                c0:c0 + cg] for a in range(kh) for b in range(kw)], axis=-1)


def _slice(n, x):
    return x[0][tuple(slice(a, a + m * st if a + m * st >= 0 else None, st)   # (a stop of -1 reads the end)
                      for a, m, st in zip(n.attrs["starts"], n.shape, n.attrs["steps"]))]


def _attention(n, x):
    sc = n.attrs["scale"] if n.attrs["scale"] is not None else 1 / math.sqrt(max(x[0].shape[-1], 1))
    return attention64(x[0], x[1], x[2], x[3] if n.attrs["mask"] else None, sc, n.attrs["causal"],
                       n.attrs["masked_rows"])


def _attention_grad(n, x):
    sc = n.attrs["scale"] if n.attrs["scale"] is not None else 1 / math.sqrt(max(x[0].shape[-1], 1))
    return attention_grad64(*x[:5], x[5] if n.attrs["mask"] else None, sc, n.attrs["causal"])


def _attention_lse(n, x):   # inputs: the attention node, then its own inputs
    a = n.inputs[0]
    sc = a.attrs["scale"] if a.attrs["scale"] is not None else 1 / math.sqrt(max(x[1].shape[-1], 1))
    return attention_lse64(x[1], x[2], x[3], x[4] if a.attrs["mask"] else None, sc, a.attrs["causal"])


def _cast(n, x):
    r = R.cast(x[0], n.dtype)
    return r if n.dtype.kind in "biu" else r.astype(np.float64)


def _reduce(f):
    return lambda n, x: f(x[0], axis=n.attrs["axes"], keepdims=n.attrs["keepdims"])


def _elementwise(f):
    return lambda n, x: f(*x)


# the float64 numpy oracle of every op of the registry (ir/opset.py), keyed by its name
REFERENCE = {
    "constant": lambda n, x: np.asarray(n.value, n.dtype) if n.dtype.kind in "biu" else np.float64(n.value),
    **{k: _elementwise(f) for k, f in {
        "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
        "minimum": np.minimum, "matmul": np.matmul, "neg": np.negative, "exp": np.exp, "tanh": np.tanh,
        "sqrt": np.sqrt, "erf": _erf64, "relu": lambda v: np.maximum(v, 0), "silu": lambda v: v * sigmoid64(v),
        **_NUMPY_UNARY}.items()},
    "gelu": _gelu, "softmax": _softmax, "layer_norm": _norm, "rms_norm": _norm,
    **{k: _reduce(f) for k, f in {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_mean": np.mean}.items()},
    "transpose": lambda n, x: np.transpose(x[0], n.attrs["perm"]),
    "reshape": lambda n, x: np.reshape(x[0], n.shape),
    "concat": lambda n, x: np.concatenate(x, axis=n.attrs["axis"]),
    "pad": _pad, "conv_patches": _conv_patches, "slice": _slice, "attention": _attention, "cast": _cast,
    "attention_grad": _attention_grad, "attention_lse": _attention_lse,
    **{k: (lambda n, x: gather64(n.op, x, n.attrs, n.shape)) for k in ("take", "take_along_axis", "one_hot")},
    "scatter_add": lambda n, x: scatter_add64(x, n.attrs, n.shape),
    **{k: (lambda n, x: R.OPS[n.op](n, x)) for k in R.OPS},   # comparisons, where, logic, integer ops
    **{k: (lambda n, x: rowops.REFERENCE[n.op](x, n)) for k in rowops.REFERENCE},
}


def _evaluate(graph: TraceGraph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    vals: dict[int, np.ndarray] = {}
    for a in graph.args:
        arr = np.asarray(arrays[a.index])
        vals[id(a)] = arr if arr.dtype.kind in "biu" else arr.astype(np.float64)   # ints in their own dtype
    for n in graph.nodes:
        x = [vals[id(i)] for i in n.inputs]
        if n.op not in REFERENCE:
            raise InternalError(f"the reference lane has no oracle for {n.op!r}")
        r = REFERENCE[n.op](n, x)
        vals[id(n)] = np.asarray(r, dtype=n.dtype if n.dtype.kind in "biu" else np.float64).reshape(n.shape)
    return [vals[id(o)].astype(o.dtype) for o in graph.outputs]
