"""Every request to the front door is honoured or refused (issue 26, sections 2 and 3).

- ``tessera.compile`` / ``tessera.explain`` honour an explicit target/arch for plain and
  ``tessera.jit`` functions, and refuse settings that contradict the decorator's;
- a jitted function called inside another composes (its graph is inlined);
- Python operators and methods trace or raise coded errors naming what exists;
- an error that tells the user to pass a parameter names one that exists;
- ``art.binary()`` on the CPU lane is the object code;
- a result never aliases an argument;
- huge copies, out-of-range scalars and non-integer sizes get numpy's result or a coded error;
- the in-memory variant cache is bounded (least recently used out).
"""
from __future__ import annotations

import gc
import inspect
import re
import struct
import weakref
from pathlib import Path

import numpy as np
import pytest

import oracle as O
import tessera as ts
from tessera.errors import (
    ArgumentError,
    DtypeError,
    MmaSelectorError,
    OutOfMemoryError,
    RankMismatchError,
    ShapeMismatchError,
    TesseraError,
    ToolchainMissingError,
    UnknownNameError,
    UnsupportedConstructError,
)
from tessera.frontend import jit as J
from tessera.toolchain import find_llvm_tool, find_ptxas

# --------------------------------------------------------------------------- 1. target/arch requests
TARGETS = [("cpu", None), ("nvidia", "sm_90"), ("rocm", "gfx1151")]
LANES = {"cpu": "cpu-x86", "nvidia": "nvidia-sm_90", "rocm": "rocm-gfx1151"}
EM_MACHINE = {"cpu": 62, "nvidia": 190, "rocm": 224}   # ELF e_machine: x86-64, CUDA, AMDGPU
OTHER = {"cpu": ("nvidia", "sm_90"), "nvidia": ("rocm", "gfx1151"), "rocm": ("cpu", None)}
TOOL = {"nvidia": ("ptxas", find_ptxas), "rocm": ("ld.lld", lambda: find_llvm_tool("ld.lld"))}


def _gemm(a, b):
    return a @ b


def _inputs(rng):
    return [rng.standard_normal((64, 64)).astype(ts.bfloat16) for _ in range(2)]   # a matrix dtype on all three


def _elf_machine(blob: bytes) -> int:
    assert blob[:4] == b"\x7fELF", "not an ELF object"
    return struct.unpack_from("<H", blob, 18)[0]


def _honoured(make, target: str, arch: str | None):
    """``make()`` compiled for (target, arch): the artifact says so (lane, target, arch, machine
    code), or, where the GPU toolchain is absent, the refusal names the missing tool."""
    if target in TOOL and TOOL[target][1]() is None:
        with pytest.raises(ToolchainMissingError, match=re.escape(TOOL[target][0])):
            make()
        return None
    art = make()
    c = art.compiled
    assert (c.target, c.lane, art.report().lane) == (target, LANES[target], LANES[target])
    if arch is not None:
        assert c.arch == arch
    assert _elf_machine(art.binary()) == EM_MACHINE[target]
    return art


@pytest.mark.parametrize("target,arch", TARGETS, ids=[t for t, _ in TARGETS])
def test_compile_honours_target_for_plain_and_decorated_functions(rng, target, arch):
    a, b = _inputs(rng)
    _honoured(lambda: ts.compile(_gemm, a, b, target=target, arch=arch), target, arch)            # plain
    _honoured(lambda: ts.compile(ts.jit(_gemm), a, b, target=target, arch=arch), target, arch)    # @jit
    own = ts.jit(_gemm, target=target, arch=arch)                                                # @jit(target)
    _honoured(lambda: ts.compile(own, a, b), target, arch)
    _honoured(lambda: ts.compile(own, a, b, target=target, arch=arch), target, arch)
    other_t, other_a = OTHER[target]
    other = ts.jit(_gemm, target=other_t, arch=other_a)                                          # contradicted
    with pytest.raises(ArgumentError, match=rf"target='{other_t}' vs target='{target}'"):
        ts.compile(other, a, b, target=target, arch=arch)


