"""Trace graph -> Graph IR with symbolic sizes.

Every argument dimension becomes a symbol (``d0``, ``d1``, ...) except size-1
dimensions, which stay the literal 1 (numpy broadcasting depends on them).  Ops
unify symbols that must be equal (a matmul's inner dimensions, broadcast pairs),
so one kernel serves every size with the same equalities.  A reshape that only
merges dimensions yields products (``d0*d1``); one that splits a symbolic
dimension cannot be expressed, so those dimensions are *specialised* (made
static) and the graph is regenerated — the specialisation is part of the cache
key.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    DenseIntOrFPElementsAttr,
    FileLineColLoc,
    FloatAttr,
    IntAttr,
    ModuleOp,
    StringAttr,
    TensorType as BuiltinTensor,
    f64,
    i1,
)
from xdsl.ir import Block, Region

from tessera import dtypes as dt
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.ir.attrs import i64_attr, int_array

from tessera.frontend import rowops
from tessera.frontend.trace import Node, TraceGraph


class Specialize(Exception):
    def __init__(self, symbols: set[str]):
        self.symbols = symbols


class _UF:
    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, s: str) -> str:
        self.parent.setdefault(s, s)
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            keep, drop = sorted((ra, rb), key=lambda s: (len(s), s))
            self.parent[drop] = keep


@dataclass
class GraphIR:
    module: ModuleOp
    arg_dims: list[tuple[D.Dim, ...]]     # per traced array argument
    static: frozenset[tuple[int, int]]    # (arg position, axis) specialised to its size


def _unify(uf: _UF, a: D.Dim, b: D.Dim) -> None:
    if a == b:
        return
    if isinstance(a, str) and isinstance(b, str) and "*" not in a and "*" not in b:
        uf.union(a, b)
        return
    raise Specialize(set(D.symbols(a)) | set(D.symbols(b)) if not isinstance(a, int) or not isinstance(b, int)
                     else set())


def _resolve(uf: _UF, d: D.Dim) -> D.Dim:
    if isinstance(d, int):
        return d
    coef, syms = D._factors(d)
    return D.mul(coef, *[uf.find(s) for s in syms])


def _broadcast(uf: _UF, a: Node, b: Node, da, db) -> list[D.Dim]:
    out = []
    for i in range(1, max(len(da), len(db)) + 1):
        x = da[-i] if i <= len(da) else 1
        y = db[-i] if i <= len(db) else 1
        cx = a.shape[-i] if i <= len(a.shape) else 1
        cy = b.shape[-i] if i <= len(b.shape) else 1
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        else:
            assert cx == cy
            _unify(uf, x, y)
            out.append(x)
    return list(reversed(out))


def _reshape_dims(ind, inc, outc) -> list[D.Dim]:
    """Output dims of a reshape, as products of input dims where groups merge, or static
    sizes where a group of static dims splits; a symbolic dim that splits -> Specialize."""
    if all(isinstance(d, int) for d in ind):
        return list(outc)
    src = [(d, c) for d, c in zip(ind, inc) if c != 1]
    dst = [(i, c) for i, c in enumerate(outc) if c != 1]
    out: list[D.Dim] = [1] * len(outc)
    i = j = 0
    while i < len(src) or j < len(dst):
        if i >= len(src) or j >= len(dst):
            raise Specialize({"__all__"})
        ins, outs = [src[i]], [dst[j]]
        i, j = i + 1, j + 1
        pi, po = ins[0][1], outs[0][1]
        while pi != po:
            if pi < po and i < len(src):
                ins.append(src[i]); pi *= src[i][1]; i += 1
            elif po < pi and j < len(dst):
                outs.append(dst[j]); po *= dst[j][1]; j += 1
            else:
                raise Specialize({"__all__"})
        if len(outs) == 1:
            out[outs[0][0]] = D.product(d for d, _ in ins)
        elif all(isinstance(d, int) for d, _ in ins):
            for k, c in outs:
                out[k] = c
        else:
            raise Specialize({s for d, _ in ins for s in D.symbols(d)})
    return out


def build(graph: TraceGraph, static: frozenset[tuple[int, int]] = frozenset()) -> GraphIR:
    """Graph IR for ``graph``; regenerates with more static dims until it can be expressed."""
    every = frozenset((a.index, axis) for a in graph.args for axis in range(len(a.shape)))
    while True:
        try:
            return _build(graph, static)
        except Specialize as sp:
            if "__all__" in sp.symbols:
                new = every
            else:
                new = static | {(a.index, axis) for a in graph.args for axis in range(len(a.shape))
                                if f"d{a.index}_{axis}" in sp.symbols}
            if new == static:
                new = every
            if new == static:
                raise AssertionError("cannot express the traced shapes even with static sizes") from None
            static = frozenset(new)


def _build(graph: TraceGraph, static: frozenset[tuple[int, int]]) -> GraphIR:
    uf = _UF()
    dims: dict[int, list[D.Dim]] = {}

    for a in graph.args:
        dims[id(a)] = [size if size == 1 or (a.index, axis) in static else f"d{a.index}_{axis}"
                       for axis, size in enumerate(a.shape)]
        syms = {dims[id(a)][ax] for ax in a.observed if isinstance(dims[id(a)][ax], str)}
        if syms:
            raise Specialize(syms)
    try:
        _infer(graph, uf, dims)
    except Specialize as sp:  # widen to every argument symbol unified with the named ones
        roots = {uf.find(x) for x in sp.symbols if x != "__all__"}
        arg_syms = {x for a in graph.args for x in dims[id(a)] if isinstance(x, str)}
        raise Specialize({x for x in arg_syms if uf.find(x) in roots} | (sp.symbols & {"__all__"})) from None
    return _emit(graph, uf, dims, static)


def _infer(graph: TraceGraph, uf: _UF, dims: dict) -> None:
    for n in graph.nodes:
        ins = [dims[id(x)] for x in n.inputs]
        op = n.op
        if op == "constant":
            d = []
        elif op in ("add", "sub", "mul", "div", "maximum", "minimum") or op in TYPED_BINARY_NAMES:
            d = _broadcast(uf, n.inputs[0], n.inputs[1], ins[0], ins[1])
        elif op == "where":
            ab = _broadcast(uf, n.inputs[1], n.inputs[2], ins[1], ins[2])
            shape_ab = _Shape(broadcast_concrete(n.inputs[1].shape, n.inputs[2].shape))
            d = _broadcast(uf, n.inputs[0], shape_ab, ins[0], ab)
        elif op == "iota":
            d = list(n.shape)
        elif op == "matmul":
            a, b = ins
            _unify(uf, a[-1], b[-2])
            batch = _broadcast(uf, _Shape(n.inputs[0].shape[:-2]), _Shape(n.inputs[1].shape[:-2]), a[:-2], b[:-2])
            d = batch + [a[-2], b[-1]]
        elif op in ("reduce_sum", "reduce_max", "reduce_mean", "reduce_prod", "reduce_any", "reduce_all"):
            axes, keep = n.attrs["axes"], n.attrs["keepdims"]
            d = [1 if i in axes else x for i, x in enumerate(ins[0]) if keep or i not in axes]
        elif op == "transpose":
            d = [ins[0][p] for p in n.attrs["perm"]]
        elif op == "slice":   # a sliced axis is static (the tracer marked it observed); others keep their dim
            d = [x if size == whole and a == 0 and st == 1 else size
                 for x, whole, size, a, st in zip(ins[0], n.inputs[0].shape, n.shape, n.attrs["starts"],
                                                  n.attrs["steps"])]
        elif op == "concat":   # the joined axis is static (observed); the others are one dim for all
            ax = n.attrs["axis"]
            d = list(ins[0])
            for other in ins[1:]:
                for k, (a, c) in enumerate(zip(d, other)):
                    if k != ax:
                        _unify(uf, a, c)
            d[ax] = n.shape[ax]
        elif op == "pad":   # a padded axis is static (observed); the others keep their dim
            d = [x if p == (0, 0) else size for x, size, p in zip(ins[0], n.shape, n.attrs["pads"])]
        elif op == "conv_patches":   # H, W, C static (observed); the batch keeps its dim
            d = [ins[0][0], *n.shape[1:]]
        elif op == "reshape":
            d = _reshape_dims(ins[0], n.inputs[0].shape, n.shape)
        elif op in ("take", "take_along_axis", "one_hot"):
            d = _gather_dims(uf, n, ins)
        elif op == "scatter_add":
            d = _scatter_dims(uf, n, ins)
        elif op == "attention":
            q, k, v = ins[:3]
            _unify(uf, q[0], k[0])
            for a, c in zip(k[:3], v[:3]):
                _unify(uf, a, c)
            _unify(uf, q[3], k[3])
            # grouped heads need their ratio to divide: keep both head counts static
            need = []
            if q[1] != k[1] and n.inputs[0].shape[1] != n.inputs[1].shape[1]:
                need += [x for x in (q[1], k[1]) if not isinstance(x, int)]
            elif n.inputs[0].shape[1] == n.inputs[1].shape[1]:
                _unify(uf, q[1], k[1])
            if need:
                raise Specialize({s for x in need for s in D.symbols(x)})
            if n.attrs["mask"]:  # the mask broadcasts to [batch, heads_q, seq_q, seq_k]
                scores = _Shape(n.shape[:3] + (n.inputs[1].shape[2],))
                _broadcast(uf, n.inputs[3], scores, ins[3], [q[0], q[1], q[2], k[2]])
            d = [q[0], q[1], q[2], v[3]]
        elif op in ("layer_norm", "rms_norm"):
            d = list(ins[0])
            for v in ins[1:]:
                _unify(uf, v[0], d[-1])
        elif op == "cross_entropy":   # labels [...] share the logits' leading dims
            for a, c in zip(ins[0][:-1], ins[1]):
                _unify(uf, a, c)
            d = list(ins[0][:-1])
        elif rowops.infer_dims(n, ins) is not None:   # logsumexp, argmax, argmin, top_k
            d = rowops.infer_dims(n, ins)
        else:  # unary, softmax, cast, log_softmax, scans
            d = list(ins[0])
        dims[id(n)] = d
        if n.observed:  # user code read these sizes (they may have become constants): specialise them
            syms = {s for ax in n.observed for s in D.symbols(d[ax])}
            if syms:
                raise Specialize(syms)


def _emit(graph: TraceGraph, uf: _UF, dims: dict, static) -> GraphIR:
    def ttype(node: Node) -> g.TensorType:
        return g.TensorType.of([_resolve(uf, x) for x in dims[id(node)]], dt.ir_type(node.dtype))

    block = Block(arg_types=[ttype(a) for a in graph.args])
    vals = {id(a): block.args[i] for i, a in enumerate(graph.args)}
    for n in graph.nodes:
        T = ttype(n)
        operands = [vals[id(x)] for x in n.inputs]
        if n.op in rowops.SECOND_RESULT:   # a second result of its first input's op (top_k's indices)
            vals[id(n)] = operands[0].owner.results[1]
            continue
        op = _make_op(n, operands, T)
        if n.loc is not None:
            op.location = FileLineColLoc(StringAttr(n.loc.file), IntAttr(n.loc.line), IntAttr(n.loc.col))
        block.add_op(op)
        vals[id(n)] = op.results[0]
    outs = [vals[id(o)] for o in graph.outputs]
    block.add_op(func.ReturnOp(*outs))
    fn = func.FuncOp("main", ([v.type for v in block.args], [v.type for v in outs]), Region(block))
    module = ModuleOp([fn])
    arg_dims = [tuple(_resolve(uf, x) for x in dims[id(a)]) for a in graph.args]
    return GraphIR(module, arg_dims, static)


def _gather_dims(uf: _UF, n: Node, ins) -> list[D.Dim]:
    """take: the axis (static: the tracer observed it) replaced by the indices' dims;
    take_along_axis: off the axis the operands broadcast, on it the indices' dim; one_hot: the
    labels' dims and the static class count."""
    if n.op == "one_hot":
        return list(ins[0]) + [n.shape[-1]]
    ax = n.attrs["axis"]
    x, i = ins
    if n.op == "take":
        return list(x[:ax]) + list(i) + list(x[ax + 1:])
    out = []
    for k, (a, b) in enumerate(zip(x, i)):
        ca, cb = n.inputs[0].shape[k], n.inputs[1].shape[k]
        if k == ax:
            out.append(b)
        elif ca == 1 and cb != 1:
            out.append(b)
        elif cb == 1 and ca != 1:
            out.append(a)
        else:
            _unify(uf, a, b)
            out.append(a)
    return out


