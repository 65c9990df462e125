"""pilot.yaml loading: the shipped pilot loads, and every problem is a ConfigError that names
the file, the 1-based YAML line and the dotted field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from pytest_osprey.config import ConfigError, Pilot, json_schema, load_pilot

ROOT = Path(__file__).resolve().parent.parent
REPO_PILOT = ROOT / "pilot.yaml"
PILOT_TEXT = REPO_PILOT.read_text(encoding="utf-8")


def fake_model(folder: Path, arch: str = "LlamaForCausalLM") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": [arch], "vocab_size": 8, "hidden_size": 4}
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


def project(tmp_path: Path, text: str = PILOT_TEXT, name: str = "pilot.yaml") -> Path:
    """A copy of the repo's pilot layout in tmp_path: pilot file, fake models, trace file."""
    proj = tmp_path / "proj"
    fake_model(proj / "fixtures" / "models" / "tiny-target")
    fake_model(proj / "fixtures" / "models" / "tiny-drafter")
    (proj / "prompts").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "prompts" / "pilot.jsonl", proj / "prompts" / "pilot.jsonl")
    pilot = proj / name
    pilot.write_text(text, encoding="utf-8")
    return pilot


def edited(old: str, new: str, text: str = PILOT_TEXT) -> str:
    assert text.count(old) == 1, f"{old!r} must occur exactly once in the pilot"
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    """1-based line of the first occurrence of needle."""
    index = text.index(needle)
    return text.count("\n", 0, index) + 1


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_pilot(path)
    message = str(info.value)
    assert message.startswith(f"{path}:"), message
    return message


# --------------------------------------------------------------------------- the valid pilot


def test_repo_pilot_loads_with_paths_resolved(tmp_path: Path) -> None:
    path = project(tmp_path)
    pilot = load_pilot(path)
    proj = path.parent
    assert pilot.name == "embedded-cpu"
    assert pilot.baseline == "baseline"
    assert pilot.current is None
    assert pilot.candidates == ["tiny-drafter"]
    assert pilot.primary_load == "concurrent"
    assert pilot.references("tiny-drafter") == ["baseline"]
    assert pilot.target.model == str(proj / "fixtures" / "models" / "tiny-target")
    assert pilot.conditions["tiny-drafter"].drafter == proj / "fixtures" / "models" / "tiny-drafter"
    assert pilot.conditions["baseline"].drafter is None
    assert pilot.trace.files == [proj / "prompts" / "pilot.jsonl"]
    assert pilot.conditions["tiny-drafter"].speculation is not None
    assert pilot.conditions["tiny-drafter"].speculation.num_draft_tokens == 4
    assert pilot.conditions["tiny-drafter"].pins.require_license is True
    assert pilot.limits.latency[0].load == "low"
    assert pilot.cost.setup["tiny-drafter"].pretraining == 0.5
    digest = pilot.digest()
    assert len(digest) == 64 and digest == load_pilot(path).digest()


def test_relative_paths_resolve_against_the_pilot_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    pilot = load_pilot(path)
    assert Path(pilot.target.model) == path.parent / "fixtures" / "models" / "tiny-target"
    # A relative pilot path, from its parent folder: still resolved against the pilot's folder.
    monkeypatch.chdir(tmp_path)
    pilot = load_pilot("proj/pilot.yaml")
    assert pilot.trace.files == [path.parent / "prompts" / "pilot.jsonl"]
    assert pilot.trace.files[0].is_absolute()


def test_home_relative_and_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    fake_model(home / "models" / "drafter")
    monkeypatch.setenv("HOME", str(home))
    trace = tmp_path / "abs-trace.jsonl"
    trace.write_text("{}\n", encoding="utf-8")
    text = edited("drafter: fixtures/models/tiny-drafter", "drafter: ~/models/drafter")
    text = edited("files: [prompts/pilot.jsonl]", f"files: [{trace}]", text)
    pilot = load_pilot(project(tmp_path, text))
    assert pilot.conditions["tiny-drafter"].drafter == home / "models" / "drafter"
    assert pilot.trace.files == [trace]


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = project(tmp_path)
    path.write_bytes(b"\xef\xbb\xbf" + PILOT_TEXT.encode("utf-8"))
    assert load_pilot(path).name == "embedded-cpu"


def test_server_model_ids_are_not_paths(tmp_path: Path) -> None:
    text = edited("engine: transformers", "engine: sglang")
    text = edited("model: fixtures/models/tiny-target", "model: meta-llama/Llama-3.1-8B", text)
    pilot = load_pilot(project(tmp_path, text))
    assert pilot.target.model == "meta-llama/Llama-3.1-8B"


