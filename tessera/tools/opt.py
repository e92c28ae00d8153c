"""``tessera-opt``: parse IR, run a pass pipeline, print IR — like ``mlir-opt``.

Errors go to stderr as ``file:line:col: error[CODE]: message`` with exit status 1;
no Python traceback is ever shown.
"""
from __future__ import annotations

import argparse
import sys

from tessera.errors import (FileAccessError, InternalError, IRNestingError, IRParseError, SourceLocation,
                            TesseraError)


def _list_passes(out) -> None:
    from tessera.passes.base import PASSES
    from tessera.passes.pipelines import NAMED

    out.write("Passes:\n")
    for name in sorted(PASSES):
        cls = PASSES[name]
        out.write(f"  {name}  [{cls.kind}]  {cls.summary}\n")
        for o in cls.options():
            req = "required" if o.required else f"default={o.default!r}"
            out.write(f"      {o.spelling}: {o.type_name} ({req}){'  ' + o.doc if o.doc else ''}\n")
    out.write("Pipelines:\n")
    for name in sorted(NAMED):
        p = NAMED[name]
        out.write(f"  {name}  {p.summary}\n")
        for o in p.options:
            req = "required" if o.required else f"default={o.default!r}"
            out.write(f"      {o.spelling}: {o.type_name} ({req}){'  ' + o.doc if o.doc else ''}\n")
        example = {o.field: (o.default if not o.required else f"<{o.spelling}>") for o in p.options}
        out.write(f"      expands to: {p.expand(example)}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tessera-opt", description=__doc__.splitlines()[0])
    ap.add_argument("input", nargs="?", default="-", help="IR file (default: stdin)")
    ap.add_argument("--pass-pipeline", default="", help="e.g. 'canonicalize,tessera-cpu{arch=znver4}'")
    ap.add_argument("--print-ir-after-all", action="store_true")
    ap.add_argument("--print-ir-after-change", action="store_true")
    ap.add_argument("--no-verify-each", action="store_true")
    ap.add_argument("--list-passes", action="store_true")
    ap.add_argument("-o", dest="output", default="-")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except TesseraError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except RecursionError:
        sys.stderr.write(f"{IRNestingError('the IR nests deeper than tessera-opt can follow')}\n")
        return 1
    except BaseException as e:  # noqa: BLE001 - the promise is: no traceback, ever
        if isinstance(e, SystemExit):
            raise
        sys.stderr.write(f"{InternalError(f'{type(e).__name__}: {e}')}\n")   # a defect (docs/errors.md)
        return 1


def _read(path: str) -> tuple[str, str]:
    """The text of ``path`` ('-': stdin) as UTF-8 (a leading byte-order mark is dropped by the parser)."""
    if path == "-":
        data, filename = sys.stdin.buffer.read(), "<stdin>"
    else:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise FileAccessError(f"cannot read {path}: {e.strerror or e}") from None
        filename = path
    try:
        return data.decode("utf-8"), filename
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise IRParseError(f"the file is not UTF-8 text (byte 0x{data[e.start]:02x})",
                           location=SourceLocation(filename, line, col)) from None


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise FileAccessError(f"cannot write {path}: {e.strerror or e}") from None


def _run(args) -> int:
    if args.list_passes:
        _list_passes(sys.stdout)
        return 0
    from tessera.ir.text import parse_module, print_ir, verify
    from tessera.passes.pipeline import parse_pipeline, run_pipeline

    passes = parse_pipeline(args.pass_pipeline)  # options checked before any IR is read
    text, filename = _read(args.input)
    module = parse_module(text, filename)
    verify(module)

    def after(p, _module, rec, ir_text):
        if args.print_ir_after_all or (args.print_ir_after_change and rec.changed):
            sys.stderr.write(f"// -----// IR Dump After {rec.spec} //----- //\n{ir_text}\n")

    run_pipeline(module, passes, verify_each=not args.no_verify_each, after_pass=after)
    out = print_ir(module)
    if args.output == "-":
        sys.stdout.write(out)
    else:
        _write(args.output, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
