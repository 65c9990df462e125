"""The ``expect`` checks (prompts/README.md semantics), the correctness gate and its exact
binomial loss rule."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.quality.correctness import (
    check,
    correctness_by_prompt,
    correctness_gate,
    last_number,
    strip_fence,
)
from pytest_osprey.judgement.stats.core import StatsError
from pytest_osprey.judgement.stats.losses import critical_count, loss_test
from pytest_osprey.pilot.trace import Prompt
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_record


def assert_rate_at_most(hits: int, n: int, alpha: float, what: str) -> None:
    p = stats.binomtest(hits, n, alpha, alternative="greater").pvalue
    assert p > 0.001, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly above {alpha}"


def prompt(pid: str = "p", expect: dict[str, Any] | None = None, slice_: str = "core") -> Prompt:
    return Prompt(id=pid, domain="d", slice=slice_, prompt="q?", messages=None,
                  max_new_tokens=None, expect=expect, file="t.jsonl", line=1)


def record(cond: str, pid: str, text: str, *, ok: bool = True, block: int = 0,
           mode: str = "greedy") -> RequestRecord:
    return make_record(cond, pid, measured=False, block=block, mode=mode, ok=ok,
                       output_text=text)


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


def test_identical_answers_pass_and_gains_never_offset_a_loss() -> None:
    answers = [True] * 40 + [False] * 10
    res = correctness_gate(*_campaign(answers, answers), max_loss_rate=0.0, alpha=0.025)
    assert res.outcome == "pass" and res.n_pairs == 50
    assert res.test is not None and res.test.at_risk == 40 and res.test.losses == 0
    assert res.reference_rate == res.candidate_rate == 0.8 and not res.losses
    assert "0 of 40 answers" in res.summary and "loss rate <= 9%" in res.summary
    # One loss and nine gains: the pass rate rises, the drafter still broke an answer.
    cand = [False] + [True] * 39 + [True] * 9 + [False]
    res = correctness_gate(*_campaign(answers, cand), max_loss_rate=0.0, alpha=0.025)
    assert res.candidate_rate is not None and res.candidate_rate > 0.8
    assert res.outcome == "fail" and list(res.losses) == ["p0"] and len(res.gains) == 9


def test_many_newly_wrong_answers_fail_and_are_named() -> None:
    ref = [True] * 40
    cand = [True] * 20 + [False] * 20
    res = correctness_gate(*_campaign(ref, cand), max_loss_rate=0.05, alpha=0.025)
    assert res.outcome == "fail" and res.test is not None and res.test.critical == 5
    assert len(res.losses) == 20 and "p20" in res.losses and "p20:" in res.summary


def test_a_tolerated_loss_rate_allows_its_critical_count() -> None:
    ref = [True] * 40
    res = correctness_gate(*_campaign(ref, [False] * 5 + [True] * 35), 0.05, 0.025)
    assert res.outcome == "pass" and res.test is not None and res.test.critical == 5
    res = correctness_gate(*_campaign(ref, [False] * 6 + [True] * 34), 0.05, 0.025)
    assert res.outcome == "fail"


def test_a_reference_never_right_is_not_evaluable_and_always_right_is() -> None:
    res = correctness_gate(*_campaign([False] * 13, [False] * 13), 0.0, 0.025)
    assert res.outcome == "skip" and "not evaluable" in res.summary and res.test is not None
    assert res.test.at_risk == 0
    res = correctness_gate(*_campaign([True] * 13, [True] * 13), 0.0, 0.025)
    assert res.outcome == "pass" and res.test is not None and res.test.at_risk == 13
    assert res.test.power[0.1] == pytest.approx(1 - 0.9**13)
    assert res.test.power[0.2] == pytest.approx(1 - 0.8**13)
    assert not res.test.underpowered  # 0.945 >= 0.8 against a 20 % loss rate
    few = correctness_gate(*_campaign([True] * 5, [True] * 5), 0.0, 0.025)
    assert few.outcome == "pass" and few.test is not None and few.test.underpowered


def test_rates_per_slice_and_gains() -> None:
    ref = [True, True, False, True]
    cand = [True, False, True, True]
    res = correctness_gate(*_campaign(ref, cand, ["core", "core", "unusual", "unusual"]),
                           max_loss_rate=0.0, alpha=0.025)
    assert res.per_slice["core"].reference_rate == 1.0
    assert res.per_slice["core"].candidate_rate == 0.5
    assert res.per_slice["unusual"].candidate_rate == 1.0 and res.per_slice["unusual"].n == 2
    assert res.gains == ["p2"] and list(res.losses) == ["p1"]
    assert "unusual: 100% vs 50% (n=2)" in res.summary


def test_only_prompts_completed_on_both_sides_are_paired() -> None:
    r, c, prompts = _campaign([True] * 30, [True] * 30)
    c[0] = record("cand", "p0", "ok", ok=False)
    res = correctness_gate(r, c, prompts, max_loss_rate=0.0, alpha=0.025)
    assert res.n_pairs == 29


def test_the_reference_rerun_is_reported_as_a_control() -> None:
    r, c, prompts = _campaign([True] * 10, [True] * 10)
    rerun = [record("base", f"p{i}", "bad" if i < 2 else "ok", block=1) for i in range(10)]
    res = correctness_gate(r + rerun, c, prompts, 0.0, 0.025)
    assert res.control_losses == 2 and res.control_at_risk == 10
    assert "control (reference rerun): 2 of 10 lost" in res.summary


def test_no_expect_skips_and_nothing_paired_fails() -> None:
    prompts = {"a": prompt("a")}
    res = correctness_gate([record("b", "a", "x")], [record("c", "a", "x")], prompts, 0.0, 0.025)
    assert res.outcome == "skip"
    r, _, prompts = _campaign([True], [True])
    res = correctness_gate(r, [record("cand", "p0", "", ok=False)], prompts, 0.0, 0.025)
    assert res.outcome == "fail" and "nothing to compare" in res.summary


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("rate", [0.0, 0.02, 0.05, 0.1, 0.3])
@pytest.mark.parametrize("at_risk", [1, 5, 13, 40])
def test_critical_count_is_the_exact_binomial_tail(rate: float, at_risk: int) -> None:
    """The critical count by brute force: the smallest c with P(Bin(R, m) > c) <= alpha."""
    alpha = 0.025
    c = critical_count(at_risk, rate, alpha)
    tail = [sum(math.comb(at_risk, k) * rate**k * (1 - rate) ** (at_risk - k)
                for k in range(j + 1, at_risk + 1)) for j in range(at_risk + 1)]
    assert tail[c] <= alpha + 1e-12
    assert c == 0 or tail[c - 1] > alpha


@pytest.mark.slow  # over a second on 2 busy cores
def test_loss_rule_size_and_power_by_simulation() -> None:
    """Drafters as Bernoulli losses on the prompts at risk, including losses that come in
    clusters (a slice of related prompts broken together): size <= alpha at the tolerated
    rate, power as the rule states at the shipped size."""
    rng = np.random.default_rng(5)
    alpha, runs = 0.025, 4000
    for at_risk, tolerated in ((13, 0.0), (13, 0.05), (40, 0.05)):
        c = critical_count(at_risk, tolerated, alpha)
        lossless = rng.random((runs, at_risk)) < tolerated
        size = np.mean([loss_test(at_risk, int(x.sum()), tolerated, alpha).outcome == "fail"
                        for x in lossless])
        assert_rate_at_most(int(size * runs), runs, alpha, f"size at R={at_risk}, m={tolerated}")
        for q in (0.1, 0.2):
            hits = (rng.random((runs, at_risk)) < q).sum(axis=1) > c
            stated = loss_test(at_risk, 0, tolerated, alpha).power.get(q)
            assert stated is not None and abs(hits.mean() - stated) < 0.03, (hits.mean(), stated)
    # Clustered losses: a drafter breaking whole groups of 3 related prompts (same share of
    # answers on average) is caught at least as often as one breaking them independently.
    at_risk, groups = 15, 5
    broken = rng.random((runs, groups)) < 0.2
    hits = np.repeat(broken, 3, axis=1).sum(axis=1) > critical_count(at_risk, 0.0, alpha)
    assert hits.mean() >= 1 - 0.8**groups - 0.03


def test_loss_rule_rejects_bad_input() -> None:
    with pytest.raises(StatsError, match="losses must lie"):
        loss_test(3, 4, 0.0, 0.025)
    with pytest.raises(StatsError, match="max_loss_rate"):
        loss_test(3, 1, 1.0, 0.025)
