"""The documented pilot reference is the schema's own rendering: docs cannot drift."""

from __future__ import annotations

from pytest_osprey.pilot.reference import render
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import ROOT

DOC = ROOT / "docs" / "pilot-reference.md"


def test_reference_doc_is_current() -> None:
    assert DOC.read_text("utf-8") == render(), (
        "docs/pilot-reference.md is stale: python -m pytest_osprey reference > "
        "docs/pilot-reference.md"
    )


def test_every_field_is_described() -> None:
    text = render()
    for line in text.splitlines():
        if line.startswith("| `"):
            assert not line.rstrip().endswith("|  |"), f"undocumented field: {line}"
    assert "## Target" in text and "## Condition" in text and Pilot.__name__ in text
