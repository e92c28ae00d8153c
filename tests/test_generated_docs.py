"""Generated documents match what their commands produce (no hand-typed counts)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tessera.errors import all_error_classes
from tessera.tools import docs

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in docs.SLOW else n
                                  for n in sorted(docs.GENERATORS)])
def test_checked_in_doc_is_current(name):
    problem = docs.drift(name, ROOT)
    assert problem is None, problem


def test_error_codes_are_unique_and_documented():
    codes = [c.code for c in all_error_classes()]
    assert len(codes) == len(set(codes))
    text = (ROOT / "docs/errors.md").read_text()
    for c in codes:
        assert f"`{c}`" in text


def test_drift_check_has_teeth(tmp_path, monkeypatch):
    """The check test_checked_in_doc_is_current runs (docs.drift) on a temp tree: a fresh copy
    passes; an edited line, a lost trailing newline, an appended line, a missing file and a
    generator whose output changed under an unchanged file are each reported."""
    p = docs.write("errors", tmp_path)
    fresh = p.read_text()
    assert docs.drift("errors", tmp_path) is None
    assert "`IR_PARSE`" in fresh
    for stale in (fresh.replace("`IR_PARSE`", "`IR_PARSE_OLD`", 1), fresh.rstrip("\n"), fresh + "| extra |\n"):
        p.write_text(stale)
        problem = docs.drift("errors", tmp_path)
        assert problem is not None and "docs/errors.md drifted" in problem, problem
    p.write_text(fresh)
    assert docs.drift("errors", tmp_path) is None
    monkeypatch.setitem(docs.GENERATORS, "errors", ("docs/errors.md", lambda: fresh.replace("IR_PARSE", "IR_X")))
    assert "drifted" in docs.drift("errors", tmp_path)
    p.unlink()
    assert "missing" in docs.drift("errors", tmp_path)
