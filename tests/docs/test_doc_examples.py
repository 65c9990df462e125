"""The example outputs the docs include (examples/first-run/: a real run of the shipped pilot,
re-rendered by examples/make_examples.py) are what this code renders: a change of format or
wording fails here until the examples are renewed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.factories import ROOT


@pytest.mark.slow
def test_the_docs_example_outputs_are_what_the_code_renders() -> None:
    proc = subprocess.run([sys.executable, "examples/make_examples.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_the_docs_include_the_generated_examples_not_copies() -> None:
    pages = {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md")}
    including = [name for name, text in pages.items()
                 if '--8<-- "examples/first-run/terminal.txt"' in text]
    assert including, "no docs page includes examples/first-run/terminal.txt"
    # No page keeps a pasted terminal summary of its own: the generated one is the example.
    pasted = [name for name, text in pages.items()
              if "===== osprey pilot =====" in text or "\nset-up: transformers" in text]
    assert not pasted, pasted
