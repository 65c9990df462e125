"""pilot.yaml loading: the shipped pilot loads, and every problem is a ConfigError that names
the file, the 1-based YAML line and the dotted field.

The tests edit a copy of the repo's pilot.yaml by key (its values may change freely) and check
the line of the edit; fake model folders and trace files make its paths resolve.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from pytest_osprey.pilot.loading import load_pilot, load_pilot_text
from pytest_osprey.pilot.schema import ConfigError, Pilot, json_schema
from testkit.factories import ROOT, fake_model, pilot_layout

PILOT_TEXT = (ROOT / "pilot.yaml").read_text(encoding="utf-8")
REPO: dict[str, Any] = yaml.safe_load(PILOT_TEXT)
ROLES = [c["role"] for c in REPO["conditions"].values()]
NAMES = list(REPO["conditions"])
BASELINE = NAMES[ROLES.index("baseline")]
CAND = NAMES[ROLES.index("candidate")]
LEVELS = list(REPO["load"]["levels"])


# --------------------------------------------------------------------------- helpers


def project(tmp_path: Path, text: str = PILOT_TEXT) -> Path:
    """The repo pilot's layout in tmp_path/proj with ``text`` as its pilot file."""
    path = pilot_layout(tmp_path / "proj", REPO) / "pilot.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _key(key: str, text: str, nth: int | None) -> re.Match[str]:
    """The ``key:`` (block or flow style) and its scalar value, up to , } newline or #."""
    found = list(re.finditer(rf"(?<![\w-]){re.escape(key)}:( ?[^,}}\n#]*)", text))
    if nth is None:
        assert len(found) == 1, f"{key!r} occurs {len(found)} times in pilot.yaml"
        return found[0]
    return found[nth]


def line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def line_of(text: str, needle: str) -> int:
    """1-based line of the first occurrence of needle."""
    return line_at(text, text.index(needle))


def set_value(key: str, value: str, text: str = PILOT_TEXT, nth: int | None = None) -> str:
    m = _key(key, text, nth)
    pad = " " if text[m.end() : m.end() + 1] == "#" else ""
    return text[: m.start()] + f"{key}: {value}{pad}" + text[m.end() :]


def rename_key(key: str, new: str, text: str = PILOT_TEXT, nth: int | None = None) -> str:
    m = _key(key, text, nth)
    return text[: m.start()] + new + ":" + text[m.start() + len(key) + 1 :]


def replace_key(key: str, lines: list[str], text: str = PILOT_TEXT) -> str:
    """Replace a block-style ``key:`` line and its deeper-indented children by ``lines``
    (indented like the key); an empty list deletes it."""
    rows = text.splitlines(keepends=True)
    hits = [i for i, row in enumerate(rows) if re.match(rf"\s*{re.escape(key)}:", row)]
    assert len(hits) == 1, f"{key!r} must start exactly one line"
    i = hits[0]
    indent = len(rows[i]) - len(rows[i].lstrip())
    end = i + 1
    while end < len(rows) and (
        not rows[end].strip() or len(rows[end]) - len(rows[end].lstrip()) > indent
    ):
        end += 1
    new = [" " * indent + line + "\n" for line in lines]
    return "".join(rows[:i] + new + rows[end:])


def add_conditions(lines: list[str], text: str = PILOT_TEXT) -> str:
    """Append condition entries (2-space indent) after the last one under ``conditions:``."""
    rows = text.splitlines(keepends=True)
    i = rows.index("conditions:\n") + 1
    while i < len(rows) and (not rows[i].strip() or rows[i].startswith((" ", "#"))):
        i += 1
    return "".join(rows[:i] + [f"  {line}\n" for line in lines] + rows[i:])


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_pilot(path)
    message = str(info.value)
    assert message.startswith(f"{path}:"), message
    return message


def assert_error(text: str, tmp_path: Path, line: int, dotted: str, says: str) -> str:
    message = error_of(project(tmp_path, text))
    assert f":{line}: {dotted}: " in message, message
    ours = next(row for row in message.splitlines() if f":{line}: {dotted}: " in row)
    assert says in ours, message
    return message


# --------------------------------------------------------------------------- the valid pilot


