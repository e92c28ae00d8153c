"""A small imperative builder over xDSL blocks (index arithmetic, scf loops, ifs).

Passes that generate code (schedule -> tile, tile -> target) use it so loop
nests read like the algorithm.  Integer operands may be Python ints; index
constants are created once per function, at its entry.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import IndexType, IntegerAttr, IntegerType
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

INDEX = IndexType()
Val = SSAValue | int


I1 = IntegerType(1)
# (op class, what else fixes its properties, result type) -> the properties and attributes its
# constructor set: Operation.create with those builds the same op at half the cost of the IRDL
# constructor (9 k index ops in the Llama example's lowering)
_MADE: dict = {}


def _made(cls, operands: tuple, result_type: Attribute, key, construct: Callable[[], Operation]) -> Operation:
    k = (cls, key, result_type)
    got = _MADE.get(k)
    if got is None:
        op = construct()
        if [r.type for r in op.results] == [result_type] and list(op.operands) == list(operands):
            _MADE[k] = (dict(op.properties), dict(op.attributes))   # else: not the shape assumed here
        return op
    props, attrs = got
    return cls.create(operands=operands, result_types=[result_type], properties=dict(props), attributes=dict(attrs))


class Builder:
    def __init__(self, block: Block, consts: dict[int, SSAValue] | None = None,
                 const_block: Block | None = None, location=None):
        self.block = block
        self.consts = {} if consts is None else consts
        self.const_block = const_block or block
        self.location = location

    # ------------------------------------------------------------------ basics
    def op(self, op: Operation) -> Operation:
        if self.location is not None:
            op.location = self.location
        self.block.add_op(op)
        return op

    def child(self, block: Block) -> "Builder":
        return Builder(block, self.consts, self.const_block, self.location)

    def c(self, v: Val) -> SSAValue:
        if isinstance(v, SSAValue):
            return v
        v = int(v)
        if v not in self.consts:
            op = arith.ConstantOp(IntegerAttr(v, INDEX), INDEX)
            first = self.const_block.first_op
            if first is None:
                self.const_block.add_op(op)
            else:
                self.const_block.insert_op_before(op, first)
            self.consts[v] = op.result
        return self.consts[v]

    # ------------------------------------------------------------------ index arithmetic
    def _bin(self, cls, a: Val, b: Val) -> SSAValue:
        a, b = self.c(a), self.c(b)
        return self.op(_made(cls, (a, b), a.type, None, lambda: cls(a, b))).results[0]

    def add(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if b == 0 and isinstance(b, int):
            return a
        if a == 0 and isinstance(a, int):
            return b
        return self._bin(arith.AddiOp, a, b)

    def sub(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a - b
        if isinstance(b, int) and b == 0:
            return a
        return self._bin(arith.SubiOp, a, b)

    def mul(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        for x, y in ((a, b), (b, a)):
            if isinstance(x, int):
                if x == 0:
                    return 0
                if x == 1:
                    return y
        return self._bin(arith.MuliOp, a, b)

    def div(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a // b
        if isinstance(b, int) and b == 1:
            return a
        return self._bin(arith.DivUIOp, a, b)

    def ceil_div(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return -(-a // b)
        return self._bin(arith.CeilDivUIOp, a, b)

    def rem(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a % b
        return self._bin(arith.RemUIOp, a, b)

    def min(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return min(a, b)
        return self._bin(arith.MinSIOp, a, b)

    def max(self, a: Val, b: Val) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b)
        return self._bin(arith.MaxSIOp, a, b)

    def cmp(self, pred: str, a: Val, b: Val) -> SSAValue:
        a, b = self.c(a), self.c(b)
        return self.op(_made(arith.CmpiOp, (a, b), I1, (pred, a.type), lambda: arith.CmpiOp(a, b, pred))).results[0]

    def select(self, cond: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(_made(arith.SelectOp, (cond, a, b), a.type, None, lambda: arith.SelectOp(cond, a, b))).results[0]

    # ------------------------------------------------------------------ structure
    def for_(self, lb: Val, ub: Val, step: Val, body: Callable[["Builder", SSAValue, Sequence[SSAValue]],
                                                                 Sequence[SSAValue] | None],
             iter_args: Sequence[SSAValue] = ()) -> list[SSAValue]:
        """``scf.for``; ``body(builder, iv, carried)`` returns the values to yield."""
        block = Block(arg_types=[INDEX] + [v.type for v in iter_args])
        inner = self.child(block)
        out = body(inner, block.args[0], block.args[1:]) or []
        block.add_op(scf.YieldOp(*out))
        loop = scf.ForOp(self.c(lb), self.c(ub), self.c(step), list(iter_args), Region(block))
        self.op(loop)
        return list(loop.results)

    def if_(self, cond: SSAValue, then: Callable[["Builder"], Sequence[SSAValue] | None],
            otherwise: Callable[["Builder"], Sequence[SSAValue] | None] | None = None,
            result_types: Sequence[Attribute] = ()) -> list[SSAValue]:
        tb = Block()
        tv = then(self.child(tb)) or []
        tb.add_op(scf.YieldOp(*tv))
        eb = None
        if otherwise is not None or result_types:
            eb = Block()
            ev = (otherwise(self.child(eb)) if otherwise else None) or []
            eb.add_op(scf.YieldOp(*ev))
        op = scf.IfOp(cond, list(result_types), Region(tb), Region(eb) if eb is not None else None)
        self.op(op)
        return list(op.results)
