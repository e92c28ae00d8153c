"""Tracing a Python function into a graph of nodes with concrete shapes.

``Tensor`` stands for an array while the function runs; operators and
``tessera.ops`` record nodes (with the user's source line) and check shapes and
dtypes right away, so a mistake is reported at the line that made it.  Python
control flow that would depend on data (``if x:``, ``len`` of a traced value in a
loop bound is fine, ``float(x)`` is not) raises ``UNSUPPORTED_CONSTRUCT``.
"""
from __future__ import annotations

import difflib
import math
import numbers
import os
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from tessera import dtypes as dt
from tessera.errors import (
    DtypeError,
    FrontendError,
    InternalError,
    RankMismatchError,
    ScalarSpecialize,
    ShapeMismatchError,
    SourceLocation,
    TesseraError,
    UnknownNameError,
    UnsupportedConstructError,
)
from tessera.ir import opset

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
    # a weak scalar (a Python number passed as a runtime value, and what is computed from such numbers
    # alone) takes the dtype of the array it meets, as a Python number does in numpy (NEP 50)
    weak: bool = False
    # the Python-number arguments this value is computed from, when it depends on nothing else (None:
    # it depends on an array): reading it as a Python value specialises them (ScalarSpecialize)
    scalar_of: frozenset | None = None
    # a weak value's kind: 'i' where it stands for Python ints only, else 'f' (JAX's weak types:
    # a weak int keeps an int array's dtype, a weak float beside an int array gives float32)
    pykind: str = "f"


@dataclass
class TraceGraph:
    args: list[Node] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)
    tuple_output: bool = False
    # each time a weak scalar met a value of a dtype: (that dtype, whether the scalar was an argument
    # itself rather than computed from numbers), which picks the dtype the numbers are passed in
    weak_uses: list[tuple[np.dtype, bool]] = field(default_factory=list)
    # a weak Python number met an int or bool value: whether it was an int or a float mattered
    int_sensitive: bool = False
    # nested tuples returned (value_and_grad's (value, (grads...))): their shape over the flat outputs
    out_spec: object = None


def nested_outputs(out) -> tuple[object, list]:
    """(spec, leaves) of nested tuples/lists: a spec is a leaf's position or (type, [specs])."""
    leaves: list = []

    def walk(t):
        if isinstance(t, (tuple, list)):
            return (type(t), [walk(x) for x in t])
        leaves.append(t)
        return len(leaves) - 1
    return walk(out), leaves


def results(graph: TraceGraph, outs: list):
    """A compiled function's outputs in the structure it returned them."""
    if graph.out_spec is None:
        return tuple(outs) if graph.tuple_output else outs[0]

    def build(s):
        return outs[s] if isinstance(s, int) else s[0](build(x) for x in s[1])
    return build(graph.out_spec)


def tracing() -> bool:
    """Whether a function is being traced in this thread."""
    return getattr(_state, "graph", None) is not None


def current_lane() -> tuple | None:
    """(target, arch, schedule pins) of the function being traced, when its tracer said."""
    return getattr(_state, "lane", None)


def _graph() -> TraceGraph:
    g = getattr(_state, "graph", None)
    if g is None:
        raise FrontendError("tessera.ops can only be used inside a function compiled with tessera.jit")
    return g


def _err(cls, msg: str) -> TesseraError:
    return cls(msg, location=user_location())


FP8_OPS = ("matmul", "reshape", "transpose")    # the ops that take fp8 operands (views feed the GEMM's packing)


def add_node(op: str, inputs: list[Node], attrs: dict, shape, dtype, weak: bool | None = None) -> "Tensor":
    """Record a node.  It is weak (``weak`` None) when every input is, and computed from Python
    numbers alone when every input is.  Only ops of the registry (``ir/opset.py``) are recorded."""
    if op not in opset.OPS and op not in opset.SECOND_RESULTS:
        raise InternalError(f"the tracer recorded {op!r}, which the op registry (tessera/ir/opset.py) does not know")
    if op not in FP8_OPS and any(i.dtype in dt.FP8 for i in inputs):
        from tessera.errors import Fp8OperandError
        raise _err(Fp8OperandError, f"{op}: fp8 arrays are matmul operands only (tessera.ops.matmul / "
                                    "scaled_matmul, through reshape / transpose views); cast on the host")
    n = Node(op, inputs, attrs, tuple(int(s) for s in shape), dt.as_dtype(dtype), user_location())
    if inputs and all(i.scalar_of is not None for i in inputs):
        n.scalar_of = frozenset().union(*(i.scalar_of for i in inputs))
    n.weak = bool(inputs) and all(i.weak for i in inputs) if weak is None else weak
    if n.weak and inputs:   # Python ints alone give a weak int (their true division a weak float)
        n.pykind = "i" if all(i.pykind == "i" for i in inputs) and op != "div" else "f"
    _graph().nodes.append(n)
    return Tensor(n)