def test_repo_pilot_loads_with_paths_resolved(tmp_path: Path) -> None:
    path = project(tmp_path)
    pilot = load_pilot(path)
    proj = path.parent
    assert pilot.name == REPO["name"]
    assert pilot.baseline == BASELINE
    assert CAND in pilot.candidates
    assert pilot.primary_load in LEVELS
    assert pilot.references(CAND)[0] == BASELINE
    assert pilot.target.model == str(proj / REPO["target"]["model"])
    assert pilot.conditions[CAND].drafter == proj / REPO["conditions"][CAND]["drafter"]
    assert pilot.conditions[BASELINE].drafter is None
    assert not pilot.conditions[BASELINE].speculates and pilot.conditions[CAND].speculates
    assert pilot.trace.files == [proj / f for f in REPO["trace"]["files"]]
    assert all(f.is_absolute() for f in pilot.trace.files)
    digest = pilot.digest()
    assert len(digest) == 64 and digest == load_pilot(path).digest()


def test_relative_paths_resolve_against_the_pilot_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert Path(load_pilot(path).target.model) == path.parent / REPO["target"]["model"]
    # A relative pilot path, from another folder: still resolved against the pilot's folder.
    monkeypatch.chdir(tmp_path)
    pilot = load_pilot("proj/pilot.yaml")
    assert pilot.trace.files == [path.parent / f for f in REPO["trace"]["files"]]


def test_home_relative_and_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    fake_model(home / "models" / "drafter")
    monkeypatch.setenv("HOME", str(home))
    trace = tmp_path / "abs-trace.jsonl"
    trace.write_text("{}\n", encoding="utf-8")
    text = set_value("drafter", "~/models/drafter")
    text = replace_key("files", [f"files: [{trace}]"], text)
    pilot = load_pilot(project(tmp_path, text))
    assert pilot.conditions[CAND].drafter == home / "models" / "drafter"
    assert pilot.trace.files == [trace]


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = project(tmp_path)
    path.write_bytes(b"\xef\xbb\xbf" + PILOT_TEXT.encode("utf-8"))
    assert load_pilot(path).name == REPO["name"]


def test_server_model_ids_are_not_paths(tmp_path: Path) -> None:
    text = set_value("engine", "sglang")
    text = set_value("model", "meta-llama/Llama-3.1-8B", text)
    assert load_pilot(project(tmp_path, text)).target.model == "meta-llama/Llama-3.1-8B"


# --------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("key", "typo", "dotted"),
    [
        ("speedup_min", "speedup_mni", "limits.speedup_mni"),
        ("max_new_tokens_cap", "max_new_token_cap", "max_new_token_cap"),
        ("context_length", "context_lenght", "target.context_lenght"),
        ("num_draft_tokens", "num_draft_tokns", f"conditions.{CAND}.speculation.num_draft_tokns"),
        ("require_license", "require_licence", f"conditions.{CAND}.pins.require_licence"),
        ("metric", "metrc", "limits.latency.0.metrc"),
        ("pretraining", "pretrainig", f"cost.setup.{CAND}.pretrainig"),
        ("samples_per_prompt", "sample_per_prompt", "sampling.sampled.sample_per_prompt"),
        ("warmup_requests", "warmup_request", "load.warmup_request"),
        ("max_loss_rate", "max_loss_rat", "limits.quality.max_loss_rat"),
        ("drafter", "drafte", f"conditions.{CAND}.drafte"),
        ("primary_load", "primary_lod", "decision.primary_lod"),
    ],
)
def test_unknown_key_suggests_the_close_one(
    tmp_path: Path, key: str, typo: str, dotted: str
) -> None:
    text = rename_key(key, typo)
    message = assert_error(
        text, tmp_path, line_of(text, typo + ":"), dotted, f"unknown key; did you mean {key!r}?"
    )
    assert key in message.split("(valid: ")[1]


def test_unknown_key_without_a_close_match_lists_valid_keys(tmp_path: Path) -> None:
    text = PILOT_TEXT + "zzzz: 1\n"
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'zzzz')}: zzzz: unknown key (valid: name, target," in message
    assert "did you mean" not in message


def test_a_condition_named_like_a_field_still_gets_the_right_suggestions(tmp_path: Path) -> None:
    # The user's condition name "speculation" must not be mistaken for Condition.speculation.
    renamed = PILOT_TEXT.replace(CAND, "speculation")
    text = rename_key("num_draft_tokens", "num_draft_tokns", renamed)
    message = error_of(project(tmp_path, text))
    assert "conditions.speculation.speculation.num_draft_tokns: unknown key; " \
        "did you mean 'num_draft_tokens'?" in message


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    text = rename_key("speedup_min", "speedup_mni")
    text = set_value("passes", "two", text)
    path = project(tmp_path, text)
    lines = error_of(path).splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"{path}:") for line in lines)
    assert any(f":{line_of(text, 'passes: two')}: load.passes:" in line for line in lines)
    assert any(f":{line_of(text, 'speedup_mni')}: limits.speedup_mni:" in line for line in lines)


