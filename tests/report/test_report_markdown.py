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
from testkit.recorded_campaign import judged_campaign


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any, str]:
    results = judged_campaign(tmp_path_factory.mktemp("md"), "results-folder")
    summary = json.loads((results / "summary.json").read_text("utf-8"))
    return summary, load_campaign(results).meta, (results / "report.md").read_text("utf-8")


@pytest.mark.slow  # over a second on 2 busy cores
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
    text = markdown(hostile, meta, "@here # title ![x](https://evil.example/x.png)", "f",
                    env={})  # no CI: the run's own links are the only ones allowed
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


@pytest.mark.slow  # over a second on 2 busy cores
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


GITHUB = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "acme/serving",
          "GITHUB_RUN_ID": "123456"}
GITLAB = {"CI_JOB_URL": "https://gitlab.example.com/acme/serving/-/jobs/77",
          "CI_PIPELINE_URL": "https://gitlab.example.com/acme/serving/-/pipelines/9"}


def _links(text: str) -> list[tuple[str, str]]:
    import re

    return re.findall(r"(?<!\\)\[([^\]\\]+)\]\((https?://[^)\s]+)\)", text)


@pytest.mark.parametrize(("env", "expected"), [
    (GITHUB, [("CI run", "https://github.com/acme/serving/actions/runs/123456"),
              ("artifacts", "https://github.com/acme/serving/actions/runs/123456#artifacts")]),
    (GITLAB, [("CI pipeline", GITLAB["CI_PIPELINE_URL"]), ("CI job", GITLAB["CI_JOB_URL"]),
              ("artifacts", GITLAB["CI_JOB_URL"] + "/artifacts/browse")]),
    ({}, []),
    # A value that is not a plain URL never becomes a link.
    ({**GITHUB, "GITHUB_REPOSITORY": "acme/x) [y](https://evil.example"}, []),
    ({"CI_JOB_URL": "javascript:alert(1)"}, []),
])
def test_links_to_the_ci_run_and_its_artifacts(
        judged: tuple[dict[str, Any], Any, str], monkeypatch: pytest.MonkeyPatch,
        env: dict[str, str], expected: list[tuple[str, str]]) -> None:
    summary, meta, _ = judged
    for key in (*GITHUB, *GITLAB):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    text = markdown(summary, meta, "t", "f")
    assert _links(text) == expected
    footer = next(line for line in text.splitlines() if line.startswith("<sub>Campaign"))
    assert all(f"[{label}]({url})" in footer for label, url in expected)


def _tables(text: str) -> list[tuple[str, list[str]]]:
    """(section title, header cells) of every table."""
    out, title = [], ""
    for line, nxt in zip(text.splitlines(), text.splitlines()[1:], strict=False):
        if line.startswith("<details><summary>"):
            title = line.removeprefix("<details><summary>").removesuffix("</summary>")
        if line.startswith("| ") and nxt.startswith("|---"):
            out.append((title, [c.strip() for c in line.strip("|").split(" | ")]))
    return out


def test_tables_fit_a_pr_comment_and_name_their_load(
        judged: tuple[dict[str, Any], Any, str]) -> None:
    _, _, text = judged
    tables = _tables(text)
    assert len(tables) >= 9
    for title, header in tables:
        assert len(header) <= 7, (title, header)
        # ~880 px: short headers, a cell of at most a few words
        assert sum(len(h) for h in header) <= 110, (title, header)
    for title, header in tables:
        if title.startswith(("Set-up", "<b>")):  # the set-up lists levels; gates say "at"
            continue
        assert "load" in header or " at " in title, (title, header)
    assert "<summary>Speed and accept length per domain at busy</summary>" in text
    figures = [h for t, h in tables if t.startswith(("Latency", "Throughput"))]
    assert len(figures) == 2 and "TPOT p50/p95 ms" in figures[0] and "req/s" in figures[1]


def test_break_even_is_rounded_sensibly(judged: tuple[dict[str, Any], Any, str]) -> None:
    summary, meta, _ = judged
    costly = copy.deepcopy(summary)
    be = costly["cost"]["break_even"][0]
    be.update(days=123.456, requests=12345.6, reason=None)
    costly["cost"]["table"][0]["setup_cost"] = 12.3456
    text = markdown(costly, meta, "t", "f", env={})
    row = next(line for line in text.splitlines()
               if line.startswith(f"| {be['candidate']} | {be['reference']} | {be['load']} |"))
    assert "| 12,000 | **120** |" in row  # over max_break_even_days (90): flagged
    assert "| 12.35 |" in text and "12.3456" not in text
    be.update(days=0.012345)
    text = markdown(costly, meta, "t", "f", env={})
    assert "| 0.012 |" in text


def test_the_footer_says_how_many_passes_ran(judged: tuple[dict[str, Any], Any, str]) -> None:
    summary, meta, text = judged
    footer = next(line for line in text.splitlines() if line.startswith("<sub>Campaign"))
    assert "2 of 2 passes" in footer and "pass(es)" not in footer
    stopped = copy.deepcopy(summary)
    stopped["campaign"].update(
        passes_planned=4, passes_run=1, stopped_early=True, stopped_after_pass=1,
        not_measured=["drift between passes"],
        text="stopped after pass 1 of 4: speed cleared the early-KEEP boundary; not "
             "measured: drift between passes")
    footer = next(line for line in markdown(stopped, meta, "t", "f", env={}).splitlines()
                  if line.startswith("<sub>Campaign"))
    assert "1 of 4 passes (stopped early)" in footer
    assert "stopped after pass 1 of 4: speed cleared the early-KEEP boundary" in footer
    assert footer.count("drift between passes") == 1


