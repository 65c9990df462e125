"""Speed timed at the serving sampling: the timed passes run at pilot.sampling.serving with
seeds shared by the conditions, a greedy pass beside them feeds identity, the records carry
the sampling, and a drafter whose acceptance falls with temperature is judged at the
temperature it serves (a planted fault: KEEP greedy, DROP at T 0.8)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign import runner
from pytest_osprey.campaign.requests import serving_seed
from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.engines.base import GenerationRequest, unsupported
from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.plan import plan_gates
from pytest_osprey.judgement.speed.gate import paired
from pytest_osprey.judgement.speed.served import lengths
from pytest_osprey.judgement.verdict.judge import judge
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.results import Preflight, SavedCampaign
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record, write_trace
from testkit.serving_sim import Planted, TemperatureEngine

PROMPTS, NEW_TOKENS = 10, 12


def test_serving_seeds_are_shared_by_conditions_and_distinct_per_prompt_pass_copy() -> None:
    seeds = {(p, b, k, c): serving_seed(7, p, b, k, c)
             for p in ("a", "b") for b in (0, 1) for k in (0, 1, 2) for c in (0, 1)}
    assert len(set(seeds.values())) == len(seeds)  # distinct per prompt, boot, pass, copy
    assert serving_seed(8, "a", 0, 0, 0) != seeds[("a", 0, 0, 0)]  # the base seed counts
    # Nothing of the condition enters: the baseline and the candidate draw alike.
    assert serving_seed(7, "a", 0, 1, 0) == seeds[("a", 0, 1, 0)]


def _pilot(trace: Path, temperature: float, **serving: Any) -> Pilot:
    return make_pilot(
        trace={"files": [str(trace)]},
        load={"levels": {"c1": 1, "c3": 3}, "passes": 3, "warmup_requests": 2},
        sampling={"serving": {"temperature": temperature, "top_p": 0.95, "top_k": 50,
                              "min_p": 0.02, **serving}},
        limits={"speedup_min": 1.1},
    )


PLANTED = Planted(greedy=1.4, hot=0.85, at=0.8)  # the drafter's true speedup, falling with T


def _campaign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              pilot: Pilot) -> tuple[SavedCampaign, dict[str, TemperatureEngine]]:
    engines: dict[str, TemperatureEngine] = {}

    def make(p: Pilot, condition: str, boot: Any) -> TemperatureEngine:
        engines[condition] = TemperatureEngine(condition, p.conditions[condition].speculates,
                                               PLANTED)
        return engines[condition]

    monkeypatch.setattr(runner, "make_engine", make)
    trace = load_trace(pilot.trace.files)
    data = Campaign(pilot, trace, tmp_path / "res", ["base", "cand"]).run()
    return data, engines


def _verdict(pilot: Pilot, data: SavedCampaign) -> tuple[str, list[str]]:
    kinds = {GateKind.SPEEDUP, GateKind.COMPLETED, GateKind.GREEDY_IDENTITY}
    specs = [s for s in plan_gates(pilot, ["base", "cand"]) if s.kind in kinds]
    (verdict,) = judge(pilot, specs, data, Preflight()).verdicts
    return verdict.verdict, verdict.reasons


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("trace") / "t.jsonl", PROMPTS, NEW_TOKENS)


@pytest.mark.slow  # over a second on 2 busy cores
def test_timed_at_serving_temperature_the_planted_drafter_is_dropped(
        trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pilot = _pilot(trace, 0.8)
    data, engines = _campaign(tmp_path, monkeypatch, pilot)
    verdict, reasons = _verdict(pilot, data)
    assert verdict == "DROP", reasons
    # The speedup the records show is the planted one at T 0.8, not the greedy 1.4x.
    primary = paired(data, "base", "cand", pilot.primary_load)
    ratio = float((primary.reference / primary.candidate).mean())
    assert 0.7 < ratio < 1.0, ratio

    timed = [r for r in data.records if r.mode == "serving"]
    greedy = [r for r in data.records if r.mode == "greedy"]
    assert timed and all((r.temperature, r.top_p, r.top_k, r.min_p, r.ignore_eos)
                         == (0.8, 0.95, 50, 0.02, True) for r in timed)
    assert all(r.output_tokens == NEW_TOKENS for r in timed)  # fixed length, like with like
    # Every timed request of a prompt, pass and copy has one seed, the same on both sides.
    by_place: dict[tuple[str, int, int, int], set[int | None]] = {}
    for r in timed:
        by_place.setdefault((r.prompt_id, r.boot, r.repetition, r.copy), set()).add(r.seed)
    assert all(len(s) == 1 for s in by_place.values())
    assert len({next(iter(s)) for s in by_place.values()}) == len(by_place)
    # Fillers and warm-up run at the serving sampling too.
    assert all(r.temperature == 0.8 for r in data.fillers)
    assert all(q.temperature == 0.8 for e in engines.values() for q in e.seen
               if q.max_new_tokens == min(16, NEW_TOKENS) and not q.want_margins
               and q.seed is not None)
    # One untimed greedy pass per condition at the lightest level feeds identity.
    assert sorted((r.condition, r.prompt_id) for r in greedy) == sorted(
        (c, f"p{i}") for c in ("base", "cand") for i in range(PROMPTS))
    assert all(r.load == "c1" and r.temperature == 0.0 and r.seed is None
               and not r.ignore_eos and r.top2_margin for r in greedy)
    assert data.timed_mode == "serving"
    # The distribution check's pass samples as the service does, top-k and min-p included.
    sampled = [r for r in data.records if r.mode == "sampled"]
    assert sampled and all((r.temperature, r.top_p, r.top_k, r.min_p) == (0.8, 0.95, 50, 0.02)
                           for r in sampled)


@pytest.mark.slow  # over a second on 2 busy cores
def test_timed_greedy_the_same_drafter_is_kept(
        trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: at serving temperature 0 (today's behaviour) the 1.4x edge is KEEP, and
    no separate greedy pass runs (the timed passes are greedy)."""
    pilot = _pilot(trace, 0.0)
    data, _ = _campaign(tmp_path, monkeypatch, pilot)
    verdict, reasons = _verdict(pilot, data)
    assert verdict == "KEEP", reasons
    assert {r.mode for r in data.records} == {"greedy"}
    assert all(r.temperature == 0.0 and r.seed is None for r in data.records)
    assert data.timed_mode == "greedy"