# --------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("old", "new", "dotted", "suggestion"),
    [
        ("speedup_min: 1.1", "speedup_mni: 1.1", "limits.speedup_mni", "speedup_min"),
        ("max_new_tokens_cap: 48", "max_new_token_cap: 48", "max_new_token_cap",
         "max_new_tokens_cap"),
        ("context_length: 1024", "context_lenght: 1024", "target.context_lenght",
         "context_length"),
        ("{algorithm: assisted, num_draft_tokens: 4}", "{algorithm: assisted, num_draft_tokns: 4}",
         "conditions.tiny-drafter.speculation.num_draft_tokns", "num_draft_tokens"),
        ("{require_license: true}", "{require_licence: true}",
         "conditions.tiny-drafter.pins.require_licence", "require_license"),
        ("{metric: ttft,", "{metrc: ttft,", "limits.latency.0.metrc", "metric"),
        ("{pretraining: 0.5,", "{pretrainig: 0.5,", "cost.setup.tiny-drafter.pretrainig",
         "pretraining"),
        ("samples_per_prompt: 4", "sample_per_prompt: 4", "sampling.sampled.sample_per_prompt",
         "samples_per_prompt"),
        ("warmup_requests: 3", "warmup_request: 3", "load.warmup_request", "warmup_requests"),
        ("max_near_tie_fraction: 0.25", "max_near_tie_fractoin: 0.25",
         "limits.quality.max_near_tie_fractoin", "max_near_tie_fraction"),
    ],
)
def test_unknown_key_suggests_the_close_one(
    tmp_path: Path, old: str, new: str, dotted: str, suggestion: str
) -> None:
    text = edited(old, new)
    message = error_of(project(tmp_path, text))
    line = line_of(text, new)
    assert f":{line}: {dotted}: unknown key; did you mean {suggestion!r}?" in message
    assert "(valid: " in message and suggestion in message.split("(valid: ")[1]


def test_unknown_key_without_a_close_match_lists_valid_keys(tmp_path: Path) -> None:
    text = PILOT_TEXT + "zzzz: 1\n"
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'zzzz')}: zzzz: unknown key (valid: name, target," in message
    assert "did you mean" not in message


def test_unknown_key_inside_a_condition_suggests_condition_fields(tmp_path: Path) -> None:
    text = edited("    role: candidate\n", "    role: candidate\n    drafte: x\n")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'drafte:')}: conditions.tiny-drafter.drafte: unknown key; " \
        "did you mean 'drafter'?" in message


def test_a_condition_named_like_a_field_still_gets_the_right_suggestions(tmp_path: Path) -> None:
    # The user's condition name "speculation" must not be mistaken for Condition.speculation.
    text = PILOT_TEXT.replace("tiny-drafter", "speculation")
    text = edited("num_draft_tokens: 4}", "num_draft_tokns: 4}", text)
    message = error_of(project(tmp_path, text))
    assert "conditions.speculation.speculation.num_draft_tokns: unknown key; " \
        "did you mean 'num_draft_tokens'?" in message


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    text = edited("speedup_min: 1.1", "speedup_mni: 1.1")
    text = edited("blocks: 2", "blocks: two", text)
    path = project(tmp_path, text)
    lines = error_of(path).splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"{path}:") for line in lines)
    assert any(f":{line_of(text, 'blocks: two')}: load.blocks:" in line for line in lines)
    assert any(f":{line_of(text, 'speedup_mni')}: limits.speedup_mni:" in line for line in lines)


# --------------------------------------------------------------------------- required fields


@pytest.mark.parametrize(
    ("remove", "parent", "dotted"),
    [
        ("  model: fixtures/models/tiny-target\n", "target:", "target.model"),
        ("  files: [prompts/pilot.jsonl]\n", "trace:", "trace.files"),
        ("    - {metric: ttft, percentile: 90, max_s: 2.0, load: low}\n",
         "    - {metric: ttft, percentile: 90, load: low}\n", "limits.latency.0.max_s"),
    ],
)
def test_missing_required_field(tmp_path: Path, remove: str, parent: str, dotted: str) -> None:
    if parent.startswith(" "):  # replace with a shorter item rather than delete
        text = edited(remove, parent)
        line = line_of(text, parent.strip())
    else:
        text = edited(remove, "")
        line = line_of(text, parent)
    message = error_of(project(tmp_path, text))
    assert f":{line}: {dotted}: required field is missing" in message