# --------------------------------------------------------------------------- required fields


@pytest.mark.parametrize(("key", "parent"), [("model", "target"), ("files", "trace")])
def test_missing_required_field(tmp_path: Path, key: str, parent: str) -> None:
    text = replace_key(key, [])
    line = line_of(text, f"\n{parent}:") + 1
    assert_error(text, tmp_path, line, f"{parent}.{key}", "required field is missing")


def test_missing_required_field_in_a_list_item(tmp_path: Path) -> None:
    text = replace_key("latency", ["latency:", f"  - {{metric: ttft, load: {LEVELS[0]}}}"])
    line = line_of(text, "- {metric: ttft")
    assert_error(text, tmp_path, line, "limits.latency.0.max_s", "required field is missing")


def test_missing_top_level_sections(tmp_path: Path) -> None:
    message = error_of(project(tmp_path, "name: only-a-name\n"))
    for section in ("target", "conditions", "trace"):
        assert f":1: {section}: required field is missing" in message


# --------------------------------------------------------------------------- wrong types, numbers


@pytest.mark.parametrize(
    ("key", "value", "dotted", "says"),
    [
        ("passes", "two", "load.passes", "expected an integer, got the string 'two'"),
        ("greedy", "maybe", "sampling.greedy", "expected true or false"),
        ("files", "prompts/pilot.jsonl", "trace.files", "valid list"),
        # The last level: the first is named again under load.level_passes.
        (LEVELS[-1], "one", f"load.levels.{LEVELS[-1]}", "expected an integer"),
        ("order", "random", "load.order", "'interleaved' or 'sequential'"),
        ("engine", "tensorrt", "target.engine", "'transformers'"),
        ("speedup_min", "[1.1]", "limits.speedup_min", "expected a number, got a list"),
        ("title", "{a: 1}", "report.title", "expected a string, got a mapping"),
        ("speculation", "assisted", f"conditions.{CAND}.speculation", "valid dictionary"),
        ("dtype", "[float32]", "target.dtype", "expected a string"),
        ("name", "[a, b]", "name", "expected a string"),
        # Strict: a quoted number is a string, not silently a number.
        ("max_new_tokens_cap", "'48'", "max_new_tokens_cap",
         "expected an integer, got the string '48' (remove the quotes)"),
        ("passes", "true", "load.passes", "expected an integer, got the boolean true"),
        ("greedy", "1", "sampling.greedy", "expected true or false, got the number 1"),
    ],
)
def test_wrong_types(tmp_path: Path, key: str, value: str, dotted: str, says: str) -> None:
    if key in ("files", "speculation"):
        text = replace_key(key, [f"{key}: {value}"])
    else:
        text = set_value(key, value)
    assert_error(text, tmp_path, line_of(text, f"{key}: {value}"), dotted, says)


def test_condition_that_is_not_a_mapping(tmp_path: Path) -> None:
    text = replace_key(BASELINE, [f"{BASELINE}: off"])
    line = line_of(text, f"{BASELINE}: off")
    assert_error(text, tmp_path, line, f"conditions.{BASELINE}", "valid dictionary")


def test_list_given_as_a_string(tmp_path: Path) -> None:
    text = add_conditions(["extra: {role: candidate, drafter: d, engine_args: --flag}"])
    assert_error(text, tmp_path, line_of(text, "extra:"), "conditions.extra.engine_args",
                 "valid list")


