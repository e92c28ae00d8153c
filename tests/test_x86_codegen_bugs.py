"""Guards against LLVM x86 backend miscompiles that Tessera's code generation steers around.

LLVM 22 (llvmlite 0.50): a masked store of 8- or 16-bit lanes whose mask LLVM folds to one
constant lane, storing a truncation from 32-bit lanes (a bf16 rounding, an int8 result), becomes
a 32-bit scalar store under AVX-512 -- two or three bytes past the lane are overwritten.  The
bf16 ``pad(mode="edge")`` kernel stores its edge columns one lane at a time and lost the element
after each edge on an AVX-512 host.  ``codegen/x86.py`` keeps the count of such stores opaque.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import tessera as ts
from tessera import dtypes as dt
from tessera.codegen import x86

import oracle as O

AVX512 = "+avx512f,+avx512bw,+avx512vl,+avx512dq"
# a 2- or 4-byte move from a register into memory that is not the stack
WIDE = re.compile(r"\t(?:vmovd|movl)\t%[xe]\w+, -?\w*\((?!%rsp)")


def _single_lane_truncating_store(opaque: bool) -> str:
    import llvmlite.binding as llvm

    from tessera.codegen import llvm_core as C
    count = "%c = call i64 asm \"\", \"=r,0\"(i64 1)" if opaque else "%c = add i64 0, 1"
    ir = f"""
declare void @llvm.masked.store.v16i16.p0(<16 x i16>, ptr, i32, <16 x i1>)
define void @f(<16 x i32> %v, ptr %dst) {{
  %s = lshr <16 x i32> %v, splat (i32 16)
  %t = trunc <16 x i32> %s to <16 x i16>
  {count}
  %sh = shl i64 1, %c
  %m1 = sub i64 %sh, 1
  %m16 = trunc i64 %m1 to i16
  %mask = bitcast i16 %m16 to <16 x i1>
  call void @llvm.masked.store.v16i16.p0(<16 x i16> %t, ptr %dst, i32 1, <16 x i1> %mask)
  ret void
}}"""
    tm = C.target_machine("x86-64", AVX512)
    mod = llvm.parse_assembly(ir)
    C.optimise(mod, tm)
    return tm.emit_assembly(mod)


def test_llvm_widens_a_single_lane_truncating_masked_store():
    """The miscompile itself (a canary: if an llvmlite upgrade fixes it, this fails and the guard
    in ``_Fn._opaque`` can go), and the opaque count that avoids it."""
    bad = _single_lane_truncating_store(opaque=False)
    assert re.search(r"\tmovl\t%e\w+, \(%rdi\)", bad), bad
    good = _single_lane_truncating_store(opaque=True)
    assert not WIDE.search(good) and re.search(r"vpmovdw\t%zmm\d+, \(%rdi\) \{%k\d\}", good), good


def _edge_pad_asm() -> str:
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(dt.bfloat16)
    art = ts.compile(lambda v: ts.ops.pad(v, ((0, 0), (2, 1)), mode="edge"), x, arch="avx512")
    assert "+avx512bw" in art.compiled.features
    return art.asm()


def test_bf16_edge_pad_for_avx512_has_no_widened_store(monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    assert not WIDE.search(_edge_pad_asm())


def test_planted_guard_removal_brings_the_widened_store_back(monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(x86._Fn, "_opaque", lambda self, v: v)
    assert WIDE.search(_edge_pad_asm())


def _host_has_avx512bw() -> bool:
    from tessera.frontend.compile import resolve_arch
    return "+avx512bw" in resolve_arch("cpu", None).llvm_features.split(",")


@pytest.mark.skipif(not _host_has_avx512bw(), reason="runs the AVX-512 code: needs an AVX-512 host")
@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "planted-unguarded"])
def test_bf16_edge_pad_runs_right_on_this_avx512_host(rng, monkeypatch, guard):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    if not guard:
        monkeypatch.setattr(x86._Fn, "_opaque", lambda self, v: v)
    x = rng.standard_normal((3, 5, 7)).astype(dt.bfloat16)
    widths = ((2, 1), (1, 0), (2, 3))
    got = ts.jit(lambda v: ts.ops.pad(v, widths, mode="edge"))(x)
    err = O.rel_err(got, np.pad(O.f64(x), widths, mode="edge").astype(x.dtype))
    assert (err < 1e-2) == guard, err