@pytest.mark.parametrize("target,arch", TARGETS, ids=[t for t, _ in TARGETS])
def test_explain_honours_target_for_plain_and_decorated_functions(rng, target, arch):
    a, b = _inputs(rng)
    for fn in (_gemm, ts.jit(_gemm), ts.jit(_gemm, target=target, arch=arch)):
        if target in TOOL and TOOL[target][1]() is None:
            with pytest.raises(ToolchainMissingError):
                ts.explain(fn, a, b, target=target, arch=arch)
        else:
            assert ts.explain(fn, a, b, target=target, arch=arch).lane == LANES[target]
    other_t, other_a = OTHER[target]
    with pytest.raises(ArgumentError, match=rf"target='{other_t}' vs target='{target}'"):
        ts.explain(ts.jit(_gemm, target=other_t, arch=other_a), a, b, target=target, arch=arch)


def test_contradicting_arch_and_schedule_are_refused_naming_both(rng):
    a, b = _inputs(rng)
    with pytest.raises(ArgumentError, match=r"arch='sm_80' vs arch='sm_90'"):
        ts.compile(ts.jit(_gemm, target="nvidia", arch="sm_80"), a, b, arch="sm_90")
    with pytest.raises(ArgumentError, match=r"schedule tile_m=64 vs tile_m=32"):
        ts.compile(ts.jit(_gemm, schedule={"tile_m": 64}), a, b, schedule={"tile_m": 32})
    # settings that agree, or add to the decorator's, are honoured
    f = ts.jit(_gemm, schedule={"threads": 1})
    art = ts.compile(f, a, b, schedule={"threads": 1, "unroll": 2})
    assert "threads=1" in art.report().pipeline and "unroll=2" in art.report().pipeline


def test_compile_request_check_has_teeth(rng, monkeypatch):
    """Planted: tessera.compile ignores its settings for a jitted function (the reported bug)."""
    a, b = _inputs(rng)
    monkeypatch.setattr(J.JitFunction, "retarget", lambda self, *a, **k: self)
    with pytest.raises(AssertionError):
        _honoured(lambda: ts.compile(ts.jit(_gemm), a, b, target="nvidia", arch="sm_90"), "nvidia", "sm_90")


# --------------------------------------------------------------------------- 2. composition
def test_jitted_function_called_inside_another_composes(rng):
    @ts.jit
    def inner(x, w):
        return ts.ops.gelu(x @ w)

    @ts.jit
    def pair(x):
        return x * 2.0, x + 1.0

    @ts.jit
    def outer(x, w, b):
        h, g = pair(inner(x, w) + b)
        return ts.ops.softmax(h) * g

    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((9, 20), (20, 33), (33,)))
    h64 = O.gelu_tanh(O.f64(x) @ w) + b
    want = O.softmax(h64 * 2) * (h64 + 1)
    got = outer(x, w, b)
    O.assert_close(got, want, 1e-5, "nested jit")
    assert got.dtype == np.float32
    # one graph: the inner functions were inlined, not run as separate calls
    assert "tessera.matmul" in ts.compile(outer, x, w, b).ir("graph")
    # called on arrays it is its own compiled function again
    O.assert_close(inner(x, w), O.gelu_tanh(O.f64(x) @ w), 1e-5)