@pytest.mark.parametrize(
    ("key", "value", "dotted", "says"),
    [
        ("speedup_min", "-1", "limits.speedup_min", "greater than 0"),
        ("speedup_min", "0", "limits.speedup_min", "greater than 0"),
        ("speedup_min", ".inf", "limits.speedup_min", "finite"),
        ("speedup_min", ".nan", "limits.speedup_min", "finite"),
        ("max_new_tokens_cap", "-5", "max_new_tokens_cap", "greater than or equal to 1"),
        (LEVELS[-1], "1000000", f"load.levels.{LEVELS[-1]}", "less than or equal to 100000"),
        (LEVELS[-1], "0", f"load.levels.{LEVELS[-1]}", "greater than or equal to 1"),
        ("num_draft_tokens", "1000", f"conditions.{CAND}.speculation.num_draft_tokens",
         "less than or equal to 64"),
        ("warmup_requests", "-1", "load.warmup_requests", "greater than or equal to 0"),
        ("passes", "100000", "load.passes", "less than or equal to 64"),
        ("top_p", "1.5", "sampling.sampled.top_p", "less than or equal to 1"),
        ("temperature", "0", "sampling.sampled.temperature", "greater than 0"),
        ("top_p", "0", "sampling.serving.top_p", "greater than 0"),
        ("temperature", "-0.5", "sampling.serving.temperature", "greater than or equal to 0"),
        ("device_hour_price", "-0.1", "cost.device_hour_price", "greater than or equal to 0"),
        ("context_length", "1.5", "target.context_length",
         "expected an integer, got the number 1.5"),
        ("context_length", "8", "target.context_length", "greater than or equal to 16"),
        ("pretraining", "-0.5", f"cost.setup.{CAND}.pretraining", "greater than or equal to 0"),
        ("max_loss_rate", "2", "limits.quality.max_loss_rate", "less than 1"),
    ],
)
def test_out_of_range_numbers(tmp_path: Path, key: str, value: str, dotted: str, says: str) -> None:
    section = dotted.rpartition(".")[0]
    if section == "sampling.sampled":  # the shipped pilot leaves these to the service
        head = "sampled: {enabled: true,"
        assert head in PILOT_TEXT
        text = PILOT_TEXT.replace(head, f"sampled: {{enabled: true, {key}: {value},")
    else:  # the serving sampling's keys come first
        text = set_value(key, value, nth=0 if section == "sampling.serving" else None)
    assert_error(text, tmp_path, line_of(text, f"{key}: {value}"), dotted, says)


def test_huge_max_new_tokens(tmp_path: Path) -> None:
    text = replace_key("max_new_tokens_cap", ["max_new_tokens: 10000000"])
    assert_error(text, tmp_path, line_of(text, "max_new_tokens:"), "max_new_tokens",
                 "less than or equal to 1000000")


def test_latency_percentile_out_of_range(tmp_path: Path) -> None:
    text = replace_key("latency", ["latency:", "  - {metric: e2e, percentile: 100, max_s: 1}"])
    assert_error(text, tmp_path, line_of(text, "- {metric: e2e"), "limits.latency.0.percentile",
                 "less than 100")


def test_integer_too_long_for_python_is_a_yaml_error_with_its_line(tmp_path: Path) -> None:
    text = set_value("max_new_tokens_cap", "1" + "0" * 5000)
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'max_new_tokens_cap')}: not valid YAML: cannot read" in message


# --------------------------------------------------------------------------- roles


def test_zero_baselines(tmp_path: Path) -> None:
    text = set_value("role", "current", nth=ROLES.index("baseline"))
    message = assert_error(text, tmp_path, line_of(text, "conditions:"), "conditions",
                           "no condition has role: baseline; one must (speculation off, the "
                           "kill switch). The conditions are: ")
    assert f"{BASELINE} (current)" in message


def test_two_baselines(tmp_path: Path) -> None:
    text = add_conditions(["plain2:", "  role: baseline"])
    assert_error(text, tmp_path, line_of(text, "plain2:") + 1, "conditions.plain2.role",
                 "exactly one condition may have role: baseline (speculation off, the kill "
                 f"switch); {BASELINE}, plain2 all do")


def test_two_current_drafters(tmp_path: Path) -> None:
    text = add_conditions(["cur-a: {role: current, drafter: d}", "cur-b: {role: current}"])
    assert_error(text, tmp_path, line_of(text, "cur-b"), "conditions.cur-b.role",
                 "at most one condition may have role: current; found 2")


