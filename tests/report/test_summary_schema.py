"""summary.json: its schema, its reference, and re-judging a saved campaign reproducing it.

The campaign is synthetic (records written as a run would write them, no engine): a fast
candidate, a slow one with a genuine greedy divergence, a current drafter, near-tie
divergences, failed expect checks, a sampled pass, and cost, memory and latency limits.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from pytest_osprey.__main__ import main
from pytest_osprey.judgement.cost.pricing import BreakEven, ConditionCost
from pytest_osprey.judgement.figures.measured import Figures
from pytest_osprey.judgement.gates import evaluate as decision
from pytest_osprey.report.summary_reference import GATE_KINDS, render_reference
from pytest_osprey.report.summary_schema import SUMMARY_SCHEMA, GateEntry, Summary, json_schema
from testkit.factories import ROOT
from testkit.recorded_campaign import (
    CONDITIONS,
    LEVELS,
    PROMPTS,
    judge_as_the_plugin_does,
    record_campaign,
    write_project,
)

DOC = ROOT / "docs" / "summary-json.md"


@dataclass(frozen=True)
class Run:
    project: Path
    results: Path
    summary: dict[str, Any]
    text: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("summary")
    project = write_project(root)
    results = root / "results"
    record_campaign(project, results)
    judge_as_the_plugin_does(project, results)
    text = (results / "summary.json").read_text("utf-8")
    return Run(project, results, json.loads(text), text)


def _gate(summary: dict[str, Any], kind: str, id_: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        g for g in summary["gates"] if (g["kind"], g["id"]) == (kind, id_)]
    assert len(found) == 1, (kind, id_)
    return found[0]


@pytest.mark.slow  # over a second on 2 busy cores
def test_campaign_exercises_every_gate_kind_and_verdict(run: Run) -> None:
    # Guards the fixture: the other tests mean something only if these all occur.
    s = run.summary
    assert {g["kind"] for g in s["gates"]} == set(GATE_KINDS)
    assert {v["candidate"]: v["verdict"] for v in s["verdicts"]} == {"cand": "KEEP",
                                                                      "slow": "DROP"}
    assert _gate(s, "speedup", "cand-vs-baseline-busy")["outcome"] == "pass"
    assert _gate(s, "speedup", "slow-vs-baseline-busy")["outcome"] in ("fail", "inconclusive")
    assert _gate(s, "greedy_identity", "slow-vs-baseline")["outcome"] == "fail"
    identity = _gate(s, "greedy_identity", "cand-vs-baseline")
    # p07 flips onto the runner-up at a near-tie in each of 2 blocks x 2 levels.
    assert identity["outcome"] == "pass" and len(identity["details"]["near_ties"]) == 4
    assert identity["details"]["rate_test"] == "control"
    assert _gate(s, "memory", "slow-vs-baseline")["outcome"] == "fail"
    assert not any("p_holm" in g["details"] for g in s["gates"])  # no adjustment across gates
    correctness = _gate(s, "correctness", "cand-vs-baseline")
    assert correctness["details"]["at_risk"] == 12 and correctness["evidence"] == "tested"
    assert _gate(s, "correctness", "slow-vs-baseline")["outcome"] == "fail"
    assert _gate(s, "sampling_params", "cand-vs-baseline")["outcome"] == "pass"
    assert _gate(s, "acceptance", "cand-vs-current")["gating"] is False


@pytest.mark.slow  # over a second on 2 busy cores
def test_summary_validates_against_the_json_schema(run: Run) -> None:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(run.summary, schema)
    assert run.summary["schema"] == SUMMARY_SCHEMA


def test_files_without_the_later_additions_still_validate(run: Run) -> None:
    # What summary.json held before the schema was written down is still a valid sheet.
    later = ("comparison", "setup", "stability", "goodput", "domains",
             "acceptance_by_position", "campaign", "models", "setup_facts")
    old = {k: v for k, v in run.summary.items() if k not in later}
    old["verdicts"] = [{k: v[k] for k in ("candidate", "verdict", "reasons")}
                       for v in old["verdicts"]]
    added = ("load_label", "dispatch_lag_p99_s", "cost_per_request", "checked", "correct",
             "correct_fraction", "memory_kind", "speedup", "speedup_ci")
    old["figures"] = [{k: v for k, v in f.items() if k not in added} for f in old["figures"]]
    old["gates"] = [{k: v for k, v in g.items() if k != "evidence"} for g in old["gates"]]
    old["verdicts"] = [{k: v for k, v in v.items() if k not in ("unproven", "unchecked")}
                       for v in old["verdicts"]]
    old["cost"] = {**old["cost"], "table": [{k: v for k, v in c.items() if k != "load_label"}
                                            for c in old["cost"]["table"]]}
    jsonschema.validate(old, json_schema())
    Summary.model_validate(old)


def test_an_unbounded_interval_round_trips(run: Run) -> None:
    # A latency bound from too few samples is inf: json writes Infinity, which reads back.
    sheet = json.loads(run.text)
    sheet["gates"][0]["ci"] = [0.1, float("inf")]
    jsonschema.validate(json.loads(json.dumps(sheet)), json_schema())


@pytest.mark.slow  # over a second on 2 busy cores
def test_schema_rejects_a_broken_sheet(run: Run) -> None:
    bad = json.loads(run.text)
    bad["gates"][0]["outcome"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json_schema())
    del bad["verdicts"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json_schema())


TOP_KEYS = ["schema", "run_id", "pilot_name", "trace_hash", "config_hash", "status",
            "partial", "rejudged", "campaign", "models", "verdicts", "gates", "figures", "cost",
            "conditions", "comparison", "setup", "setup_facts", "stability", "goodput",
            "domains", "acceptance_by_position", "shards", "merge_note"]
GATE_KEYS = ["kind", "id", "condition", "reference", "load", "slice", "gating", "outcome",
             "evidence", "summary", "estimate", "ci", "threshold", "p_value", "details"]
FIGURE_KEYS = ["condition", "load", "concurrency", "ok", "total", "ttft_p50_s", "ttft_p95_s",
               "e2e_p50_s", "e2e_p95_s", "tpot_p50_s", "tpot_p95_s", "ttft_p99_s",
               "e2e_p99_s", "tpot_p99_s", "tokens_per_s",
               "request_tokens_per_s_p50", "accept_length_pooled", "accept_length_mean",
               "peak_memory_mb", "load_label", "dispatch_lag_p99_s", "cost_per_request",
               "checked", "correct", "correct_fraction", "in_flight_mean", "in_flight_min",
               "in_flight_within", "achieved_rate", "fillers", "requests_per_s",
               "input_tokens_mean", "output_tokens_mean", "output_tokens_total", "duration_s",
               "memory_kind", "speedup", "speedup_ci"]
COST_KEYS = ["currency", "device_hour_price", "devices_per_server", "expected_requests_per_day",
             "primary_load", "limits", "table", "break_even"]
COST_ROW_KEYS = ["condition", "load", "concurrency", "ok", "total", "busy_s",
                 "requests_per_hour", "hourly_cost", "cost_per_request", "setup_cost",
                 "currency", "load_label"]
BREAK_EVEN_KEYS = ["candidate", "reference", "load", "currency", "setup_cost",
                   "cost_reference", "cost_candidate", "savings_per_request", "requests",
                   "days", "reason"]


def test_golden_structure(run: Run) -> None:
    s = run.summary
    assert list(s) == TOP_KEYS and s["comparison"] is None
    assert all(list(g) == GATE_KEYS for g in s["gates"])
    assert all(list(f) == FIGURE_KEYS for f in s["figures"])
    assert [(f["condition"], f["load"]) for f in s["figures"]] == [
        (c, level) for c in CONDITIONS for level in LEVELS]
    assert list(s["cost"]) == COST_KEYS
    assert list(s["cost"]["limits"]) == ["max_cost_per_request", "max_break_even_days"]
    assert all(list(c) == COST_ROW_KEYS for c in s["cost"]["table"])
    assert [list(b) for b in s["cost"]["break_even"]] == [BREAK_EVEN_KEYS] * 4  # 2 x 2 refs
    assert list(s["verdicts"][0]) == ["candidate", "verdict", "reasons", "headline", "bullets",
                                      "notes", "unproven", "unchecked", "next_step", "crossover"]
    assert all(len(v["headline"]) <= 160 for v in s["verdicts"])
    assert list(s["goodput"]) == ["ttft_s", "tpot_s", "e2e_s", "min_share", "margin", "table"]
    assert [(r["condition"], r["load"]) for r in s["goodput"]["table"]] == [
        (c, level) for c in CONDITIONS for level in LEVELS]
    assert {r["what"] for r in s["setup"]} >= {"engine", "hardware", "dtype", "replay",
                                               "load levels"}
    assert list(s["stability"]) == ["baseline", "drift", "max_drift", "load", "cpus",
                                    "warnings"]
    assert {(d["candidate"], d["domain"]) for d in s["domains"]} == {("cand", "d"),
                                                                     ("slow", "d")}
    assert all(list(c) == ["role", "error", "boot_s", "peak_memory_mb", "memory_kind"]
               for c in s["conditions"].values())
    # Every quality check the recorded campaign ran is checked; the one it did not, named.
    for v in s["verdicts"]:
        assert [list(u) for u in v["unchecked"]] == [["check", "kind", "why"]] * len(
            v["unchecked"])
        assert "sampled distribution" not in [u["check"] for u in v["unchecked"]], v
        if v["unchecked"]:
            assert "quality identical" not in v["headline"], v
            assert "unchecked: " in v["headline"] or "quality unproven: " in v["headline"], v
    # Counts stay integers, CIs pairs.
    assert _gate(s, "greedy_identity", "cand-vs-baseline")["estimate"] == 0
    assert '"estimate": 0,' in run.text
    assert all(g["ci"] is None or len(g["ci"]) == 2 for g in s["gates"])


def test_figures_cover_each_condition_and_level(run: Run) -> None:
    s = run.summary
    costs = {(c["condition"], c["load"]): c["cost_per_request"] for c in s["cost"]["table"]}
    for f in s["figures"]:
        for key in ("ttft_p50_s", "e2e_p95_s", "tpot_p50_s", "tokens_per_s",
                    "request_tokens_per_s_p50", "peak_memory_mb", "cost_per_request"):
            assert f[key] is not None and f[key] > 0, (f["condition"], f["load"], key)
        assert f["cost_per_request"] == costs[(f["condition"], f["load"])]
        assert f["checked"] == len(PROMPTS)
        drafted = f["condition"] != "baseline"
        assert (f["accept_length_pooled"] is not None) == drafted
        assert f["accept_length_pooled"] == (pytest.approx(2.0) if drafted else None)
    slow = next(f for f in s["figures"] if (f["condition"], f["load"]) == ("slow", "low"))
    assert slow["correct"] == len(PROMPTS) - 1
    assert slow["correct_fraction"] == pytest.approx(11 / 12)
    current = next(f for f in s["figures"] if (f["condition"], f["load"]) == ("current", "busy"))
    assert (current["ok"], current["total"]) == (2 * len(PROMPTS) - 1, 2 * len(PROMPTS))


@pytest.mark.slow  # over a second on 2 busy cores
def test_rejudging_reproduces_the_summary(
    run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m pytest_osprey report DIR` on the saved campaign: the same sheet, exactly,
    in a marked copy (``rejudged``) beside the untouched original.

    Nothing else is excluded: judging reads only the saved files, the bootstrap and
    permutation tests are seeded by the pilot, and nothing else written depends on the time
    of judging.
    """
    results = tmp_path / "results"
    shutil.copytree(run.results, results)
    assert main(["report", str(results)]) == 1  # one candidate is dropped
    out = capsys.readouterr().out
    assert "KEEP cand" in out and "DROP slow" in out
    assert (results / "summary.json").read_text("utf-8") == run.text  # untouched
    copy = next(results.glob("rejudged-*"))
    marked = json.loads((copy / "summary.json").read_text("utf-8"))
    assert marked["rejudged"]["source"] == str(results)
    marked["rejudged"] = None  # in place: the key order is part of the sheet
    again = json.dumps(marked, indent=2, ensure_ascii=False) + "\n"
    summary = json.loads(again)
    # Gate by gate first, so that a difference names its gate.
    before = {(g["kind"], g["id"]): g for g in run.summary["gates"]}
    after = {(g["kind"], g["id"]): g for g in summary["gates"]}
    assert list(after) == list(before)
    for key, gate in before.items():
        for field in ("outcome", "estimate", "ci", "threshold", "p_value", "summary",
                      "details"):
            assert after[key][field] == gate[field], (key, field)
    assert summary["verdicts"] == run.summary["verdicts"]
    assert json.loads(again) == json.loads(run.text)
    assert list(json.loads(again)) == list(json.loads(run.text))
    text = (copy / "report.md").read_text("utf-8")  # names its own folder in its footer
    md = text.replace(f"`{copy.name}/report.html`", f"`{results.name}/report.html`").splitlines(
        keepends=True)
    assert md[2].startswith("_Re-judged copy (")
    assert "".join(md[:2] + md[4:]) == (run.results / "report.md").read_text("utf-8")


