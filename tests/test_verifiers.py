"""Each verifier code is raised by a minimal bad example and absent from the good one."""
from __future__ import annotations

import pytest

from ir_samples import FRAG_A, FRAG_B, FRAG_C, SAMPLES
from tessera.errors import TesseraError, all_error_classes
from tessera.ir.text import parse_and_verify

GOOD_TILE = SAMPLES["tile.mma"]
GOOD_GRAPH = SAMPLES["tessera.matmul"]
GOOD_SCHEDULE = SAMPLES["schedule.kernel"]
MMA_LINE = f"%d = tile.mma %a, %b, %z : {FRAG_A}, {FRAG_B}, {FRAG_C} -> {FRAG_C}"

# code[/variant] -> (good text, [(old, new), ...]) — each replacement must apply
CASES = {
    "TILE_MMA_UNTYPED_OPERAND": (GOOD_TILE, [(MMA_LINE, f"%d = tile.mma %va, %b, %z : !tile.view<[6, 1], f32, global>, "
                                                        f"{FRAG_B}, {FRAG_C} -> {FRAG_C}")]),
    "TILE_MMA_OPERAND_ROLE": (GOOD_TILE, [(MMA_LINE, f"%d = tile.mma %z, %b, %z : {FRAG_C}, {FRAG_B}, {FRAG_C} -> "
                                                     f"{FRAG_C}")]),
    "TILE_MMA_SHAPE_MISMATCH": (GOOD_TILE, [(FRAG_B, FRAG_B.replace("6, 32, 1", "6, 16, 1")),
                                            ("bounds [%c1, %c32] : !tile.buffer<f32, global> -> !tile.view<[1, 32]",
                                             "bounds [%c1, %c32] : !tile.buffer<f32, global> -> !tile.view<[1, 16]"),
                                            ("%vb : !tile.view<[1, 32]", "%vb : !tile.view<[1, 16]")]),
    "TILE_MMA_FAMILY_MISMATCH": (GOOD_TILE, [(FRAG_B, FRAG_B.replace("fma>", "wmma>"))]),
    "TILE_MMA_ACCUM_MISMATCH": (GOOD_TILE, [(FRAG_C, "!tile.fragment<6, 32, 1, bf16, f32, acc, row_major, fma>")]),
    # the same code, each clause of the check on its own: b's declared accumulator differs ...
    "TILE_MMA_ACCUM_MISMATCH/acc-type": (GOOD_TILE, [(FRAG_B, FRAG_B.replace("f32, f32, b", "f32, f64, b"))]),
    # ... and a and b agree with the accumulator in everything but their input element type
    # (b packed from a bf16 buffer, so fragment_pack's own element check holds)
    "TILE_MMA_ACCUM_MISMATCH/input-elem": (GOOD_TILE, [
        ("func.func @f(%p : !tile.buffer<f32, global>)",
         "func.func @f(%p : !tile.buffer<f32, global>, %q : !tile.buffer<bf16, global>)"),
        ("%vb = tile.view %p[%c0] strides [%c32, %c1] bounds [%c1, %c32] : !tile.buffer<f32, global> -> "
         "!tile.view<[1, 32], f32, global>",
         "%vb = tile.view %q[%c0] strides [%c32, %c1] bounds [%c1, %c32] : !tile.buffer<bf16, global> -> "
         "!tile.view<[1, 32], bf16, global>"),
        ("%b = tile.fragment_pack %vb : !tile.view<[1, 32], f32, global>",
         "%b = tile.fragment_pack %vb : !tile.view<[1, 32], bf16, global>"),
        (FRAG_B, FRAG_B.replace("f32, f32, b", "bf16, f32, b"))]),
    "TILE_MMA_RESULT_TYPE": (GOOD_TILE, [(f"{FRAG_C} -> {FRAG_C}\n", f"{FRAG_C} -> "
                                          "!tile.fragment<6, 32, 1, f32, f32, acc, col_major, fma>\n"),
                                         (f"%t = tile.fragment_unpack %d : {FRAG_C}",
                                          "%t = tile.fragment_unpack %d : !tile.fragment<6, 32, 1, f32, f32, acc, "
                                          "col_major, fma>")]),
    "TILE_FRAGMENT_ZERO_ROLE": (GOOD_TILE, [(f"%z = tile.fragment_zero : {FRAG_C}",
                                             f"%z0 = tile.fragment_zero : {FRAG_A}\n  %z = tile.fragment_zero : "
                                             f"{FRAG_C}")]),
    "TILE_FRAGMENT_UNPACK_ROLE": (GOOD_TILE, [(f"%t = tile.fragment_unpack %d : {FRAG_C} -> !tile.tile<[6, 32], f32>",
                                               f"%t0 = tile.fragment_unpack %a : {FRAG_A} -> !tile.tile<[6, 1], f32>\n"
                                               f"  %t = tile.fragment_unpack %d : {FRAG_C} -> !tile.tile<[6, 32], f32>")]),
    "TILE_FRAGMENT_ROLE_DISAGREES": (GOOD_TILE, [(MMA_LINE, f"%d = tile.mma %b, %b, %z : {FRAG_B}, {FRAG_B}, {FRAG_C} "
                                                            f"-> {FRAG_C}")]),
    "TILE_FRAGMENT_PACK_SHAPE": (GOOD_TILE, [(f"%a = tile.fragment_pack %va : !tile.view<[6, 1], f32, global> -> "
                                              f"{FRAG_A}", f"%a = tile.fragment_pack %vb : !tile.view<[1, 32], f32, "
                                                           f"global> -> {FRAG_A}")]),
    "GRAPH_SHAPE": (GOOD_GRAPH, [("%b : !tessera.tensor<[K, N], f32>", "%b : !tessera.tensor<[J, N], f32>"),
                                 ("!tessera.tensor<[K, N], f32>) ->", "!tessera.tensor<[J, N], f32>) ->")]),
    "GRAPH_DTYPE": (GOOD_GRAPH, [("%b : !tessera.tensor<[K, N], f32>", "%b : !tessera.tensor<[K, N], bf16>"),
                                 ("!tessera.tensor<[K, N], f32>) ->", "!tessera.tensor<[K, N], bf16>) ->")]),
    "GRAPH_RANK": (GOOD_GRAPH, [("%b : !tessera.tensor<[K, N], f32>", "%b : !tessera.tensor<[K], f32>"),
                                ("!tessera.tensor<[K, N], f32>) ->", "!tessera.tensor<[K], f32>) ->")]),
    "GRAPH_RESULT_TYPE": (GOOD_GRAPH, [("-> !tessera.tensor<[M, N], f32>\n  func.return",
                                        "-> !tessera.tensor<[N, M], f32>\n  func.return"),
                                       ("func.return %r : !tessera.tensor<[M, N], f32>",
                                        "func.return %r : !tessera.tensor<[N, M], f32>"),
                                       (") -> (!tessera.tensor<[M, N], f32>)", ") -> (!tessera.tensor<[N, M], f32>)")]),
    "GRAPH_ATTRIBUTE": (SAMPLES["tessera.softmax"], [("axis = -1 : i64", "axis = 2 : i64")]),
    "SCHEDULE_VERIFY": (GOOD_SCHEDULE, [('order = ["r", "c"]', 'order = ["r", "x"]')]),
}