def test_one_current_is_fine_and_is_a_reference(tmp_path: Path) -> None:
    drafter = REPO["conditions"][CAND]["drafter"]
    pilot = load_pilot(project(tmp_path, add_conditions([f"today: {{role: current, "
                                                         f"drafter: {drafter}}}"])))
    assert pilot.current == "today"
    assert pilot.references(CAND) == [BASELINE, "today"]


def test_baseline_with_a_drafter(tmp_path: Path) -> None:
    text = set_value("role", "candidate", nth=ROLES.index("baseline"))
    text = set_value("role", "baseline", text, nth=ROLES.index("candidate"))
    assert_error(text, tmp_path, line_of(text, f"\n  {CAND}:") + 1, f"conditions.{CAND}",
                 "the baseline runs with speculation off: remove drafter/speculation")


def test_baseline_with_speculation_only(tmp_path: Path) -> None:
    text = add_conditions(["fake-base: {role: baseline, speculation: {algorithm: NGRAM}}"])
    text = set_value("role", "candidate", text, nth=ROLES.index("baseline"))
    assert_error(text, tmp_path, line_of(text, "fake-base"), "conditions.fake-base",
                 "the baseline runs with speculation off")


@pytest.mark.parametrize("bad", ["tiny drafter", "tiny/drafter", "'tiny:drafter'", "''", "'é€'"])
def test_bad_condition_names(tmp_path: Path, bad: str) -> None:
    text = add_conditions([f"{bad}: {{role: candidate, drafter: d}}"])
    assert_error(text, tmp_path, line_of(text, "conditions:"), "conditions",
                 "use letters, digits, '-', '_', '.'")


def test_unicode_letters_in_condition_names_are_fine(tmp_path: Path) -> None:
    drafter = REPO["conditions"][CAND]["drafter"]
    text = add_conditions([f"drafter-ü.2: {{role: candidate, drafter: {drafter}}}"])
    assert "drafter-ü.2" in load_pilot(project(tmp_path, text)).candidates


def test_no_conditions_at_all(tmp_path: Path) -> None:
    text = "target: {model: m}\nconditions: {}\ntrace: {files: [t.jsonl]}\n"
    assert_error(text, tmp_path, 2, "conditions", "at least 1")


# --------------------------------------------------------------------------- paths


def test_drafter_folder_missing(tmp_path: Path) -> None:
    text = set_value("drafter", "fixtures/models/nope")
    path = project(tmp_path, text)
    assert error_of(path) == (
        f"{path}:{line_of(text, 'drafter: fixtures/models/nope')}: conditions.{CAND}.drafter: "
        f"no such directory: {path.parent / 'fixtures' / 'models' / 'nope'}"
    )


def test_a_dry_run_may_name_a_drafter_folder_absent_here(tmp_path: Path) -> None:
    """A dry run checks a deployment's command lines where its checkpoints are not (the
    artifact check then says the folder is not on this machine); a run refuses."""
    text = set_value("drafter", "/models/not-here")
    path = project(tmp_path, text)
    assert f"conditions.{CAND}.drafter: no such directory: /models/not-here" in error_of(path)
    pilot = load_pilot(path, absent_drafters=True)
    assert pilot.conditions[CAND].drafter == Path("/models/not-here")


def test_drafter_is_a_file_not_a_folder(tmp_path: Path) -> None:
    text = set_value("drafter", REPO["trace"]["files"][0])
    assert f"conditions.{CAND}.drafter: no such directory" in error_of(project(tmp_path, text))


def test_target_model_missing(tmp_path: Path) -> None:
    text = set_value("model", "fixtures/models/gone")
    assert_error(text, tmp_path, line_of(text, "model: fixtures/models/gone"), "target.model",
                 "no such directory: ")


def test_overlong_path_is_a_config_error_not_oserror(tmp_path: Path) -> None:
    text = set_value("drafter", "d" * 5000)
    assert f"conditions.{CAND}.drafter: no such directory" in error_of(project(tmp_path, text))


def test_trace_file_missing(tmp_path: Path) -> None:
    first = REPO["trace"]["files"][0]
    text = replace_key("files", [f"files: [{first}, prompts/x.jsonl]"])
    path = project(tmp_path, text)
    assert error_of(path) == (
        f"{path}:{line_of(text, 'files:')}: trace.files.1: no such file: "
        f"{path.parent / 'prompts' / 'x.jsonl'}"
    )


