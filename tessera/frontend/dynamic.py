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

Axes given as an int or a tuple of ints all follow one length (``"length"``); ``{axis: "name"}``
names the length an axis follows, so ``dynamic={"x": {0: "batch", 1: "seq"}, "bias": {1: "seq"}}``
has two independent lengths, each with its own bucket and runtime value (and one more trace,
at its size + 1).  The dimensions of one length must agree in a call (``BAD_ARGUMENT``).
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
DEFAULT = "length"   # the length an axis follows when dynamic= does not name one
LEN_DTYPE = np.dtype(np.int32)   # the true length's runtime dtype (an iota's)


def _lowest(size: int) -> int:
    """The shortest length of bucket ``size``."""
    return size // 2 + 1 if size > MIN_BUCKET else 1


def bucket(n: int) -> int:
    """The bucket of length ``n``: the next power of two, at least MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << max(0, n - 1).bit_length())


# ---------------------------------------------------------------------------- the spec
def parse_spec(fn: JitFunction, spec) -> dict[int, list[tuple[int, str]]]:
    """``dynamic=`` as argument position -> (axis as given, the length's name) pairs."""
    if not isinstance(spec, dict):
        raise ArgumentError(f"{fn.name}: dynamic= takes a dict of argument name (or position) -> axis or tuple of "
                            f"axes, got {type(spec).__name__}")
    names = [p.name for p in fn._params] if fn._params is not None else []
    out: dict[int, list[tuple[int, str]]] = {}
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
        if isinstance(v, dict):
            items = list(v.items())
        else:
            axes = (v,) if isinstance(v, int) else tuple(v) if isinstance(v, (tuple, list)) else ()
            items = [(a, DEFAULT) for a in axes]
        if not items or any(isinstance(a, bool) or not isinstance(a, int) or not isinstance(n, str) or not n
                            for a, n in items):
            raise ArgumentError(f"dynamic=: the axes of {k!r} must be an int, a tuple of ints or a dict of axis -> "
                                f"length name, got {v!r}")
        if pos in fn._static:
            raise ArgumentError(f"dynamic=: argument {k!r} is static (static_argnums/static_argnames); a static "
                                "value has no dynamic axis")
        out.setdefault(pos, []).extend(items)
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


def label(g1: TraceGraph, g2s: list[TraceGraph], sizes: list[int]) -> dict[int, dict[int, int]]:
    """id(node of g1) -> {dynamic axis: the length it follows}; ``g2s[s]`` is traced with length
    ``s`` at ``sizes[s] + 1``, the others as in g1."""
    n1 = g1.args + g1.nodes
    dyn: dict[int, dict[int, int]] = {id(a): {} for a in n1}
    for s, g2 in enumerate(g2s):
        _label_one(n1, g1, g2, sizes[s], s, dyn)
    return dyn


def _label_one(n1: list[Node], g1: TraceGraph, g2: TraceGraph, p1: int, sym: int, dyn: dict) -> None:
    p2 = p1 + 1
    n2 = g2.args + g2.nodes
    if len(n1) != len(n2) or len(g1.outputs) != len(g2.outputs):
        raise DynamicShapeError(f"the traced graph changes with the dynamic size ({len(n1)} nodes at length {p1}, "
                                f"{len(n2)} at {p2}): its structure must not depend on the size (dynamic=)")
    pos1 = {id(n): i for i, n in enumerate(n1)}
    pos2 = {id(n): i for i, n in enumerate(n2)}
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
        axes = dyn[id(a)]
        for ax, (s1, s2) in enumerate(zip(a.shape, b.shape)):
            if (s1, s2) == (p1, p2):
                if ax in axes:
                    raise DynamicShapeError(f"{_where(a)}: axis {ax} follows two dynamic lengths (dynamic=)")
                axes[ax] = sym
            elif s1 != s2:
                raise DynamicShapeError(f"{_where(a)}: axis {ax} has size {s1} at dynamic length {p1} and {s2} "
                                        f"at {p2}: only an axis that is the dynamic length itself (1:1) can be padded "
                                        "and masked (a reshape merging or splitting it, a concat or slice along it "
                                        "is not supported with dynamic=)")


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

    def __init__(self, g: TraceGraph, dyn: dict[int, dict[int, int]], lengths: list[Node], sizes: list[int]):
        self.g, self.dyn, self.lengths, self.sizes = g, dyn, lengths, sizes
        self.out: list[Node] = []
        self.cache: dict[tuple, Node] = {}
        self.zero: set[tuple[int, int]] = set()   # (id(node), axis): exactly 0 in the padded part of that axis
        self.neg: set[tuple[int, int]] = set()    # (id(node), axis): -inf there

    def _new(self, op, inputs, attrs, shape, dtype, loc, value=None, like=None) -> Node:
        n = Node(op, inputs, attrs, tuple(shape), np.dtype(dtype), loc, value=value,
                 scalar_of=frozenset() if op == "constant" else None)
        self.out.append(n)
        self.dyn[id(n)] = dict(self.dyn[id(like)]) if like is not None else {}
        return n

    def mask(self, x: Node, axis: int, neutral, loc, row: bool = False) -> Node:
        """where(iota < L, x, neutral) along ``axis`` (shared by every reader of x).  The condition
        has x's shape (iota and less are then computed inside the kernel that reads the where, never
        stored), or for a row op (``row``) a unit shape but along ``axis``: fuse-attention takes that
        small bool as the attention's mask operand."""
        key = (id(x), axis, neutral)
        if key in self.cache:
            return self.cache[key]
        sym = self.dyn[id(x)][axis]
        shape = tuple(self.sizes[sym] if i == axis else 1 if row else s for i, s in enumerate(x.shape))
        it = self._new("iota", [], {"axis": axis}, shape, LEN_DTYPE, loc)
        cond = self._new("less", [it, self.lengths[sym]], {}, shape, dt.bool_, loc)
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
            ins = [self.dyn.get(id(i), {}) for i in n.inputs]
            if any(ins):
                after = self._visit(n, ins)
            else:
                after = None
            self.out.append(n)
            if after:   # a mean over padded axes: times P / L for each
                repl[id(n)] = self._rescale(n, after)
        self.g.nodes = self.out
        self.g.outputs = [repl.get(id(o), o) for o in self.g.outputs]

    def _rescale(self, n: Node, syms: list[int]) -> Node:
        """The mean ``n`` over padded axes (following lengths ``syms``) times P / L for each (each
        factor at most P: no overflow in f16)."""
        fac = None
        for s in syms:
            lf = self._new("cast", [self.lengths[s]], {}, (), n.dtype, n.loc)
            num = self._new("constant", [], {}, (), n.dtype, n.loc, value=float(self.sizes[s]))
            f = self._new("div", [num, lf], {}, (), n.dtype, n.loc)
            fac = f if fac is None else self._new("mul", [fac, f], {}, (), n.dtype, n.loc)
        return self._new("mul", [n, fac], {}, n.shape, n.dtype, n.loc, like=n)

    def _visit(self, n: Node, ins: list[dict]):   # noqa: C901 - one rule per op family
        op, d0 = n.op, ins[0] if ins else {}
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
            return [d0[a] for a in hit] if op == "reduce_mean" else None
        if op == "matmul":
            a, b = n.inputs
            ka, kb = len(a.shape) - 1, (len(b.shape) - 2 if len(b.shape) >= 2 else 0)
            if ka in ins[0] or kb in ins[1]:
                if ka in ins[0] and (id(a), ka) not in self.zero:
                    n.inputs[0] = self.mask(a, ka, 0.0, n.loc)
                if kb in ins[1] and (id(b), kb) not in self.zero:
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
            if set(d0) - {0}:
                raise _refuse(n, "conv2d over a dynamic spatial or channel axis")
            return None
        if op == "attention":
            return self._attention(n, ins)
        raise _refuse(n, f"{op} on a dynamic axis")

    def _attention(self, n: Node, ins: list[dict]) -> None:
        """Keys along the dynamic axis: v masked with 0, and the padded keys masked out (the
        attention's bool mask, or anded into the one it has) unless a causal attention's queries
        run along the same axis (a real query then never reaches a padded key)."""
        if not (2 in ins[1] or 2 in ins[2]):
            return None
        if ins[3:] and set(ins[3]) - {len(n.inputs[3].shape) - 1, len(n.inputs[3].shape) - 2}:
            raise _refuse(n, "an attention mask dynamic along another axis than the queries' or keys'")
        sym = ins[1].get(2, ins[2].get(2))
        if 2 in ins[2]:
            n.inputs[2] = self.mask(n.inputs[2], 2, 0.0, n.loc)
        if n.attrs["causal"] and ins[0].get(2) == sym:
            return None
        shape = (1, 1, 1, self.sizes[sym])
        it = self._new("iota", [], {"axis": 3}, shape, LEN_DTYPE, n.loc)
        keep = self._new("less", [it, self.lengths[sym]], {}, shape, dt.bool_, n.loc)
        self.dyn[id(keep)] = {3: sym}
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

    def _reshape(self, n: Node, d0: dict):
        """A reshape keeps a dynamic axis where the same elements lie before it on both sides."""
        shape, d1 = n.inputs[0].shape, self.dyn[id(n)]
        for s in set(d0.values()) | set(d1.values()):
            src = sorted(a for a, t in d0.items() if t == s)
            dst = sorted(a for a, t in d1.items() if t == s)
            if len(src) != len(dst) or any(math.prod(shape[:a]) != math.prod(n.shape[:b]) for a, b in zip(src, dst)):
                raise _refuse(n, f"a reshape from {shape} to {n.shape} that moves or merges the dynamic axis")
        return None


def mask_graph(g1: TraceGraph, g2s: list[TraceGraph], sizes: list[int]) -> list[dict[int, int]]:
    """Label g1's dynamic axes (``g2s[s]`` traced with length s at ``sizes[s] + 1``), insert the
    masks; each output's {dynamic axis: length}.  The true lengths are g1's last arguments (0-d
    int32 arrays, one per length)."""
    dyn = label(g1, g2s, sizes)
    _Masker(g1, dyn, g1.args[len(g1.args) - len(sizes):], sizes).rewrite()
    return [dyn[id(o)] for o in g1.outputs]


# ---------------------------------------------------------------------------- the compiled function
def _describe(names: list[str], ns: list[int], sizes: list[int], verb: str) -> str:
    """Each length's bucket: "bucket 128 (lengths 65..128, first at length 70)"."""
    parts = [f"{'' if len(names) == 1 else name + ' '}{p} (lengths {_lowest(p)}..{p}, {verb} {n})"
             for name, n, p in zip(names, ns, sizes)]
    return ("bucket " if len(parts) == 1 else "buckets ") + ", ".join(parts)


class BucketedJit(JitFunction):
    """The compiled form: the user's function with the true lengths as last arguments; its trace
    is masked (mask_graph) and each compile's cause names the bucket."""

    def __init__(self, owner: "Buckets"):
        outer, k = owner.fn, len(owner.names)

        def padded_call(*flat):
            return outer._call_fn(*flat[:-k])
        padded_call.__name__ = padded_call.__qualname__ = outer.name
        super().__init__(padded_call, target=outer.target, arch=outer.arch, strict=outer.strict,
                         schedule=outer.schedule, static_argnums=tuple(outer._static))
        self.owner = owner
        self.out_axes: dict[tuple, list[dict[int, int]]] = {}

    def _trace(self, prepared, kinds, ints):
        g1 = super()._trace(prepared, kinds, ints)
        k = len(self.owner.names)
        dims = self.owner.dims(prepared[:-k])
        sizes = self.owner.sizes(prepared[:-k], dims)
        g2s = []
        for sym, name in enumerate(self.owner.names):
            wider = list(prepared)
            for pos in {p for p, _, t in dims if t == sym}:
                shape = list(prepared[pos].shape)
                for p, ax, t in dims:
                    if p == pos and t == sym:
                        shape[ax] = sizes[sym] + 1
                wider[pos] = np.broadcast_to(np.zeros((), prepared[pos].dtype), shape)   # shapes only: no memory
            try:
                g2s.append(super()._trace(wider, kinds, ints))
            except TesseraError as e:
                raise DynamicShapeError(
                    f"tracing {self.name} at dynamic {name} {sizes[sym] + 1} (to find which axes follow it) failed "
                    f"where {sizes[sym]} traced: {e.code}: {e.message}") from None
        self.out_axes[_pattern_key(prepared, kinds, dims)] = mask_graph(g1, g2s, sizes)
        return g1

    def _count_compile(self, key, kinds, prepared, arrays, nthreads=None) -> None:
        super()._count_compile(key, kinds, prepared, arrays, nthreads)
        k = len(self.owner.names)
        sizes = self.owner.sizes(prepared[:-k], self.owner.dims(prepared[:-k]))
        ns = [int(n) for n in prepared[-k:]]
        with self._lock:
            cause = self.compiles[-1]
            cause = "a new bucket" if cause.startswith("sizes ") else cause   # the bucket's size is compiled in
            self.compiles[-1] = f"dynamic {_describe(self.owner.names, ns, sizes, 'first at length')}: {cause}"


def _pattern_key(args, kinds, dims=()) -> tuple:
    """What a trace's output axes are kept by: arrays' dtypes and shapes (the dynamic axes' sizes
    left out: another bucket may reuse a compile without tracing again), numbers as numbers,
    static values by value."""
    def shape(i, a):
        return tuple(-1 if any(p == i and ax == j for p, ax, _ in dims) else n for j, n in enumerate(a.shape))
    return tuple(("a", a.dtype.str, shape(i, a)) if k == ARRAY else ("n",) if k == SCALAR else ("s",) + _scalar_key(a)
                 for i, (a, k) in enumerate(zip(args, kinds)))


class Buckets:
    """The part of a ``tessera.jit(dynamic=...)`` function that pads, calls and slices."""

    def __init__(self, fn: JitFunction, spec):
        self.fn = fn
        self.spec = parse_spec(fn, spec)
        # the lengths, in order of first mention: one runtime length argument and one bucket each
        self.names = list(dict.fromkeys(n for items in self.spec.values() for _, n in items))
        self.inner = BucketedJit(self)
        fn.compiles = self.inner.compiles   # the recompile counter: one entry per bucket compiled

    def dims(self, args) -> list[tuple[int, int, int]]:
        """(position, axis, length) of every dynamic dimension of this call, axes normalised."""
        out: list[tuple[int, int, int]] = []
        for pos, items in self.spec.items():
            if pos >= len(args):
                raise ArgumentError(f"dynamic=: {self.fn.name} was called with {len(args)} arguments; argument "
                                    f"{pos} is marked dynamic")
            a = args[pos]
            if not (isinstance(a, np.ndarray) or hasattr(a, "__array_interface__")):
                raise ArgumentError(f"dynamic=: argument {pos} of {self.fn.name} is a {type(a).__name__}; only an "
                                    "array has a dynamic axis")
            rank = np.ndim(a)
            for ax, name in items:
                if not -rank <= ax < rank:
                    raise ArgumentError(f"dynamic=: axis {ax} of argument {pos} of {self.fn.name} is out of range "
                                        f"for its rank {rank}")
                sym = self.names.index(name)
                if any(p == pos and a_ == ax % rank and t != sym for p, a_, t in out):
                    raise ArgumentError(f"dynamic=: axis {ax} of argument {pos} follows two lengths")
                if (pos, ax % rank, sym) not in out:
                    out.append((pos, ax % rank, sym))
        return out

    def sizes(self, args, dims) -> list[int]:
        """Each length's size in ``args`` (the first of its dimensions)."""
        return [next(np.shape(args[p])[ax] for p, ax, t in dims if t == sym) for sym in range(len(self.names))]

    def pad(self, args) -> tuple[list, list[int], list[int]]:
        """The arguments padded to their buckets, the true lengths appended; (args, lengths, buckets)."""
        # array-likes as arrays (numpy scalars too): the output-axes key sees what the trace saw
        args = [np.asarray(a) if hasattr(a, "__array_interface__") and not isinstance(a, np.ndarray) else a
                for a in args]
        dims = self.dims(args)
        ns = []
        for sym, name in enumerate(self.names):
            mine = [(p, ax) for p, ax, t in dims if t == sym]
            lengths = {args[p].shape[ax] for p, ax in mine}
            if len(lengths) != 1:
                shown = ", ".join(f"argument {p} axis {ax} = {args[p].shape[ax]}" for p, ax in mine)
                raise ArgumentError(f"dynamic=: the dynamic dimensions of one call following one length ({name!r}) "
                                    f"share one length; got {shown}")
            n = lengths.pop()
            if n == 0:
                raise ArgumentError(f"dynamic=: {self.fn.name} called with dynamic {name} 0 (at least 1)")
            ns.append(n)
        sizes = [bucket(n) for n in ns]
        for pos in {p for p, _, _ in dims}:
            a = args[pos]
            shape = list(a.shape)
            for p, ax, t in dims:
                if p == pos:
                    shape[ax] = sizes[t]
            if tuple(shape) == a.shape:
                continue
            out = np.zeros(shape, a.dtype)   # finite padding: masked wherever it could reach a result
            out[tuple(slice(0, s) for s in a.shape)] = a
            args[pos] = out
        return args + [np.asarray(n, LEN_DTYPE) for n in ns], ns, sizes

    def _kinds(self, args) -> list[str]:
        inner = self.inner
        static = inner._static | set(inner._learned)
        return [STATIC if i in static or not (isinstance(a, np.ndarray) or isinstance(a, (int, float)))
                or isinstance(a, bool) else ARRAY if isinstance(a, np.ndarray) else SCALAR
                for i, a in enumerate(args)]

    def call(self, args):
        padded, ns, sizes = self.pad(args)
        return self.unpad(self.inner(*padded), padded, ns, sizes)

    def unpad(self, outs, padded, ns: list[int], sizes: list[int]):
        """The results sliced back to the true lengths along their dynamic axes."""
        tup = isinstance(outs, tuple)
        axes = self.inner.out_axes.get(_pattern_key(padded, self._kinds(padded), self.dims(padded)))
        if axes is None:
            raise InternalError(f"dynamic=: no traced output axes for this call of {self.fn.name}")
        res = []
        for o, ax in zip(outs if tup else (outs,), axes):
            if any(ns[t] != sizes[t] for t in ax.values()):
                o = o[tuple(slice(0, ns[ax[i]]) if i in ax else slice(None) for i in range(o.ndim))]
                if not o.flags.c_contiguous:
                    o = o.copy()
            res.append(o)
        return tuple(res) if tup else res[0]

    def compile(self, args) -> "BucketArtifact":
        padded, ns, sizes = self.pad(args)
        v, _, _ = self.inner._variant(padded)
        return BucketArtifact(self, v, ns, sizes)


class BucketArtifact(Artifact):
    """A bucket's compiled specialisation; its report names the bucket."""

    def __init__(self, owner: Buckets, variant, ns: list[int], sizes: list[int]):
        super().__init__(owner.inner, variant)
        self.owner, self.lengths, self.sizes = owner, ns, sizes

    def report(self):
        r = super().report()
        dims = ", ".join(f"argument {p} axis {ax}" + ("" if len(self.owner.names) == 1 else f" ({name})")
                         for p, items in sorted(self.owner.spec.items()) for ax, name in items)
        now = _describe(self.owner.names, self.lengths, self.sizes, "this call at length")
        r.notes.append(f"dynamic ({dims}): {now} (each bucket one compile; padded and masked); "
                       f"{len(self.owner.inner.compiles)} bucket compile(s)")
        # a bucket's kernels read and write padded copies, never the caller's buffers
        r.donated = [f"argument {p}: refused: dynamic= pads the arguments into bucket-sized buffers, so every "
                     "result is allocated" for p in self.owner.fn.donate_argnums]
        return r

    def emulate(self, *args, **kwargs):
        padded, ns, sizes = self.owner.pad(self.owner.fn._flat(args, kwargs))
        return self.owner.unpad(super().emulate(*padded), padded, ns, sizes)

    def __call__(self, *args, **kwargs):
        return self.owner.fn(*args, **kwargs)
