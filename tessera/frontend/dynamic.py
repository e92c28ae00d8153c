"""Dynamic-shape buckets: ``tessera.jit(dynamic={"x": 1})``.

A dimension marked dynamic (a sequence length) is compiled once per power-of-two *bucket*
(``bucket(n)``: at least ``MIN_BUCKET``; lengths 65..128 share the 128 compile) instead of once
per length.  A call pads the dynamic arguments with zeros to the bucket, passes the true length
``L`` as a runtime 0-d int32 array (so one compile serves every length of the bucket) and
slices every result back to ``L`` along its dynamic axes.

Padding alone is wrong wherever the computation reduces, contracts or normalises over the padded
axis, so the trace is rewritten (:func:`mask_graph`):

1. the function is traced twice, at the bucket size ``P`` and at ``P + 1`` (no compile); the two
   graphs must be the same node for node, and an axis of a node is *dynamic* where its size is
   ``P`` in the first and ``P + 1`` in the second.  Any other change (an axis scaling otherwise,
   as a reshape merging the dynamic axis does; a constant, a slice bound or ``k`` computed from the
   size) is refused with ``DYNAMIC_SHAPE`` naming the op and line;
2. before every op that reduces over a dynamic axis the operand becomes
   ``where(iota < L, x, neutral)``: 0 for sums and for *both* operands of a matmul contracting it
   (0 * NaN is NaN), -inf for max/softmax/log_softmax/logsumexp/argmax/top_k, +inf for argmin,
   1 for prod, False/True for any/all; a mean is the masked sum's mean times ``P / L``.  A
   softmax's output over a -inf-masked axis is exactly 0 there, so a matmul reading it needs no
   second mask (``softmax(s) @ v`` stays attention-shaped for fuse-attention);
3. ops that cannot be made exact along a dynamic axis are refused with ``DYNAMIC_SHAPE``: a
   slice, pad, concat or gather along it, layer_norm/rms_norm/cross_entropy over it, conv over a
   dynamic spatial axis, an unknown op.  An explicit ``attention`` whose keys are dynamic gets
   the key-length mask as (or anded into) its mask operand, and ``v`` masked with 0.

All dynamic dimensions of one call share one length (a sequence length); a call whose marked
dimensions differ is refused (``BAD_ARGUMENT``).
"""
from __future__ import annotations

import math

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError, DynamicShapeError, InternalError, TesseraError
from tessera.frontend.jit import ARRAY, SCALAR, STATIC, Artifact, JitFunction, _scalar_key
from tessera.frontend.trace import Node, TraceGraph
from tessera.ir import opset

MIN_BUCKET = 16   # the smallest bucket: lengths 1..16 share one compile
LEN_DTYPE = np.dtype(np.int32)   # the true length's runtime dtype (an iota's)


def _lowest(size: int) -> int:
    """The shortest length of bucket ``size``."""
    return size // 2 + 1 if size > MIN_BUCKET else 1