@pytest.mark.slow  # over a second on 2 busy cores
def test_without_fixed_length_the_edge_is_judged_per_output_token(
        trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs end where sampling ends them: lengths differ between prompts' draws, the
    latencies are compared at a common length, and the planted loss is still seen."""
    pilot = _pilot(trace, 0.8, fixed_length=False)
    data, _ = _campaign(tmp_path, monkeypatch, pilot)
    timed = [r for r in data.records if r.mode == "serving"]
    assert all(r.ignore_eos is False for r in timed)
    assert len({r.output_tokens for r in timed}) > 1
    verdict, reasons = _verdict(pilot, data)
    assert verdict == "DROP", reasons
    (gate,) = [g for g in judge(pilot, [s for s in plan_gates(pilot, ["base", "cand"])
                                        if s.kind == GateKind.SPEEDUP and s.gating],
                                data, Preflight()).results.values()]
    assert gate.details["lengths"]["rescaled"] > 0
    assert "timed at temperature 0.8" in gate.summary


def test_a_request_short_of_its_prompts_length_is_compared_per_token() -> None:
    """An engine that ignored ignore_eos: its request's latency is taken at the prompt's
    common length, so a short output does not pass for a fast one."""
    def rec(cond: str, tokens: int, e2e: float) -> RequestRecord:
        return make_record(cond, "p0", mode="serving", load="c1", e2e_s=e2e,
                           output_tokens=tokens, output_ids=list(range(tokens)))
    full, short = rec("base", 100, 2.0), rec("cand", 25, 1.0)
    got = lengths([full, short, replace(full, load="c4")], "c1", "serving")
    assert got.common == {"p0": 100} and (got.rescaled, got.timed) == (1, 2)
    assert got.latency(full) == 2.0
    assert got.latency(short) == pytest.approx(4.0)  # 25 tokens in 1 s: 4 s for 100


def test_an_engine_without_a_serving_parameter_says_so() -> None:
    request = GenerationRequest("p", "Hi", 4, temperature=0.7, top_k=40, min_p=0.1,
                                ignore_eos=True)
    assert unsupported(request, frozenset()) == ["top_k", "min_p", "ignore_eos"]
    assert unsupported(replace(request, top_k=None, min_p=0.0, ignore_eos=False),
                       frozenset()) == []


def test_records_from_before_the_sampling_fields_still_load() -> None:
    old = make_record("base", "p0").to_json()
    import json

    data = json.loads(old)
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos"):
        data.pop(name)
    r = RequestRecord.from_dict(data)
    assert r.temperature is None and r.ignore_eos is None


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("greedy_boots", [1, 2])
def test_the_greedy_pass_runs_on_the_first_greedy_boots_only(
        trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, greedy_boots: int) -> None:
    """``sampling.greedy_boots``: with three boots timed at T 0.8, the untimed greedy pass
    runs on the first N boots, the timed passes on all three; the campaign's size and
    expected time count the greedy pass that often."""
    from pytest_osprey.campaign.expected_time import expected_time
    from pytest_osprey.campaign.size import campaign_size

    def pilot_of(boots: int | None) -> Pilot:
        return make_pilot(
            trace={"files": [str(trace)]},
            load={"levels": {"c1": 1}, "passes": 1, "boots_per_condition": 3,
                  "warmup_requests": 1},
            sampling={"serving": {"temperature": 0.8}, "greedy_boots": boots,
                      "sampled": {"enabled": False}},
            decision={"early_stop": False})

    pilot, every = pilot_of(greedy_boots), pilot_of(None)
    data, _ = _campaign(tmp_path, monkeypatch, pilot)
    greedy = {r.boot for r in data.records if r.mode == "greedy"}
    timed = {r.boot for r in data.records if r.mode == "serving"}
    assert greedy == set(range(greedy_boots)) and timed == {0, 1, 2}
    loaded = load_trace(pilot.trace.files)
    assert campaign_size(pilot, loaded, 2).greedy_per_condition == PROMPTS * greedy_boots
    assert campaign_size(every, loaded, 2).greedy_per_condition == PROMPTS * 3
    ours, all_boots = expected_time(pilot, loaded, 2), expected_time(every, loaded, 2)
    assert ours.phases["greedy"] == pytest.approx(all_boots.phases["greedy"] * greedy_boots / 3)