def test_trace_file_missing_in_block_list_names_its_own_line(tmp_path: Path) -> None:
    first = REPO["trace"]["files"][0]
    text = replace_key("files", ["files:", f"  - {first}", "  - prompts/y.jsonl"])
    assert_error(text, tmp_path, line_of(text, "- prompts/y.jsonl"), "trace.files.1",
                 "no such file")


def test_endpoint_engine_needs_endpoints(tmp_path: Path) -> None:
    text = set_value("engine", "endpoint")
    text = set_value("model", "served-model", text)
    first = NAMES[0]
    assert_error(text, tmp_path, line_of(text, f"\n  {first}:") + 1, f"conditions.{first}",
                 "target.engine is endpoint: give endpoint.url")


# --------------------------------------------------------------------------- cross references


def test_unknown_primary_load(tmp_path: Path) -> None:
    text = set_value("primary_load", "busy")
    assert_error(text, tmp_path, line_of(text, "primary_load"), "decision.primary_load",
                 f"load level 'busy' is not in load.levels ({', '.join(LEVELS)})")


def test_unknown_latency_limit_load(tmp_path: Path) -> None:
    text = replace_key("latency", ["latency:", "  - {metric: ttft, max_s: 1.0}",
                                   "  - {metric: e2e, max_s: 2.0, load: lo}"])
    assert_error(text, tmp_path, line_of(text, "load: lo}"), "limits.latency.1.load",
                 "load level 'lo' is not in load.levels")


def test_cost_setup_names_unknown_condition(tmp_path: Path) -> None:
    text = rename_key(CAND, "tiny-draftr", nth=-1)  # the last one: under cost.setup
    assert_error(text, tmp_path, line_of(text, "tiny-draftr"), "cost.setup.tiny-draftr",
                 "cost.setup names unknown condition 'tiny-draftr'")


def test_all_cross_reference_problems_at_once(tmp_path: Path) -> None:
    text = set_value("primary_load", "busy")
    text = rename_key(CAND, "tiny-draftr", text, nth=-1)
    text = set_value("role", "candidate", text, nth=ROLES.index("baseline"))
    lines = error_of(project(tmp_path, text)).splitlines()
    assert len(lines) == 3
    assert [line.split(": ")[1] for line in lines] == [
        "conditions", "decision.primary_load", "cost.setup.tiny-draftr"
    ]


def test_direct_construction_still_checks_cross_references() -> None:
    data: dict[str, Any] = {
        "target": {"model": "m"},
        "conditions": {"a": {"role": "candidate", "drafter": "d"}},
        "trace": {"files": ["t"]},
    }
    with pytest.raises(ValidationError, match="no condition has role: baseline"):
        Pilot.model_validate(data)
    data["conditions"] = {"b": {"role": "baseline"}}
    assert Pilot.model_validate(data).baseline == "b"


# --------------------------------------------------------------------------- the file itself


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    text = replace_key("dtype", ["dtype: float32", " bad: indent"])
    message = error_of(project(tmp_path, text))
    assert message == (
        f"{tmp_path / 'proj' / 'pilot.yaml'}:{line_of(text, 'bad: indent')}: "
        "not valid YAML: mapping values are not allowed here"
    )


def test_unclosed_flow_sequence(tmp_path: Path) -> None:
    text = replace_key("files", ["files: [prompts/pilot.jsonl"])
    assert "not valid YAML" in error_of(project(tmp_path, text))


def test_tab_indentation(tmp_path: Path) -> None:
    message = error_of(project(tmp_path, "target:\n\tmodel: x\n"))
    assert ":2: not valid YAML: found character '\\t'" in message


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("2024-13-45", "month must be in 1..12"),
        ("!!float abc", "could not convert"),
        ("!!timestamp soon", "cannot read"),
        ("!!int 12x", "cannot read"),
        ("!!bool maybe", "cannot read"),
        ('"\\ud800"', "surrogates not allowed"),
    ],
)
def test_yaml_values_that_cannot_be_built(tmp_path: Path, value: str, says: str) -> None:
    text = set_value("name", value)
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'name:')}: not valid YAML: cannot read" in message
    assert says in message


def test_unsafe_tags_are_refused(tmp_path: Path) -> None:
    text = set_value("name", "!!python/object/apply:os.system [echo hi]")
    assert "not valid YAML" in error_of(project(tmp_path, text))