def bucket(n: int) -> int:
    """The bucket of length ``n``: the next power of two, at least MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << max(0, n - 1).bit_length())


# ---------------------------------------------------------------------------- the spec
def parse_spec(fn: JitFunction, spec) -> dict[int, tuple[int, ...]]:
    """``dynamic=`` as argument position -> axes (as given; normalised per call)."""
    if not isinstance(spec, dict):
        raise ArgumentError(f"{fn.name}: dynamic= takes a dict of argument name (or position) -> axis or tuple of "
                            f"axes, got {type(spec).__name__}")
    names = [p.name for p in fn._params] if fn._params is not None else []
    out: dict[int, tuple[int, ...]] = {}
    for k, v in spec.items():
        if isinstance(k, str):
            if k not in names:
                raise ArgumentError(f"dynamic=: {fn.name} has no parameter {k!r} (parameters: "
                                    f"{', '.join(names) or 'none'})")
            pos = names.index(k)
        elif isinstance(k, int) and not isinstance(k, bool) and k >= 0:
            pos = k
        else:
            raise ArgumentError(f"dynamic=: {k!r} is not a parameter name or position")
        axes = (v,) if isinstance(v, int) and not isinstance(v, bool) else tuple(v) if isinstance(v, (tuple, list)) \
            else None
        if not axes or any(isinstance(a, bool) or not isinstance(a, int) for a in axes):
            raise ArgumentError(f"dynamic=: the axes of {k!r} must be an int or a tuple of ints, got {v!r}")
        if pos in fn._static:
            raise ArgumentError(f"dynamic=: argument {k!r} is static (static_argnums/static_argnames); a static "
                                "value has no dynamic axis")
        out[pos] = out.get(pos, ()) + axes
    return out


# ---------------------------------------------------------------------------- labelling
def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an attribute numpy compares elementwise
        return repr(a) == repr(b)


def _where(n: Node) -> str:
    """The op as the user wrote it and its line."""
    op = "conv2d (its patches)" if n.op == "conv_patches" else n.op
    return f"{op} at {n.loc}" if n.loc else op


def label(g1: TraceGraph, g2: TraceGraph, p1: int, p2: int) -> dict[int, frozenset]:
    """id(node of g1) -> its dynamic axes, from the traces at sizes p1 and p2."""
    n1, n2 = g1.args + g1.nodes, g2.args + g2.nodes
    if len(n1) != len(n2) or len(g1.outputs) != len(g2.outputs):
        raise DynamicShapeError(f"the traced graph changes with the dynamic size ({len(n1)} nodes at length {p1}, "
                                f"{len(n2)} at {p2}): its structure must not depend on the size (dynamic=)")
    pos1 = {id(n): i for i, n in enumerate(n1)}
    pos2 = {id(n): i for i, n in enumerate(n2)}
    dyn: dict[int, frozenset] = {}
    for a, b in zip(n1, n2):
        if (a.op != b.op or [pos1[id(i)] for i in a.inputs] != [pos2[id(i)] for i in b.inputs]
                or len(a.shape) != len(b.shape)):
            raise DynamicShapeError(f"{_where(a)}: the traced graph differs at another dynamic size ({b.op} "
                                    "there); its structure must not depend on the size (dynamic=)")
        if not _same(a.value, b.value) or a.attrs.keys() != b.attrs.keys() or \
                not all(_same(a.attrs[k], b.attrs[k]) for k in a.attrs):
            what = f"the constant {a.value!r}" if a.op == "constant" else f"{a.op}'s attributes {a.attrs}"
            raise DynamicShapeError(f"{_where(a)}: {what} change with the dynamic size (a size, slice bound, "
                                    "index or number computed from it): padding to the bucket cannot keep that "
                                    "exact (dynamic=)")
        axes = set()
        for ax, (s1, s2) in enumerate(zip(a.shape, b.shape)):
            if (s1, s2) == (p1, p2):
                axes.add(ax)
            elif s1 != s2:
                raise DynamicShapeError(f"{_where(a)}: axis {ax} has size {s1} at dynamic length {p1} and {s2} "
                                        f"at {p2}: only an axis that is the dynamic length itself (1:1) can be padded "
                                        "and masked (a reshape merging or splitting it, a concat or slice along it "
                                        "is not supported with dynamic=)")
        dyn[id(a)] = frozenset(axes)
    return dyn


# ---------------------------------------------------------------------------- masking
_NEUTRAL = {"reduce_sum": 0.0, "reduce_mean": 0.0, "reduce_max": -math.inf, "reduce_prod": 1.0, "reduce_any": 0,
            "reduce_all": 1, "softmax": -math.inf, "log_softmax": -math.inf, "logsumexp": -math.inf,
            "argmax": -math.inf, "argmin": math.inf, "top_k": -math.inf}
_LAST_AXIS = ("log_softmax", "logsumexp", "argmax", "argmin", "top_k")
_REFUSE_LAST = ("layer_norm", "rms_norm", "cross_entropy")   # normalise over their last axis
# ops along whose dynamic axes padding changes nothing that is kept (rows stay rows)
_FREE = {"transpose", "cumsum", "cumprod", "iota", "constant", "one_hot", "top_k_indices", "cross_entropy_valid"}


def _refuse(n: Node, why: str) -> DynamicShapeError:
    return DynamicShapeError(f"{_where(n)}: {why} is not supported with dynamic= (padding to the bucket "
                             "cannot keep it exact)")


class _Masker:
    """Rewrites one trace graph in place (see the module docstring)."""

    def __init__(self, g: TraceGraph, dyn: dict[int, frozenset], length: Node, size: int):
        self.g, self.dyn, self.length, self.size = g, dyn, length, size
        self.out: list[Node] = []
        self.cache: dict[tuple, Node] = {}
        self.zero: set[tuple[int, int]] = set()   # (id(node), axis): exactly 0 in the padded part of that axis
        self.neg: set[tuple[int, int]] = set()    # (id(node), axis): -inf there

    def _new(self, op, inputs, attrs, shape, dtype, loc, value=None, like=None) -> Node:
        n = Node(op, inputs, attrs, tuple(shape), np.dtype(dtype), loc, value=value,
                 scalar_of=frozenset() if op == "constant" else None)
        self.out.append(n)
        self.dyn[id(n)] = self.dyn[id(like)] if like is not None else frozenset()
        return n

    def mask(self, x: Node, axis: int, neutral, loc, row: bool = False) -> Node:
        """where(iota < L, x, neutral) along ``axis`` (shared by every reader of x).  The condition
        has x's shape (iota and less are then computed inside the kernel that reads the where, never
        stored), or for a row op (``row``) a unit shape but along ``axis``: fuse-attention takes that
        small bool as the attention's mask operand."""
        key = (id(x), axis, neutral)
        if key in self.cache:
            return self.cache[key]
        shape = tuple(self.size if i == axis else 1 if row else s for i, s in enumerate(x.shape))
        it = self._new("iota", [], {"axis": axis}, shape, LEN_DTYPE, loc)
        cond = self._new("less", [it, self.length], {}, shape, dt.bool_, loc)
        value = int(bool(neutral)) if x.dtype == dt.bool_ else neutral
        c = self._new("constant", [], {}, (), x.dtype, loc, value=value)
        w = self._new("where", [cond, x, c], {}, x.shape, x.dtype, loc, like=x)
        self.cache[key] = w
        if neutral == 0:
            self.zero.add((id(w), axis))
        elif neutral == -math.inf:
            self.neg.add((id(w), axis))
        return w

    def rewrite(self) -> None:
        repl: dict[int, Node] = {}
        for n in self.g.nodes:
            n.inputs = [repl.get(id(i), i) for i in n.inputs]
            ins = [self.dyn.get(id(i), frozenset()) for i in n.inputs]
            if any(ins):
                after = self._visit(n, ins)
            else:
                after = None
            self.out.append(n)
            if after is not None:   # a mean over the padded axis: times P / L
                repl[id(n)] = self._rescale(n, after)
        self.g.nodes = self.out
        self.g.outputs = [repl.get(id(o), o) for o in self.g.outputs]

    def _rescale(self, n: Node, k: int) -> Node:
        """The mean ``n`` over ``k`` padded axes times (P / L) ** k (each factor at most P: no
        overflow in f16)."""
        lf = self._new("cast", [self.length], {}, (), n.dtype, n.loc)
        num = self._new("constant", [], {}, (), n.dtype, n.loc, value=float(self.size))
        fac = one = self._new("div", [num, lf], {}, (), n.dtype, n.loc)
        for _ in range(k - 1):
            fac = self._new("mul", [fac, one], {}, (), n.dtype, n.loc)
        return self._new("mul", [n, fac], {}, n.shape, n.dtype, n.loc, like=n)

    def _visit(self, n: Node, ins: list[frozenset]):   # noqa: C901 - one rule per op family
        op, d0 = n.op, ins[0] if ins else frozenset()
        fam = opset.OPS[op].family if op in opset.OPS else ""
        if op == "top_k_indices":   # read from top_k's (masked) operand, as the reference lane reads it
            n.inputs[1] = n.inputs[0].inputs[0]
        if fam == "elementwise" or op in _FREE:
            return None
        if op in _NEUTRAL:
            axes = [len(n.inputs[0].shape) - 1] if op in _LAST_AXIS else [n.attrs["axis"]] if op == "softmax" \
                else list(n.attrs["axes"])
            hit = [a for a in axes if a in d0]
            x = n.inputs[0]
            for a in hit:
                x = self.mask(x, a, _NEUTRAL[op], n.loc, row=opset.OPS[op].family == "row")
            n.inputs[0] = x
            if op == "softmax" and hit and all((id(x), a) in self.neg for a in hit):
                self.zero.update((id(n), a) for a in hit)   # exp(-inf) = 0 exactly
            return len(hit) if op == "reduce_mean" and hit else None
        if op == "matmul":
            a, b = n.inputs
            ka, kb = len(a.shape) - 1, (len(b.shape) - 2 if len(b.shape) >= 2 else 0)
            if ka in ins[0] or kb in ins[1]:
                if (id(a), ka) not in self.zero:
                    n.inputs[0] = self.mask(a, ka, 0.0, n.loc)
                if (id(b), kb) not in self.zero:
                    n.inputs[1] = self.mask(b, kb, 0.0, n.loc)
            return None
        if op == "reshape":
            return self._reshape(n, d0)
        if op == "slice":
            for a in d0:
                if (n.attrs["starts"][a], n.attrs["steps"][a]) != (0, 1) or a not in self.dyn[id(n)]:
                    raise _refuse(n, f"a slice along the dynamic axis {a} (a window, an index or a step)")
            return None
        if op == "concat":
            if n.attrs["axis"] in set().union(*ins):
                raise _refuse(n, "concatenate along the dynamic axis")
            return None
        if op == "pad":
            if any(n.attrs["pads"][a] != (0, 0) and tuple(n.attrs["pads"][a]) != (0, 0) for a in d0):
                raise _refuse(n, "pad along the dynamic axis")
            return None
        if op in ("take", "take_along_axis"):
            if n.attrs["axis"] in d0 or (op == "take_along_axis" and n.attrs["axis"] in ins[1]):
                raise _refuse(n, f"{op} (a gather) along the dynamic axis")
            return None
        if op in _REFUSE_LAST:
            if len(n.inputs[0].shape) - 1 in d0:
                raise _refuse(n, f"{op} over the dynamic axis")
            return None
        if op == "conv_patches":
            if d0 - {0}:
                raise _refuse(n, "conv2d over a dynamic spatial or channel axis")
            return None
        if op == "attention":
            return self._attention(n, ins)
        raise _refuse(n, f"{op} on a dynamic axis")

    def _attention(self, n: Node, ins: list[frozenset]) -> None:
        """Keys along the dynamic axis: v masked with 0, and the padded keys masked out (the
        attention's bool mask, or anded into the one it has) unless a causal attention's queries
        run along the same axis (a real query then never reaches a padded key)."""
        if not (2 in ins[1] or 2 in ins[2]):
            return None
        if ins[3:] and ins[3] - {len(n.inputs[3].shape) - 1, len(n.inputs[3].shape) - 2}:
            raise _refuse(n, "an attention mask dynamic along another axis than the queries' or keys'")
        n.inputs[2] = self.mask(n.inputs[2], 2, 0.0, n.loc)
        if n.attrs["causal"] and 2 in ins[0]:
            return None
        shape = (1, 1, 1, self.size)
        it = self._new("iota", [], {"axis": 3}, shape, LEN_DTYPE, n.loc)
        keep = self._new("less", [it, self.length], {}, shape, dt.bool_, n.loc)
        self.dyn[id(keep)] = frozenset({3})
        if n.attrs["mask"]:
            m = n.inputs[3]
            out = (1,) * (4 - len(m.shape)) + tuple(m.shape)
            out = tuple(max(a, b) for a, b in zip(out, shape))
            if m.dtype == dt.bool_:
                keep = self._new("bitwise_and", [m, keep], {}, out, dt.bool_, n.loc)
            else:   # additive: -inf at the padded keys
                c = self._new("constant", [], {}, (), m.dtype, n.loc, value=-math.inf)
                keep = self._new("where", [keep, m, c], {}, out, m.dtype, n.loc)
            n.inputs[3] = keep
        else:
            n.inputs.append(keep)
            n.attrs = {**n.attrs, "mask": True}
        return None

    def _reshape(self, n: Node, d0: frozenset):
        """A reshape keeps a dynamic axis where the same elements lie before it on both sides."""
        src, dst = sorted(d0), sorted(self.dyn[id(n)])
        shape = n.inputs[0].shape
        if len(src) != len(dst) or any(math.prod(shape[:a]) != math.prod(n.shape[:b]) for a, b in zip(src, dst)):
            raise _refuse(n, f"a reshape from {shape} to {n.shape} that moves or merges the dynamic axis")
        return None