def test_missing_top_level_sections(tmp_path: Path) -> None:
    text = "name: only-a-name\n"
    message = error_of(project(tmp_path, text))
    assert ":1: target: required field is missing" in message
    assert ":1: conditions: required field is missing" in message
    assert ":1: trace: required field is missing" in message


# --------------------------------------------------------------------------- wrong types, numbers


@pytest.mark.parametrize(
    ("old", "new", "dotted", "says"),
    [
        ("blocks: 2", "blocks: two", "load.blocks", "valid integer"),
        ("greedy: true", "greedy: maybe", "sampling.greedy", "valid boolean"),
        ("files: [prompts/pilot.jsonl]", "files: prompts/pilot.jsonl", "trace.files",
         "valid list"),
        ("{low: 1, concurrent: 4}", "{low: one, concurrent: 4}", "load.levels.low",
         "valid integer"),
        ("order: abba", "order: random", "load.order", "'abba' or 'sequential'"),
        ("engine: transformers", "engine: tensorrt", "target.engine", "'transformers'"),
        ("speedup_min: 1.1", "speedup_min: [1.1]", "limits.speedup_min", "valid number"),
        ("role: candidate", "role: challenger", "conditions.tiny-drafter.role", "'candidate'"),
        ("title: Embedded CPU pilot (tiny models)", "title: {a: 1}", "report.title",
         "valid string"),
        ("    role: candidate\n", "    role: candidate\n    engine_args: --flag\n",
         "conditions.tiny-drafter.engine_args", "valid list"),
        ("  baseline:\n    role: baseline            # speculation off: the kill switch, "
         "always kept\n", "  baseline: off\n", "conditions.baseline", "valid dictionary"),
        ("speculation: {algorithm: assisted, num_draft_tokens: 4}", "speculation: assisted",
         "conditions.tiny-drafter.speculation", "valid dictionary"),
    ],
)
def test_wrong_types(tmp_path: Path, old: str, new: str, dotted: str, says: str) -> None:
    text = edited(old, new)
    message = error_of(project(tmp_path, text))
    line = line_of(text, new.strip().split("\n")[-1])
    assert f":{line}: {dotted}: " in message
    assert says in message


@pytest.mark.parametrize(
    ("old", "new", "dotted", "says"),
    [
        ("speedup_min: 1.1", "speedup_min: -1", "limits.speedup_min", "greater than 0"),
        ("speedup_min: 1.1", "speedup_min: 0", "limits.speedup_min", "greater than 0"),
        ("speedup_min: 1.1", "speedup_min: .inf", "limits.speedup_min", "finite"),
        ("speedup_min: 1.1", "speedup_min: .nan", "limits.speedup_min", "finite"),
        ("max_new_tokens_cap: 48", "max_new_tokens_cap: -5", "max_new_tokens_cap",
         "greater than or equal to 1"),
        ("max_new_tokens_cap: 48", "max_new_tokens: 10000000", "max_new_tokens",
         "less than or equal to 1000000"),
        ("{low: 1, concurrent: 4}", "{low: 1, concurrent: 1000000}", "load.levels.concurrent",
         "less than or equal to 100000"),
        ("num_draft_tokens: 4}", "num_draft_tokens: 1000}",
         "conditions.tiny-drafter.speculation.num_draft_tokens", "less than or equal to 64"),
        ("warmup_requests: 3", "warmup_requests: -1", "load.warmup_requests",
         "greater than or equal to 0"),
        ("top_p: 1.0", "top_p: 1.5", "sampling.sampled.top_p", "less than or equal to 1"),
        ("device_hour_price: 0.10", "device_hour_price: -0.1", "cost.device_hour_price",
         "greater than or equal to 0"),
        ("percentile: 90", "percentile: 100", "limits.latency.0.percentile", "less than 100"),
        ("context_length: 1024", "context_length: 1.5", "target.context_length",
         "fractional part"),
        ("{pretraining: 0.5,", "{pretraining: -0.5,", "cost.setup.tiny-drafter.pretraining",
         "greater than or equal to 0"),
    ],
)
def test_out_of_range_numbers(tmp_path: Path, old: str, new: str, dotted: str, says: str) -> None:
    text = edited(old, new)
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, new)}: {dotted}: " in message
    assert says in message


def test_integer_too_long_for_python_is_a_yaml_error_with_its_line(tmp_path: Path) -> None:
    text = edited("max_new_tokens_cap: 48", "max_new_tokens_cap: 1" + "0" * 5000)
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'max_new_tokens_cap')}: not valid YAML: cannot read" in message


