"""Pipeline strings, checked when parsed, and an instrumented runner.

``parse_pipeline("canonicalize,tessera-cpu{arch=znver4}")`` builds every pass
object before any IR is touched: an unknown pass (with the nearest registered
names), an unknown option, a wrong type or a missing required option raises a
coded ``Pipeline*`` error naming the pass and the option.

:func:`run_pipeline` applies passes one by one, verifies after each (unless told
not to), and records for every pass: the op census before and after, the ops it
consumed and produced, whether the printed IR changed (byte comparison), and its
time.  ``TESSERA_DUMP_IR=<dir>`` writes the IR after every pass, one numbered
file per pass.
"""
from __future__ import annotations

import difflib
import os
import time
import types
import typing
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.arg_spec import parse_pipeline as _xdsl_parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError

from tessera.errors import (
    PassFailedError,
    PipelineError,
    PipelineMissingOption,
    PipelineOptionType,
    PipelineUnknownOption,
    PipelineUnknownPass,
    TesseraError,
)
from tessera.ir.context import make_context
from tessera.ir.text import print_ir, verify
from tessera.passes.base import PASSES, OptionInfo, TesseraPass


# --------------------------------------------------------------------------- parsing
def _split(spec: str) -> list[tuple[str, dict[str, tuple]]]:
    try:
        return [(s.name, dict(s.parameters)) for s in _xdsl_parse_pipeline(spec)]
    except ArgSpecParseError as e:  # derives from BaseException in xDSL
        raise PipelineError(f"malformed pipeline {spec!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - lexer errors
        raise PipelineError(f"malformed pipeline {spec!r}: {e}") from None


def _coerce(owner: str, opt: OptionInfo, values: tuple) -> object:
    t = opt.type
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        if not values:
            return None
        t = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(t), typing.get_args(t)

    def one(v: object, want: type) -> object:
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if want is str and isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)  # e.g. arch=90a lexes as a number + ident; names stay names
        if want is int and isinstance(v, bool):
            raise TypeError
        if not isinstance(v, want):
            raise TypeError
        return v

    try:
        if origin is tuple:
            return tuple(one(v, args[0]) for v in values)
        if len(values) != 1:
            raise TypeError
        return one(values[0], t)  # type: ignore[arg-type]
    except TypeError:
        shown = ",".join(str(v) for v in values) if values else "(no value)"
        raise PipelineOptionType(f"pass '{owner}': option '{opt.spelling}' expects {opt.type_name}, got {shown!r}") \
            from None


def check_options(owner: str, options: Sequence[OptionInfo], given: dict[str, tuple]) -> dict[str, object]:
    """Validate ``given`` (spelling -> raw values) against declared options; returns field -> value."""
    by_spelling = {o.spelling: o for o in options}
    by_spelling.update({o.field: o for o in options})
    out: dict[str, object] = {}
    for key, values in given.items():
        opt = by_spelling.get(key)
        if opt is None:
            legal = ", ".join(o.spelling for o in options) or "none"
            raise PipelineUnknownOption(f"pass '{owner}' has no option '{key}' (options: {legal})")
        out[opt.field] = _coerce(owner, opt, values)
    for opt in options:
        if opt.required and opt.field not in out:
            raise PipelineMissingOption(f"pass '{owner}' requires option '{opt.spelling}' ({opt.type_name})"
                                        + (f": {opt.doc}" if opt.doc else ""))
    return out


def parse_pipeline(spec: str) -> list[TesseraPass]:
    """Parse a pipeline string into pass objects (named pipelines expanded)."""
    from tessera.passes import pipelines  # registers every pass and the named pipelines

    passes: list[TesseraPass] = []
    if not spec.strip():
        return passes
    for name, params in _split(spec):
        if name in pipelines.NAMED:
            named = pipelines.NAMED[name]
            values = check_options(name, named.options, params)
            passes.extend(parse_pipeline(named.expand(values)))
            continue
        cls = PASSES.get(name)
        if cls is None:
            known = sorted(PASSES) + sorted(pipelines.NAMED)
            near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
            raise PipelineUnknownPass(f"unknown pass '{name}'{hint} (see tessera-opt --list-passes)")
        values = check_options(name, cls.options(), params)
        try:
            passes.append(cls(**values))
        except TesseraError:
            raise
        except (TypeError, ValueError) as e:
            raise PipelineOptionType(f"pass '{name}': {e}") from None
    return passes


