"""The replay core of ``tessera.onnx``: the op registry, one node's context, constants.

A value of the ONNX graph is, while the jitted function traces, either a traced
``Tensor`` (a graph input, a bound initializer, a computed value) or a numpy array
known without running anything (an initializer or ``Constant`` read only as a shape,
an axis list or a scalar; ``Shape`` of a traced tensor; ops folded over such arrays).
A handler takes its inputs in those two forms and returns its outputs in either.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tessera import dtypes as dt
from tessera.errors import OnnxUnsupportedError
from tessera.frontend import ops
from tessera.frontend.trace import Tensor, constant

# ONNX TensorProto element types Tessera takes (the rest are refused by name)
ONNX_DTYPES = {1: dt.float32, 2: dt.uint8, 3: dt.int8, 6: dt.int32, 7: dt.int64, 9: dt.bool_, 10: dt.float16,
               11: dt.float64, 16: dt.bfloat16}
ONNX_TYPE_NAMES = {0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
                   7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64",
                   14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ",
                   19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1",
                   24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2"}
FOLD_LIMIT = 4096        # a node over numpy arrays no larger than this is folded with numpy
BUILD_LIMIT = 64         # a computed (not loaded) numpy array used as data is built from scalars up to this size


@dataclass
class Spec:
    """One mapped ONNX op: its handler, input count, the attributes it reads, the input positions
    that must be known numpy arrays (shapes, axes), and an optional numpy fold."""
    fn: Callable
    inputs: tuple[int, int]
    attrs: frozenset
    static: frozenset = frozenset()
    fold: Callable | None = None
    check: Callable | None = None      # (attrs, opset) -> a reason it is refused, or None
    outputs: int = 1


OPS: dict[str, Spec] = {}

# ops refused on purpose, with the reason the error and docs/onnx.md give (the rest: "op type not mapped")
_RUNTIME_FLOW = "control flow on runtime values is out of scope (Tessera compiles one static dataflow graph)"
_DATA_SHAPE = "its output shape depends on the input's values (data-dependent shapes are out of scope)"
WHY_NOT: dict[str, str] = {"If": _RUNTIME_FLOW, "Loop": _RUNTIME_FLOW, "Scan": _RUNTIME_FLOW,
                           "NonZero": _DATA_SHAPE, "Unique": _DATA_SHAPE, "Compress": _DATA_SHAPE,
                           "NonMaxSuppression": _DATA_SHAPE}


def op(names, *, inputs=(1, 1), attrs=(), static=(), fold=None, check=None, outputs=1):
    """Register a handler ``fn(ctx, ins) -> list of outputs`` under one or more ONNX op types."""
    def deco(fn):
        for n in ([names] if isinstance(names, str) else names):
            OPS[n] = Spec(fn, inputs, frozenset(attrs), frozenset(static), fold, check, outputs)
        return fn
    return deco


def describe(node) -> str:
    return f"node {node.name or '<unnamed>'!r} ({node.op_type})"


@dataclass
class Ctx:
    """The node being replayed: its attributes (Python values), the opset, how many outputs the
    graph reads, and the helpers that turn values into tensors or numpy arrays."""
    node: object
    attrs: dict
    opset: int
    n_outputs: int
    bound: dict = field(default_factory=dict)

    def refuse(self, reason: str) -> OnnxUnsupportedError:
        return OnnxUnsupportedError(f"tessera.onnx: {describe(self.node)}: {reason}")

    def a(self, name: str, default=None):
        return self.attrs.get(name, default)

    def const(self, v, what: str) -> np.ndarray:
        """An input that must be known while tracing (a shape, axes, k)."""
        if isinstance(v, Tensor):
            raise self.refuse(f"{what} must be a constant or computed from shapes (it depends on runtime values)")
        return v

    def t(self, v) -> Tensor:
        """An input as a traced tensor: numpy arrays are built from scalars (see ``materialise``)."""
        return v if isinstance(v, Tensor) else materialise(self, v)


def materialise(ctx: Ctx, arr: np.ndarray) -> Tensor:
    """A numpy array computed while tracing, used as data: one scalar constant (reshaped), one
    scalar broadcast (all elements equal), or up to BUILD_LIMIT elements chosen by index."""
    arr = np.asarray(arr)
    d = dt.as_dtype(arr.dtype)
    if arr.size == 0:
        raise ctx.refuse(f"an empty constant of shape {arr.shape} used as data")
    flat = arr.reshape(-1)
    first = constant(flat[0].item(), d)
    if arr.size == 1:
        return ops.reshape(first, arr.shape) if arr.ndim else first
    if (flat == flat[0]).all():
        return ops.where(ops.greater_equal(ops.iota(arr.shape, 0, dt.int32), 0), first, first)
    if arr.size > BUILD_LIMIT:
        raise ctx.refuse(f"a constant of {arr.size} elements computed while tracing is used as data "
                         f"(at most {BUILD_LIMIT}; a loaded initializer has no such limit)")
    idx = ops.iota((arr.size,), 0, dt.int32)
    out = first
    for i in range(1, arr.size):
        out = ops.where(ops.equal(idx, i), constant(flat[i].item(), d), out)
    return ops.reshape(out, arr.shape)


def norm_axis(ctx: Ctx, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.refuse(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def ints(v) -> list[int]:
    return [int(i) for i in np.asarray(v).reshape(-1)]


def small(ins) -> bool:
    """Every present input is a numpy array small enough to fold."""
    present = [v for v in ins if v is not None]
    return bool(present) and all(isinstance(v, np.ndarray) and v.size <= FOLD_LIMIT for v in present)


def shape_of(v) -> tuple[int, ...]:
    return tuple(v.shape)


def numel(shape) -> int:
    return math.prod(shape)


def cast(v, d):
    d = dt.as_dtype(d)
    if isinstance(v, np.ndarray):
        return v.astype(d)
    return v if v.dtype == d else ops.cast(v, d)