def test_composition_refuses_settings_it_cannot_honour(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    gpu_inner = ts.jit(lambda t: t * 2.0, target="nvidia", arch="sm_90")
    with pytest.raises(UnsupportedConstructError, match=r"target='nvidia'.*'cpu'"):
        ts.jit(lambda t: gpu_inner(t) + 1.0)(x)
    pinned = ts.jit(lambda t: t * 2.0, schedule={"threads": 2})
    with pytest.raises(UnsupportedConstructError, match=r"schedule threads=2"):
        ts.jit(lambda t: pinned(t) + 1.0)(x)
    # the same pins on the outer function: inlined under them
    y = ts.jit(lambda t: pinned(t) + 1.0, schedule={"threads": 2})(x)
    O.assert_close(y, O.f64(x) * 2 + 1, 1e-6)


# --------------------------------------------------------------------------- 3. operators and names
POWERS = [(2, lambda x: x * x), (3, lambda x: x ** 3), (-1, lambda x: 1 / x), (-2, lambda x: x ** -2.0),
          (8, lambda x: x ** 8), (5.0, lambda x: x ** 5), (0.5, np.sqrt), (-0.5, lambda x: 1 / np.sqrt(x))]


@pytest.mark.parametrize("p,ref", POWERS, ids=[str(p) for p, _ in POWERS])
def test_small_powers_trace(rng, p, ref):
    x = (rng.random((5, 37)) + 0.5).astype(np.float32) * rng.choice([-1, 1], (5, 37)).astype(np.float32)
    if p in (0.5, -0.5):
        x = np.abs(x)
    got = ts.jit(lambda t: t ** p)(x)
    O.assert_close(got, ref(O.f64(x)), 2e-6, f"x ** {p}")


def test_abs_and_methods_trace(rng):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    x[0, :3] = [np.nan, -np.inf, -0.0]
    got = ts.jit(lambda t: abs(t))(x)
    np.testing.assert_array_equal(got, np.abs(x))
    x = rng.standard_normal((6, 10)).astype(np.float32)
    got = ts.jit(lambda t: (t.T.sum(0), t.mean(axis=1, keepdims=True), t.max(), t.reshape(3, 20),
                            t.astype(np.float16)))(x)
    x64 = O.f64(x)
    for g, want in zip(got, (x64.T.sum(0), x64.mean(axis=1, keepdims=True), x64.max(), x64.reshape(3, 20))):
        O.assert_close(g, want, 1e-6)
    np.testing.assert_array_equal(got[4], x.astype(np.float16))


REFUSED = [
    # comparisons, //, %, ** with any exponent and the bitwise operators are ops now
    # (tests/test_compare_where.py); what remains refused:
    ("~x", lambda t: ~t, DtypeError, r"bitwise_not: dtype f32"),
    ("x << 1", lambda t: t << 1, DtypeError, r"left_shift: dtype f32"),
    ("divmod(x, 2)", lambda t: divmod(t, 2), UnsupportedConstructError, r"divmod\(\) operator"),
    ("round(x)", lambda t: round(t), UnsupportedConstructError, r"round\(\) operator"),
    ("x.min()", lambda t: t.min(), UnknownNameError, r"no attribute 'min'; nearest: argmin, mean"),
    ("x.exp()", lambda t: t.exp(), UnknownNameError, r"tessera\.ops\.exp\(x\)"),
    ("x.flaten()", lambda t: t.flaten(), UnknownNameError, r"tensor attributes: T, .*astype"),
    ("ops.softmaxx", lambda t: ts.ops.softmaxx(t), UnknownNameError, r"no 'softmaxx'; nearest: softmax"),
    ("ops.layernorm", lambda t: ts.ops.layernorm(t), UnknownNameError, r"nearest: layer_norm"),
    ("ops.power", lambda t: ts.ops.power(t, 2), UnknownNameError, r"pow\(x, y\) or x \*\* y"),
    ("reshape float", lambda t: ts.ops.reshape(t, (4.9, 8)), ShapeMismatchError, r"must be an integer, got 4\.9"),
    ("reshape 4.0", lambda t: t.reshape(4.0, 8), ShapeMismatchError, r"must be an integer"),
    ("axis float", lambda t: t.sum(axis=1.5), RankMismatchError, r"axis must be an integer"),
]


@pytest.mark.parametrize("what,fn,cls,pattern", REFUSED, ids=[r[0] for r in REFUSED])
def test_unsupported_operators_and_names_raise_coded_errors(rng, what, fn, cls, pattern):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(cls, match=pattern) as ei:
        ts.jit(fn)(x)
    assert ei.value.code != "FRONTEND" and ei.value.location is not None
    assert Path(ei.value.location.file).name == Path(__file__).name   # the user's line


def test_unknown_names_are_attribute_errors_for_hasattr():
    assert not hasattr(ts.ops, "power") and hasattr(ts.ops, "softmax")
    with pytest.raises(UnknownNameError):
        ts.ops.nonexistent_op  # noqa: B018
    seen = {}

    def probe(t):
        seen["has_min"], seen["has_sum"] = hasattr(t, "min"), hasattr(t, "sum")
        return t

    ts.jit(probe)(np.ones(3, np.float32))
    assert seen == {"has_min": False, "has_sum": True}


# --------------------------------------------------------------------------- 4. suggested parameters
SUGGESTION = re.compile(r"\b(?:pass|set|use|with|give|for)\s+`?([a-z_][a-z0-9_]*)=")
# the public entry point each suggested parameter belongs to
SUGGESTED_IN = {"math_mode": "tessera.mma.selector.select_mma", "arch": "tessera.jit",
                "family": "tessera.emulate.layouts.instr_layout", "num": "tessera.emulate.layouts.ldmatrix_layout"}
SUGGESTED_IN["dynamic"] = "tessera.jit"   # DYNAMIC_SHAPE messages name tessera.jit(dynamic=...)
SUGGESTED_IN["lse"] = "tessera.frontend.attention_grad.attention_backward"   # the GPU backward's refusal


def _suggestions() -> dict[str, list[str]]:
    root = Path(ts.__file__).parent
    found: dict[str, list[str]] = {}
    for path in root.rglob("*.py"):
        if path.parent.name == "onnx":   # the ONNX importer's messages name node attributes (mode=, group=)
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            for name in SUGGESTION.findall(line):
                found.setdefault(name, []).append(f"{path.relative_to(root)}:{i}")
    return found


def _resolve_dotted(name: str):
    import importlib
    mod, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(mod), attr)