def _undeclared(model: BaseModel, where: str) -> list[str]:
    out = [f"{where}.{k}" for k in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value.items() if isinstance(value, dict) else enumerate(
            value if isinstance(value, list) else [value])
        for key, item in items:
            if isinstance(item, BaseModel):
                out += _undeclared(item, f"{where}.{name}[{key}]")
    return out


def test_every_written_key_is_declared(run: Run) -> None:
    # Models keep undeclared keys (so nothing is lost): any such key is undocumented.
    assert _undeclared(Summary.model_validate(run.summary), "summary") == [], (
        "document new summary.json keys in pytest_osprey/report/summary_schema.py")


def test_the_sheet_declares_each_shape_once() -> None:
    # The figures and cost rows judging computes are the summary's own models, not copies.
    assert Summary.model_fields["figures"].annotation == list[Figures]
    cost = Summary.model_fields["cost"].annotation
    assert cost is not None
    assert cost.model_fields["table"].annotation == list[ConditionCost]
    assert cost.model_fields["break_even"].annotation == list[BreakEven]


def test_gate_entries_match_gate_results() -> None:
    result = decision.GateResult(decision.GateSpec("completed", "c", load="low"), "pass", "ok")
    assert list(result.as_dict()) == list(GateEntry.model_fields) == GATE_KEYS


def test_every_gate_kind_is_documented(run: Run) -> None:
    kinds = set(decision.KINDS)
    assert set(GATE_KINDS) == kinds
    nested: dict[str, type[BaseModel]] = {"cost": ConditionCost, "break_even": BreakEven}
    for g in run.summary["gates"]:
        doc = GATE_KINDS[g["kind"]].details
        for key in g["details"]:
            known = key in nested[g["kind"]].model_fields if g["kind"] in nested \
                else f"`{key}`" in doc
            assert known, f"details key {key!r} of {g['kind']} gates is not documented"


def test_reference_doc_is_current() -> None:
    assert DOC.read_text("utf-8") == render_reference(), (
        "docs/summary-json.md is stale: python -m pytest_osprey summary-reference > "
        "docs/summary-json.md"
    )


def test_every_field_is_described() -> None:
    text = render_reference()
    for line in text.splitlines():
        if line.startswith("| `"):
            assert not line.rstrip().endswith("|  |"), f"undocumented field: {line}"
    for model in ("Summary", "GateEntry", "Figures", "CostSection", "Gate kinds"):
        assert f"## {model}" in text


def test_cli_prints_the_schema_and_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary-schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema()
    assert main(["summary-reference"]) == 0
    assert capsys.readouterr().out == render_reference()


def test_serving_figures_follow_from_the_records(run: Run) -> None:
    """Request throughput, token counts and duration are the records' own arithmetic; a p99
    needs P99_MIN_REQUESTS values and is null (said why) below that."""
    from pytest_osprey.judgement.cost.pricing import busy_seconds
    from pytest_osprey.judgement.figures.measured import P99_MIN_REQUESTS
    from pytest_osprey.results.folder import load_campaign

    data = load_campaign(run.results)
    for f in run.summary["figures"]:
        ok = [r for r in data.of(f["condition"], f["load"]) if r.ok]
        wall = busy_seconds(ok)
        assert wall is not None and f["duration_s"] == pytest.approx(wall)
        assert f["requests_per_s"] == pytest.approx(len(ok) / wall)
        assert f["output_tokens_total"] == sum(r.output_tokens or 0 for r in ok)
        assert f["output_tokens_mean"] == pytest.approx(f["output_tokens_total"] / len(ok))
        assert f["tpot_p95_s"] is not None and f["tpot_p95_s"] >= f["tpot_p50_s"]
        assert len(ok) < P99_MIN_REQUESTS and f["ttft_p99_s"] is None