def constant(value: float, dtype, weak: bool = False, pykind: str = "f") -> "Tensor":
    """A scalar in ``dtype``: a Python number converts as numpy converts it (NEP 50: the array's
    dtype wins), so one beyond the dtype's range is +-inf, as ``x * 70000.0`` is in numpy for f16;
    an int beyond an int dtype's range is refused, as numpy and JAX refuse it (OverflowError)."""
    d = dt.as_dtype(dtype)
    if d.kind in "iub":
        if d.kind == "b":
            v = int(bool(value))
        else:
            if isinstance(value, float) and not value.is_integer():
                raise _err(DtypeError, f"the number {value!r} cannot be a {dt.name(d)} constant")
            v = int(value)
            info = np.iinfo(d)
            if not info.min <= v <= info.max:
                raise _err(DtypeError, f"the Python int {value} is out of range for {dt.name(d)} "
                                       f"({info.min}..{info.max}); numpy and JAX refuse it too")
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            v = float(np.asarray(float(value), np.float64).astype(d)) if d.kind in "fV" else float(value)
    n = Node("constant", [], {}, (), d, user_location(), value=v, weak=weak, scalar_of=frozenset(), pykind=pykind)
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
        pk = "i" if isinstance(v, (int, np.integer)) else "f"
        if like._node.weak:
            return constant(v, like.dtype, weak=True, pykind=pk if like._node.pykind == "i" else "f")
        return constant(v, dt.promote_weak(like.dtype, pk))   # JAX: x_int * 0.5 is float32
    if isinstance(v, bool):
        return constant(v, dt.bool_ if not like._node.weak else like.dtype, weak=like._node.weak)
    if isinstance(v, np.ndarray):
        raise _err(UnsupportedConstructError, f"{what}: a numpy array captured inside the traced function; "
                                               "pass it as an argument instead")
    raise _err(UnsupportedConstructError, f"{what}: cannot use a {type(v).__name__} here")


def promote_weak(a: "Tensor", b: "Tensor") -> tuple["Tensor", "Tensor"]:
    """Where one operand is a weak scalar and the other is not, the weak one is cast to the
    other's dtype (``x_f16 * s`` stays f16 for a Python float ``s``)."""
    if a._node.weak == b._node.weak:
        return a, b
    w, strong = (a, b) if a._node.weak else (b, a)
    to = dt.promote_weak(strong.dtype, w._node.pykind)
    if dt.kind(strong.dtype) != "f":
        _graph().int_sensitive = True
    if w._node.scalar_of:
        _graph().weak_uses.append((to, w._node.op == "arg"))
    if strong.dtype != to:   # a weak float beside an int array: float32 (JAX)
        strong = add_node("cast", [strong._node], {}, strong.shape, to, weak=False)
    if w.dtype != to:
        w = add_node("cast", [w._node], {}, w.shape, to, weak=False)
    return (w, strong) if a._node.weak else (strong, w)


def scalar_dtype_for(graph: TraceGraph, current: np.dtype) -> np.dtype:
    """The dtype the Python-number arguments are best passed in, from what they met while tracing:
    that of every value they met where it is one and they met it directly (no cast, one rounding,
    as numpy's), else float64 where they met float64 and float32 otherwise (a cast each use)."""
    if not graph.weak_uses:
        return current
    met = {d for d, _ in graph.weak_uses}
    if len(met) == 1 and all(direct for _, direct in graph.weak_uses):
        return met.pop()
    return dt.float64 if dt.float64 in met else dt.float32


def scalar_value_needed(t: "Tensor", what: str) -> None:
    """User code reads a traced Python-number argument (or a value computed from such numbers alone)
    as a Python value: ``tessera.jit`` specialises on those arguments and traces again."""
    deps = t._node.scalar_of
    if deps:
        raise ScalarSpecialize(f"{what} of a Python-number argument: specialised on its value",
                               indices=deps, location=user_location())


