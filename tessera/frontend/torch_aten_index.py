"""ATen entries of the ``torch.compile`` backend for integer-indexed ops (``torch_aten.py`` holds the
table and the float ops; this module adds to it when imported).

Embedding lookup and its dense backward, ``nll_loss`` forward and backward (what AOTAutograd makes of
``F.cross_entropy`` after its ``_log_softmax``), ``index_select`` / ``gather`` / ``index_add``,
``cumsum``, ``argmax`` / ``argmin`` and ``topk``.  Integer tensors may appear only at the argument
positions in ``INDEX_ARGS`` and as the results named in ``INDEX_RESULTS``; an integer view (a
``target.view(-1)``) is covered too.  Out-of-range indices are clamped by Tessera's gather (torch
raises): the backend's first-call check against ATen reports such a difference as a mismatch.
"""
from __future__ import annotations

from tessera.frontend import ops
from tessera.frontend.torch_aten import INDEX_ARGS, INDEX_RESULTS, aten

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}   # ATen's Reduction enum


def _index(name: str, *pos: int, results: bool = False):
    """Register ``name`` as taking integer tensors at ``pos`` (and giving integer results)."""
    INDEX_ARGS.setdefault(name, set()).update(pos)
    if results:
        INDEX_RESULTS.add(name)


# ------------------------------------------------------------------------------- embedding
def _embedding_check(node):
    return "sparse=True" if len(node.args) > 4 and node.args[4] else None


@aten("aten.embedding.default", check=_embedding_check)
def _embedding(node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return ops.take(weight, indices, 0)   # the padding row is looked up like any other (torch too)


def _embedding_backward_check(node):
    return "scale_grad_by_freq=True" if node.args[4] else None


@aten("aten.embedding_dense_backward.default", check=_embedding_backward_check)
def _embedding_dense_backward(node, g, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The table's gradient: each id's output gradient added into its row (duplicates summed in
    order); the padding row (``padding_idx`` >= 0) gets none."""
    if padding_idx >= 0:
        g = ops.where(ops.expand_dims(ops.equal(indices, padding_idx), -1), 0.0, g)
    return ops.scatter_add((num_weights, g.shape[-1]), indices, g, 0)


_index("aten.embedding.default", 1)
_index("aten.embedding_dense_backward.default", 1)


# ------------------------------------------------------------------------------- nll_loss
def _nll_check(node):
    x, reduction = node.args[0].meta["val"], node.args[3]
    if x.dim() != 2:
        return f"input of rank {x.dim()} (the [N, C] form maps)"
    if reduction not in _REDUCTIONS:
        return f"reduction={reduction}"
    return None


def _nll_weights(target, weight, ignore_index, dtype):
    """Per row: the class weight of its target (1 without ``weight``), 0 where ignored."""
    keep = ops.not_equal(target, ignore_index)
    if weight is None:
        return ops.cast(keep, dtype)
    return ops.where(keep, ops.take(weight, target, 0), 0.0)   # an ignored id is clamped, then masked


@aten("aten.nll_loss_forward.default", check=_nll_check)
def _nll_loss_forward(node, x, target, weight, reduction, ignore_index):
    """(loss, total_weight): ``-w[t] x[i, t]`` per row, summed, or divided by the rows' total weight
    for "mean" (NaN when every row is ignored, as torch); total_weight is that sum (0 for "none")."""
    w = _nll_weights(target, weight, ignore_index, x.dtype)
    picked = ops.reshape(ops.take_along_axis(x, ops.expand_dims(target, 1), 1), (x.shape[0],))
    loss = -(picked * w)
    total = ops.reduce_sum(w)
    mode = _REDUCTIONS[reduction]
    if mode == "none":
        return loss, total * 0.0
    return (ops.reduce_sum(loss) / total if mode == "mean" else ops.reduce_sum(loss)), total


@aten("aten.nll_loss_backward.default", check=lambda node: _nll_check(_Shift(node)))
def _nll_loss_backward(node, g, x, target, weight, reduction, ignore_index, total_weight):
    """dL/dx: ``-w[t] g`` (divided by total_weight for "mean") at each row's target column, 0 elsewhere."""
    w = _nll_weights(target, weight, ignore_index, x.dtype)
    mode = _REDUCTIONS[reduction]
    coef = -(w * g) if mode == "none" else -(w * (g / total_weight if mode == "mean" else g))
    hot = ops.one_hot(target, x.shape[1], x.dtype)   # an out-of-range (ignored) id: a zero row
    return hot * ops.expand_dims(coef, 1)


class _Shift:
    """``node`` seen with its first argument dropped (the backward's grad_output), so the forward's
    check reads (input, target, weight, reduction, ...) at the same positions."""

    def __init__(self, node):
        self.args = node.args[1:]


_index("aten.nll_loss_forward.default", 1)
_index("aten.nll_loss_backward.default", 2)


# ------------------------------------------------------------------------------- gathers, scans, arg-reductions
@aten("aten.index_select.default")
def _index_select(node, x, dim, index):
    return ops.take(x, index, dim)


def _gather_check(node):
    x, dim, idx = node.args[0].meta["val"], node.args[1], node.args[2].meta["val"]
    if idx.dim() != x.dim():
        return f"index of rank {idx.dim()} for an input of rank {x.dim()}"
    d = dim % x.dim()
    if any(a != b for k, (a, b) in enumerate(zip(idx.shape, x.shape)) if k != d):
        return "index smaller than the input off the gathered dim (take_along_axis maps equal sizes)"
    return None


@aten("aten.gather.default", check=_gather_check)
def _gather(node, x, dim, index, sparse_grad=False):
    return ops.take_along_axis(x, index, dim)


@aten("aten.index_add.default")
def _index_add(node, x, dim, index, source, alpha=1):
    return ops.index_add(x, dim, index, source if alpha == 1 else source * alpha)


_index("aten.index_select.default", 2)
_index("aten.gather.default", 2)
_index("aten.index_add.default", 2)

aten("aten.cumsum.default", check=lambda node: "a dtype= argument" if node.kwargs.get("dtype") is not None
     else None)(lambda node, x, dim, dtype=None: ops.cumsum(x, dim))


@aten("aten.argmax.default")
def _argmax(node, x, dim=None, keepdim=False):
    return ops.argmax(x, dim, keepdims=keepdim)


@aten("aten.argmin.default")
def _argmin(node, x, dim=None, keepdim=False):
    return ops.argmin(x, dim, keepdims=keepdim)


def _topk_check(node):
    largest = node.kwargs.get("largest", node.args[3] if len(node.args) > 3 else True)
    ordered = node.kwargs.get("sorted", node.args[4] if len(node.args) > 4 else True)
    return None if largest and ordered else "largest=False or sorted=False"


@aten("aten.topk.default", check=_topk_check)
def _topk(node, x, k, dim=-1, largest=True, sorted=True):
    return ops.top_k(x, k, dim)


for _n in ("aten.argmax.default", "aten.argmin.default", "aten.topk.default"):
    _index(_n, results=True)
