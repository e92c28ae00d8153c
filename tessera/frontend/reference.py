"""The reference lane: the traced graph evaluated with numpy (float64 internally).

It runs only when a caller passes ``strict=False`` and compilation failed; the
lane log records ``lane="reference"`` with the reason.  It is also the meaning of
every op, written plainly.
"""
from __future__ import annotations

import math

import numpy as np

from tessera.frontend.trace import TraceGraph

_erf = np.frompyfunc(math.erf, 1, 1)


def _erf64(x: np.ndarray) -> np.ndarray:
    return _erf(x).astype(np.float64)


def evaluate(graph: TraceGraph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    vals: dict[int, np.ndarray] = {}
    for a in graph.args:
        vals[id(a)] = np.asarray(arrays[a.index], dtype=np.float64)
    for n in graph.nodes:
        x = [vals[id(i)] for i in n.inputs]
        op = n.op
        if op == "constant":
            r = np.float64(n.value)
        elif op in ("add", "sub", "mul", "div", "maximum"):
            r = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                 "maximum": np.maximum}[op](x[0], x[1])
        elif op == "matmul":
            r = np.matmul(x[0], x[1])
        elif op == "neg":
            r = -x[0]
        elif op in ("exp", "tanh", "sqrt"):
            r = getattr(np, op)(x[0])
        elif op == "erf":
            r = _erf64(x[0])
        elif op == "relu":
            r = np.maximum(x[0], 0)
        elif op == "silu":
            r = x[0] / (1 + np.exp(-x[0]))
        elif op == "gelu":
            v = x[0]
            if n.attrs["approximate"] == "tanh":
                r = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
            else:
                r = 0.5 * v * (1 + _erf64(v / math.sqrt(2)))
        elif op == "softmax":
            ax = n.attrs["axis"]
            e = np.exp(x[0] - x[0].max(axis=ax, keepdims=True))
            r = e / e.sum(axis=ax, keepdims=True)
        elif op in ("layer_norm", "rms_norm"):
            v = x[0]
            rest = iter(x[1:])
            if op == "layer_norm":
                mu = v.mean(-1, keepdims=True)
                r = (v - mu) / np.sqrt(((v - mu) ** 2).mean(-1, keepdims=True) + n.attrs["eps"])
            else:
                r = v / np.sqrt((v * v).mean(-1, keepdims=True) + n.attrs["eps"])
            present = n.attrs["present"]
            if present[0]:
                r = r * next(rest)
            if len(present) > 1 and present[1]:
                r = r + next(rest)
        elif op in ("reduce_sum", "reduce_max", "reduce_mean"):
            f = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_mean": np.mean}[op]
            r = f(x[0], axis=n.attrs["axes"], keepdims=n.attrs["keepdims"])
        elif op == "transpose":
            r = np.transpose(x[0], n.attrs["perm"])
        elif op == "reshape":
            r = np.reshape(x[0], n.shape)
        elif op == "cast":
            r = x[0].astype(n.dtype).astype(np.float64)
        else:
            raise NotImplementedError(op)
        vals[id(n)] = np.asarray(r, dtype=np.float64).reshape(n.shape)
    return [vals[id(o)].astype(o.dtype) for o in graph.outputs]
