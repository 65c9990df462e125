"""The ``expect`` checks (prompts/README.md semantics) and the paired correctness gate."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.judgement.correctness import (
    check,
    correctness_by_prompt,
    correctness_gate,
    last_number,
    strip_fence,
)
from pytest_osprey.pilot.trace import Prompt
from pytest_osprey.results.records import RequestRecord


def prompt(pid: str = "p", expect: dict[str, Any] | None = None, slice_: str = "core") -> Prompt:
    return Prompt(id=pid, domain="d", slice=slice_, prompt="q?", messages=None,
                  max_new_tokens=None, expect=expect, file="t.jsonl", line=1)


def record(cond: str, pid: str, text: str, *, ok: bool = True, block: int = 0,
           mode: str = "greedy") -> RequestRecord:
    return RequestRecord(run_id="r", condition=cond, block=block, repetition=block, load="low",
                         concurrency=1, prompt_id=pid, slice="core", domain="d",
                         mode=mode, sample_index=0, ok=ok, output_text=text)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("expect", "output", "passed"),
    [
        ({"type": "exact", "value": "negative"}, "  negative\n", True),
        ({"type": "exact", "value": "negative"}, "Negative", False),
        ({"type": "exact", "value": "negative"}, "negative.", False),
        ({"type": "contains", "value": "Friday"}, "by Friday, please", True),
        ({"type": "contains", "value": "Friday"}, "by friday, please", False),
        ({"type": "contains", "value": "Friday", "case_sensitive": False}, "by FRIDAY", True),
        ({"type": "contains", "value": "Friday", "case_sensitive": True}, "friday", False),
        ({"type": "regex", "pattern": r"def \w+\("}, "x\ndef add(a, b):", True),
        ({"type": "regex", "pattern": r"^answer"}, "The answer", False),
        ({"type": "regex", "pattern": r"(?im)^answer"}, "x\nANSWER: 3", True),
        ({"type": "number", "value": 20}, "x = 5 at first.\nAnswer: 20", True),
        ({"type": "number", "value": 20}, "Answer: 20.\n(checked 3 times)", False),  # last one
        ({"type": "number", "value": 1234567.5}, "Total: $1,234,567.50", True),
        ({"type": "number", "value": -4}, "so x = -4", True),
        ({"type": "number", "value": 4}, "pages 3-4", True),  # a range, not minus four
        ({"type": "number", "value": 0.3}, "0.30000000000000004", True),  # float noise only
        ({"type": "number", "value": 0.3}, "0.31", False),
        ({"type": "number", "value": 0.3, "tolerance": 0.02}, "0.31", True),
        ({"type": "number", "value": 12}, "12%", True),
        ({"type": "number", "value": 5}, "no digits here", False),
    ],
)
def test_checks(expect: dict[str, Any], output: str, passed: bool) -> None:
    res = check(expect, output)
    assert res.passed is passed, res.detail
    assert res.detail


def test_last_number_reads_separators_signs_and_exponents() -> None:
    assert last_number("1,000 then 2,500,000") == 2_500_000
    assert last_number("list 1,2,3") == 3  # not thousands groups
    assert last_number("\u22127.5 degrees") == -7.5
    assert last_number("about 1.5e3 units") == 1500
    assert last_number("x.5") == 5  # "x.5" is no decimal
    assert last_number("nothing") is None


SCHEMA = {"type": "object", "required": ["name", "qty"],
          "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("output", "passed", "detail"),
    [
        ('{"name": "bolt", "qty": 3}', True, "valid"),
        ('```json\n{"name": "bolt", "qty": 3}\n```', True, "valid"),
        ('```\n{"name": "bolt", "qty": 3}```', True, "valid"),
        ('{"name": "bolt", "qty": "3"}', False, "at qty"),
        ('{"name": "bolt"}', False, "'qty' is a required property"),
        ("Here you go: {\"name\": \"bolt\", \"qty\": 3}", False, "not JSON"),
        ('```json\n{"name": "bolt", "qty": 3}\n```\nextra', False, "not JSON"),
    ],
)
def test_json_schema(output: str, passed: bool, detail: str) -> None:
    pytest.importorskip("jsonschema")
    res = check({"type": "json_schema", "schema": SCHEMA}, output)
    assert res.passed is passed and detail in res.detail, res.detail


def test_json_schema_with_an_invalid_schema_fails_clearly() -> None:
    pytest.importorskip("jsonschema")
    res = check({"type": "json_schema", "schema": {"type": 12}}, "{}")
    assert not res.passed and "schema itself is invalid" in res.detail


def test_json_schema_without_jsonschema_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import now raises ImportError
    res = check({"type": "json_schema", "schema": SCHEMA}, '{"name": "a", "qty": 1}')
    assert not res.passed and "jsonschema not installed" in res.detail


def test_strip_fence_removes_one_surrounding_fence_only() -> None:
    assert strip_fence("```json\n[1]\n```") == "[1]"
    assert strip_fence("  [1]  ") == "[1]"
    assert strip_fence("```\n```inner```\n```") == "```inner```"


@pytest.fixture
def checks_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "osprey_checks_mod.py").write_text(
        "def has_id(prompt, output):\n"
        "    return prompt is not None and prompt.id in output\n"
        "def boom(prompt, output):\n"
        "    raise RuntimeError('checker broke')\n"
        "class Checks:\n"
        "    @staticmethod\n"
        "    def upper(prompt, output):\n"
        "        return output.isupper()\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "osprey_checks_mod"


def test_python_function_gets_the_prompt_and_the_output(checks_module: str) -> None:
    expect = {"type": "python", "function": f"{checks_module}:has_id"}
    assert check(expect, "answer for p", prompt("p")).passed
    res = check(expect, "answer", prompt("p"))
    assert not res.passed and "returned False" in res.detail
    assert check({"type": "python", "function": f"{checks_module}:Checks.upper"}, "OK").passed


@pytest.mark.parametrize(
    ("function", "detail"),
    [
        ("osprey_checks_mod:boom", "raised RuntimeError: checker broke"),
        ("osprey_checks_mod:missing", "cannot load osprey_checks_mod:missing: AttributeError"),
        ("osprey_no_such_module:f", "cannot load osprey_no_such_module:f: ModuleNotFoundError"),
        ("osprey_checks_mod:NOT_CALLABLE", "not a function"),
        ("no_colon", "not of the form"),
    ],
)
def test_python_function_failures_fail_with_the_cause(
    checks_module: str, function: str, detail: str
) -> None:
    res = check({"type": "python", "function": function}, "x", prompt())
    assert not res.passed and detail in res.detail, res.detail


def test_unknown_and_malformed_expects_fail() -> None:
    assert "unknown expect type 'fuzzy'" in check({"type": "fuzzy"}, "x").detail
    res = check({"type": "number"}, "3")
    assert not res.passed and "malformed expect" in res.detail


# --------------------------------------------------------------------------- per prompt


def test_correctness_by_prompt_uses_the_first_ok_greedy_record() -> None:
    prompts = {"a": prompt("a", {"type": "exact", "value": "yes"}), "b": prompt("b"),
               "c": prompt("c", {"type": "contains", "value": "7"})}
    records = [
        record("x", "a", "no", block=1),
        record("x", "a", "yes", block=0),  # earliest block wins
        record("x", "a", "no", block=0, mode="sampled"),
        record("x", "b", "anything"),  # no expect: not judged
        record("x", "c", "7", ok=False),  # failed request: not judged
        record("x", "z", "yes"),  # not in the trace
    ]
    assert correctness_by_prompt(records, prompts) == {"a": True}


# --------------------------------------------------------------------------- the gate


def _campaign(ref: list[bool], cand: list[bool], slices: list[str] | None = None,
              ) -> tuple[list[RequestRecord], list[RequestRecord], dict[str, Prompt]]:
    prompts = {f"p{i}": prompt(f"p{i}", {"type": "exact", "value": "ok"},
                               (slices or ["core"] * len(ref))[i]) for i in range(len(ref))}
    r = [record("base", f"p{i}", "ok" if v else "bad") for i, v in enumerate(ref)]
    c = [record("cand", f"p{i}", "ok" if v else "bad") for i, v in enumerate(cand)]
    return r, c, prompts


def test_identical_answers_pass_non_inferiority() -> None:
    answers = [True] * 40 + [False] * 10
    res = correctness_gate(*_campaign(answers, answers), margin=0.1, alpha=0.05)
    assert res.outcome == "pass" and res.n_pairs == 50
    assert res.reference_rate == res.candidate_rate == 0.8 and res.estimate == 0
    assert not res.losses and "0 newly wrong" in res.summary


def test_many_newly_wrong_answers_fail_and_are_named() -> None:
    ref = [True] * 40
    cand = [True] * 20 + [False] * 20
    res = correctness_gate(*_campaign(ref, cand), margin=0.05, alpha=0.05)
    assert res.outcome == "fail" and res.estimate == -0.5
    assert len(res.losses) == 20 and "p20" in res.losses and "p20:" in res.summary


def test_too_few_pairs_are_inconclusive() -> None:
    res = correctness_gate(*_campaign([True] * 4, [True] * 4), margin=0.05, alpha=0.05)
    assert res.outcome == "inconclusive"


def test_rates_per_slice_and_gains() -> None:
    ref = [True, True, False, True]
    cand = [True, False, True, True]
    res = correctness_gate(*_campaign(ref, cand, ["core", "core", "unusual", "unusual"]),
                           margin=0.2, alpha=0.05)
    assert res.per_slice["core"].reference_rate == 1.0
    assert res.per_slice["core"].candidate_rate == 0.5
    assert res.per_slice["unusual"].candidate_rate == 1.0 and res.per_slice["unusual"].n == 2
    assert res.gains == ["p2"] and list(res.losses) == ["p1"]
    assert "unusual: 100% vs 50% (n=2)" in res.summary


def test_only_prompts_completed_on_both_sides_are_paired() -> None:
    r, c, prompts = _campaign([True] * 30, [True] * 30)
    c[0] = record("cand", "p0", "ok", ok=False)
    res = correctness_gate(r, c, prompts, margin=0.1, alpha=0.05)
    assert res.n_pairs == 29


def test_no_expect_skips_and_nothing_paired_fails() -> None:
    prompts = {"a": prompt("a")}
    res = correctness_gate([record("b", "a", "x")], [record("c", "a", "x")], prompts, 0.05, 0.05)
    assert res.outcome == "skip"
    r, _, prompts = _campaign([True], [True])
    res = correctness_gate(r, [record("cand", "p0", "", ok=False)], prompts, 0.05, 0.05)
    assert res.outcome == "fail" and "nothing to compare" in res.summary