def test_every_suggested_parameter_exists():
    found = _suggestions()
    assert "math_mode" in found   # the scan sees the message it guards
    for name, where in found.items():
        assert name in SUGGESTED_IN, f"an error suggests '{name}=' ({', '.join(where)}) naming no known parameter"
        fn = _resolve_dotted(SUGGESTED_IN[name])
        assert name in inspect.signature(fn).parameters, f"{SUGGESTED_IN[name]} has no parameter {name}"


def test_math_mode_suggestion_works_when_followed_and_is_not_given_by_the_frontend(rng):
    from tessera.mma.selector import get_isa, select_mma
    isa = get_isa("nvidia", "sm_90")
    with pytest.raises(MmaSelectorError, match=r"pass math_mode=\.\.\.") as ei:
        select_mma(isa, "f32")
    mode = re.search(r"math_mode \((\w+)", ei.value.message).group(1)
    assert select_mma(isa, "f32", math_mode=mode).record.math_mode == mode   # followed: it works
    # through the frontend the math mode is a schedule pin, asked for, never defaulted: the message
    # names the pin, and following it works
    a = rng.standard_normal((32, 32)).astype(np.float32)
    with pytest.raises(MmaSelectorError, match=r"schedule=\{'math_mode': 'tf32'\}") as ei:
        ts.compile(_gemm, a, a, target="nvidia", arch="sm_90")
    assert "pass math_mode" not in str(ei.value)
    art = ts.compile(_gemm, a, a, target="nvidia", arch="sm_90", schedule={"math_mode": "tf32"})
    assert art.report().kernels[0]["mma"]["record"] == "nvidia.mma_sync.m16n8k8.tf32"
    with pytest.raises(MmaSelectorError) as ei:
        ts.compile(_gemm, a, a, target="rocm", arch="gfx942")
    assert "pass math_mode" not in str(ei.value)


