"""Small IR-editing helpers shared by passes."""
from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Block, Operation, SSAValue


def view_through(view, op):
    """``view`` (a ``StridedView``) seen through one Graph IR view op: a transpose, a slice or a
    reshape; None where strides cannot express the reshape."""
    from tessera.ir import graph as g
    from tessera.ir.attrs import ints
    if isinstance(op, g.TransposeOp):
        return view.transpose(op.permutation)
    if isinstance(op, g.SliceOp):
        return view.slice(ints(op.starts), ints(op.steps), op.result.type.dims)
    return view.reshape(op.result.type.dims)


def view_through_all(view, ops):
    """``view`` seen through ``ops`` in order (source first), or None where one cannot be."""
    for op in ops:
        view = view_through(view, op)
        if view is None:
            return None
    return view


def function_blocks(module: Operation) -> list[Block]:
    """The body block of every function with a body (taken up front: passes edit them)."""
    return [f.body.block for f in module.walk() if isinstance(f, func.FuncOp) and f.body.blocks]


def replace_op(op: Operation, values: list[SSAValue]) -> None:
    """Redirect every use of ``op``'s results to ``values`` and erase ``op``."""
    for r, v in zip(op.results, values, strict=True):
        r.replace_all_uses_with(v)
    op.detach()
    op.erase()


def swap_op(old: Operation, new: Operation) -> None:
    """Put ``new`` where ``old`` is (same location): its first results replace ``old``'s."""
    new.location = old.location
    insert_before(old, new)
    replace_op(old, list(new.results[:len(old.results)]))


def insert_before(anchor: Operation, *ops: Operation) -> None:
    block = anchor.parent
    assert block is not None
    for o in ops:
        block.insert_op_before(o, anchor)


def erase_dead(block: Block, is_removable) -> bool:
    """Erase ops in ``block`` whose results are all unused and that ``is_removable`` allows."""
    changed = False
    for op in reversed(list(block.ops)):
        if op.results and all(not r.uses for r in op.results) and is_removable(op):
            op.detach()
            op.erase()
            changed = True
    return changed


def register_elem(op: Operation):
    """The element type a CPU kernel computes in (the type of its vector registers): ``f64``
    when any tensor the fusion group ``op`` reads, writes or computes is float64, else ``f32``
    (narrower floats widen to f32 exactly).  The schedule sizes the vectors by it (half the
    lanes for f64) and the kernel generators type their register tiles with it."""
    from xdsl.dialects.builtin import Float64Type, f32, f64

    def is64(v) -> bool:
        return isinstance(getattr(v.type, "element_type", None), Float64Type)

    values = list(op.operands) + list(op.results)
    for region in op.regions:
        for inner in region.walk():
            values += list(inner.results)
    return f64 if any(is64(v) for v in values) else f32