_FUNCTIONS: dict = {}


class _Published:
    """The ``tessera.ops`` functions, as ``frontend/ops.py`` publishes them when it loads (it
    imports this module, so this one cannot import it): the Tensor operators call through here."""

    def __getattr__(self, name: str):
        try:
            return _FUNCTIONS[name]
        except KeyError:
            raise AttributeError(name) from None


ops = _Published()


def publish(functions: dict) -> None:
    _FUNCTIONS.update(functions)


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
        return ops.matmul(self, as_tensor(o, self, "matmul"))

    def __rmatmul__(self, o):
        return ops.matmul(as_tensor(o, self, "matmul"), self)

    def __neg__(self):
        return ops.neg(self)

    def __pos__(self):
        return self

    def __pow__(self, o):
        return ops.pow(self, o)

    def __rpow__(self, o):
        return ops.pow(as_tensor(o, self, "pow"), self)

    def __abs__(self):
        return ops.abs(self)

    # comparisons give bool tensors, as numpy's; // % & | ^ << >> (frontend/ops_typed.py; the
    # methods are set below the class)
    def __eq__(self, o):
        if not isinstance(o, (Tensor, numbers.Number)):   # x == None, x == slice(...): Python's identity answer
            return NotImplemented
        return self._bin(o, "equal")

    def __ne__(self, o):
        if not isinstance(o, (Tensor, numbers.Number)):
            return NotImplemented
        return self._bin(o, "not_equal")

    def __invert__(self):
        return ops.bitwise_not(self)

    # --- methods numpy users reach for
    @property
    def T(self) -> "Tensor":
        return ops.transpose(self)

    def transpose(self, *axes) -> "Tensor":
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.transpose(self, axes or None)

    def reshape(self, *shape) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ops.reshape(self, shape)

    def astype(self, dtype) -> "Tensor":
        return ops.cast(self, dtype)

    def sum(self, axis=None, keepdims=False):
        return ops.reduce_sum(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return ops.reduce_max(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return ops.reduce_mean(self, axis, keepdims)

    def var(self, axis=None, keepdims=False, ddof=0):
        return ops.var(self, axis, keepdims, ddof)

    def std(self, axis=None, keepdims=False, ddof=0):
        return ops.std(self, axis, keepdims, ddof)

    def squeeze(self, axis=None):
        return ops.squeeze(self, axis)

    def swapaxes(self, axis1, axis2):
        return ops.swapaxes(self, axis1, axis2)

    def __len__(self) -> int:
        if not self._node.shape:
            raise _err(UnsupportedConstructError, "len() of a 0-d traced tensor")
        if _from_user_code():
            self._node.observed.add(0)
        return self._node.shape[0]

    # --- what a trace cannot do (a Python-number argument read as a value is specialised on instead)
    def __bool__(self):
        scalar_value_needed(self, "bool()")
        raise _err(UnsupportedConstructError, "control flow on a traced tensor's value (if/while/and/or) is "
                                              "not supported: the value is unknown until the kernel runs")

    def __float__(self):
        scalar_value_needed(self, "float()")
        raise _err(UnsupportedConstructError, "float() of a traced tensor: its value is unknown at trace time")

    def __int__(self):
        scalar_value_needed(self, "int()")
        raise _err(UnsupportedConstructError, "int() of a traced tensor: its value is unknown at trace time")

    def __index__(self):
        scalar_value_needed(self, "an index")
        raise _err(UnsupportedConstructError, "a traced tensor cannot be used as an index")

    def __iter__(self):
        raise _err(UnsupportedConstructError, "iterating over a traced tensor is not supported")

    def __getitem__(self, item):
        return ops.index(self, item)

    def __array__(self, *a, **k):
        scalar_value_needed(self, "numpy conversion")
        raise _err(UnsupportedConstructError, "a traced tensor cannot be converted to a numpy array inside "
                                              "the traced function")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for t in inputs:
            if isinstance(t, Tensor):
                scalar_value_needed(t, f"numpy.{ufunc.__name__}")
        raise _err(UnsupportedConstructError, f"numpy.{ufunc.__name__} on a traced tensor: use tessera.ops "
                                              "instead")

    def __array_function__(self, func, types, args, kwargs):
        for t in args:
            if isinstance(t, Tensor):
                scalar_value_needed(t, f"numpy.{func.__name__}")
        raise _err(UnsupportedConstructError, f"numpy.{func.__name__} on a traced tensor: use tessera.ops "
                                              "instead")

    def __getattr__(self, name: str):
        if name.startswith("_"):   # protocol probes (copy, pickle, numpy's __array_*__) get the plain answer
            raise AttributeError(name)
        known = sorted(n for n in dir(Tensor) if not n.startswith("_"))
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        msg = f"a traced tensor has no attribute {name!r}"
        if name in _FUNCTIONS:
            msg += f"; it is a function: tessera.ops.{name}(x)"
        elif near:
            msg += f"; nearest: {', '.join(near)}"
        raise _err(UnknownNameError, f"{msg} (tensor attributes: {', '.join(known)}; "
                                     "other ops are in tessera.ops)")

    __hash__ = object.__hash__


def _operator(op: str, reverse: bool):
    def method(self, o):
        return self._bin(o, op, reverse)
    method.__name__ = op
    return method


for _name, _op in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                   ("floordiv", "floor_divide"), ("mod", "mod"), ("and", "bitwise_and"), ("or", "bitwise_or"),
                   ("xor", "bitwise_xor"), ("lshift", "left_shift"), ("rshift", "right_shift")):
    setattr(Tensor, f"__{_name}__", _operator(_op, False))
    if _name not in ("lt", "le", "gt", "ge"):   # Python reflects comparisons itself
        setattr(Tensor, f"__r{_name}__", _operator(_op, True))


def _refuse_operator(symbol: str):
    def refuse(self, *_):
        raise _err(UnsupportedConstructError, f"the {symbol} operator on a traced tensor has no op; elementwise "
                                              f"operators: {', '.join(ELEMENTWISE_OPERATORS)}; other ops are in "
                                              "tessera.ops")
    refuse.__name__ = f"refuse_{symbol}"
    return refuse


ELEMENTWISE_OPERATORS = ("+", "-", "*", "/", "//", "%", "**", "@", "unary -", "abs()", "== != < <= > >=",
                         "& | ^ ~", "<< >>")
for _names, _symbol in ((("__divmod__", "__rdivmod__"), "divmod()"),
                        (("__round__",), "round()"), (("__trunc__",), "math.trunc()"),
                        (("__floor__",), "math.floor()"), (("__ceil__",), "math.ceil()")):
    for _name in _names:
        setattr(Tensor, _name, _refuse_operator(_symbol))


POW_INTEGER_MAX = 8   # x ** n for 1 <= |n| <= this traces as multiplications (by squaring)
_POW_HELP = (f"traced exponents: integers +-1..+-{POW_INTEGER_MAX} (multiplications), 0.5 (sqrt) and -0.5 "
             "(1/sqrt); a general pow op comes later (e ** y: tessera.ops.exp)")


def _power(x: Tensor, o) -> Tensor:
    if isinstance(o, Tensor):
        scalar_value_needed(o, "an exponent")
        raise _err(UnsupportedConstructError, f"x ** y with a traced exponent has no op yet; {_POW_HELP}")
    if isinstance(o, bool) or not isinstance(o, numbers.Real):
        raise _err(UnsupportedConstructError, f"x ** {type(o).__name__}: {_POW_HELP}")
    e = float(o)
    if e == 0.5:
        return ops.sqrt(x)
    if e == -0.5:
        return ops.div(1.0, ops.sqrt(x))
    if not (e.is_integer() and 1 <= abs(e) <= POW_INTEGER_MAX):
        what = "x ** 0 is all ones (write the constant)" if e == 0 else f"x ** {o!r} has no op yet"
        raise _err(UnsupportedConstructError, f"{what}; {_POW_HELP}")
    n = int(abs(e))
    result, base = None, x
    while True:
        if n & 1:
            result = base if result is None else ops.mul(result, base)
        n >>= 1
        if not n:
            break
        base = ops.mul(base, base)
    return result if e > 0 else ops.div(1.0, result)


def require_float(t: Tensor, what: str) -> None:
    if t.dtype in dt.FP8:
        from tessera.errors import Fp8OperandError
        raise _err(Fp8OperandError, f"{what}: fp8 ({dt.name(t.dtype)}) arrays are matmul operands only "
                                    "(tessera.ops.matmul / scaled_matmul); cast with .astype(np.float32)")
    if t.dtype not in (dt.float32, dt.bfloat16, dt.float16, dt.float64):
        raise _err(DtypeError, f"{what}: dtype {dt.name(t.dtype)} is not supported ({what} takes floating-point "
                               "tensors; cast with .astype(np.float32))")


def require_number(t: Tensor, what: str) -> None:
    """A float or int tensor (not bool: numpy's arithmetic on two bools is logic; spell it so)."""
    if t.dtype == dt.bool_:
        raise _err(DtypeError, f"{what}: dtype bool is not supported (cast with .astype(np.int32), or use "
                               "logical_and / logical_or)")


def promote_pair(a: Tensor, b: Tensor, what: str) -> tuple[Tensor, Tensor]:
    """Two operands in the dtype they compute in: a weak scalar takes the other's dtype; two
    floats of different dtypes are cast to their join (``dtypes.promote``: f16 with f32 is f32,
    bf16 with f16 is f32), as JAX promotes; anything else must match."""
    a, b = promote_weak(a, b)
    if a.dtype == b.dtype:
        return a, b
    to = dt.promote(a.dtype, b.dtype)
    if to is None:
        same_dtype(a, b, what)
    return tuple(t if t.dtype == to else add_node("cast", [t._node], {}, t.shape, to, weak=False) for t in (a, b))


def same_dtype(a: Tensor, b: Tensor, what: str) -> None:
    if a.dtype != b.dtype:
        raise _err(DtypeError, f"{what}: operand dtypes differ ({dt.name(a.dtype)} vs {dt.name(b.dtype)}); "
                               "cast one with .astype()")


def require_int(v, what: str, cls=ShapeMismatchError) -> int:
    """A size or axis: a Python or numpy integer (numpy refuses 4.9, and 4.0, too)."""
    if isinstance(v, Tensor):
        scalar_value_needed(v, what)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise _err(cls, f"{what} must be an integer, got {v!r} ({type(v).__name__})")
    return int(v)


def normalize_axis(axis: int, rank: int, what: str) -> int:
    axis = require_int(axis, f"{what}: an axis", RankMismatchError)
    if not -rank <= axis < rank:
        raise _err(RankMismatchError, f"{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank


ARRAY, SCALAR, STATIC = "array", "scalar", "static"   # how trace() takes each argument


def trace(fn, args: list, kinds: list, lane: tuple | None = None, int_scalars=frozenset()) -> TraceGraph:
    """Run ``fn`` on Tensors standing for its arguments.  ``kinds``: per argument, ARRAY (a Tensor
    of its shape and dtype), SCALAR (a Python number passed at run time, as a 0-d array: a weak
    0-d Tensor) or STATIC (passed to ``fn`` as it is; True/False are taken as ARRAY/STATIC).
    ``lane``: (target, arch, schedule pins) the graph is compiled for, which a jitted function
    called inside checks against.  ``int_scalars``: the SCALAR positions given as Python ints."""
    graph = TraceGraph()
    prev, prev_lane = getattr(_state, "graph", None), getattr(_state, "lane", None)
    _state.graph, _state.lane = graph, lane
    try:
        call_args = []
        for i, (a, kind) in enumerate(zip(args, kinds)):
            kind = {True: ARRAY, False: STATIC}.get(kind, kind)
            if kind == STATIC:
                call_args.append(a)
                continue
            n = Node("arg", [], {}, tuple(a.shape), dt.as_dtype(a.dtype), None, index=i)
            if kind == SCALAR:
                n.weak, n.scalar_of = True, frozenset((i,))
                n.pykind = "i" if i in int_scalars else "f"
            graph.args.append(n)
            call_args.append(Tensor(n))
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
        if any(isinstance(o, (tuple, list)) for o in outs):
            graph.out_spec, outs = nested_outputs(out)
        for o in outs:
            if not isinstance(o, Tensor):
                raise FrontendError(f"a compiled function must return tessera tensors (or a tuple of them), "
                                    f"got {type(o).__name__}", location=SourceLocation(
                                        fn.__code__.co_filename, fn.__code__.co_firstlineno))
            graph.outputs.append(o._node)
        return graph
    finally:
        _state.graph, _state.lane = prev, prev_lane