def test_suggestion_scan_has_teeth(monkeypatch, tmp_path):
    """Planted: a message suggesting a parameter nobody has."""
    fake = tmp_path / "tessera"
    fake.mkdir()
    (fake / "x.py").write_text('raise ValueError("pass math_mode=... or pass fast_math=True")\n')
    monkeypatch.setattr(ts, "__file__", str(fake / "__init__.py"))
    with pytest.raises(AssertionError, match="fast_math"):
        test_every_suggested_parameter_exists()


# --------------------------------------------------------------------------- 5. binary() on the CPU lane
def _elf_symbols(obj: bytes) -> set[str]:
    """Names in an ELF64 object's symbol table (read with struct, no tools)."""
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, typ, _, _, off, size, link, _, _, entsize in sections:
        if typ != 2:   # SHT_SYMTAB
            continue
        stroff = sections[link][4]
        for k in range(size // entsize):
            st_name = struct.unpack_from("<I", obj, off + k * entsize)[0]
            end = obj.index(b"\0", stroff + st_name)
            names.add(obj[stroff + st_name:end].decode())
    return names


def test_cpu_binary_is_the_loaded_object_code(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    from tessera.codegen import jit as cj
    emitted = []
    orig = cj.emit_cpu

    def recording(*a, **k):
        out = orig(*a, **k)
        emitted.append(out.obj)
        return out

    monkeypatch.setattr(cj, "emit_cpu", recording)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
    art = ts.compile(lambda a, b: ts.ops.softmax(a @ b), x, w)
    loaded = emitted[-1]
    obj = art.binary()
    assert obj == loaded                                        # the object the lane loaded
    assert obj[:4] == b"\x7fELF" and obj[4] == 2 and obj[5] == 1   # ELF64, little endian
    assert struct.unpack_from("<HH", obj, 16) == (1, 62)       # ET_REL, EM_X86_64
    syms = _elf_symbols(obj)
    for k in art.compiled.kernels:
        assert k in syms and k + ".entry" in syms, (k, sorted(syms))


# --------------------------------------------------------------------------- 6. results never alias arguments
ALIASING = [
    ("identity", lambda x: x),
    ("neg neg", lambda x: -(-x)),
    ("transpose twice", lambda x: ts.ops.transpose(ts.ops.transpose(x))),
    ("cast to own dtype", lambda x: ts.ops.cast(x, x.dtype)),
    ("reshape to own shape", lambda x: x.reshape(x.shape)),
    ("pos", lambda x: +x),
    ("power 1", lambda x: x ** 1),
    ("tuple", lambda x: (x, x * 2.0)),
]


@pytest.mark.parametrize("what,fn", ALIASING, ids=[a[0] for a in ALIASING])
@pytest.mark.parametrize("strict", [True, False], ids=["compiled", "reference"])
def test_results_never_alias_arguments(rng, what, fn, strict, monkeypatch):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    keep = x.copy()
    f = ts.jit(fn, strict=strict)
    if not strict:   # the reference lane: force the compile to fail
        from tessera.errors import CodegenError

        def fail(*a, **k):
            raise CodegenError("planted: no compiled lane")
        monkeypatch.setattr(J, "compile_graph", fail)
    for _ in range(2):   # the first call and the planned repeat
        out = f(x)
        outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            assert not np.shares_memory(o, x), what
            o[...] = 7.0
        np.testing.assert_array_equal(x, keep)


def test_aliasing_check_has_teeth(rng, monkeypatch):
    """Planted: the runtime returns an argument as is again."""
    from tessera.runtime.cpu import CpuExecutable
    monkeypatch.setattr(CpuExecutable, "_fresh", staticmethod(lambda a: a))
    x = rng.standard_normal((5, 7)).astype(np.float32)
    assert np.shares_memory(ts.jit(lambda t: -(-t))(x), x)


# --------------------------------------------------------------------------- 7. hostile values
def test_huge_broadcast_argument_is_out_of_memory_not_memoryerror():
    huge = np.broadcast_to(np.float32(1.0), (1 << 20, 1 << 20))   # 4 TiB once copied
    with pytest.raises(OutOfMemoryError, match="argument 0"):
        ts.jit(lambda t: t + 1.0)(huge)


def test_huge_copy_that_fails_to_allocate_is_out_of_memory(monkeypatch):
    """When the free-memory estimate allows the copy but the allocation still fails."""
    from tessera import host
    monkeypatch.setattr(host, "memory_available", lambda: 1 << 62)
    huge = np.broadcast_to(np.float32(1.0), (1 << 24, 1 << 24))   # 1 PiB
    with pytest.raises(OutOfMemoryError, match="could not be allocated"):
        ts.jit(lambda t: t + 1.0)(huge)


@pytest.mark.parametrize("dtype,scalar", [(np.float16, 70000.0), (np.float32, 1e39), (np.float16, -1e5),
                                          (np.float32, 1e-50)])
def test_scalars_beyond_the_dtype_range_give_numpys_result(rng, dtype, scalar):
    x = rng.standard_normal((4, 33)).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x * scalar   # NEP 50: the Python float takes the array's dtype
    got = ts.jit(lambda t: t * scalar)(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ts.jit(lambda t, s: t * s)(x, scalar), want)


# --------------------------------------------------------------------------- 8. bounded variant cache
# A Python float is a runtime value (one compile serves them all: tests/test_runtime_scalars.py); a
# static one is compiled in, one specialisation per value, which is what these bound.
def _static_mul(op=lambda t, s: t * s):
    return ts.jit(op, static_argnames="s")


def _distinct_floats(f, x, n, start=1.0):
    for i in range(n):
        f(x, start + i / 64)


@pytest.mark.filterwarnings("ignore::tessera.errors.RecompileWarning")
def test_variant_cache_is_bounded_lru(rng, monkeypatch):
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")   # compile.py's own cache stays out of the count
    monkeypatch.setattr(J, "MAX_VARIANTS", 4)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    f = _static_mul()
    f(x, 1.0)
    first = weakref.ref(next(iter(f._variants.values()))[0].compiled)
    _distinct_floats(f, x, 11, start=2.0)
    f(x, 2.0 + 10 / 64)              # a recent one stays (no recompile)
    assert f._nvariants == sum(len(v) for v in f._variants.values()) == 4
    assert len(f._plans) <= 4
    gc.collect()
    assert first() is None, "an evicted variant is still alive"
    # the least recently used goes: touch the oldest retained, add one, it survives
    keys = list(f._variants)
    oldest = keys[0]
    f(x, float.fromhex(oldest[1][2]))
    f(x, 100.0)
    assert oldest in f._variants and keys[1] not in f._variants
    np.testing.assert_allclose(f(x, 3.5), O.f64(x) * 3.5, rtol=1e-6)


@pytest.mark.filterwarnings("ignore::tessera.errors.RecompileWarning")
def test_variant_eviction_under_threads(rng, monkeypatch):
    """Calls on the planned path reorder the LRU without the lock while others evict."""
    import threading
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(J, "MAX_VARIANTS", 3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    f = _static_mul(lambda t, s: t - s)
    errors = []

    def work(k):
        try:
            for i in range(5):
                s = 1.0 + (k * 5 + i) / 8
                for _ in range(20):
                    np.testing.assert_allclose(f(x, s), O.f64(x) - s, rtol=1e-6, atol=1e-6)
                    f(x, 0.5)   # a shared one, mostly on the planned path
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert f._nvariants == sum(len(v) for v in f._variants.values()) <= 3


def test_variant_bound_has_teeth(rng, monkeypatch):
    """Planted: eviction off; the count check fails."""
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    monkeypatch.setattr(J, "MAX_VARIANTS", 2)
    monkeypatch.setattr(J.JitFunction, "_evict", lambda self: None)
    f = _static_mul(lambda t, s: t + s)
    _distinct_floats(f, np.ones(3, np.float32), 4)
    assert f._nvariants > 2


def _rss_mb() -> float:
    import resource
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tessera.errors.RecompileWarning")
def test_memory_stays_flat_over_1000_distinct_floats(rng, monkeypatch):
    """The reported case at the default bound: after 300 distinct floats, 700 more leave the
    Python heap where it was (the retained variants are replaced, not added to).  Unbounded
    (eviction patched off), each variant kept 46 KB of IR text and metadata here: 32 MB over 700."""
    import tracemalloc
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")   # compile.py's in-memory cache has its own bound
    x = rng.standard_normal((8, 8)).astype(np.float32)
    f = _static_mul()
    _distinct_floats(f, x, 300)
    gc.collect()
    tracemalloc.start()
    try:
        _distinct_floats(f, x, 700, start=1000.0)
        gc.collect()
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f._nvariants == J.MAX_VARIANTS
    assert grown < 10 << 20, f"{grown / 2**20:.1f} MiB still held after 700 distinct floats"


def test_rss_stays_flat_over_1000_distinct_floats(rng):
    """The reported case (RSS 186 -> 448 MB over 300 floats): a float is a runtime value, so 1,000
    distinct ones are one compile, and the process does not grow."""
    x = rng.standard_normal((8, 8)).astype(np.float32)
    f = ts.jit(lambda t, s: t * s)
    _distinct_floats(f, x, 300)
    gc.collect()
    base = _rss_mb()
    _distinct_floats(f, x, 1000, start=1000.0)
    gc.collect()
    assert f._nvariants == 1
    assert _rss_mb() - base < 8, (base, _rss_mb())
    np.testing.assert_allclose(f(x, 1999.0), O.f64(x) * 1999.0, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="native memory: each compile leaves ~90-130 KB in LLVM (llvmlite 0.50, "
                   "codegen/jit.py optimise(): PassBuilder.getModulePassManager() alone leaks ~60 KB per call "
                   "and running it ~70 KB more, pass managers and builders closed; an empty module pass "
                   "manager run leaks nothing); with it fixed and compile.py's cache bounded this passes, "
                   "and strict=True says so")
@pytest.mark.filterwarnings("ignore::tessera.errors.RecompileWarning")
def test_rss_stays_flat_over_1000_distinct_static_floats(rng):
    """Floats compiled in (static_argnames): one compile each, bounded in Python but not in LLVM."""
    x = rng.standard_normal((8, 8)).astype(np.float32)
    f = _static_mul()
    _distinct_floats(f, x, 300)
    gc.collect()
    base = _rss_mb()
    _distinct_floats(f, x, 700, start=1000.0)
    gc.collect()
    assert f._nvariants <= J.MAX_VARIANTS
    assert _rss_mb() - base < 32, (base, _rss_mb())


def test_errors_are_coded():
    for cls in (UnknownNameError,):
        assert issubclass(cls, TesseraError) and cls.code


def test_a_long_compile_says_so_on_a_terminal_only(rng, monkeypatch):
    """A compile past PROGRESS_AFTER_S prints one progress line (then its total) on a terminal;
    on a pipe or log nothing is printed."""
    import io
    import sys

    from tessera.frontend import compile as C

    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(C, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setenv("TESSERA_NO_CACHE", "1")
    x = rng.standard_normal((8, 8)).astype(np.float32)
    for stream, expect in ((Tty(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        ts.jit(lambda a: ts.ops.gelu(a @ a))(x)
        text = stream.getvalue()
        assert (text.startswith("tessera: compiling <lambda> for cpu ...") and text.endswith(" s\n")) == expect, text