# --------------------------------------------------------------------------- roles


BASELINE_LINE = "    role: baseline            # speculation off: the kill switch, always kept\n"


def test_zero_baselines(tmp_path: Path) -> None:
    text = edited(BASELINE_LINE, "    role: current\n")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'conditions:')}: conditions: exactly one condition must have " \
        "role: baseline" in message
    assert "found 0" in message


def test_two_baselines(tmp_path: Path) -> None:
    text = edited(BASELINE_LINE, BASELINE_LINE + "  plain2:\n    role: baseline\n")
    message = error_of(project(tmp_path, text))
    line = line_of(text, "  plain2:") + 1
    assert f":{line}: conditions.plain2.role: exactly one condition must have role: baseline" \
        in message
    assert "found 2" in message


def test_two_current_drafters(tmp_path: Path) -> None:
    extra = (
        "  cur-a: {role: current, drafter: fixtures/models/tiny-drafter}\n"
        "  cur-b: {role: current, drafter: fixtures/models/tiny-drafter}\n"
    )
    text = edited(BASELINE_LINE, BASELINE_LINE + extra)
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'cur-b')}: conditions.cur-b.role: at most one condition may have " \
        "role: current" in message


def test_one_current_is_fine_and_is_a_reference(tmp_path: Path) -> None:
    extra = "  today: {role: current, drafter: fixtures/models/tiny-drafter}\n"
    pilot = load_pilot(project(tmp_path, edited(BASELINE_LINE, BASELINE_LINE + extra)))
    assert pilot.current == "today"
    assert pilot.references("tiny-drafter") == ["baseline", "today"]


def test_baseline_with_a_drafter(tmp_path: Path) -> None:
    text = edited(BASELINE_LINE, "    role: candidate\n")
    text = edited("    role: candidate\n    drafter:", "    role: baseline\n    drafter:", text)
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, '  tiny-drafter:')}: conditions.tiny-drafter: the baseline runs " \
        "with speculation off" in message


def test_baseline_with_speculation_only(tmp_path: Path) -> None:
    text = edited(BASELINE_LINE, BASELINE_LINE + "    speculation: {algorithm: NGRAM}\n")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, '  baseline:')}: conditions.baseline: the baseline runs" in message


@pytest.mark.parametrize("bad", ["tiny drafter", "tiny/drafter", "'tiny:drafter'", "''"])
def test_bad_condition_names(tmp_path: Path, bad: str) -> None:
    text = PILOT_TEXT.replace("tiny-drafter:", f"{bad}:")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'conditions:')}: conditions: condition name" in message
    assert "use letters, digits, '-', '_', '.'" in message


def test_no_conditions_at_all(tmp_path: Path) -> None:
    text = "target: {model: m}\nconditions: {}\ntrace: {files: [t.jsonl]}\n"
    message = error_of(project(tmp_path, text))
    assert ":2: conditions: " in message and "at least 1" in message


# --------------------------------------------------------------------------- paths


def test_drafter_folder_missing(tmp_path: Path) -> None:
    text = edited("drafter: fixtures/models/tiny-drafter", "drafter: fixtures/models/nope")
    path = project(tmp_path, text)
    message = error_of(path)
    want = path.parent / "fixtures" / "models" / "nope"
    assert message == (
        f"{path}:{line_of(text, '    drafter:')}: conditions.tiny-drafter.drafter: "
        f"no such directory: {want}"
    )


def test_drafter_is_a_file_not_a_folder(tmp_path: Path) -> None:
    text = edited("drafter: fixtures/models/tiny-drafter", "drafter: prompts/pilot.jsonl")
    assert "conditions.tiny-drafter.drafter: no such directory" in error_of(project(tmp_path, text))


def test_target_model_missing(tmp_path: Path) -> None:
    text = edited("model: fixtures/models/tiny-target", "model: fixtures/models/gone")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'model: fixtures')}: target.model: no such directory: " in message


def test_overlong_path_is_a_config_error_not_oserror(tmp_path: Path) -> None:
    text = edited("drafter: fixtures/models/tiny-drafter", "drafter: " + "d" * 5000)
    message = error_of(project(tmp_path, text))
    assert "conditions.tiny-drafter.drafter: no such directory" in message


def test_trace_file_missing(tmp_path: Path) -> None:
    text = edited("files: [prompts/pilot.jsonl]", "files: [prompts/pilot.jsonl, prompts/x.jsonl]")
    path = project(tmp_path, text)
    message = error_of(path)
    assert message == (
        f"{path}:{line_of(text, 'files:')}: trace.files.1: no such file: "
        f"{path.parent / 'prompts' / 'x.jsonl'}"
    )


