"""The README stays short and keeps its two commands; the reference lives on the docs site,
whose nav holds every page under docs/ and whose links resolve (CI also builds it with
``mkdocs build --strict``)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from testkit.factories import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The two set-up commands, as a fresh machine runs them (CI's install repeats the second).
PILOT_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 "
                 "-e '.[embedded]' && .venv/bin/pytest --osprey-config=pilot.yaml")
TEST_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 "
                "-e '.[embedded,test]' && .venv/bin/pytest -n 2 --dist loadfile")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.M)


def local_links(text: str) -> Iterator[str]:
    """Relative link targets, without their anchor (web links and same-page anchors left out)."""
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        yield target.split("#", 1)[0]


def nav_pages(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)


def mkdocs_config() -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text("utf-8"))
    assert isinstance(config, dict)
    return config


def test_readme_is_short_and_keeps_the_two_commands() -> None:
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 200
    lines = text.splitlines()
    assert PILOT_COMMAND in lines and TEST_COMMAND in lines


def test_ci_installs_what_the_readme_test_command_installs() -> None:
    """.ci/run's project install is the README's (less pip's -q), so CI tests what users get."""
    readme_install = shlex.split(TEST_COMMAND.split(" && ")[1])[1:]
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    installs = [shlex.split(line)[1:] for line in ci.splitlines()
                if line.startswith('"$work/venv/bin/pip" install')]
    assert [arg for arg in installs[0] if arg != "-q"] == readme_install
    # The site is built from the docs extra's pins, strictly.
    assert '["optional-dependencies"]["docs"]' in ci and 'mkdocs" build --strict' in ci


def test_readme_links_resolve_and_docs_links_are_site_pages() -> None:
    pages = set(nav_pages(mkdocs_config()["nav"]))
    targets = list(local_links(README.read_text("utf-8")))
    assert any(t.startswith("docs/") for t in targets)
    for target in targets:
        assert (ROOT / target).exists(), f"README links to a missing {target}"
        if target.startswith("docs/") and target.endswith(".md"):
            assert target.removeprefix("docs/") in pages, f"{target} is not in mkdocs.yml's nav"


def test_report_picture_is_small() -> None:
    pictures = [t for t in local_links(README.read_text("utf-8")) if t.endswith(".png")]
    assert pictures, "the README shows report.html"
    for picture in pictures:
        assert (ROOT / picture).stat().st_size < 300 * 1024, picture


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = mkdocs_config()
    assert config["theme"]["name"] == "material" and config["docs_dir"] == "docs"
    # A page left out of the nav fails the strict build instead of being listed as info.
    assert config["validation"]["nav"]["omitted_files"] == "warn"
    pages = list(nav_pages(config["nav"]))
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk
    assert len(pages) == len(set(pages)), "a page is in the nav twice"


def test_docs_links_stay_inside_the_site() -> None:
    """What mkdocs --strict checks, without mkdocs: every relative link of a page (and of the
    files the pages include) names a file under docs/."""
    pages = sorted(DOCS.rglob("*.md"))
    included: list[Path] = []
    for page in pages:
        for name in SNIPPET.findall(page.read_text("utf-8")):
            assert (ROOT / name).is_file(), f"{page.name} includes a missing {name}"
            included.append(ROOT / name)
    assert included, "the trace format and the CI templates' guide are included"
    for source, page in [(p, p) for p in pages] + [(f, DOCS / "index.md") for f in included]:
        for target in local_links(source.read_text("utf-8")):
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(DOCS) and resolved.exists(), (
                f"{source.relative_to(ROOT)} links to {target}, not a page of the site")
