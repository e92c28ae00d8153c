"""Symbolic dims of each traced op's result: the shape rules Graph IR generation reads.

``graphgen`` gives every argument dimension a symbol and asks :func:`dims_of` for each node's
result dims.  A rule unifies symbols that must be equal (a matmul's inner dimensions, the
non-1 pairs of a broadcast) in the union-find ``UF``, and raises :class:`Specialize` with
the symbols it cannot express (a split of a symbolic dim, grouped-query head counts), which
``graphgen`` then makes static.

Rules are chosen from the op registry (``ir/opset.py``) before any op name is looked at:

* the ``elementwise`` family broadcasts all its operands (one operand: its dims);
* the ``reduction`` family drops (or keeps as 1) its ``axes``;
* the ``scan`` family, and a row op without a rule of its own, keeps its input's dims, as a
  second result (``opset.SECOND_RESULTS``: top_k's indices) keeps its op's;
* every other op has a rule in ``RULES``, registered with :func:`rule`.  An op with none is an
  internal error naming it, never a guessed shape.

So a new elementwise, reduction or scan op needs nothing here.
"""
from __future__ import annotations

from typing import Callable

from tessera.errors import InternalError
from tessera.ir import dims as D
from tessera.ir import opset


class Specialize(Exception):
    """The named symbols (``__all__``: every argument dim) must become static sizes."""

    def __init__(self, symbols: set[str]):
        self.symbols = symbols


class UF:
    """Union-find over dim symbols; the shorter (then smaller) name represents its class."""

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


def unify(uf: UF, a: D.Dim, b: D.Dim) -> None:
    if a == b:
        return
    if isinstance(a, str) and isinstance(b, str) and "*" not in a and "*" not in b:
        uf.union(a, b)
        return
    raise Specialize(set(D.symbols(a)) | set(D.symbols(b)) if not isinstance(a, int) or not isinstance(b, int)
                     else set())


def resolve(uf: UF, d: D.Dim) -> D.Dim:
    if isinstance(d, int):
        return d
    coef, syms = D._factors(d)
    return D.mul(coef, *[uf.find(s) for s in syms])


def broadcast_concrete(a, b) -> tuple:
    """numpy's broadcast of two concrete shapes (they are known to broadcast)."""
    return tuple(reversed([y if x == 1 else x for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)),
                                                              reversed((1,) * (len(a) - len(b)) + tuple(b)))]))


def broadcast(uf: UF, ca, cb, da, db) -> list[D.Dim]:
    """The dims of broadcasting dims ``da`` (concrete shape ``ca``) with ``db`` (``cb``)."""
    out = []
    for i in range(1, max(len(da), len(db)) + 1):
        x = da[-i] if i <= len(da) else 1
        y = db[-i] if i <= len(db) else 1
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        else:
            assert (ca[-i] if i <= len(ca) else 1) == (cb[-i] if i <= len(cb) else 1)
            unify(uf, x, y)
            out.append(x)
    return list(reversed(out))


def reshape_dims(ind, inc, outc) -> list[D.Dim]:
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


# ----------------------------------------------------------------------------- the rules
Rule = Callable[[UF, object, list], list]   # (uf, trace node, its inputs' dims) -> the result's dims
RULES: dict[str, Rule] = {}


def rule(*names: str):
    def register(fn: Rule) -> Rule:
        for name in names:
            assert name in opset.OPS and name not in RULES, name
            RULES[name] = fn
        return fn
    return register


def dims_of(uf: UF, n, ins: list) -> list[D.Dim]:
    """The symbolic dims of trace node ``n``'s result, from its inputs' dims ``ins``."""
    if n.op in RULES:
        return RULES[n.op](uf, n, ins)
    if n.op == "attention_lse":   # one value per query row of the attention: [B, H, SQ]
        return list(ins[0][:3])
    if n.op in opset.SECOND_RESULTS:   # a second result of its first input's op: that op's dims
        return list(ins[0])
    family = opset.OPS[n.op].family if n.op in opset.OPS else None
    if family == "elementwise":
        return _broadcast_all(uf, n, ins)
    if family == "reduction":
        axes, keep = n.attrs["axes"], n.attrs["keepdims"]
        return [1 if i in axes else x for i, x in enumerate(ins[0]) if keep or i not in axes]
    if family in ("scan", "row"):
        return list(ins[0])
    raise InternalError(f"no shape rule for the op {n.op!r} (tessera/frontend/dim_rules.py)")


def _broadcast_all(uf: UF, n, ins: list) -> list[D.Dim]:
    d, shape = list(ins[0]), n.inputs[0].shape
    for x, dx in zip(n.inputs[1:], ins[1:]):
        d = broadcast(uf, shape, x.shape, d, dx)
        shape = broadcast_concrete(shape, x.shape)
    return d


@rule("constant")
def _constant(uf, n, ins):
    return []


@rule("iota")
def _iota(uf, n, ins):
    return list(n.shape)


@rule("matmul")
def _matmul(uf, n, ins):
    a, b = ins
    unify(uf, a[-1], b[-2])
    batch = broadcast(uf, n.inputs[0].shape[:-2], n.inputs[1].shape[:-2], a[:-2], b[:-2])
    return batch + [a[-2], b[-1]]


@rule("transpose")
def _transpose(uf, n, ins):
    return [ins[0][p] for p in n.attrs["perm"]]


@rule("slice")
def _slice(uf, n, ins):
    """A sliced axis is static (the tracer marked it observed); the others keep their dim."""
    return [x if size == whole and a == 0 and st == 1 else size
            for x, whole, size, a, st in zip(ins[0], n.inputs[0].shape, n.shape, n.attrs["starts"], n.attrs["steps"])]


