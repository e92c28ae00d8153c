"""Generated documents match what their commands produce (no hand-typed counts)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tessera.errors import all_error_classes
from tessera.tools import docs

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(docs.GENERATORS))
def test_checked_in_doc_is_current(name):
    path, _ = docs.GENERATORS[name]
    current = (ROOT / path).read_text()
    assert current == docs.generate(name), f"{path} drifted: run `tessera docs {name} --write`"


def test_error_codes_are_unique_and_documented():
    codes = [c.code for c in all_error_classes()]
    assert len(codes) == len(set(codes))
    text = (ROOT / "docs/errors.md").read_text()
    for c in codes:
        assert f"`{c}`" in text


def test_drift_check_has_teeth(tmp_path, monkeypatch):
    """A stale copy is detected: regenerate into a temp tree, edit it, compare."""
    p = docs.write("errors", tmp_path)
    p.write_text(p.read_text().replace("IR_PARSE", "IR_PARSE_OLD"))
    assert p.read_text() != docs.generate("errors")