def test_trace_file_missing_in_block_list_names_its_own_line(tmp_path: Path) -> None:
    text = edited(
        "files: [prompts/pilot.jsonl]", "files:\n    - prompts/pilot.jsonl\n    - prompts/y.jsonl"
    )
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, '- prompts/y.jsonl')}: trace.files.1: no such file" in message


def test_endpoint_engine_needs_endpoints(tmp_path: Path) -> None:
    text = edited("engine: transformers", "engine: endpoint")
    text = edited("model: fixtures/models/tiny-target", "model: served-model", text)
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, '  baseline:')}: conditions.baseline: target.engine is endpoint" \
        in message


# --------------------------------------------------------------------------- cross references


def test_unknown_primary_load(tmp_path: Path) -> None:
    text = edited("primary_load: concurrent", "primary_load: busy")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'primary_load')}: decision.primary_load: load level 'busy' is not " \
        "in load.levels (low, concurrent)" in message


def test_unknown_latency_limit_load(tmp_path: Path) -> None:
    text = edited("max_s: 2.0, load: low}", "max_s: 2.0, load: lo}")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'load: lo}')}: limits.latency.0.load: load level 'lo' is not in " \
        "load.levels" in message


def test_cost_setup_names_unknown_condition(tmp_path: Path) -> None:
    text = edited("    tiny-drafter: {pretraining", "    tiny-draftr: {pretraining")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'tiny-draftr')}: cost.setup.tiny-draftr: cost.setup names unknown " \
        "condition 'tiny-draftr'" in message


def test_direct_construction_still_checks_cross_references() -> None:
    data = {
        "target": {"model": "m"},
        "conditions": {"a": {"role": "candidate", "drafter": "d"}},
        "trace": {"files": ["t"]},
    }
    with pytest.raises(ValidationError, match="exactly one condition must have role: baseline"):
        Pilot.model_validate(data)
    data["conditions"] = {"b": {"role": "baseline"}}
    assert Pilot.model_validate(data).baseline == "b"


# --------------------------------------------------------------------------- the file itself


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    text = edited("  dtype: float32\n", "  dtype: float32\n   bad: indent\n")
    message = error_of(project(tmp_path, text))
    assert message.endswith("not valid YAML: mapping values are not allowed here")
    assert f":{line_of(text, 'bad: indent')}: " in message


def test_unclosed_flow_sequence(tmp_path: Path) -> None:
    text = edited("files: [prompts/pilot.jsonl]", "files: [prompts/pilot.jsonl")
    message = error_of(project(tmp_path, text))
    assert "not valid YAML" in message


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
        ('"\\ud800"', "surrogates not allowed"),
    ],
)
def test_yaml_values_that_cannot_be_built(tmp_path: Path, value: str, says: str) -> None:
    text = edited("name: embedded-cpu", f"name: {value}")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'name:')}: not valid YAML: cannot read" in message
    assert says in message


def test_unsafe_tags_are_refused(tmp_path: Path) -> None:
    text = edited("name: embedded-cpu", "name: !!python/object/apply:os.system [echo hi]")
    assert "not valid YAML" in error_of(project(tmp_path, text))


def test_too_deeply_nested(tmp_path: Path) -> None:
    text = edited("name: embedded-cpu", "name: " + "[" * 1000 + "]" * 1000)
    assert "not valid YAML: nested too deeply" in error_of(project(tmp_path, text))


def test_recursive_alias(tmp_path: Path) -> None:
    text = edited("title: Embedded CPU pilot (tiny models)", "title: &loop [*loop]")
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, 'title:')}: report.title: " in message


def test_alias_bomb_is_not_expanded(tmp_path: Path) -> None:
    bomb = "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
    )
    message = error_of(project(tmp_path, PILOT_TEXT + bomb))
    assert "x8: unknown key" in message


def test_string_keys_required(tmp_path: Path) -> None:
    text = PILOT_TEXT + "1: 2\n"
    message = error_of(project(tmp_path, text))
    assert f":{line_of(text, '1: 2')}: 1: " in message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "", "# only a comment\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    path = project(tmp_path, text)
    assert error_of(path) == f"{path}: the pilot file must be a mapping (key: value) at top level"


def test_two_documents(tmp_path: Path) -> None:
    message = error_of(project(tmp_path, PILOT_TEXT + "---\nname: again\n"))
    assert "not valid YAML" in message


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