def mask_graph(g1: TraceGraph, g2: TraceGraph, p1: int, p2: int) -> list[frozenset]:
    """Label g1's dynamic axes (g2 traced at p2), insert the masks; the outputs' dynamic axes.
    The true length is g1's last argument (a 0-d int32 array)."""
    dyn = label(g1, g2, p1, p2)
    _Masker(g1, dyn, g1.args[-1], p1).rewrite()
    return [dyn[id(o)] for o in g1.outputs]


# ---------------------------------------------------------------------------- the compiled function
class BucketedJit(JitFunction):
    """The compiled form: the user's function with the true length as a last argument; its trace
    is masked (mask_graph) and each compile's cause names the bucket."""

    def __init__(self, owner: "Buckets"):
        outer = owner.fn

        def padded_call(*flat):
            return outer._call_fn(*flat[:-1])
        padded_call.__name__ = padded_call.__qualname__ = outer.name
        super().__init__(padded_call, target=outer.target, arch=outer.arch, strict=outer.strict,
                         schedule=outer.schedule, static_argnums=tuple(outer._static))
        self.owner = owner
        self.out_axes: dict[tuple, list[frozenset]] = {}

    def _trace(self, prepared, kinds, ints):
        g1 = super()._trace(prepared, kinds, ints)
        dims = self.owner.dims(prepared[:-1])
        p1 = prepared[dims[0][0]].shape[dims[0][1]]
        wider = list(prepared)
        for pos in {p for p, _ in dims}:
            shape = list(prepared[pos].shape)
            for p, ax in dims:
                if p == pos:
                    shape[ax] = p1 + 1
            wider[pos] = np.broadcast_to(np.zeros((), prepared[pos].dtype), shape)   # shapes only: no memory
        try:
            g2 = super()._trace(wider, kinds, ints)
        except TesseraError as e:
            raise DynamicShapeError(f"tracing {self.name} at dynamic length {p1 + 1} (to find which axes follow the "
                                    f"dynamic one) failed where length {p1} traced: {e.code}: {e.message}") from None
        self.out_axes[_pattern_key(prepared, kinds)] = mask_graph(g1, g2, p1, p1 + 1)
        return g1

    def _count_compile(self, key, kinds, prepared, arrays) -> None:
        super()._count_compile(key, kinds, prepared, arrays)
        p, ax = self.owner.dims(prepared[:-1])[0]
        size, n = prepared[p].shape[ax], int(prepared[-1])
        with self._lock:
            cause = self.compiles[-1]
            cause = "a new bucket" if cause.startswith("sizes ") else cause   # the bucket's size is compiled in
            self.compiles[-1] = f"dynamic bucket {size} (lengths {_lowest(size)}..{size}, first at length {n}): {cause}"