def test_too_deeply_nested(tmp_path: Path) -> None:
    text = set_value("name", "[" * 600 + "]" * 600)
    assert "not valid YAML: nested too deeply" in error_of(project(tmp_path, text))


def test_recursive_alias(tmp_path: Path) -> None:
    text = set_value("title", "&loop [*loop]")
    assert_error(text, tmp_path, line_of(text, "title:"), "report.title", "expected a string")


def test_alias_bomb_is_not_expanded(tmp_path: Path) -> None:
    bomb = "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )
    assert "x8: unknown key" in error_of(project(tmp_path, PILOT_TEXT + bomb))


def test_string_keys_required(tmp_path: Path) -> None:
    text = PILOT_TEXT + "1: 2\n"
    path = project(tmp_path, text)
    assert error_of(path) == (f"{path}:{line_of(text, chr(10) + '1: 2') + 1}: the key 1 is read "
                              "by YAML as a number, not a name; quote it ('1':) to use it as a "
                              "name")


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "", "# only a comment\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    path = project(tmp_path, text)
    assert error_of(path) == f"{path}: the pilot file must be a mapping (key: value) at top level"


def test_two_documents(tmp_path: Path) -> None:
    assert "not valid YAML" in error_of(project(tmp_path, PILOT_TEXT + "---\nname: again\n"))


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    assert error_of(path) == f"{path}: no such pilot file"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert "cannot read" in error_of(tmp_path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_unreadable_file(tmp_path: Path) -> None:
    path = project(tmp_path)
    path.chmod(0)
    try:
        assert "cannot read" in error_of(path)
    finally:
        path.chmod(0o644)


def test_not_utf8(tmp_path: Path) -> None:
    path = project(tmp_path)
    path.write_bytes(PILOT_TEXT.encode("utf-8") + b"title2: caf\xe9\n")
    message = error_of(path)
    assert "cannot read" in message and "utf-8" in message


def test_nul_in_pilot_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_pilot(str(tmp_path / "a\x00b.yaml"))


# --------------------------------------------------------------------------- the schema


@pytest.mark.slow  # over a second on 2 busy cores
def test_schema_command_prints_json_schema() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest_osprey", "schema"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    schema = json.loads(out.stdout)
    assert schema == json_schema()
    assert schema["title"] == "Pilot"
    assert {"Target", "Condition", "Speculation", "Limits"} <= set(schema["$defs"])
    assert set(schema["required"]) == {"target", "conditions", "trace"}
    assert schema["$defs"]["Target"]["additionalProperties"] is False


def test_blocks_is_the_former_name_of_passes(tmp_path: Path) -> None:
    old = load_pilot(project(tmp_path, rename_key("passes", "blocks")))
    assert old.load.passes == REPO["load"]["passes"]
    both = rename_key("passes", "passes: 2\n  blocks")
    with pytest.raises(ConfigError, match="passes or its former name blocks"):
        load_pilot(project(tmp_path, both))


def test_abba_is_the_former_name_of_interleaved(tmp_path: Path) -> None:
    """A pilot file is told the new name; a campaign's saved pilot is read as it was meant."""
    text = set_value("order", "abba")
    assert_error(text, tmp_path, line_of(text, "order: abba"), "load.order",
                 "order 'abba' is now called 'interleaved'")
    assert load_pilot_text(text, "saved").load.order == "interleaved"


def test_primary_slice_is_no_key_but_a_saved_pilot_may_have_it(tmp_path: Path) -> None:
    text = PILOT_TEXT.replace("\ndecision:\n", "\ndecision:\n  primary_slice: core\n")
    assert_error(text, tmp_path, line_of(text, "primary_slice:"), "decision.primary_slice",
                 "unknown key")
    assert load_pilot_text(text, "saved").decision == load_pilot_text(PILOT_TEXT, "s").decision


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--port=8000"], ["--uds", "/tmp/s"]])
def test_engine_args_cannot_move_the_bind(tmp_path: Path, args: list[str]) -> None:
    """A bind flag in engine_args would come after the tool's --host 127.0.0.1 and win."""
    text = add_conditions([f"extra: {{role: candidate, drafter: d, engine_args: {args}}}"])
    message = error_of(project(tmp_path, text))
    flag = args[0].split("=")[0]
    assert "conditions.extra.engine_args.0" in message and f"{flag} is set by the tool" in message
    assert "target.host" in message
