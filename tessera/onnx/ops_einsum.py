"""ONNX Einsum (version 12) of one or two operands replayed as transposes, sums, reshapes and one
batched ``tessera.ops.matmul``.

The equation is read into letters per operand (``...`` becomes as many fresh letters as the
operand has dims left over, right-aligned; an implicit output is the ellipsis then the letters
used once, alphabetically).  Each operand first sums away the letters no one else reads; two
operands are then split into batch letters (in both and the output), contracted letters (in both,
not the output) and each one's own kept letters, and multiplied as [B, M, K] @ [B, K, N].  A
letter repeated inside one operand (a diagonal), more than two operands, and batch dims of
different sizes (broadcasting) are refused.
"""
from __future__ import annotations

import math

from tessera import dtypes as dt
from tessera.frontend import ops
from tessera.onnx.convert import op

FRESH = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"    # the ellipsis' letters (an equation's own are lower case)


def _parse(ctx, eq: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.refuse(f"equation {eq!r} names {len(terms)} operands, the node has {len(ranks)}")
    n_ell = 0
    out_terms = []
    for t, r in zip(terms, ranks):
        body = t.replace("...", "")
        if body and not (body.isascii() and body.isalpha()):
            raise ctx.refuse(f"equation {eq!r}: term {t!r} is not letters and '...'")
        if any(c in FRESH for c in body):
            raise ctx.refuse(f"equation {eq!r}: upper-case letters are not mapped")
        if "..." in t:
            k = r - len(t.replace("...", ""))
            if k < 0:
                raise ctx.refuse(f"term {t!r} has more letters than its operand's rank {r}")
            n_ell = max(n_ell, k)
            t = t.replace("...", FRESH[n_ell - k: n_ell] if k else "")
        elif len(t) != r:
            raise ctx.refuse(f"term {t!r} has {len(t)} letters, its operand rank {r}")
        if len(set(t)) != len(t):
            raise ctx.refuse(f"term {t!r} repeats a letter (a diagonal): not mapped")
        out_terms.append(t)
    ell = FRESH[:n_ell]
    if arrow:
        out = rhs.replace("...", ell)
        if any(c not in "".join(out_terms) for c in out) or len(set(out)) != len(out):
            raise ctx.refuse(f"equation {eq!r}: the output names a letter no operand has, or one twice")
    else:
        letters = "".join(out_terms)
        out = ell + "".join(sorted(c for c in set(letters) if c not in ell and letters.count(c) == 1))
    return out_terms, out


def _sum_away(x, term: str, keep: str):
    axes = tuple(i for i, c in enumerate(term) if c not in keep)
    if axes:
        x = ops.reduce_sum(x, axis=axes)
        term = "".join(c for c in term if c in keep)
    return x, term


def _permute(x, term: str, order: str):
    return x if term == order else ops.transpose(x, tuple(term.index(c) for c in order))


@op("Einsum", inputs=(1, 2), attrs=("equation",))
def _einsum(ctx, ins):
    xs = [ctx.t(v) for v in ins]
    for x in xs:
        if dt.kind(x.dtype) != "f":
            raise ctx.refuse(f"float operands only, got {dt.name(x.dtype)}")
    terms, out = _parse(ctx, str(ctx.a("equation", "")), [x.ndim for x in xs])
    size = {}
    for x, t in zip(xs, terms):
        for c, n in zip(t, x.shape):
            if size.setdefault(c, n) != n:
                raise ctx.refuse(f"letter {c!r} is {size[c]} in one operand and {n} in another (broadcasting "
                                 "is not mapped)")
    if len(xs) == 1:
        x, t = _sum_away(xs[0], terms[0], out)
        return [_permute(x, t, out)]
    (a, ta), (b, tb) = (_sum_away(x, t, out + terms[1 - i]) for i, (x, t) in enumerate(zip(xs, terms)))
    batch = "".join(c for c in out if c in ta and c in tb)
    contract = "".join(c for c in ta if c in tb and c not in out)
    m = "".join(c for c in ta if c not in tb)
    n = "".join(c for c in tb if c not in ta)
    dims = [math.prod(size[c] for c in s) for s in (batch, m, contract, n)]
    a = ops.reshape(_permute(a, ta, batch + m + contract), (dims[0], dims[1], dims[2]))
    b = ops.reshape(_permute(b, tb, batch + contract + n), (dims[0], dims[2], dims[3]))
    y = ops.reshape(ops.matmul(a, b), tuple(size[c] for c in batch + m + n))
    return [_permute(y, batch + m + n, out)]
