"""Every field docs/summary-json.md documents, checked against a real run's summary.json: it
is written wherever its section occurs, null only where documented so, and its documented
unit holds (seconds, MiB, fractions, counts, ratios, times, digests). Then the new fields'
meanings: the campaign's ending, the models, the set-up as fields, speedups beside figures,
what the memory figure holds and no accept length for the baseline."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from pytest_osprey.judgement.figures.measured import figures_for, memory_kind
from pytest_osprey.report.setup import models, setup_facts
from pytest_osprey.report.summary_schema import SetupFacts, Summary
from pytest_osprey.results.folder import load_campaign
from testkit.factories import ROOT, make_record, saved_campaign
from testkit.recorded_campaign import judge_as_the_plugin_does, record_campaign, write_project

DOC = ROOT / "docs" / "summary-json.md"

# Sections this run has no instance of: each says why.
NOT_IN_THIS_RUN = {
    "Rejudged": "set on a re-judged copy only",
    "Comparison": "needs --osprey-compare",
    "Finding": "part of a comparison",
    "ShardEntry": "a merged campaign's",
    "UncheckedEntry": "every quality check ran",
    "UnprovenEntry": "every gating gate had the evidence to fail",
    "BlockLoad": "the recorded schedule logs no stretches",
}


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("documented")
    project = write_project(root)
    results = root / "results"
    record_campaign(project, results)
    judge_as_the_plugin_does(project, results)
    sheet: dict[str, Any] = json.loads((results / "summary.json").read_text("utf-8"))
    sheet["_folder"] = str(results)
    return sheet


def documented() -> dict[str, list[tuple[str, str, str]]]:
    """Section (model name) -> its rows (key, type, meaning), as the reference prints them."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for part in DOC.read_text("utf-8").split("\n## ")[1:]:
        name = part.splitlines()[0].strip()
        if name == "Gate kinds":
            continue
        rows = []
        for line in part.splitlines():
            if not line.startswith("| `"):
                continue
            cells = [c.strip() for c in line.replace("\\|", "\x00").strip("|").split("|")]
            key, kind, meaning = (c.replace("\x00", "|") for c in cells)
            rows.append((key.strip("`"), kind, meaning))
        out[name] = rows
    return out


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models(arg)


def instances(model: type[BaseModel], value: Any,
              found: dict[str, list[dict[str, Any]]]) -> None:
    """Every JSON object of ``value`` that ``model`` describes, by model name."""
    if value is None:
        return
    found.setdefault(model.__name__, []).append(value)
    for name, field in model.model_fields.items():
        child = value.get(field.alias or name)
        for sub in dict.fromkeys(_models(field.annotation)):
            items = (child.values() if isinstance(child, dict) and sub is not field.annotation
                     and not _direct(field.annotation, sub) else
                     child if isinstance(child, list) else [child])
            for item in items:
                if isinstance(item, dict):
                    instances(sub, item, found)


