"""Option-injection control for tests that compare two builds differing in one pass option.

``inject`` rewrites one option of one pass in an expanded pipeline string and proves the
injection applied: the pass appears exactly once, a bogus option name makes the pipeline
fail to parse, and the caller checks that the real change changed the output.  (A seed
note tells of an experiment that compared two "different" builds for weeks while the
injection had silently never applied.)
"""
from __future__ import annotations

import re

import pytest

from tessera.errors import TesseraError
from tessera.passes.pipeline import parse_pipeline


def expand(spec: str) -> str:
    return ",".join(p.spec_text() for p in parse_pipeline(spec))


def inject(spec: str, pass_name: str, option: str, value: str) -> str:
    full = expand(spec)
    pattern = re.compile(rf"(?<![\w-]){re.escape(pass_name)}(\{{[^}}]*\}})?(?=,|$)")
    hits = pattern.findall(full)
    assert len(hits) == 1, f"{pass_name} occurs {len(hits)} times in {full}"

    def rewrite(m: re.Match, opt: str = option, val: str = value) -> str:
        opts = m.group(1)[1:-1].split() if m.group(1) else []
        opts = [o for o in opts if not o.startswith(opt + "=")] + [f"{opt}={val}"]
        return f"{pass_name}{{{' '.join(opts)}}}"

    new = pattern.sub(rewrite, full, count=1)
    assert new != full, "the injection changed nothing"
    bogus = pattern.sub(lambda m: rewrite(m, opt=option + "-bogus"), full, count=1)
    with pytest.raises(TesseraError):
        parse_pipeline(bogus)  # a misspelt option is refused, so a typo cannot pass for a change
    parse_pipeline(new)
    return new
