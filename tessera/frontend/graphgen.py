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
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType as BuiltinTensor,
    f64,
    i1,
)
from xdsl.ir import Block, Region
from xdsl.irdl import OptOperandDef, OptResultDef

from tessera import dtypes as dt
from tessera.ir import dims as D
from tessera.ir import graph as g
from tessera.errors import InternalError
from tessera.ir import opset
from tessera.ir.attrs import i64_attr, int_array

from tessera.frontend.dim_rules import UF, Specialize, dims_of, resolve
from tessera.frontend.trace import Node, TraceGraph


@dataclass
class GraphIR:
    module: ModuleOp
    arg_dims: list[tuple[D.Dim, ...]]     # per traced array argument
    static: frozenset[tuple[int, int]]    # (arg position, axis) specialised to its size


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
    uf = UF()
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


def _infer(graph: TraceGraph, uf: UF, dims: dict) -> None:
    for n in graph.nodes:
        d = dims[id(n)] = dims_of(uf, n, [dims[id(x)] for x in n.inputs])
        if n.observed:  # user code read these sizes (they may have become constants): specialise them
            syms = {s for ax in n.observed for s in D.symbols(d[ax])}
            if syms:
                raise Specialize(syms)


def _emit(graph: TraceGraph, uf: UF, dims: dict, static) -> GraphIR:
    def ttype(node: Node) -> g.TensorType:
        return g.TensorType.of([resolve(uf, x) for x in dims[id(node)]], dt.ir_type(node.dtype))

    block = Block(arg_types=[ttype(a) for a in graph.args])
    vals = {id(a): block.args[i] for i, a in enumerate(graph.args)}
    second = {id(n.inputs[0]): ttype(n) for n in graph.nodes if n.op in opset.SECOND_RESULTS}
    for n in graph.nodes:
        T = ttype(n)
        operands = [vals[id(x)] for x in n.inputs]
        if n.op in opset.SECOND_RESULTS:   # a second result of its first input's op (top_k's indices)
            vals[id(n)] = operands[0].owner.results[1]
            continue
        op = _make_op(n, operands, T, second.get(id(n)))
        if n.loc is not None:
            op.location = FileLineColLoc(StringAttr(n.loc.file), IntAttr(n.loc.line), IntAttr(n.loc.col))
        block.add_op(op)
        vals[id(n)] = op.results[0]
    outs = [vals[id(o)] for o in graph.outputs]
    block.add_op(func.ReturnOp(*outs))
    fn = func.FuncOp("main", ([v.type for v in block.args], [v.type for v in outs]), Region(block))
    module = ModuleOp([fn])
    arg_dims = [tuple(resolve(uf, x) for x in dims[id(a)]) for a in graph.args]
    return GraphIR(module, arg_dims, static)


# every Graph IR op class by its registry name (ir/opset.py: the dialect holds one class per entry)
OP_CLASS = {op.name.split(".", 1)[1]: op for op in g.Graph.operations}


def attr_kind(constr):
    """The attribute class an IRDL attribute constraint declares (``BaseAttr`` or parametrised)."""
    return getattr(constr, "attr", None) or getattr(constr, "base_attr", None)


def _attribute(name: str, constr, value):
    """A trace node's attribute value as the IR attribute its op declares (by the declared kind)."""
    kind = attr_kind(constr)
    if kind is ArrayAttr:      # int tuples; pairs (pad's) flattened
        flat = [w for v in value for w in (v if isinstance(v, (tuple, list)) else (v,))]
        return int_array(flat)
    if kind is StringAttr:
        return StringAttr(value)
    if kind is FloatAttr:
        return FloatAttr(float(value), f64)
    if kind is IntegerAttr and isinstance(value, bool):
        return BoolAttr(value, i1)
    if kind is IntegerAttr and isinstance(value, int):
        return i64_attr(value)
    raise InternalError(f"the attribute {name}={value!r} has no IR encoding ({constr})")


def _make_op(n: Node, operands, T, second):
    """The Graph IR op of trace node ``n``: its class from the registry name, its attributes
    encoded as the class declares them, optional operand groups filled in order, and a second
    result typed as its trace node (``second``; else as the first)."""
    if n.op == "constant":
        val = DenseIntOrFPElementsAttr.from_list(BuiltinTensor(dt.ir_type(n.dtype), []), [n.value])
        return g.ConstantOp.create(result_types=[T], attributes={"value": val})
    cls = OP_CLASS[n.op]
    d = cls.get_irdl_definition()
    attrs = {k: _attribute(k, a.constr, n.attrs[k]) for k, a in d.attributes.items() if n.attrs.get(k) is not None}
    optional = len(d.results) == 2 and isinstance(d.results[1][1], OptResultDef)   # attention's lse
    results = [T] if len(d.results) == 1 or (optional and second is None) else [T, second or T]
    opt = [isinstance(od, OptOperandDef) for _, od in d.operands]
    if not any(opt):
        return cls.create(operands=operands, result_types=results, attributes=attrs)
    present = n.attrs.get("present", (len(operands) == len(opt),) if sum(opt) == 1 else None)
    flags, rest = iter(present), iter(operands)
    groups = [([next(rest)] if next(flags) else []) if o else [next(rest)] for o in opt]
    if optional:   # the constructor takes an optional result as a group
        results = [T, [second] if second is not None else []]
    return cls(operands=groups, result_types=results, attributes=attrs)


__all__ = ["build", "GraphIR", "ArrayAttr"]
