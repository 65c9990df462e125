"""Goodput: the share of requests meeting the pilot's targets, and its gate (paired
non-inferiority against the baseline) - planted faults it must catch, gates that could not
fail and therefore never pass, and the false-pass rate by simulation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_osprey.judgement import GateSpec, evaluate, plan_gates
from pytest_osprey.judgement.service.goodput import goodput_section, meets, share_bounds
from pytest_osprey.pilot.limits import GoodputTargets
from pytest_osprey.pilot.schema import ConfigError, Pilot
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record

TARGETS = {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": 3.0}


def rec(cond: str, pid: int, block: int, *, ttft: float = 0.2, e2e: float = 1.0,
        tokens: int = 21, ok: bool = True, load: str = "busy") -> RequestRecord:
    return make_record(
        cond, f"p{pid:03d}", measured=False, block=block, load=load, concurrency=4, ok=ok,
        error=None if ok else "timed out", ttft_s=ttft if ok else None,
        e2e_s=e2e if ok else None, output_tokens=tokens if ok else None,
    )


def pilot(**goodput: Any) -> Pilot:
    return make_pilot(
        target={"model": "t"},
        conditions={"baseline": {"role": "baseline"},
                    "cand": {"role": "candidate", "drafter": "d"}},
        trace={"files": ["p.jsonl"]},
        load={"levels": {"low": 1, "busy": 4}, "blocks": 2},
        limits={"goodput": {**TARGETS, **goodput}},
    )


def campaign(records: list[RequestRecord]) -> SavedCampaign:
    meta = {"run_id": "r", "baseline": "baseline", "candidates": ["cand"],
            "load_levels": {"low": 1, "busy": 4}, "blocks": 2,
            "conditions": {"baseline": {"role": "baseline"}, "cand": {"role": "candidate"}}}
    return SavedCampaign(Path("."), meta, records)


def judge(records: list[RequestRecord], **goodput: Any) -> Any:
    spec = GateSpec("goodput", "cand", reference="baseline", load="busy")
    return evaluate(spec, pilot(**goodput), campaign(records), Preflight())


def both(n: int, blocks: int = 2, **cand: Any) -> list[RequestRecord]:
    """Baseline requests all good; candidate requests as ``cand`` says."""
    return [r for p in range(n) for b in range(blocks)
            for r in (rec("baseline", p, b), rec("cand", p, b, **cand))]


def test_a_request_is_good_only_when_it_meets_every_target() -> None:
    t = GoodputTargets(**TARGETS)
    assert meets(rec("c", 1, 0), t)
    assert not meets(rec("c", 1, 0, ttft=0.6), t)  # first token too late
    assert not meets(rec("c", 1, 0, e2e=3.5), t)  # completion too late
    # (1.8 - 0.2) / 20 = 80 ms per token: too slow between tokens
    assert not meets(rec("c", 1, 0, e2e=1.8), t)
    assert not meets(rec("c", 1, 0, ok=False), t)  # a failed request is never good
    assert meets(rec("c", 1, 0, tokens=1, e2e=0.3), t)  # one token: no inter-token gap
    with pytest.raises(ValueError, match="at least one target"):
        GoodputTargets(margin=0.1)


def test_pilot_key_and_planned_gates() -> None:
    p = pilot()
    specs = [s for s in plan_gates(p, list(p.conditions)) if s.kind == "goodput"]
    assert [(s.load, s.gating) for s in specs] == [("low", False), ("busy", True)]
    plain = make_pilot(target={"model": "t"}, trace={"files": ["p.jsonl"]},
                       conditions={"baseline": {"role": "baseline"}})
    assert plain.limits.goodput is None
    with pytest.raises((ConfigError, ValueError)):
        pilot(margin=1.5)


def test_an_unchanged_candidate_passes() -> None:
    res = judge(both(40))
    assert res.outcome == "pass", res.summary
    assert res.estimate == 0 and res.threshold == pytest.approx(-0.05)
    assert res.details["n_pairs"] == 80 and res.details["losses"] == 0


def test_planted_fault_slow_first_token_fails() -> None:
    # The candidate's first token arrives late on one request in three: a third of the
    # requests the baseline served well now miss the TTFT target.
    records = [r for p in range(40) for b in range(2) for r in (
        rec("baseline", p, b), rec("cand", p, b, ttft=0.9 if p % 3 == 0 else 0.2))]
    res = judge(records)
    assert res.outcome == "fail", res.summary
    assert res.ci_high < -0.05
    assert "goodput" in res.summary and "TTFT <= 500 ms" in res.summary


def test_planted_fault_failed_requests_fail() -> None:
    records = [r for p in range(40) for b in range(2) for r in (
        rec("baseline", p, b), rec("cand", p, b, ok=p % 4 != 0))]
    assert judge(records).outcome == "fail"


def test_a_gate_that_could_not_fail_never_passes() -> None:
    # The baseline meets the targets nowhere: the candidate has nothing to lose, so the test
    # is vacuous; it must say so, not pass.
    records = [r for p in range(40) for b in range(2) for r in (
        rec("baseline", p, b, ttft=2.0), rec("cand", p, b, ttft=2.0))]
    res = judge(records)
    assert res.outcome == "inconclusive"
    assert "cannot detect a loss" in res.summary


def test_too_few_pairs_cannot_pass() -> None:
    tiny = judge(both(2, blocks=1))
    assert tiny.outcome == "inconclusive" and "cannot detect a loss" in tiny.summary
    # 20 pairs: losing them all would show, but even a perfect candidate cannot show
    # non-inferiority at a 5-point margin.
    few = judge(both(10))
    assert few.outcome == "inconclusive", few.summary
    assert "cannot show non-inferiority" in few.summary


def test_floor_on_the_share() -> None:
    # Candidate as good as the baseline, both at 50%: non-inferior, but under a 90% floor.
    records = [r for p in range(40) for b in range(2) for r in (
        rec("baseline", p, b, e2e=5.0 if p % 2 else 1.0),
        rec("cand", p, b, e2e=5.0 if p % 2 else 1.0))]
    res = judge(records, min_share=0.9)
    assert res.outcome == "fail" and "below the floor" in res.summary
    assert judge(both(40), min_share=0.9).outcome == "pass"
    low, high = share_bounds(80, 80, 0.025)
    assert high == 1.0 and 0.95 < low < 1.0


def test_section_reports_every_condition_and_level() -> None:
    records = both(10) + [rec("baseline", p, 0, load="low") for p in range(10)]
    section = goodput_section(pilot(), campaign(records))
    assert section is not None
    rows = {(r.condition, r.load): r for r in section.table}
    assert set(rows) == {(c, lv) for c in ("baseline", "cand") for lv in ("low", "busy")}
    assert rows[("baseline", "busy")].share == 1.0 and rows[("cand", "low")].sent == 0
    assert rows[("cand", "low")].share is None


def _simulated(rng: np.random.Generator, loss: float, n: int = 50) -> list[RequestRecord]:
    """Baseline good with 0.9 by prompt difficulty; the candidate loses ``loss`` of the good
    requests at random, and a shared block shock slows both sides alike."""
    out = []
    for b in range(2):
        shock = rng.lognormal(0, 0.1)
        for p in range(n):
            base_good = rng.random() < 0.9
            e2e = (1.0 if base_good else 4.0) * shock
            cand_e2e = 4.0 * shock if base_good and rng.random() < loss else e2e
            out += [rec("baseline", p, b, e2e=e2e), rec("cand", p, b, e2e=cand_e2e)]
    return out


@pytest.mark.slow  # over a second on 2 busy cores
def test_simulated_false_pass_and_power() -> None:
    """A candidate worse by exactly the margin (the null's boundary, where a false pass is
    likeliest) passes at most alpha (2.5%) of the time, plus Monte Carlo error; an unchanged
    candidate passes most of the time."""
    rng = np.random.default_rng(3)
    sims = 300
    worse = sum(judge(_simulated(rng, 0.05 / 0.9)).outcome == "pass" for _ in range(sims))
    assert worse / sims <= 0.025 + 2 * np.sqrt(0.025 * 0.975 / sims)
    same = sum(judge(_simulated(rng, 0.0)).outcome == "pass" for _ in range(100))
    assert same >= 80