def _scatter_dims(uf: _UF, n: Node, ins) -> list[D.Dim]:
    """scatter_add: the updates' dims with the indices' dims replaced by the (static) axis; a
    target's dims are the same ones."""
    ax, m = n.attrs["axis"], len(n.inputs[0].shape)
    u = ins[1]
    for k in range(m):   # the updates' middle dims are the indices' dims
        _unify(uf, ins[0][k], u[ax + k])
    d = list(u[:ax]) + [n.shape[ax]] + list(u[ax + m:])
    if n.attrs["based"]:
        for k, (a, c) in enumerate(zip(d, ins[2])):
            if k != ax:
                _unify(uf, a, c)
    return d


class _Shape:
    def __init__(self, shape):
        self.shape = shape


# every Graph IR op class by its registry name (ir/opset.py: the dialect holds one class per entry)
OP_CLASS = {op.name.split(".", 1)[1]: op for op in g.Graph.operations}
TYPED_BINARY_NAMES = frozenset(c.name.split(".", 1)[1] for c in g.TYPED_BINARY)


def broadcast_concrete(a, b) -> tuple:
    return tuple(reversed([y if x == 1 else x for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)),
                                                              reversed((1,) * (len(a) - len(b)) + tuple(b)))]))


def _make_op(n: Node, operands, T):
    if not n.attrs and n.op not in rowops.MAKE and n.op not in ("iota", "constant"):   # no attributes to carry
        return OP_CLASS[n.op].create(operands=operands, result_types=[T])
    if n.op == "iota":
        return g.IotaOp.create(result_types=[T], attributes={"axis": i64_attr(n.attrs["axis"])})
    if n.op == "gelu":
        return g.GeluOp.create(operands=operands, result_types=[T],
                               attributes={"approximate": StringAttr(n.attrs["approximate"])})
    if n.op == "softmax":
        return g.SoftmaxOp.create(operands=operands, result_types=[T], attributes={"axis": i64_attr(n.attrs["axis"])})
    if n.op in ("layer_norm", "rms_norm"):
        present = n.attrs["present"]
        rest = iter(operands[1:])
        groups = [[operands[0]]] + [[next(rest)] if p else [] for p in present]
        cls = g.LayerNormOp if n.op == "layer_norm" else g.RmsNormOp
        return cls(operands=groups, result_types=[T], attributes={"eps": FloatAttr(n.attrs["eps"], f64)})
    if n.op in rowops.MAKE:
        return rowops.MAKE[n.op](n, operands, T)
    if n.op in ("reduce_sum", "reduce_max", "reduce_mean", "reduce_prod", "reduce_any", "reduce_all"):
        cls = {"reduce_sum": g.ReduceSumOp, "reduce_max": g.ReduceMaxOp, "reduce_mean": g.ReduceMeanOp,
               "reduce_prod": g.ReduceProdOp, "reduce_any": g.ReduceAnyOp, "reduce_all": g.ReduceAllOp}[n.op]
        return cls.create(operands=operands, result_types=[T],
                          attributes={"axes": int_array(n.attrs["axes"]),
                                      "keepdims": BoolAttr(n.attrs["keepdims"], i1)})
    if n.op == "transpose":
        return g.TransposeOp.create(operands=operands, result_types=[T], attributes={"perm": int_array(n.attrs["perm"])})
    if n.op == "concat":
        return g.ConcatOp.create(operands=operands, result_types=[T], attributes={"axis": i64_attr(n.attrs["axis"])})
    if n.op == "pad":
        return g.PadOp.create(operands=operands, result_types=[T], attributes={
            "pads": int_array([w for p in n.attrs["pads"] for w in p]), "mode": StringAttr(n.attrs["mode"]),
            "value": FloatAttr(n.attrs["value"], f64)})
    if n.op == "conv_patches":
        return g.ConvPatchesOp.create(operands=operands, result_types=[T], attributes={
            k: int_array(n.attrs[k]) for k in ("kernel", "stride", "dilation", "channels")})
    if n.op == "slice":
        return g.SliceOp.create(operands=operands, result_types=[T], attributes={
            "starts": int_array(n.attrs["starts"]), "steps": int_array(n.attrs["steps"])})
    if n.op in ("take", "take_along_axis"):
        cls = g.TakeOp if n.op == "take" else g.TakeAlongAxisOp
        return cls.create(operands=operands, result_types=[T], attributes={"axis": i64_attr(n.attrs["axis"])})
    if n.op == "one_hot":
        return g.OneHotOp.create(operands=operands, result_types=[T])
    if n.op == "scatter_add":
        return g.ScatterAddOp(operands=[operands[0], operands[1], operands[2:]], result_types=[T],
                              attributes={"axis": i64_attr(n.attrs["axis"])})
    if n.op == "attention":
        groups = [[operands[0]], [operands[1]], [operands[2]], [operands[3]] if n.attrs["mask"] else []]
        attrs = {"causal": BoolAttr(n.attrs["causal"], i1), "masked_rows": StringAttr(n.attrs["masked_rows"])}
        if n.attrs["scale"] is not None:  # none: 1/sqrt(head dim), computed from the runtime size
            attrs["scale"] = FloatAttr(n.attrs["scale"], f64)
        return g.AttentionOp(operands=groups, result_types=[T], attributes=attrs)
    if n.op == "constant":
        et = dt.ir_type(n.dtype)
        val = DenseIntOrFPElementsAttr.from_list(BuiltinTensor(et, []), [n.value])
        return g.ConstantOp.create(result_types=[T], attributes={"value": val})
    raise AssertionError(n.op)


__all__ = ["build", "GraphIR", "ArrayAttr"]
