"""IR text in and out, with source locations and coded verifier errors.

xDSL does not remember where an op came from, so :class:`LocatingParser` stamps
every parsed op that has no explicit ``loc(...)`` with a ``FileLineColLoc`` of its
first token.  :func:`verify` walks ops one at a time so a failure names the op and
its location; Tessera verifiers raise coded errors, anything else from xDSL becomes
``IR_VERIFY``.
"""
from __future__ import annotations

import re
from io import StringIO

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr, UnknownLoc
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import NoTerminator
from xdsl.utils.exceptions import ParseError, VerifyException

from tessera.errors import IRNestingError, IRParseError, IRVerifyError, SourceLocation, TesseraError
from tessera.ir import verify_memo
from tessera.ir.context import make_context


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, col


class LocatingParser(Parser):
    filename: str = "<input>"
    last_op_start: int = 0

    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        self.last_op_start = start
        op = super().parse_operation()
        if isinstance(op.location, UnknownLoc):
            line, col = _line_col(self.lexer.input.content, start)
            op.location = FileLineColLoc(StringAttr(self.filename), IntAttr(line), IntAttr(col))
        return op


# xDSL's string-literal regex nests a quantifier ("(?:[^"...]+|...)*"): on a quote left open it
# backtracks exponentially in the rest of the line (a 100-character line hangs for hours).  The same
# language, one character per step, fails in linear time.
_STRING_LITERAL = re.compile(r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')


def location_of(op: Operation | None) -> SourceLocation | None:
    loc = getattr(op, "location", None)
    if isinstance(loc, FileLineColLoc):
        return SourceLocation(loc.filename.data, loc.line.data, loc.column.data)
    return None


def parse_module(text: str, filename: str = "<input>") -> ModuleOp:
    """Parse MLIR text into a module (not yet verified); errors are ``IRParseError``.  A leading
    byte-order mark is dropped (editors on some systems write one)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    parser = None
    try:
        parser = LocatingParser(make_context(), text, name=filename)
        parser.filename = filename
        parser.lexer._unescaped_characters_regex = _STRING_LITERAL
        return parser.parse_module()
    except ParseError as e:
        line, col = _line_col(text, e.span.start)
        raise IRParseError(e.msg, location=SourceLocation(filename, line, col)) from None
    except RecursionError:
        raise IRNestingError("the IR nests deeper than the parser can follow (regions, blocks, types or "
                             "attributes nested hundreds of levels)", location=SourceLocation(filename, 1, 1)) from None
    except TesseraError as e:  # a type or attribute verifier of ours, raised while parsing
        line, col = _line_col(text, parser.last_op_start if parser else 0)
        raise e.with_location(SourceLocation(filename, line, col)) from None
    except (VerifyException, ValueError, TypeError, OverflowError) as e:   # OverflowError: dense<1e9> : f16
        line, col = _line_col(text, parser._current_token.span.start if parser else 0)
        raise IRParseError(str(e).splitlines()[0] if str(e) else type(e).__name__,
                           location=SourceLocation(filename, line, col)) from None


def verify(module: Operation) -> None:
    """Verify every op; the first failure is raised as a coded ``TesseraError``."""
    try:
        _verify_ops(module)
    except RecursionError:
        raise IRNestingError("the IR nests deeper than the verifier can follow") from None


def _verify_ops(module: Operation) -> None:
    memo = verify_memo.Memo()    # the ops that passed: an equal op passes too
    for op in module.walk():
        k = verify_memo.key(op)
        if k is not None and memo.passed_before(op, k):
            continue
        try:
            op.verify(verify_nested_ops=False)
        except TesseraError as e:
            if e.op is None:
                e.op = op
            raise e.with_location(location_of(e.op)) from None
        except (VerifyException, ValueError) as e:
            msg = str(e).strip().splitlines()
            raise IRVerifyError(f"{op.name}: {msg[0] if msg else type(e).__name__}", op=op,
                                location=location_of(op)) from None
        except (AttributeError, TypeError, KeyError, IndexError, OverflowError) as e:
            # a verifier that met an attribute of the wrong kind (a string where it reads integers)
            raise IRVerifyError(f"{op.name}: malformed attributes ({type(e).__name__}: {e})", op=op,
                                location=location_of(op)) from None
        if k is not None:
            memo.passed(op, k)
        _verify_structure(op)
    _verify_defined_before_use(module, set())


def _verify_structure(op: Operation) -> None:
    """What ``Operation.verify`` checks of nested regions besides the ops themselves (each op
    was verified once, above; ``module.verify()`` would verify every op a second time), and
    that a function has one block: Tessera's programs have no branches between blocks (a second
    block reached lower-schedule-to-tile as a ValueError from xDSL)."""
    if op.name == "func.func" and len(op.regions[0].blocks) > 1:
        raise IRVerifyError(f"func.func: {len(op.regions[0].blocks)} blocks in the body; a Tessera function has "
                            "one (no control flow between blocks)", op=op, location=location_of(op))
    for region in op.regions:
        for block in region.blocks:
            if block.parent is not region:
                raise IRVerifyError(f"{op.name}: a block's parent pointer does not refer to its region", op=op,
                                    location=location_of(op))
            if block.first_op is None:
                if len(region.blocks) == 1 and not op.has_trait(NoTerminator):
                    raise IRVerifyError(f"{op.name}: an empty block in a region that needs a terminator", op=op,
                                        location=location_of(op))
                continue
            for inner in block.ops:
                if inner.parent is not block:
                    raise IRVerifyError(f"{inner.name}: its parent pointer does not refer to its block", op=inner,
                                        location=location_of(inner))


def _verify_defined_before_use(op: Operation, pending: set) -> None:
    """Within a block, a value is used only after the op defining it, by the ops that follow and
    everything nested in them (xDSL does not check dominance: a mutant whose ops used each
    other's results in a cycle passed verification and failed inside lower-schedule-to-tile with
    a KeyError).  One walk: ``pending`` holds the ops of every enclosing block not yet passed
    (an op's own results are pending inside its regions)."""
    for v in op.operands:
        owner = getattr(v, "op", None)
        if owner in pending:
            raise IRVerifyError(f"{op.name}: operand %{v.name_hint or '?'} is used before the op that "
                                f"defines it ({owner.name})", op=op, location=location_of(op))
    for region in op.regions:
        for block in region.blocks:
            inner = list(block.ops)
            pending.update(inner)
            for o in inner:
                _verify_defined_before_use(o, pending)
                pending.discard(o)


class _TextPrinter(Printer):
    """xDSL's printer into a text stream, with a short path for text without a line break (most
    of the 300 k pieces of an 18 k-op module): xDSL's own checks for breaks, encodes and counts
    columns through three calls each."""

    def print_string(self, text: str, *, indent: int | None = None) -> None:
        if "\n" in text:
            super().print_string(text, indent=indent)
            return
        self._current_column += len(text)
        self.stream.write(text)


def print_ir(op: Operation, *, debuginfo: bool = False) -> str:
    out = StringIO()
    _TextPrinter(stream=out, print_debuginfo=debuginfo).print_op(op)
    return out.getvalue() + "\n"


def parse_and_verify(text: str, filename: str = "<input>") -> ModuleOp:
    module = parse_module(text, filename)
    verify(module)
    return module
