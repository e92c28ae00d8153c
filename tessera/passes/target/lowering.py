"""What every tile -> target lowering shares: walking a block op by op, dispatching each to
``op_<dialect>_<name>``, and carrying ``arith`` index arithmetic over with its operands
remapped.  ``vmap`` maps each Tile IR value to what stands for it in the target IR."""
from __future__ import annotations

from xdsl.ir import Block, Operation, SSAValue

from tessera.errors import CodegenError
from tessera.ir.builder import Builder


class OpLowerer:
    lowering_name = "the lowering"
    vmap: dict

    def lower_block(self, src: Block, b: Builder) -> None:
        for op in src.ops:
            self.lower_op(op, b)

    def lower_op(self, op: Operation, b: Builder) -> None:
        handler = getattr(self, "op_" + op.name.replace(".", "_"), None)
        if handler is not None:
            handler(op, b)
            return
        if op.dialect_name() == "arith":
            vm = self.vmap   # only the op's operands need mapping (the whole map grows with the kernel)
            new = op.clone(value_mapper={o: vm[o] for o in op.operands if isinstance(vm.get(o), SSAValue)})
            b.op(new)
            for o, n in zip(op.results, new.results):
                self.vmap[o] = n
            return
        raise CodegenError(f"{self.lowering_name} cannot lower {op.name}")
