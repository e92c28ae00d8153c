"""What the cold-compile speed-ups must not change: the verifier still rejects every bad op (its
memo of equal ops), the garbage collector's state after a compile, and the machine code."""
from __future__ import annotations

import gc
import threading

import pytest

from tessera.errors import IRVerifyError
from tessera.frontend import gc_pause
from tessera.ir import verify_memo
from tessera.ir.text import parse_and_verify, parse_module, verify

V8 = "vector<8xf32>"


def _fn(body: str, ret: bool = True) -> str:
    tail = "  func.return\n" if ret else ""
    return (f"func.func @f(%a: {V8}, %b: {V8}) {{\n"
            + "".join(f"  {ln}\n" for ln in body.strip().splitlines()) + tail + "}\n")


GOOD = [f'%{i + 1} = tessera_x86.vbinary "add" %{i if i else "a"}, %b : {V8}' for i in range(6)]


def test_equal_ops_pass_and_a_differing_attribute_is_still_checked():
    parse_and_verify(_fn("\n".join(GOOD)))
    bad = GOOD + [f'%9 = tessera_x86.vbinary "bogus" %6, %b : {V8}']
    with pytest.raises(IRVerifyError, match="bogus"):
        parse_and_verify(_fn("\n".join(bad)))


def test_a_differing_operand_type_is_still_checked():
    """The same class and attributes as the verified ops, but an f32 operand (set after parsing)."""
    m = parse_module(_fn("\n".join(GOOD)).replace(f"%b: {V8})", f"%b: {V8}, %s: f32)"))
    f = next(o for o in m.walk() if o.name == "func.func")
    last = [o for o in m.walk() if o.name == "tessera_x86.vbinary"][-1]
    last.operands[1] = f.body.block.args[2]
    with pytest.raises(IRVerifyError, match="tessera_x86.vbinary"):
        verify(m)


def test_planted_memo_that_ignores_attributes_lets_the_bad_op_through(monkeypatch):
    """Teeth: a key of the op's class alone (a stale entry for the bad op) hides the error."""
    real = verify_memo.key
    monkeypatch.setattr(verify_memo, "key", lambda op: None if real(op) is None else (type(op),))
    monkeypatch.setattr(verify_memo, "value_key", lambda op: None)
    bad = GOOD + [f'%9 = tessera_x86.vbinary "bogus" %6, %b : {V8}']
    parse_and_verify(_fn("\n".join(bad)))      # passes: the memo matched the good ops' entry


def test_an_op_equal_to_a_verified_one_but_ending_its_block_is_checked():
    """The terminator rules read the op's place: the last op of a block is verified in full."""
    with pytest.raises(IRVerifyError, match="terminator"):
        parse_and_verify(_fn("\n".join(GOOD), ret=False))


def test_planted_memo_that_keys_the_last_op_misses_the_missing_terminator(monkeypatch):
    def placeless(op):
        if op.regions or op.successors or not verify_memo._class_eligible(type(op), op):
            return None
        return (type(op),)
    monkeypatch.setattr(verify_memo, "key", placeless)
    parse_and_verify(_fn("\n".join(GOOD), ret=False))     # passes: the missing terminator goes unnoticed


def test_value_key_matches_equal_types_that_are_distinct_objects():
    m = parse_module(_fn("\n".join(GOOD)))
    a, b = [o for o in m.walk() if o.name == "tessera_x86.vbinary"][:2]
    assert a.results[0].type is not b.results[0].type or a.attributes["fn"] is not b.attributes["fn"]
    assert verify_memo.value_key(a) == verify_memo.value_key(b)
    memo = verify_memo.Memo()
    memo.passed(a, verify_memo.key(a))
    assert memo.passed_before(b, verify_memo.key(b))


# ---------------------------------------------------------------------------- the collector's pause
def test_gc_pause_restores_the_collector_and_nests():
    assert gc.isenabled()
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_gc_pause_keeps_a_collector_the_program_disabled():
    gc.disable()
    try:
        with gc_pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_gc_pause_across_threads_ends_with_the_last_compile():
    inside, leave = threading.Event(), threading.Event()

    def other():
        with gc_pause.paused():
            inside.set()
            leave.wait(10)
    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with gc_pause.paused():
        pass
    assert not gc.isenabled()          # the other thread still compiles
    leave.set()
    t.join(10)
    assert gc.isenabled()


def test_gc_pause_restores_the_collector_when_the_compile_raises():
    with pytest.raises(RuntimeError):
        with gc_pause.paused():
            raise RuntimeError("a failed compile")
    assert gc.isenabled()


# ---------------------------------------------------------------------------- the builder's shortcut
def _build_index_ops() -> str:
    """Every index op the builder makes, printed."""
    from xdsl.dialects.builtin import ModuleOp
    from xdsl.ir import Block, Region

    from tessera.ir import builder as B
    from tessera.ir.text import print_ir
    blk = Block(arg_types=[B.INDEX, B.INDEX])
    b = B.Builder(blk)
    x, y = blk.args
    c = b.cmp("slt", x, y)
    for f in (b.add, b.sub, b.mul, b.div, b.ceil_div, b.rem, b.min, b.max):
        f(x, y)
    b.select(c, x, y)
    b.cmp("uge", x, y)
    return print_ir(ModuleOp(Region(blk)))


def test_builder_shortcut_builds_the_ops_the_constructors_build(monkeypatch):
    from tessera.ir import builder as B
    monkeypatch.setattr(B, "_MADE", {})
    constructed = _build_index_ops()          # an empty cache: xDSL's constructors, entries recorded
    assert len(B._MADE) == 11
    assert _build_index_ops() == constructed  # every op from a cached entry
    for name in ("arith.addi", "arith.subi", "arith.muli", "arith.divui", "arith.ceildivui", "arith.remui",
                 "arith.minsi", "arith.maxsi", "arith.select", "arith.cmpi slt", "arith.cmpi uge"):
        assert name in constructed, name


def test_planted_stale_builder_entry_shows_in_the_ir(monkeypatch):
    """Teeth: an entry holding another op's properties (a stale entry) changes the printed IR."""
    from xdsl.dialects import arith

    from tessera.ir import builder as B
    monkeypatch.setattr(B, "_MADE", {})
    constructed = _build_index_ops()
    slt = next(k for k in B._MADE if k[0] is arith.CmpiOp and k[1][0] == "slt")
    uge = next(k for k in B._MADE if k[0] is arith.CmpiOp and k[1][0] == "uge")
    B._MADE[slt] = B._MADE[uge]
    assert _build_index_ops() != constructed