def _mutate(text: str, edits) -> str:
    for old, new in edits:
        assert old in text, f"mutation did not apply: {old!r}"
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("code", sorted(CASES))
def test_bad_example_raises_its_code(code):
    good, edits = CASES[code]
    parse_and_verify(good)  # absent on the good one
    with pytest.raises(TesseraError) as info:
        parse_and_verify(_mutate(good, edits), "bad.mlir")
    assert info.value.code == code.split("/")[0], str(info.value)
    assert info.value.location is not None and info.value.location.file == "bad.mlir"


def test_every_tile_mma_code_is_covered():
    tile_codes = {c.code for c in all_error_classes() if c.code.startswith(("TILE_MMA", "TILE_FRAGMENT"))}
    covered = {k.split("/")[0] for k in CASES}
    assert tile_codes <= covered, sorted(tile_codes - covered)


def test_no_untyped_mma_form_exists():
    """tile.mma has no permissive branch: a tensor operand is refused."""
    text = _mutate(GOOD_TILE, [(MMA_LINE, f"%d = tile.mma %p, %b, %z : !tile.buffer<f32, global>, {FRAG_B}, "
                                          f"{FRAG_C} -> {FRAG_C}")])
    with pytest.raises(TesseraError) as info:
        parse_and_verify(text)
    assert info.value.code == "TILE_MMA_UNTYPED_OPERAND"


def _mma_verify_without(monkeypatch, clause: str) -> None:
    """Plant: tile.mma's verifier recompiled from its own source with one clause of the
    accumulator check removed (xDSL's irdl_op_definition wraps the class's verify_ as
    op_def.verify then the custom one; the wrapper keeps the first, the plant replaces the second)."""
    import inspect
    import textwrap

    from tessera.ir import tile
    env = inspect.getclosurevars(tile.MmaOp.verify_).nonlocals
    custom, op_def = env["custom_verify"], env["op_def"]
    src = textwrap.dedent(inspect.getsource(custom))
    assert src.count(clause) == 1, f"the clause {clause!r} moved: update this plant"
    home = inspect.getmodule(custom)   # the module whose names the verifier reads (ir/tile_fragment.py)
    ns = dict(vars(home))
    exec(compile(src.replace(clause, ""), home.__file__, "exec"), ns)
    planted = ns["verify_"]

    def verify_(self):
        op_def.verify(self)
        planted(self)

    monkeypatch.setattr(tile.MmaOp, "verify_", verify_)


@pytest.mark.parametrize("variant, clause", [("input-elem", " or (fa.elem != fb.elem and not mixed_ok)"),
                                             ("acc-type", " or not (fa.acc == fb.acc == fc.acc)"),
                                             ("", "fc.elem != fc.acc or ")])
def test_each_accum_mismatch_clause_is_needed(monkeypatch, variant, clause):
    """Removing one clause of TILE_MMA_ACCUM_MISMATCH lets its example through (or to a later,
    different check), so each case above guards its clause."""
    key = "TILE_MMA_ACCUM_MISMATCH" + (f"/{variant}" if variant else "")
    good, edits = CASES[key]
    bad = _mutate(good, edits)
    _mma_verify_without(monkeypatch, clause)
    parse_and_verify(good)   # the planted verifier still accepts the good example
    try:
        parse_and_verify(bad)
    except TesseraError as e:
        assert e.code != "TILE_MMA_ACCUM_MISMATCH", str(e)