def test_the_set_up_line_says_the_passes_run(judged: tuple[dict[str, Any], Any, str]) -> None:
    from pytest_osprey.report.setup import short_setup

    _, meta, _ = judged
    ending = {"status": "complete", "passes_planned": 4, "passes_run": 1,
              "stopped_early": True, "not_measured": ["drift between passes",
                                                      "near-tie control"]}
    line = short_setup(meta, ending=ending)
    assert ("1 of 4 passes (stopped early; not measured: drift between passes, near-tie "
            "control)") in line
    assert "pass(es)" not in line
    full = short_setup(meta, ending={**ending, "passes_run": 4, "stopped_early": False,
                                     "not_measured": []})
    assert "4 of 4 passes" in full and "stopped early" not in full


def test_the_key_tables_flag_where_a_candidate_is_worse_than_the_baseline() -> None:
    """report.md's and report.html's key figures carry the rise over the baseline, as the
    terminal does: only where the candidate is worse, at the same load."""
    from pytest_osprey.judgement.figures.measured import Figures
    from pytest_osprey.report.terminal import Columns, table_rows

    def fig(cond: str, ttft: float, memory: float) -> Figures:
        return Figures(condition=cond, load="low", concurrency=1, ok=4, total=4,
                       ttft_p50_s=ttft, ttft_p95_s=ttft * 2, e2e_p50_s=1.0, e2e_p95_s=2.0,
                       tpot_p50_s=0.01, tokens_per_s=10.0, request_tokens_per_s_p50=10.0,
                       accept_length_pooled=None, accept_length_mean=None,
                       peak_memory_mb=memory, load_label="x1")

    figs = [fig("base", 0.031, 68.0), fig("cand", 0.042, 91.0), fig("fast", 0.020, 60.0)]
    rows = {r[0]: r for r in table_rows(figs, Columns(baseline="base"), deltas=True)}
    assert rows["cand"][3] == "42 (+35%)/84 (+35%)" and rows["cand"][8] == "91 (+34%)"
    assert rows["fast"][3] == "20/40" and rows["fast"][8] == "60"
    assert rows["base"][3] == "31/62"
    plain = {r[0]: r for r in table_rows(figs, Columns(baseline="base"))}
    assert plain["cand"][3] == "42/84"


def test_a_quality_check_that_did_not_run_is_named(
        judged: tuple[dict[str, Any], Any, str]) -> None:  # fmt: skip
    """summary.json's `unchecked` (here: the sampled pass off under a sampled service) is a
    bullet under its verdict, the headline's own words kept; nothing implies it passed."""
    summary, meta, _ = judged
    changed = copy.deepcopy(summary)
    v = changed["verdicts"][0]
    v["headline"] = (f"KEEP {v['candidate']}: greedy output identical; unchecked: sampled "
                     "distribution")
    v["unchecked"] = [{"check": "sampled distribution", "kind": "distribution",
                       "why": "the sampled pass is off (sampling.sampled.enabled: false)"}]
    text = markdown(changed, meta, "t", "results")
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if "unchecked: sampled distribution" in line)
    assert "**KEEP** cand: greedy output identical" in lines[head]
    assert "- *unchecked sampled distribution:* the sampled pass is off " \
        "(sampling.sampled.enabled: false)" in lines[head + 1:]
    assert "quality identical" not in text


def test_the_fairness_reason_is_whole_in_the_gate_table(
        judged: tuple[dict[str, Any], Any, str]) -> None:
    """What differs between the conditions follows the gate's heading line: the table row
    keeps it, not the heading alone."""
    from pytest_osprey.judgement.service.fairness import FairnessResult

    summary, meta, _ = judged
    planted = FairnessResult(ok=False, differences=[
        "dtype: baseline='float16', cand='bfloat16'", "context_length: baseline=4096, cand=2048"],
        not_shown=["quantization (cand)"])
    assert len(planted.summary.splitlines()) > 1
    changed = copy.deepcopy(summary)
    gate = next(g for g in changed["gates"] if g["kind"] == "fairness")
    gate.update(outcome="fail", summary=planted.summary)
    text = markdown(changed, meta, "t", "f")
    row = next(line for line in text.splitlines() if line.startswith("| fairness |"))
    for part in ("differ beyond the drafter", "dtype: baseline='float16', cand='bfloat16'",
                 "context_length: baseline=4096, cand=2048", "not shown: quantization (cand)"):
        assert part in row, row


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("evidence", "words"), [
    ("underpowered", "too few data to trust its pass"),
    ("not_evaluable", "could not have failed"),
])
def test_a_gate_without_the_evidence_to_fail_is_a_bullet_from_its_fields(
        judged: tuple[dict[str, Any], Any, str], evidence: str, words: str) -> None:
    """summary.json's `unproven` entries are data (gate, kind, evidence): the bullet reads
    the evidence field, never words parsed back out of a string."""
    summary, meta, _ = judged
    changed = copy.deepcopy(summary)
    v = changed["verdicts"][0]
    v["unproven"] = [{"gate": "correctness[cand-vs-base]", "kind": "correctness",
                      "evidence": evidence}]
    text = markdown(changed, meta, "t", "results")
    assert f"- *{words}:* correctness\\[cand-vs-base\\]" in text \
        or f"- *{words}:* correctness[cand-vs-base]" in text