def _pattern_key(args, kinds) -> tuple:
    """What a trace's output axes are kept by: arrays' dtypes and shapes, numbers as numbers,
    static values by value."""
    return tuple(("a", a.dtype.str, a.shape) if k == ARRAY else ("n",) if k == SCALAR else ("s",) + _scalar_key(a)
                 for a, k in zip(args, kinds))


class Buckets:
    """The part of a ``tessera.jit(dynamic=...)`` function that pads, calls and slices."""

    def __init__(self, fn: JitFunction, spec):
        self.fn = fn
        self.spec = parse_spec(fn, spec)
        self.inner = BucketedJit(self)
        fn.compiles = self.inner.compiles   # the recompile counter: one entry per bucket compiled

    def dims(self, args) -> list[tuple[int, int]]:
        """(position, axis) of every dynamic dimension of this call, axes normalised."""
        out = []
        for pos, axes in self.spec.items():
            if pos >= len(args):
                raise ArgumentError(f"dynamic=: {self.fn.name} was called with {len(args)} arguments; argument "
                                    f"{pos} is marked dynamic")
            a = args[pos]
            if not (isinstance(a, np.ndarray) or hasattr(a, "__array_interface__")):
                raise ArgumentError(f"dynamic=: argument {pos} of {self.fn.name} is a {type(a).__name__}; only an "
                                    "array has a dynamic axis")
            rank = np.ndim(a)
            for ax in axes:
                if not -rank <= ax < rank:
                    raise ArgumentError(f"dynamic=: axis {ax} of argument {pos} of {self.fn.name} is out of range "
                                        f"for its rank {rank}")
                if (pos, ax % rank) not in out:
                    out.append((pos, ax % rank))
        return out

    def pad(self, args) -> tuple[list, int, int]:
        """The arguments padded to the bucket, with the true length appended; (args, L, P)."""
        # array-likes as arrays (numpy scalars too): the output-axes key sees what the trace saw
        args = [np.asarray(a) if hasattr(a, "__array_interface__") and not isinstance(a, np.ndarray) else a
                for a in args]
        dims = self.dims(args)
        lengths = {args[p].shape[ax] for p, ax in dims}
        if len(lengths) != 1:
            shown = ", ".join(f"argument {p} axis {ax} = {args[p].shape[ax]}" for p, ax in dims)
            raise ArgumentError(f"dynamic=: the dynamic dimensions of one call share one length; got {shown}")
        n = lengths.pop()
        if n == 0:
            raise ArgumentError(f"dynamic=: {self.fn.name} called with dynamic length 0 (at least 1)")
        size = bucket(n)
        for pos in {p for p, _ in dims}:
            a = args[pos]
            if n == size:
                continue
            shape = list(a.shape)
            for p, ax in dims:
                if p == pos:
                    shape[ax] = size
            out = np.zeros(shape, a.dtype)   # finite padding: masked wherever it could reach a result
            out[tuple(slice(0, s) for s in a.shape)] = a
            args[pos] = out
        return args + [np.asarray(n, LEN_DTYPE)], n, size

    def _kinds(self, args) -> list[str]:
        inner = self.inner
        static = inner._static | set(inner._learned)
        return [STATIC if i in static or not (isinstance(a, np.ndarray) or isinstance(a, (int, float)))
                or isinstance(a, bool) else ARRAY if isinstance(a, np.ndarray) else SCALAR
                for i, a in enumerate(args)]

    def call(self, args):
        padded, n, size = self.pad(args)
        return self.unpad(self.inner(*padded), padded, n, size)

    def unpad(self, outs, padded, n: int, size: int):
        """The results sliced back to length ``n`` along their dynamic axes."""
        tup = isinstance(outs, tuple)
        axes = self.inner.out_axes.get(_pattern_key(padded, self._kinds(padded)))
        if axes is None:
            raise InternalError(f"dynamic=: no traced output axes for this call of {self.fn.name}")
        res = []
        for o, ax in zip(outs if tup else (outs,), axes):
            if ax and n != size:
                o = o[tuple(slice(0, n) if i in ax else slice(None) for i in range(o.ndim))]
                if not o.flags.c_contiguous:
                    o = o.copy()
            res.append(o)
        return tuple(res) if tup else res[0]

    def compile(self, args) -> "BucketArtifact":
        padded, n, size = self.pad(args)
        v, _, _ = self.inner._variant(padded)
        return BucketArtifact(self, v, n, size)


class BucketArtifact(Artifact):
    """A bucket's compiled specialisation; its report names the bucket."""

    def __init__(self, owner: Buckets, variant, n: int, size: int):
        super().__init__(owner.inner, variant)
        self.owner, self.length, self.size = owner, n, size

    def report(self):
        r = super().report()
        dims = ", ".join(f"argument {p} axis {ax}" for p, ax in sorted(
            (p, ax) for p, axes in self.owner.spec.items() for ax in axes))
        lo = _lowest(self.size)
        r.notes.append(f"dynamic ({dims}): length {self.length} runs in bucket {self.size} (lengths {lo}..{self.size} "
                       f"share this compile; padded and masked); {len(self.owner.inner.compiles)} bucket compile(s)")
        return r

    def emulate(self, *args, **kwargs):
        padded, n, size = self.owner.pad(self.owner.fn._flat(args, kwargs))
        return self.owner.unpad(super().emulate(*padded), padded, n, size)

    def __call__(self, *args, **kwargs):
        return self.owner.fn(*args, **kwargs)