@rule("concat")
def _concat(uf, n, ins):
    """The joined axis is static (observed); the others are one dim for all operands."""
    ax = n.attrs["axis"]
    d = list(ins[0])
    for other in ins[1:]:
        for k, (a, c) in enumerate(zip(d, other)):
            if k != ax:
                unify(uf, a, c)
    d[ax] = n.shape[ax]
    return d


@rule("pad")
def _pad(uf, n, ins):
    """A padded axis is static (observed); the others keep their dim."""
    return [x if p == (0, 0) else size for x, size, p in zip(ins[0], n.shape, n.attrs["pads"])]


@rule("conv_patches")
def _conv_patches(uf, n, ins):
    """H, W, C static (observed); the batch keeps its dim."""
    return [ins[0][0], *n.shape[1:]]


@rule("reshape")
def _reshape(uf, n, ins):
    return reshape_dims(ins[0], n.inputs[0].shape, n.shape)


@rule("one_hot")
def _one_hot(uf, n, ins):
    """The labels' dims and the static class count."""
    return list(ins[0]) + [n.shape[-1]]


@rule("take")
def _take(uf, n, ins):
    """The axis (static: the tracer observed it) replaced by the indices' dims."""
    ax = n.attrs["axis"]
    x, i = ins
    return list(x[:ax]) + list(i) + list(x[ax + 1:])


@rule("take_along_axis")
def _take_along_axis(uf, n, ins):
    """Off the axis the operands broadcast; on it, the indices' dim."""
    ax = n.attrs["axis"]
    out = []
    for k, (a, b) in enumerate(zip(*ins)):
        ca, cb = n.inputs[0].shape[k], n.inputs[1].shape[k]
        if k == ax or (ca == 1 and cb != 1):
            out.append(b)
        elif cb == 1 and ca != 1:
            out.append(a)
        else:
            unify(uf, a, b)
            out.append(a)
    return out


@rule("attention")
def _attention(uf, n, ins):
    q, k, v = ins[:3]
    unify(uf, q[0], k[0])
    for a, c in zip(k[:3], v[:3]):
        unify(uf, a, c)
    unify(uf, q[3], k[3])
    # grouped heads need their ratio to divide: keep both head counts static
    need = []
    if q[1] != k[1] and n.inputs[0].shape[1] != n.inputs[1].shape[1]:
        need += [x for x in (q[1], k[1]) if not isinstance(x, int)]
    elif n.inputs[0].shape[1] == n.inputs[1].shape[1]:
        unify(uf, q[1], k[1])
    if need:
        raise Specialize({s for x in need for s in D.symbols(x)})
    if n.attrs["mask"]:  # the mask broadcasts to [batch, heads_q, seq_q, seq_k]
        scores = n.shape[:3] + (n.inputs[1].shape[2],)
        broadcast(uf, n.inputs[3].shape, scores, ins[3], [q[0], q[1], q[2], k[2]])
    return [q[0], q[1], q[2], v[3]]


@rule("attention_grad")
def _attention_grad(uf, n, ins):
    """attention's rule on (q, k, v [, mask]); o and do have q's dims; the packed result
    [B, HKV, G + 2, S, D] with seq_q == seq_k and head dim == value dim."""
    class _Fwd:   # the forward's node as attention's rule reads it
        shape = n.inputs[0].shape[:3] + n.inputs[2].shape[3:]
        inputs = n.inputs[:3] + n.inputs[5:6 if n.attrs["mask"] else 5]
        attrs = {"mask": n.attrs["mask"]}
    q, k, v = ins[:3]
    out = _attention(uf, _Fwd, ins[:3] + ins[5:6 if n.attrs["mask"] else 5])
    if n.attrs.get("lse"):   # the forward's log-sum-exp, one per query row
        for a, c in zip(ins[-1], out[:3]):
            unify(uf, a, c)
    for x in ins[3:5]:
        for a, c in zip(x, out):
            unify(uf, a, c)
    unify(uf, q[2], k[2])
    unify(uf, q[3], v[3])
    return [q[0], k[1], n.shape[2], q[2], q[3]]


@rule("layer_norm", "rms_norm")
def _norm(uf, n, ins):
    d = list(ins[0])
    for v in ins[1:]:
        unify(uf, v[0], d[-1])
    return d


@rule("cross_entropy")
def _cross_entropy(uf, n, ins):
    """Labels [...] share the logits' leading dims."""
    for a, c in zip(ins[0][:-1], ins[1]):
        unify(uf, a, c)
    return list(ins[0][:-1])


@rule("logsumexp", "argmax", "argmin")
def _row_reduce(uf, n, ins):
    return list(ins[0][:-1]) + ([1] if n.attrs["keepdims"] else [])


@rule("top_k")
def _top_k(uf, n, ins):
    return list(ins[0][:-1]) + [n.attrs["k"]]


@rule("scatter_add")
def _scatter_add(uf, n, ins):
    """The updates' dims with the indices' dims replaced by the (static) axis; a target's dims are
    the same ones."""
    ax, m = n.attrs["axis"], len(n.inputs[0].shape)
    u = ins[1]
    for k in range(m):   # the updates' middle dims are the indices' dims
        unify(uf, ins[0][k], u[ax + k])
    d = list(u[:ax]) + [n.shape[ax]] + list(u[ax + m:])
    if n.attrs["based"]:
        for k, (a, c) in enumerate(zip(d, ins[2])):
            if k != ax:
                unify(uf, a, c)
    return d