# --------------------------------------------------------------------------- running
def census(module: ModuleOp) -> Counter[str]:
    c: Counter[str] = Counter()
    for op in module.walk():
        c[op.name] += 1
    return c


@dataclass
class PassRecord:
    name: str
    spec: str
    kind: str
    census_before: dict[str, int]
    census_after: dict[str, int]
    changed: bool
    seconds: float

    @property
    def consumed(self) -> list[str]:
        return sorted(n for n, c in self.census_before.items() if self.census_after.get(n, 0) < c)

    @property
    def produced(self) -> list[str]:
        return sorted(n for n, c in self.census_after.items() if self.census_before.get(n, 0) < c)

    @property
    def ops_in(self) -> int:
        return sum(self.census_before.values())

    @property
    def ops_out(self) -> int:
        return sum(self.census_after.values())

    def to_dict(self) -> dict:
        return {"pass": self.spec, "kind": self.kind, "changed": self.changed, "ops_in": self.ops_in,
                "ops_out": self.ops_out, "consumed": self.consumed, "produced": self.produced,
                "ms": round(self.seconds * 1e3, 2)}


@dataclass
class PipelineRun:
    records: list[PassRecord] = field(default_factory=list)
    snapshots: dict[str, str] = field(default_factory=dict)  # pass spec -> IR text after it (when kept)
    initial_census: dict[str, int] = field(default_factory=dict)


AfterPass = Callable[[TesseraPass, ModuleOp, PassRecord, str], None]
AfterApply = Callable[[TesseraPass, ModuleOp], None]


def run_pipeline(module: ModuleOp, passes: Sequence[TesseraPass], *, verify_each: bool = True,
                 after_pass: AfterPass | None = None, dump_dir: str | os.PathLike | None = None,
                 dump_prefix: str = "", after_apply: AfterApply | None = None) -> PipelineRun:
    """Apply ``passes`` in order, instrumented; the module is modified in place.  ``after_apply``
    sees the module right after each pass, before it is printed and verified (it must not change
    it, nor raise for IR that might not verify)."""
    ctx = make_context()
    if dump_dir is None and os.environ.get("TESSERA_DUMP_IR"):
        dump_dir = os.environ["TESSERA_DUMP_IR"]
    run = PipelineRun()
    text = print_ir(module)
    before = census(module)
    run.initial_census = dict(before)
    if dump_dir is not None:
        Path(dump_dir).mkdir(parents=True, exist_ok=True)
        (Path(dump_dir) / f"{dump_prefix}00-input.mlir").write_text(text)
    for i, p in enumerate(passes, 1):
        t0 = time.perf_counter()
        try:
            p.apply(ctx, module)
        except TesseraError:
            raise
        except Exception as e:  # noqa: BLE001 - an internal failure becomes a coded error, chained
            raise PassFailedError(f"pass '{p.name}' failed: {type(e).__name__}: {e}") from e
        seconds = time.perf_counter() - t0
        if after_apply is not None:
            after_apply(p, module)
        try:
            after_text = print_ir(module)
        except Exception:  # noqa: BLE001 - IR the printer cannot walk: the verifier says why, coded
            verify(module)
            raise
        if verify_each and after_text != text:   # a pass that changed nothing leaves verified IR
            t1 = time.perf_counter()
            verify(module)
            seconds += time.perf_counter() - t1
        after = census(module)
        rec = PassRecord(p.name, p.spec_text(), p.kind, dict(before), dict(after), after_text != text, seconds)
        run.records.append(rec)
        if dump_dir is not None:
            (Path(dump_dir) / f"{dump_prefix}{i:02d}-{p.name}.mlir").write_text(after_text)
        if after_pass is not None:
            after_pass(p, module, rec, after_text)
        text, before = after_text, after
    return run
