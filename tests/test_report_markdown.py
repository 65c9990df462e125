"""report.md as a pull-request comment: verdicts and one key table first, details collapsed,
reported-only gates apart, cost or "not configured", date, hardware, where the HTML is;
untrusted text escaped; never over its size cap."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from pytest_osprey.report.markdown import GITHUB_LIMIT, markdown
from pytest_osprey.results.folder import load_campaign
from testkit.recorded_campaign import judge_as_the_plugin_does, record_campaign, write_project


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any, str]:
    root = tmp_path_factory.mktemp("md")
    project = write_project(root)
    results = root / "results-folder"
    record_campaign(project, results)
    judge_as_the_plugin_does(project, results)
    summary = json.loads((results / "summary.json").read_text("utf-8"))
    return summary, load_campaign(results).meta, (results / "report.md").read_text("utf-8")


def test_what_decides_comes_first(judged: tuple[dict[str, Any], Any, str]) -> None:
    _, _, text = judged
    lines = text.splitlines()
    assert lines[0].startswith("## ")
    keep = next(i for i, line in enumerate(lines) if "**KEEP** cand: speedup" in line)
    drop = next(i for i, line in enumerate(lines) if "**DROP** slow: speedup" in line)
    table = next(i for i, line in enumerate(lines) if line.startswith("| condition | load |"))
    first_details = next(i for i, line in enumerate(lines) if line.startswith("<details>"))
    assert keep < drop < table < first_details
    # The DROP's reasons are named bullets, without internal ids or p-values.
    bullets = [line for line in lines[drop + 1:table] if line.startswith("- ")]
    assert bullets and all("p=" not in b and "[slow-" not in b for b in bullets)
    assert any(b.startswith("- **greedy outputs**") for b in bullets)


def test_details_are_collapsed_and_reported_only_gates_apart(
        judged: tuple[dict[str, Any], Any, str]) -> None:
    summary, _, text = judged
    assert text.count("<details>") == text.count("</details>") >= 6
    deciding = text.index("<b>Gates that decide the verdict</b>")
    reported = text.index("<b>Reported only</b>")
    assert deciding < reported
    section = text[reported:text.index("</details>", reported)]
    assert "never decide the verdict or fail the run" in section
    n_reported = sum(not g["gating"] for g in summary["gates"])
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(rows) - 1 == n_reported  # the header, then one row per gate
    # A reported-only failure does not read like the fatal kind.
    deciding_part = text[deciding:reported]
    assert "on unusual" not in deciding_part


def test_cost_date_hardware_and_where_the_html_is(
        judged: tuple[dict[str, Any], Any, str]) -> None:
    summary, meta, text = judged
    assert "<summary>Cost and break-even</summary>" in text
    assert "Campaign started 1970-01-01 00:16 UTC on cpu, x86_64" in text
    assert "`results-folder/report.html`" in text
    assert "transformers 4.56.0" in text
    free = copy.deepcopy(summary)
    free["cost"]["device_hour_price"] = 0.0
    plain = markdown(free, meta, "t", "f")
    assert "<summary>Cost: not configured</summary>" in plain
    assert "0.00" not in plain.split("Cost: not configured")[1].split("</details>")[0]


def test_untrusted_text_is_escaped(judged: tuple[dict[str, Any], Any, str]) -> None:
    summary, meta, _ = judged
    hostile = copy.deepcopy(summary)
    evil = '<script>alert(1)</script><img src=x onerror="x()"> | pipe'
    hostile["gates"][0]["summary"] = evil
    hostile["verdicts"][0]["headline"] = "KEEP cand: " + evil
    hostile["verdicts"][1]["bullets"][0]["text"] = evil
    hostile["setup"][0]["value"] = evil
    text = markdown(hostile, meta, "<b>title</b>", "<i>f</i>")
    assert "<script" not in text and "<img" not in text and "<b>title" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<i>f</i>" not in text
    # In a table cell a pipe would open a new column.
    row = next(line for line in text.splitlines() if "alert(1)" in line and line.startswith("|"))
    assert "\\| pipe" in row


def test_untrusted_text_makes_no_live_markdown(judged: tuple[dict[str, Any], Any, str]) -> None:
    """In a PR comment: no mention that pings, no image that tracks readers, no link, no
    heading, wherever a server's, a trace's or a pilot's text lands."""
    import re

    summary, meta, _ = judged
    hostile = copy.deepcopy(summary)
    evil = ("@octocat ![t](https://evil.example/t.png) [click](https://evil.example) "
            "https://evil.example/bare www.evil.example")
    hostile["gates"][0]["summary"] = evil
    hostile["verdicts"][0]["headline"] = "KEEP cand: " + evil
    hostile["verdicts"][1]["bullets"][0]["text"] = "# heading " + evil
    hostile["setup"][0]["value"] = evil
    text = markdown(hostile, meta, "@here # title ![x](https://evil.example/x.png)", "f")
    assert not re.search(r"(?<![\\\w])@\w", text)  # no @name mention
    assert not re.search(r"(?<!\\)!(?<!\\)\[", text)  # no image
    assert not re.search(r"(?<!\\)\[[^\]\\]*(?<!\\)\]\(", text)  # no [text](link)
    assert "https://evil" not in text and "www.evil" not in text  # no autolink
    assert not re.search(r"^#+ .*heading", text, re.M)
    assert "octocat" in text and "evil.example" in text  # said, not dropped


def _huge(summary: dict[str, Any], gates: int) -> dict[str, Any]:
    big = copy.deepcopy(summary)
    big["gates"] = [dict(summary["gates"][i % len(summary["gates"])],
                         summary="x" * 300) for i in range(gates)]
    return big


@pytest.mark.parametrize(("gates", "kib"), [(2000, 64), (20_000, 1000), (200, 4)])
def test_never_over_the_cap(judged: tuple[dict[str, Any], Any, str], gates: int,
                            kib: int) -> None:
    summary, meta, _ = judged
    text = markdown(_huge(summary, gates), meta, "t", "f", max_kib=kib)
    size = len(text.encode("utf-8"))
    assert size <= kib * 1024 <= GITHUB_LIMIT
    assert "**KEEP** cand" in text  # the verdicts always make it
    assert "cut to fit the size cap" in text or "Left out to stay under" in text


def test_a_head_too_large_is_cut_at_a_line(judged: tuple[dict[str, Any], Any, str]) -> None:
    summary, meta, _ = judged
    many = copy.deepcopy(summary)
    many["verdicts"] = [dict(summary["verdicts"][1], candidate=f"c{i}") for i in range(3000)]
    text = markdown(many, meta, "t", "f", max_kib=8)
    assert len(text.encode("utf-8")) <= 8 * 1024
    assert text.rstrip().endswith("the rest is in report.html.*")


def test_default_size_is_small(judged: tuple[dict[str, Any], Any, str]) -> None:
    _, _, text = judged
    assert len(text.encode("utf-8")) < 64 * 1024
    assert "Left out" not in text and "cut to fit" not in text
    assert "/tmp" not in text  # the report names its folder, not an absolute path