def _direct(annotation: Any, sub: type[BaseModel]) -> bool:
    """``annotation`` is ``sub`` or ``sub | None`` (an object, not a mapping of them)."""
    args = set(get_args(annotation))
    return annotation is sub or (sub in args and args <= {sub, type(None)})


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# (what the meaning says, the check it implies); each must fire at least once.
UNITS: list[tuple[str, Any]] = [
    ("seconds", lambda k, v: _number(v) and v >= 0),
    ("MiB", lambda k, v: _number(v) and v >= 0),
    ("0-1", lambda k, v: _number(v) and 0 <= v <= 1),
    ("count", lambda k, v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    ("ratio", lambda k, v: _number(v) and v > 0),
    ("Unix time", lambda k, v: _number(v) and v >= 0),
    ("ISO 8601", lambda k, v: isinstance(v, str) and datetime.fromisoformat(v).tzinfo),
    ("hex", lambda k, v: isinstance(v, str) and re.fullmatch("[0-9a-f]+", v) is not None),
]


def _unit_of(key: str, meaning: str) -> str | None:
    if key.endswith("_s") or "(seconds)" in meaning:
        return "seconds"
    if key.endswith("_mb") or "(MiB)" in meaning:
        return "MiB"
    for marker, unit in (("(0-1", "0-1"), ("0-1)", "0-1"), ("(count)", "count"),
                         ("(ratio", "ratio"), ("Unix time", "Unix time"),
                         ("ISO 8601", "ISO 8601"), ("(hex)", "hex"), ("16 hex", "hex")):
        if marker in meaning:
            return unit
    return None


@pytest.mark.slow  # over a second on 2 busy cores
def test_every_documented_field_is_written_and_means_what_it_says(
        summary: dict[str, Any]) -> None:
    found: dict[str, list[dict[str, Any]]] = {}
    instances(Summary, {k: v for k, v in summary.items() if k != "_folder"}, found)
    doc = documented()
    assert set(doc) - set(found) == set(NOT_IN_THIS_RUN), "a section no run writes"
    fired: set[str] = set()
    checks = dict(UNITS)
    for section, rows in doc.items():
        for obj in found.get(section, []):
            for key, kind, meaning in rows:
                assert key in obj, f"{section}.{key} documented but not written"
                value = obj[key]
                if value is None:
                    assert "null" in kind, f"{section}.{key} is null, documented as {kind}"
                    continue
                unit = _unit_of(key, meaning)
                if unit is None or not (_number(value) or isinstance(value, str)):
                    continue
                if isinstance(value, float) and math.isinf(value):
                    continue  # an unbounded limit, documented as Infinity
                assert checks[unit](key, value), f"{section}.{key} = {value!r}: not {unit}"
                fired.add(unit)
    assert fired == {u for u, _ in UNITS}, "a unit no field of this run exercises"


def test_the_campaign_says_how_it_ran_and_when(summary: dict[str, Any]) -> None:
    c = summary["campaign"]
    meta = load_campaign(Path(summary["_folder"])).meta
    assert (c["passes_planned"], c["passes_run"], c["stopped_early"]) == (2, 2, False)
    assert c["tool_version"] == meta.tool_version
    assert (c["started_at"], c["ended_at"]) == (meta.started_at, meta.ended_at)
    assert datetime.fromisoformat(c["started_at_iso"]).timestamp() == c["started_at"]
    assert datetime.fromisoformat(c["ended_at_iso"]).timestamp() == c["ended_at"]
    assert c["text"] == "ran 2 of 2 passes"
    # The planned size and the quality passes' share, as campaign.json records them.
    assert meta.size is not None and c["requests_planned"] == meta.size.requests
    assert 0 < c["quality_requests"] < c["requests_planned"]
    assert c["quality_share"] == meta.size.quality_share
    assert c["draws"] == {k: d.prompt_ids for k, d in meta.draws.items()} and c["draws"]


def test_models_carry_the_engine_digests(summary: dict[str, Any]) -> None:
    meta = load_campaign(Path(summary["_folder"])).meta
    models = summary["models"]
    fp = meta.conditions["baseline"].fingerprint
    assert models["target"] == {"path": fp["model"], "digest": fp["model_digest"]}
    assert set(models["drafters"]) == {"current", "cand", "slow"}  # not the baseline
    for name, entry in models["drafters"].items():
        fp = meta.conditions[name].fingerprint
        assert entry == {"path": fp["drafter"], "digest": fp["drafter_digest"]}


def test_setup_facts_are_fields(summary: dict[str, Any]) -> None:
    s = summary["setup_facts"]
    assert (s["engine"], s["engine_version"], s["dtype"], s["threads"]) == (
        "transformers", "4.56.0", "float32", 2)
    assert s["hardware"]["cpus"] == 2 and s["hardware"]["machine"] == "x86_64"
    assert s["sampling"]["serving"]["temperature"] == 0.0
    assert set(s["speculation"]) == {"current", "cand", "slow"}
    assert s["speculation"]["cand"]["num_draft_tokens"] == 2
    assert s["differs"] == [] and s["load_levels"] == {"low": 1, "busy": 4}


def test_speedups_sit_beside_the_figures(summary: dict[str, Any]) -> None:
    gates = {(g["condition"], g["load"]): g for g in summary["gates"]
             if g["kind"] == "speedup" and g["reference"] == "baseline" and not g["slice"]}
    assert gates
    for f in summary["figures"]:
        gate = gates.get((f["condition"], f["load"]))
        if gate is None:
            assert f["speedup"] is None and f["speedup_ci"] is None
        else:
            assert f["speedup"] == gate["estimate"] and f["speedup_ci"] == gate["ci"]
    assert all(f["speedup"] is None for f in summary["figures"] if f["condition"] == "baseline")


def test_memory_says_what_it_holds_and_the_baseline_has_no_accept_length(
        summary: dict[str, Any]) -> None:
    assert {c["memory_kind"] for c in summary["conditions"].values()} == {"weights"}
    for f in summary["figures"]:
        assert f["memory_kind"] == "weights"
        drafted = f["condition"] != "baseline"
        assert (f["accept_length_pooled"] is not None) == drafted
        assert (f["accept_length_mean"] is not None) == drafted


def test_a_baseline_counting_steps_still_has_no_accept_length() -> None:
    # The embedded engine counts the baseline's steps too: one token each, read as 1.00.
    records = [make_record(c, f"p{i}", e2e_s=1.0, ttft_s=0.1, output_tokens=8,
                           spec_verify_ct=8 if c == "base" else 4)
               for c in ("base", "cand") for i in range(3)]
    data = saved_campaign(records, baseline="base",
                          conditions={"base": {"role": "baseline"}, "cand": {"role": "candidate"}})
    base, cand = (figures_for(data, c, "low", 1) for c in ("base", "cand"))
    assert (base.accept_length_pooled, base.accept_length_mean) == (None, None)
    assert cand.accept_length_pooled == pytest.approx(2.0)


@pytest.mark.parametrize(("facts", "kind"), [
    ({"kind": "host", "basis": "weights"}, "weights"),
    ({"kind": "host", "basis": "rss"}, "rss_peak"),
    ({"kind": "gpu", "basis": "process"}, "gpu_peak"),
    ({"kind": "gpu", "basis": "device"}, "gpu_peak"),
    (None, None),
])
def test_memory_kind_follows_the_engine_facts(facts: dict[str, str] | None,
                                              kind: str | None) -> None:
    assert memory_kind({} if facts is None else {"memory": facts}) == kind


def test_setup_facts_from_disagreeing_or_loosely_typed_fingerprints() -> None:
    fp = {"engine": "sglang", "version": "0.5.3", "dtype": "bfloat16", "context_length": "2048",
          "threads": "many", "speculation": {"asked": {"algorithm": "EAGLE3", "num_steps": 3},
                                             "ran": {"num_steps": 2, "eagle_topk": 1}}}
    data = saved_campaign([make_record("base"), make_record("cand")], baseline="base",
                          host={"cpus": 16, "machine": "x86_64"},
                          conditions={"base": {"role": "baseline", "fingerprint": {
                              **fp, "speculation": None}},
                                      "cand": {"role": "candidate", "fingerprint": {
                                          **fp, "dtype": "float16", "drafter": "/m/d"}}})
    facts = SetupFacts.model_validate(setup_facts(data.meta)).model_dump()
    assert facts["dtype"] is None and facts["differs"] == ["dtype"]
    assert (facts["context_length"], facts["threads"]) == (2048, None)
    assert facts["hardware"]["cpus"] == 16
    # What the engine read back wins over what was asked; what it does not say, as asked.
    assert facts["speculation"] == {"cand": {
        "algorithm": "EAGLE3", "num_steps": 2, "eagle_topk": 1, "num_draft_tokens": None,
        "adaptive": None, "draft_loop": None}}
    assert models(data.meta)["drafters"] == {"cand": {"path": "/m/d", "digest": None}}
