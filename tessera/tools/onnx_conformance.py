"""ONNX's own backend node tests run through ``tessera.onnx.load`` (``tessera docs onnx``).

The ``onnx`` wheel carries the node-test generators (``onnx.backend.test.case.node``): one small
model per case with its inputs and the expected outputs computed by ONNX's numpy reference.  Every
case whose op ``tessera.onnx`` maps is loaded, run on the CPU lane, and compared with those outputs
(shape and dtype exactly, values within the case's own rtol/atol, NaN where NaN is expected):

- ``passed``: the outputs match (a bf16 / f16 result within one unit in its last place where the
  case's tolerance is tighter than that: ONNX's reference rounds intermediates to 16 bits where
  Tessera keeps them in f32, and two roundings of one value differ by an ulp);
- ``failed``: Tessera ran and gave something else (a bug, or a semantic the loader took wrongly);
- ``refused``: the loader or the compiler refused the case with a coded ``TesseraError`` (an
  attribute, dtype or opset it does not map) — the reason is listed;
- ``error``: anything else raised (a bug).

Cases of ops the loader does not map are counted as not mapped without running.  The
``_expanded`` variants (the op's function body written out in other ops) are left out: they test
the decomposition, not the op.  ``docs/onnx.md`` is this sweep rendered; ``python -m
tessera.tools.onnx_conformance --op Gemm`` runs one op's cases and prints each.
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Case:
    name: str
    op: str
    model: object
    inputs: list
    outputs: list
    rtol: float
    atol: float


@dataclass
class Result:
    case: str
    op: str
    status: str          # passed / failed / refused / error
    detail: str = ""


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    unmapped: Counter = field(default_factory=Counter)   # op -> number of cases

    def by_op(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for r in self.results:
            out.setdefault(r.op, Counter())[r.status] += 1
        return out


@functools.lru_cache(maxsize=1)
def _raw_cases() -> tuple:
    """ONNX's generators run once per process (several seconds)."""
    from onnx.backend.test.case import node
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(node.collect_testcases(None))


def collect(ops: set[str] | None = None) -> list[Case]:
    """ONNX's node test cases (not the ``_expanded`` ones), each with its op type."""
    out = []
    for c in _raw_cases():
        if c.kind != "node" or "_expanded" in c.name or not c.model.graph.node:
            continue
        op = c.model.graph.node[0].op_type
        if ops is not None and op not in ops:
            continue
        inputs, outputs = (list(map(_array, v)) for v in c.data_sets[0])
        out.append(Case(c.name, op, c.model, inputs, outputs, c.rtol, c.atol))
    return sorted(out, key=lambda c: (c.op, c.name))


def _array(v):
    """A case's value as numpy (some cases give ``TensorProto`` s)."""
    from onnx import TensorProto, numpy_helper
    return numpy_helper.to_array(v) if isinstance(v, TensorProto) else v


_MANTISSA = {"bfloat16": 7, "float16": 10}   # explicit mantissa bits of the 16-bit float results


def _mismatch(got, want, rtol: float, atol: float) -> str | None:
    """Why ``got`` is not ONNX's ``want`` (None: it is)."""
    want = np.asarray(want)
    if not isinstance(got, np.ndarray):
        got = np.asarray(got)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.kind not in "fc" and not want.dtype.name.startswith(("bfloat", "float")):   # ml_dtypes' are "V"
        bad = int(np.count_nonzero(got != want))
        return f"{bad} of {want.size} elements differ" if bad else None
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_w, nan_g = np.isnan(w), np.isnan(g)
    if not np.array_equal(nan_w, nan_g):
        return f"NaN at {int(np.count_nonzero(nan_w != nan_g))} other places"
    g, w = g[~nan_w], w[~nan_w]
    same = g == w   # equal infinities agree
    err = np.abs(g[~same] - w[~same])
    tol = atol + rtol * np.abs(w[~same])
    bits = _MANTISSA.get(want.dtype.name)
    if bits is not None:   # a 16-bit result: one unit in its last place (two roundings of one value)
        mag = np.maximum(np.abs(w[~same]), np.finfo(np.float32).tiny)
        tol = np.maximum(tol, np.exp2(np.floor(np.log2(mag)) - bits))
    if err.size and not np.all(err <= tol):
        k = int(np.argmax(err - tol))
        return f"max |diff| {err[k]:.3g} where the tolerance is {tol[k]:.3g} ({int(np.count_nonzero(err > tol))} elements)"
    return None


def bind_static(case: Case) -> tuple[object, list]:
    """(model, inputs) with the graph inputs the op reads as static values (axes, shapes, starts,
    ...: ``Spec.static``) turned into initializers, as a model written for inference has them;
    the node tests pass them as inputs."""
    from onnx import numpy_helper

    import tessera.onnx.model  # noqa: F401  (registers the handlers)
    from tessera.onnx.convert import OPS
    spec, node = OPS.get(case.op), case.model.graph.node[0]
    names = [vi.name for vi in case.model.graph.input]
    static = {node.input[i] for i in (spec.static if spec else ()) if i < len(node.input) and node.input[i]}
    if not static & set(names):
        return case.model, case.inputs
    m = type(case.model)()
    m.CopyFrom(case.model)
    keep = []
    for vi, arr in zip(list(m.graph.input), case.inputs):
        if vi.name in static:
            m.graph.initializer.append(numpy_helper.from_array(np.asarray(arr), vi.name))
            m.graph.input.remove(vi)
        else:
            keep.append(arr)
    return m, keep


