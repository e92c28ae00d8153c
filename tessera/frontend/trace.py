"""Tracing a Python function into a graph of nodes with concrete shapes.

``Tensor`` stands for an array while the function runs; operators and
``tessera.ops`` record nodes (with the user's source line) and check shapes and
dtypes right away, so a mistake is reported at the line that made it.  Python
control flow that would depend on data (``if x:``, ``len`` of a traced value in a
loop bound is fine, ``float(x)`` is not) raises ``UNSUPPORTED_CONSTRUCT``.
"""
from __future__ import annotations

import math
import os
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from tessera import dtypes as dt
from tessera.errors import (
    DtypeError,
    FrontendError,
    RankMismatchError,
    ShapeMismatchError,
    SourceLocation,
    TesseraError,
    UnsupportedConstructError,
)

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_state = threading.local()


def _from_user_code() -> bool:
    """Whether the caller two frames up (the one reading a size) is user code, not Tessera."""
    f = sys._getframe(2)
    return not os.path.abspath(f.f_code.co_filename).startswith(_PKG_DIR + os.sep)


def user_location() -> SourceLocation | None:
    """The innermost stack frame outside the tessera package."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_PKG_DIR + os.sep):
            return SourceLocation(f.f_code.co_filename, f.f_lineno)
        f = f.f_back
    return None


@dataclass(eq=False)
class Node:
    op: str
    inputs: list["Node"]
    attrs: dict
    shape: tuple[int, ...]
    dtype: np.dtype
    loc: SourceLocation | None
    index: int = -1              # for "arg" nodes: argument position
    value: object = None         # for "constant" nodes
    observed: set = field(default_factory=set)  # axes whose size user code read (they must stay static)


@dataclass
class TraceGraph:
    args: list[Node] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)
    tuple_output: bool = False


def _graph() -> TraceGraph:
    g = getattr(_state, "graph", None)
    if g is None:
        raise FrontendError("tessera.ops can only be used inside a function compiled with tessera.jit")
    return g


def _err(cls, msg: str) -> TesseraError:
    return cls(msg, location=user_location())


def add_node(op: str, inputs: list[Node], attrs: dict, shape, dtype) -> "Tensor":
    n = Node(op, inputs, attrs, tuple(int(s) for s in shape), dt.as_dtype(dtype), user_location())
    _graph().nodes.append(n)
    return Tensor(n)


def constant(value: float, dtype) -> "Tensor":
    n = Node("constant", [], {}, (), dt.as_dtype(dtype), user_location(), value=float(value))
    _graph().nodes.append(n)
    return Tensor(n)


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], what: str) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            raise _err(ShapeMismatchError, f"{what}: shapes {a} and {b} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def as_tensor(v, like: "Tensor", what: str) -> "Tensor":
    if isinstance(v, Tensor):
        return v
    if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool):
        return constant(float(v), like.dtype)
    if isinstance(v, np.ndarray):
        raise _err(UnsupportedConstructError, f"{what}: a numpy array captured inside the traced function; "
                                               "pass it as an argument instead")
    raise _err(UnsupportedConstructError, f"{what}: cannot use a {type(v).__name__} here")


class Tensor:
    """A traced array (shape and dtype are concrete at trace time)."""

    __array_priority__ = 1000

    def __init__(self, node: Node):
        self._node = node

    @property
    def shape(self) -> tuple[int, ...]:
        if _from_user_code():
            self._node.observed.update(range(len(self._node.shape)))
        return self._node.shape

    @property
    def dtype(self) -> np.dtype:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return len(self._node.shape)

    @property
    def size(self) -> int:
        if _from_user_code():
            self._node.observed.update(range(len(self._node.shape)))
        return math.prod(self._node.shape)

    def __repr__(self) -> str:
        return f"tessera.Tensor(shape={self.shape}, dtype={dt.name(self.dtype)})"

    # --- operators
    def _bin(self, other, op: str, reverse: bool = False) -> "Tensor":
        from tessera.frontend import ops
        o = as_tensor(other, self, op)
        return getattr(ops, op)(o, self) if reverse else getattr(ops, op)(self, o)

    def __add__(self, o):
        return self._bin(o, "add")

    def __radd__(self, o):
        return self._bin(o, "add", True)

    def __sub__(self, o):
        return self._bin(o, "sub")

    def __rsub__(self, o):
        return self._bin(o, "sub", True)

    def __mul__(self, o):
        return self._bin(o, "mul")

    def __rmul__(self, o):
        return self._bin(o, "mul", True)

    def __truediv__(self, o):
        return self._bin(o, "div")

    def __rtruediv__(self, o):
        return self._bin(o, "div", True)

    def __matmul__(self, o):
        from tessera.frontend import ops
        return ops.matmul(self, as_tensor(o, self, "matmul"))

    def __rmatmul__(self, o):
        from tessera.frontend import ops
        return ops.matmul(as_tensor(o, self, "matmul"), self)

    def __neg__(self):
        from tessera.frontend import ops
        return ops.neg(self)

    def __pos__(self):
        return self

    # --- methods numpy users reach for
    @property
    def T(self) -> "Tensor":
        from tessera.frontend import ops
        return ops.transpose(self)

    def transpose(self, *axes) -> "Tensor":
        from tessera.frontend import ops
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.transpose(self, axes or None)

    def reshape(self, *shape) -> "Tensor":
        from tessera.frontend import ops
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ops.reshape(self, shape)

    def astype(self, dtype) -> "Tensor":
        from tessera.frontend import ops
        return ops.cast(self, dtype)

    def sum(self, axis=None, keepdims=False):
        from tessera.frontend import ops
        return ops.reduce_sum(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        from tessera.frontend import ops
        return ops.reduce_max(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        from tessera.frontend import ops
        return ops.reduce_mean(self, axis, keepdims)

    def __len__(self) -> int:
        if not self._node.shape:
            raise _err(UnsupportedConstructError, "len() of a 0-d traced tensor")
        if _from_user_code():
            self._node.observed.add(0)
        return self._node.shape[0]

    # --- what a trace cannot do
    def __bool__(self):
        raise _err(UnsupportedConstructError, "control flow on a traced tensor's value (if/while/and/or) is "
                                              "not supported: the value is unknown until the kernel runs")

    def __float__(self):
        raise _err(UnsupportedConstructError, "float() of a traced tensor: its value is unknown at trace time")

    def __int__(self):
        raise _err(UnsupportedConstructError, "int() of a traced tensor: its value is unknown at trace time")

    def __index__(self):
        raise _err(UnsupportedConstructError, "a traced tensor cannot be used as an index")

    def __iter__(self):
        raise _err(UnsupportedConstructError, "iterating over a traced tensor is not supported")

    def __getitem__(self, item):
        raise _err(UnsupportedConstructError, "indexing/slicing a traced tensor is not supported yet")

    def __array__(self, *a, **k):
        raise _err(UnsupportedConstructError, "a traced tensor cannot be converted to a numpy array inside "
                                              "the traced function")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise _err(UnsupportedConstructError, f"numpy.{ufunc.__name__} on a traced tensor: use tessera.ops "
                                              "instead")

    def __array_function__(self, func, types, args, kwargs):
        raise _err(UnsupportedConstructError, f"numpy.{func.__name__} on a traced tensor: use tessera.ops "
                                              "instead")

    __hash__ = object.__hash__


def require_float(t: Tensor, what: str) -> None:
    if t.dtype not in (dt.float32, dt.bfloat16, dt.float16, dt.float64):
        raise _err(DtypeError, f"{what}: dtype {t.dtype} is not supported")


def same_dtype(a: Tensor, b: Tensor, what: str) -> None:
    if a.dtype != b.dtype:
        raise _err(DtypeError, f"{what}: operand dtypes differ ({dt.name(a.dtype)} vs {dt.name(b.dtype)}); "
                               "cast one with .astype()")


def normalize_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise _err(RankMismatchError, f"{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def trace(fn, args: list, arg_is_tensor: list[bool]) -> TraceGraph:
    """Run ``fn`` on Tensors standing for the array arguments."""
    graph = TraceGraph()
    prev = getattr(_state, "graph", None)
    _state.graph = graph
    try:
        call_args = []
        for i, (a, is_t) in enumerate(zip(args, arg_is_tensor)):
            if is_t:
                n = Node("arg", [], {}, tuple(a.shape), dt.as_dtype(a.dtype), None, index=i)
                graph.args.append(n)
                call_args.append(Tensor(n))
            else:
                call_args.append(a)
        try:
            out = fn(*call_args)
        except TesseraError:
            raise
        except RecursionError:
            raise _err(UnsupportedConstructError, "the traced function recursed too deeply") from None
        except Exception as e:  # noqa: BLE001 - a Python error in user code while tracing
            tb = e.__traceback__
            loc = None
            while tb is not None:
                fname = os.path.abspath(tb.tb_frame.f_code.co_filename)
                if not fname.startswith(_PKG_DIR + os.sep):
                    loc = SourceLocation(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
                tb = tb.tb_next
            raise UnsupportedConstructError(f"tracing raised {type(e).__name__}: {e}", location=loc) from e
        outs = out if isinstance(out, tuple) else (out,)
        graph.tuple_output = isinstance(out, tuple)
        for o in outs:
            if not isinstance(o, Tensor):
                raise FrontendError(f"a compiled function must return tessera tensors (or a tuple of them), "
                                    f"got {type(o).__name__}", location=SourceLocation(
                                        fn.__code__.co_filename, fn.__code__.co_firstlineno))
            graph.outputs.append(o._node)
        return graph
    finally:
        _state.graph = prev
