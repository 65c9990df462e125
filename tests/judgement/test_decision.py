"""Gates and verdicts on synthetic campaigns with a known truth (no engine)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_osprey.judgement import judge
from pytest_osprey.judgement.gates import plan_gates
from pytest_osprey.judgement.speed.gate import candidate_looks, combined_decision, look_at
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from testkit.factories import deep_merge, make_pilot, paired_campaign, saved_campaign

LEVELS = {"low": 1, "high": 4}


def decision_pilot(**over: Any) -> Pilot:
    defaults = {"load": {"levels": LEVELS, "passes": 4}, "limits": {"speedup_min": 1.0},
                "decision": {"early_stop": False}}
    return make_pilot(**deep_merge(defaults, over))


def campaign(
    speedup: float, *, prompts: int = 20, passes: int = 4, seed: int = 0,
    tokens: tuple[list[int], list[int]] | None = None, fail_cand: int = 0,
) -> SavedCampaign:
    """Lognormal latencies with prompt effects; the candidate is ``speedup`` times faster."""

    def fields(cond: str, i: int, block: int) -> dict[str, Any]:
        ids = (tokens[0] if cond == "base" else tokens[1]) if tokens else [1, 2, 3]
        return {"ok": not (cond == "cand" and i < fail_cand), "output_ids": ids,
                "slice": "core" if i % 4 else "unusual", "top2_margin": [1.0] * len(ids),
                "spec_verify_ct": 1, "started_at": float(block)}  # fmt: skip

    return saved_campaign(paired_campaign(
        {"base": 1.0, "cand": 1.0 / speedup}, prompts=prompts, loads=LEVELS, passes=passes,
        seed=seed, fields=fields,
    ))  # fmt: skip


def outcomes(pilot: Pilot, data: SavedCampaign) -> dict[tuple[str, str], str]:
    specs = plan_gates(pilot, ["base", "cand"])
    judged = judge(pilot, specs, data, Preflight())
    return {k: v.outcome for k, v in judged.results.items()}


def test_plan_names_and_primary() -> None:
    pilot = decision_pilot()
    ids = {(s.kind, s.id, s.gating) for s in plan_gates(pilot, ["base", "cand"])}
    assert ("speedup", "cand-vs-base-high", True) in ids  # primary: highest concurrency
    assert ("speedup", "cand-vs-base-low", False) in ids
    assert ("speedup", "cand-vs-base-high-unusual", False) in ids
    assert ("completed", "base-low", True) in ids
    dry = plan_gates(pilot, ["base", "cand"], dry_run=True)
    assert {s.kind for s in dry} == {"command_line", "artifact"}


def test_clear_speedup_keeps() -> None:
    pilot = decision_pilot()
    data = campaign(1.5)
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    assert [v.verdict for v in judged.verdicts] == ["KEEP"]
    gate = judged.results[("speedup", "cand-vs-base-high")]
    assert gate.ci_low is not None and gate.ci_high is not None
    assert 1.3 < gate.estimate < 1.7 and gate.ci_low > 1.0


def test_slowdown_drops_with_reason() -> None:
    pilot = decision_pilot()
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), campaign(0.7), Preflight())
    verdict = judged.verdicts[0]
    assert verdict.verdict == "DROP"
    assert any("speedup[cand-vs-base-high]" in r for r in verdict.reasons)


def test_straddling_is_inconclusive_with_more_pairs() -> None:
    pilot = decision_pilot(limits={"speedup_min": 1.05})
    data = campaign(1.05, prompts=6, passes=1)
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    gate = judged.results[("speedup", "cand-vs-base-high")]
    assert gate.outcome == "inconclusive"
    assert "more prompts" in gate.summary and "passes" in gate.summary
    assert gate.details["advice"]["better"] in ("prompts", "passes", "neither")
    assert judged.verdicts[0].verdict == "INCONCLUSIVE"


def test_failed_requests_fail_completed_gate() -> None:
    pilot = decision_pilot()
    got = outcomes(pilot, campaign(1.5, fail_cand=2))
    assert got[("completed", "cand-low")] == "fail"
    assert got[("completed", "base-low")] == "pass"


def test_greedy_divergence_is_genuine_and_fails() -> None:
    pilot = decision_pilot()
    got = outcomes(pilot, campaign(1.5, tokens=([1, 2, 3], [1, 9, 3])))
    assert got[("greedy_identity", "cand-vs-base")] == "fail"
    assert outcomes(pilot, campaign(1.5))[("greedy_identity", "cand-vs-base")] == "pass"


def test_condition_error_fails_its_gates() -> None:
    pilot = decision_pilot()
    data = campaign(1.5)
    data.meta.conditions["cand"].error = "cand: boot timed out after 600 s"
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    gate = judged.results[("speedup", "cand-vs-base-high")]
    assert gate.outcome == "fail" and "boot timed out" in gate.summary
    assert judged.verdicts[0].verdict == "DROP"


def test_rejudging_is_deterministic() -> None:
    pilot = decision_pilot()
    data = campaign(1.2, seed=3)
    assert outcomes(pilot, data) == outcomes(pilot, data)


def test_sequential_look_stops_early_on_clear_effect() -> None:
    pilot = decision_pilot(decision={"early_stop": True})
    look = look_at(pilot, campaign(2.0, passes=2), "cand", 2)
    assert not isinstance(look, str)
    assert look.look == 2 and look.decision == "keep"
    slow = look_at(pilot, campaign(0.5, passes=2), "cand", 2)
    assert not isinstance(slow, str) and slow.decision == "drop"  # confidently below 1.0
    single = look_at(pilot, campaign(1.0, prompts=1, passes=1), "cand", 1)
    assert isinstance(single, str)


def test_the_primary_gate_follows_the_sequential_decision() -> None:
    pilot = decision_pilot(decision={"early_stop": True})
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), campaign(2.0, passes=2),
                   Preflight())
    gate = judged.results[("speedup", "cand-vs-base-high")]
    assert gate.outcome == "pass" and gate.details["sequential"]["look"] == 2
    assert "group-sequential KEEP at look 2/4" in gate.summary


def test_gates_are_not_adjusted_against_each_other() -> None:
    # KEEP needs every gate: an intersection-union test, already at alpha; no gate's
    # p-value may veto another's pass.
    pilot = decision_pilot()
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), campaign(1.5), Preflight())
    assert [v.verdict for v in judged.verdicts] == ["KEEP"]
    assert not any("p_holm" in g.details for g in judged.results.values())


@pytest.mark.slow  # over a second on 2 busy cores
def test_memory_gate_limits() -> None:
    pilot = decision_pilot(limits={"memory": {"max_peak_mb": 100, "max_increase_pct": 20}})
    data = campaign(1.5)
    data.meta.conditions["base"].peak_memory_mb = 80.0
    data.meta.conditions["cand"].peak_memory_mb = 90.0  # +12.5%, under 100 MiB
    assert outcomes(pilot, data)[("memory", "cand-vs-base")] == "pass"
    data.meta.conditions["cand"].peak_memory_mb = 99.0  # +23.8%
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    gate = judged.results[("memory", "cand-vs-base")]
    assert gate.outcome == "fail" and "max_increase_pct" in gate.summary
    data.meta.conditions["cand"].peak_memory_mb = None
    assert outcomes(pilot, data)[("memory", "cand-vs-base")] == "fail"


def test_an_inconclusive_gate_fails_the_run_only_as_the_pilot_says() -> None:
    from pytest_osprey.exit_codes import EXIT_GATE_FAILED, EXIT_INTERRUPTED, EXIT_OK, exit_code
    from pytest_osprey.pilot.schema import Decision

    pilot = decision_pilot(limits={"speedup_min": 1.05})
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), campaign(1.05, prompts=6,
                                                                       passes=1), Preflight())
    results = list(judged.results.values())
    assert "inconclusive" in {r.outcome for r in results if r.spec.gating}
    assert "fail" not in {r.outcome for r in results if r.spec.gating}
    decided = {p: Decision(inconclusive=p) for p in ("pass", "skip", "fail")}
    assert exit_code(judged, decided["pass"]) == exit_code(results, decided["skip"]) == EXIT_OK
    assert exit_code(judged, decided["fail"]) == EXIT_GATE_FAILED
    assert exit_code(judged, decided["pass"], incomplete=True) == EXIT_INTERRUPTED
    assert exit_code(results, decided["pass"], failed_outside_gates=True) == EXIT_GATE_FAILED
    slow = judge(pilot, plan_gates(pilot, ["base", "cand"]), campaign(0.5), Preflight())
    assert exit_code(slow, decided["pass"]) == EXIT_GATE_FAILED


def test_a_skip_reason_is_short_and_says_things_once() -> None:
    from pytest_osprey.pytest_adapter import SKIP_WIDTH, skip_reason

    said = skip_reason("could not have failed (not evaluable)", "not evaluable: no answer right")
    assert said == "could not have failed (not evaluable): no answer right"
    long = skip_reason("INCONCLUSIVE", "INCONCLUSIVE " + "speedup 1.04x [0.55, 1.97] " * 20)
    assert len(long) <= SKIP_WIDTH
    assert long.startswith("INCONCLUSIVE: speedup") and long.endswith("(report.md)")


def _with_current(speedups: dict[str, float], passes: int = 2) -> tuple[Pilot, SavedCampaign]:
    """A pilot with a current drafter and a campaign where each condition is ``speedups``
    times faster than the baseline."""
    pilot = decision_pilot(
        conditions={"base": {"role": "baseline"},
                    "cur": {"role": "current", "drafter": "/d/1"},
                    "cand": {"role": "candidate", "drafter": "/d/2"}},
        decision={"early_stop": True})
    factors = {"base": 1.0, **{c: 1.0 / s for c, s in speedups.items()}}
    data = saved_campaign(paired_campaign(factors, prompts=20, loads=LEVELS, passes=passes,
                                          seed=5))
    return pilot, data


def test_combined_decision_needs_every_primary_gate_for_a_keep() -> None:
    assert combined_decision(["keep", "keep"]) == "keep"
    assert combined_decision(["keep", "continue"]) == "continue"
    assert combined_decision(["keep", "inconclusive"]) == "inconclusive"
    assert combined_decision(["continue", "drop"]) == "drop"
    assert combined_decision(["inconclusive", "drop"]) == "drop"
    assert combined_decision(["keep"]) == "keep"


def test_a_keep_against_the_baseline_does_not_stop_a_campaign_still_open_against_the_current(
) -> None:
    # Twice the baseline's speed, 5% above the current drafter: the look against the
    # baseline keeps at look 2 of 4; the one against the current drafter continues.
    pilot, data = _with_current({"cur": 2.0, "cand": 2.1})
    alone = look_at(pilot, data, "cand", 2)
    assert not isinstance(alone, str) and alone.decision == "keep"
    against = look_at(pilot, data, "cand", 2, "cur")
    assert not isinstance(against, str) and against.decision == "continue"
    decided, looks = candidate_looks(pilot, data, ["base", "cur", "cand"], 2)
    assert not decided and looks["cand"]["decision"] == "continue"
    assert looks["cand"]["against"]["cur"]["decision"] == "continue"
    assert looks["cand"]["z"] == alone.z  # the top-level facts stay the baseline gate's
    # Without the current drafter in the campaign, the look against the baseline decides.
    decided_alone, looks_alone = candidate_looks(pilot, data, ["base", "cand"], 2)
    assert decided_alone and looks_alone["cand"]["decision"] == "keep"
    assert "against" not in looks_alone["cand"]
    # Level with the current drafter: the futility stop there ends the campaign inconclusive.
    pilot, level = _with_current({"cur": 2.0, "cand": 2.0})
    decided, looks = candidate_looks(pilot, level, ["base", "cur", "cand"], 2)
    assert decided and looks["cand"]["decision"] == "inconclusive"


def test_a_candidate_slower_than_the_current_drafter_stops_as_a_drop() -> None:
    pilot, data = _with_current({"cur": 3.0, "cand": 1.5})
    decided, looks = candidate_looks(pilot, data, ["base", "cur", "cand"], 2)
    assert decided and looks["cand"]["decision"] == "drop"
    assert looks["cand"]["against"]["cur"]["decision"] == "drop"
    # Its gate against the current drafter reads the same sequential look.
    judged = judge(pilot, plan_gates(pilot, ["base", "cur", "cand"]), data, Preflight())
    gate = judged.results[("speedup", "cand-vs-cur-high")]
    assert gate.outcome == "fail" and gate.details["sequential"]["decision"] == "drop"
    assert judged.results[("speedup", "cand-vs-base-high")].outcome == "pass"


def test_a_candidate_faster_than_both_stops_as_a_keep() -> None:
    pilot, data = _with_current({"cur": 1.3, "cand": 3.0})
    decided, looks = candidate_looks(pilot, data, ["base", "cur", "cand"], 2)
    assert decided and looks["cand"]["decision"] == "keep"