def run_case(case: Case) -> Result:
    """Load and run one case; never raises."""
    from tessera.errors import TesseraError
    from tessera.onnx import load
    try:
        model, inputs = bind_static(case)
        fn = load(model)
        got = fn(*inputs)
        got = list(got) if isinstance(got, tuple) else [got]
        if len(got) != len(case.outputs):
            return Result(case.name, case.op, "failed", f"{len(got)} outputs, expected {len(case.outputs)}")
        for k, (g, w) in enumerate(zip(got, case.outputs)):
            why = _mismatch(g, w, case.rtol, case.atol)
            if why:
                return Result(case.name, case.op, "failed", f"output {k}: {why}")
        return Result(case.name, case.op, "passed")
    except TesseraError as e:
        first = str(e).strip().splitlines()
        reason = first[-1].strip() if len(first) > 1 else first[0]
        return Result(case.name, case.op, "refused", f"{e.code}: {_short(reason)}")
    except Exception as e:  # noqa: BLE001 - a bug to report, not to hide
        return Result(case.name, case.op, "error", f"{type(e).__name__}: {_short(str(e))}")


def _short(text: str, n: int = 110) -> str:
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"^.*?error\[[A-Z_]+\]:\s*", "", text)   # the location and code prefix (host-dependent)
    text = re.sub(r"node '[^']*' \(\w+\): ", "", text)
    return text if len(text) <= n else text[: n - 3] + "..."


def sweep(ops: set[str] | None = None, progress=None) -> Report:
    import tessera.onnx.model  # noqa: F401  (registers the handlers)
    from tessera.onnx.convert import OPS
    rep = Report()
    for case in collect(ops):
        if case.op not in OPS:
            rep.unmapped[case.op] += 1
            continue
        rep.results.append(run_case(case))
        if progress:
            progress(rep.results[-1])
    return rep


def render(rep: Report, header: str) -> str:
    by_op = rep.by_op()
    tot = Counter()
    for c in by_op.values():
        tot.update(c)
    out = [header, "# ONNX conformance: ONNX's backend node tests through `tessera.onnx.load`\n\n",
           "Each case of ONNX's own node tests (`onnx.backend.test.case.node`, the `_expanded` variants left out) "
           "whose op the loader maps is loaded, run on the CPU lane and compared with ONNX's expected outputs "
           "(shape and dtype exactly, values within the case's rtol/atol, or one unit in the last place of a 16-bit float "
           "result where that is tighter). *refused*: a coded error (an "
           "attribute, dtype or opset not mapped; the reason is listed); *failed*: ran and gave other values; "
           "*error*: an uncoded exception.  Inputs the op reads as static values (axes, shapes, slice bounds) are "
           "bound as initializers, as an inference model has them (the node tests pass them as inputs).  Generated by "
           "`tessera/tools/onnx_conformance.py` from the installed `onnx` wheel's node tests.\n\n",
           f"{len(by_op)} mapped ops, {sum(tot.values())} cases: **{tot['passed']} passed**, {tot['failed']} failed, "
           f"{tot['refused']} refused, {tot['error']} errors; {len(rep.unmapped)} ops of the node tests not mapped "
           f"({sum(rep.unmapped.values())} cases).\n\n",
           "| op | cases | passed | failed | refused | error |\n|---|---:|---:|---:|---:|---:|\n"]
    for op in sorted(by_op):
        c = by_op[op]
        out.append(f"| {op} | {sum(c.values())} | {c['passed']} | {c['failed']} | {c['refused']} | {c['error']} |\n")
    bad = [r for r in rep.results if r.status != "passed"]
    if bad:
        out.append("\n## Cases not passed\n\n| case | status | why |\n|---|---|---|\n")
        for r in sorted(bad, key=lambda r: (r.status, r.op, r.case)):
            out.append(f"| `{r.case}` | {r.status} | {r.detail.replace('|', '/')} |\n")
    out.append("\n## Ops of the node tests not mapped\n\n")
    out.append(", ".join(f"{op} ({n})" for op, n in sorted(rep.unmapped.items())) + "\n")
    from tessera.onnx.convert import WHY_NOT
    out.append("\nRefused by design (the error names the op and gives this reason):\n\n")
    out.extend(f"- {op}: {why}\n" for op, why in sorted(WHY_NOT.items()))
    return "".join(out)


def onnx_md() -> str:
    from tessera.tools.docs import HEADER
    return render(sweep(), HEADER.format(cmd="tessera docs onnx --write"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.tools.onnx_conformance",
                                 description="run ONNX's backend node tests through tessera.onnx.load")
    ap.add_argument("--op", action="append", help="only this op type (repeatable)")
    a = ap.parse_args(argv)
    rep = sweep(set(a.op) if a.op else None,
                progress=lambda r: print(f"{r.status:8s} {r.case}  {r.detail}", flush=True))
    tot = Counter(r.status for r in rep.results)
    print(", ".join(f"{k} {v}" for k, v in sorted(tot.items())))
    return 0 if not tot["error"] else 1


if __name__ == "__main__":
    sys.exit(main())
