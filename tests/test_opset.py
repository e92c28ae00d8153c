"""The op registry (tessera/ir/opset.py) against the code that reads it: the Graph IR dialect,
tessera.ops, the tracer, the verifier, the reference lane, the CPU lane and (slow) the GPU
lanes' compilers.  A declaration that drifts from the code fails here."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tessera as ts
from tessera.errors import DtypeError, GraphDtypeError, InternalError, TesseraError
from tessera.frontend import reference
from tessera.frontend.trace import ARRAY, add_node, trace
from tessera.ir import graph as g
from tessera.ir import opset
from tessera.tools import ops_doc

KERNEL_OPS = [n for n, d in opset.OPS.items() if d.family != "structure"]


def test_every_dialect_op_has_one_entry_and_back():
    dialect = {op.name.split(".", 1)[1] for op in g.Graph.operations}
    assert dialect == set(opset.OPS)
    for d in opset.OPS.values():
        assert d.family in opset.FAMILIES and d.gpu in opset.GPU_MODES and d.summary


def test_every_tessera_ops_function_is_accounted_for():
    names = {a for d in opset.OPS.values() for a in d.api if a.isidentifier()}
    public = set(ts.ops.__all__) - {"np"}
    assert names <= public, f"the registry names functions tessera.ops lacks: {sorted(names - public)}"
    loose = public - names - set(opset.COMPOSITES)
    assert not loose, f"tessera.ops functions neither in an entry's api nor in COMPOSITES: {sorted(loose)}"
    assert set(opset.COMPOSITES) <= public


def test_every_op_has_an_example_that_records_it():
    for name in KERNEL_OPS:
        kind = opset.kinds(name)[0]
        d = {"f": np.float32, "i": np.int32, "b": np.bool_}[kind]
        assert ops_doc.records(name, d), name


def _mismatches() -> list[str]:
    return [f"{n}: declared {opset.kinds(n)}, traced {ops_doc.kinds_of(ops_doc.traced_dtypes(n))}"
            for n in KERNEL_OPS if opset.kinds(n) != ops_doc.kinds_of(ops_doc.traced_dtypes(n))]


def test_declared_kinds_are_what_the_tracer_takes(monkeypatch):
    assert _mismatches() == []
    # teeth: a wrong declaration is caught (softmax declared to take ints; the tracer refuses them)
    monkeypatch.setitem(opset.OPS, "softmax", dataclasses.replace(opset.OPS["softmax"], kinds="fi"))
    assert [m for m in _mismatches() if m.startswith("softmax:")]


def test_the_tracer_reads_the_registry(monkeypatch):
    x = np.ones((2, 3), np.float32)
    shift = lambda a: ts.ops.left_shift(a, a)   # noqa: E731
    with pytest.raises(DtypeError, match="left_shift takes int tensors"):
        trace(shift, [x], [ARRAY])
    # declared to take floats too, the tracer records it
    monkeypatch.setitem(opset.OPS, "left_shift", dataclasses.replace(opset.OPS["left_shift"], kinds="fi"))
    assert any(n.op == "left_shift" for n in trace(shift, [x], [ARRAY]).nodes)


def test_the_tracer_records_only_registered_ops():
    with pytest.raises(InternalError, match="op registry"):
        trace(lambda a: add_node("bogus", [a._node], {}, a.shape, a.dtype), [np.ones(3, np.float32)], [ARRAY])


def test_the_verifier_reads_the_registry(monkeypatch):
    from tessera.ir.text import parse_module
    src = ('func.func @main(%a: !tessera.tensor<[4], i32>) -> !tessera.tensor<[4], i32> {\n'
           '  %r = "tessera.exp"(%a) : (!tessera.tensor<[4], i32>) -> !tessera.tensor<[4], i32>\n'
           '  func.return %r : !tessera.tensor<[4], i32>\n}\n')
    with pytest.raises(GraphDtypeError, match="floating-point"):
        parse_module(src).verify()
    monkeypatch.setitem(opset.OPS, "exp", dataclasses.replace(opset.OPS["exp"], kinds="fi"))
    parse_module(src).verify()


def test_graph_ir_generation_reads_the_registry(monkeypatch):
    """Shape rules come from the op's family (elementwise broadcasts, reductions drop axes) or a
    named rule; an op with neither is an internal error naming it, never a guessed shape.  The
    IR op and its attributes come from the dialect class the registry names."""
    from tessera.frontend import dim_rules, graphgen
    for name, d in opset.OPS.items():
        assert name in dim_rules.RULES or d.family in ("elementwise", "reduction", "scan", "row", "structure"), name
        for k, a in graphgen.OP_CLASS[name].get_irdl_definition().attributes.items():
            assert graphgen.attr_kind(a.constr) is not None, (name, k)
    x = np.ones((3, 4), np.float32)
    bcast = lambda a, b: ts.ops.where(a > 0, a, b)   # noqa: E731
    gir = graphgen.build(trace(bcast, [x, np.ones((1, 4), np.float32)], [ARRAY, ARRAY]))
    assert "[d0_0, d0_1]" in str(gir.module).replace("%", "")
    # teeth: declared a row op without a rule, softmax keeps its dims; declared a gather, it has none
    monkeypatch.setitem(opset.OPS, "where", dataclasses.replace(opset.OPS["where"], family="gather"))
    with pytest.raises(InternalError, match="no shape rule for the op 'where'"):
        graphgen.build(trace(bcast, [x, x], [ARRAY, ARRAY]))


def test_the_reference_lane_has_an_oracle_for_every_op():
    want = set(KERNEL_OPS) | set(opset.SECOND_RESULTS)
    assert set(reference.REFERENCE) == want


def test_docs_render_every_op_once():
    md = ops_doc.render()
    for name in KERNEL_OPS:
        assert md.count(f"| `{name}` |") == 1, name


def _close(got, want, dtype) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype.kind in "biu":
        return got.shape == want.shape and np.array_equal(got, want)
    tol = 2e-2 if np.dtype(dtype).itemsize <= 2 else 1e-5
    return got.shape == want.shape and np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                                   atol=tol, equal_nan=True)


def _cpu_vs_reference(name: str, dtype) -> bool:
    fn, args = ops_doc.example(name, dtype)
    got = ts.jit(fn)(*args)
    want = _reference(fn, args)
    gs, ws = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    return all(_close(a, b, dtype) for a, b in zip(gs, ws))


def _reference(fn, args):
    graph = trace(fn, list(args), [ARRAY] * len(args))
    out = reference.evaluate(graph, list(args))
    return tuple(out) if graph.tuple_output else out[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", KERNEL_OPS)
def test_every_op_runs_on_the_cpu_lane_in_every_dtype(name):
    for d in ops_doc.traced_dtypes(name):
        assert _cpu_vs_reference(name, d), (name, d)


def test_cpu_lane_check_has_teeth(monkeypatch):
    assert _cpu_vs_reference("sin", np.float32)
    monkeypatch.setitem(reference.REFERENCE, "sin", lambda n, x: np.sin(x[0]) + 1e-3)
    assert not _cpu_vs_reference("sin", np.float32)


GPU_LANES = [("nvidia", "sm_90"), ("rocm", "gfx942")]


def _gpu_compile(name: str, target: str, arch: str, epilogue: bool):
    """Compile the op's example (f16 data) for a GPU lane; with ``epilogue``, its first operand
    (of the data dtype) is a GEMM's result.  Returns None when it compiles, else the coded error's message."""
    d = np.float16 if "f" in opset.kinds(name) else np.int32
    fn, args = ops_doc.example(name, d)
    if epilogue:   # the first operand of the data dtype becomes a GEMM's result
        i = next(k for k, x in enumerate(args) if x.dtype == d)
        a, b = ops_doc.data(d, 4, 16), ops_doc.data(d, 16, args[i].shape[-1], seed=3)
        rest = args[:i] + args[i + 1:]
        call, args = (lambda p, q, *r: fn(*r[:i], p @ q, *r[i:])), (a, b, *rest)
    else:
        call = fn
    try:
        ts.compile(call, *args, target=target, arch=arch)
    except TesseraError as e:
        return str(e)
    return None


def _names_the_op(name: str, msg: str) -> bool:
    return any(w in msg for w in (name, *opset.OPS[name].api) if w.isidentifier())


def _fusable(d) -> bool:
    """An elementwise op that can follow a GEMM (GEMMs take floats only)."""
    return d.family == "elementwise" and "f" in d.kinds


def gpu_mode_mismatches(name: str) -> list[str]:
    d = opset.OPS[name]
    out = []
    for target, arch in GPU_LANES:
        alone = _gpu_compile(name, target, arch, epilogue=False)
        fused = _gpu_compile(name, target, arch, epilogue=True) if _fusable(d) else None
        if d.gpu == "kernel" and alone is not None:
            out.append(f"{target}: declared a GPU kernel, refused: {alone}")
        if d.gpu == "epilogue" and fused is not None:
            out.append(f"{target}: declared a GPU epilogue, refused there: {fused}")
        if d.gpu in ("epilogue", "refused") and (alone is None or not _names_the_op(name, alone)):
            out.append(f"{target}: declared no GPU kernel, alone: {alone or 'compiled'}")
        if d.gpu == "refused" and _fusable(d) and (fused is None or not _names_the_op(name, fused)):
            out.append(f"{target}: declared refused, in an epilogue: {fused or 'compiled'}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in KERNEL_OPS if n != "constant"])
def test_declared_gpu_mode_is_what_the_gpu_lanes_do(name):
    assert gpu_mode_mismatches(name) == []


@pytest.mark.slow
def test_gpu_mode_check_has_teeth(monkeypatch):
    monkeypatch.setitem(opset.OPS, "exp", dataclasses.replace(opset.OPS["exp"], gpu="refused"))
    assert gpu_mode_mismatches("exp")
    monkeypatch.setitem(opset.OPS, "log", dataclasses.replace(opset.OPS["log"], gpu="epilogue"))
    assert gpu_mode_mismatches("log")
