"""Boots alike: a condition whose boots serve differently is flagged (planted faults), a
healthy one passes, and the gate exists only with several boots per condition."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from pytest_osprey.judgement import judge, plan_gates
from pytest_osprey.judgement.service.consistency import boot_consistency
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record, saved_campaign

PROMPTS = [f"p{i}" for i in range(12)]


def boots(n_boots: int = 2, *, wrong_boot: int | None = None, accept: dict[int, float] | None
          = None, tie_at: int | None = None, seed: int = 0) -> list[RequestRecord]:
    """One condition over ``n_boots`` boots x 2 passes; ``wrong_boot`` answers differently
    (a divergence at token 2), ``accept`` sets a boot's mean tokens per verify step."""
    rng = np.random.default_rng(seed)
    out = []
    for boot in range(n_boots):
        for p in range(2):
            for i, pid in enumerate(PROMPTS):
                ids = [i, i + 1, i + 2, i + 3]
                if boot == wrong_boot and i % 3 == 0:
                    ids[2] = 999
                margins = [1.0] * 4
                if tie_at is not None:
                    margins[2] = 0.01
                tokens = 40
                rate = (accept or {}).get(boot, 3.0) * rng.lognormal(0, 0.1)
                out.append(make_record("cand", pid, boot=boot, repetition=p, load="low",
                                       output_ids=ids, top2_margin=margins,
                                       output_tokens=tokens,
                                       spec_verify_ct=max(1, round(tokens / rate)),
                                       started_at=float(boot * 1000 + p * 100 + i)))
    return out


def test_identical_boots_pass() -> None:
    res = boot_consistency(boots(3), "low", epsilon=0.05, tolerance=0.05)
    assert res.boots == 3 and res.prompts == len(PROMPTS) and res.ok


def test_a_boot_that_answers_differently_is_flagged() -> None:
    res = boot_consistency(boots(2, wrong_boot=1), "low", epsilon=0.05, tolerance=0.05)
    assert not res.ok and len(res.divergent) == 4
    assert res.divergent[0].startswith("p0: boot 1 vs boot 2 @token 2")


def test_a_divergence_at_a_near_tie_is_not_a_fault() -> None:
    res = boot_consistency(boots(2, wrong_boot=1, tie_at=2), "low", epsilon=0.05,
                           tolerance=0.05)
    assert res.ok and len(res.near_ties) == 4


def test_acceptance_collapsing_on_one_boot_is_flagged() -> None:
    res = boot_consistency(boots(3, accept={2: 1.2}), "low", epsilon=0.05, tolerance=0.05)
    assert not res.ok and len(res.accept_flags) == 1 and "boot 3" in res.accept_flags[0]
    two = boot_consistency(boots(2, accept={1: 1.2}), "low", epsilon=0.05, tolerance=0.05)
    assert len(two.accept_flags) == 1  # two boots: that they differ, once
    # Noise alone (the same acceptance on every boot) flags nothing, over many seeds.
    flagged = sum(not boot_consistency(boots(3, seed=s), "low", 0.05, 0.05).ok
                  for s in range(40))
    assert flagged == 0


def _pilot(n_boots: int) -> Any:
    return make_pilot({"base": {"role": "baseline"},
                       "cand": {"role": "candidate", "speculation": {"algorithm": "NGRAM"}}},
                      target={"engine": "sglang", "model": "m"},
                      load={"levels": {"low": 1}, "boots_per_condition": n_boots},
                      decision={"early_stop": False})


def test_the_gate_is_planned_with_several_boots_and_decides() -> None:
    assert not [s for s in plan_gates(_pilot(1), ["base", "cand"])
                if s.kind == "boot_consistency"]
    pilot = _pilot(2)
    specs = [s for s in plan_gates(pilot, ["base", "cand"]) if s.kind == "boot_consistency"]
    assert [s.condition for s in specs] == ["base", "cand"]
    base = [make_record("base", r.prompt_id, boot=r.boot, repetition=r.repetition, load="low",
                        output_ids=r.output_ids, top2_margin=r.top2_margin,
                        e2e_s=2.0 * (r.e2e_s or 1.0), started_at=r.started_at)
            for r in boots(2)]
    for bad, verdict in ((None, "pass"), (1, "fail")):
        data = saved_campaign(base + boots(2, wrong_boot=bad))
        judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
        gate = judged.results[("boot_consistency", "cand")]
        assert gate.outcome == verdict, gate.summary
    assert judged.verdicts[0].verdict == "DROP"
    assert any("boot_consistency[cand]" in r for r in judged.verdicts[0].reasons)


def test_a_lightest_level_measured_on_one_boot_gives_way_to_the_next() -> None:
    """``load.level_passes`` measures x1 on the first boot alone: the boots are compared at
    the lightest level they all ran (x8 here), where a planted divergence still fails the
    gate and healthy boots pass (not 'nothing completed on every boot')."""
    pilot = make_pilot({"base": {"role": "baseline"},
                        "cand": {"role": "candidate", "speculation": {"algorithm": "NGRAM"}}},
                       target={"engine": "sglang", "model": "m"},
                       load={"levels": {"low": 1, "mid": 8}, "boots_per_condition": 2,
                             "level_passes": {"low": 1}},
                       decision={"early_stop": False})

    def at_mid(records: list[RequestRecord], name: str) -> list[RequestRecord]:
        once = [make_record(name, r.prompt_id, boot=0, repetition=0, load="low",
                            output_ids=r.output_ids, started_at=r.started_at)
                for r in records if r.boot == 0 and r.repetition == 0]
        return once + [make_record(name, r.prompt_id, boot=r.boot, repetition=r.repetition,
                                   load="mid", concurrency=8, output_ids=r.output_ids,
                                   top2_margin=r.top2_margin, output_tokens=r.output_tokens,
                                   spec_verify_ct=r.spec_verify_ct,
                                   started_at=(r.started_at or 0.0) + 50)
                       for r in records]

    for bad, outcome in ((None, "pass"), (1, "fail")):
        data = saved_campaign(at_mid(boots(2), "base") + at_mid(boots(2, wrong_boot=bad),
                                                               "cand"))
        judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
        for cond in ("base", "cand"):
            gate = judged.results[("boot_consistency", cond)]
            assert "at mid" in gate.summary, gate.summary
        assert judged.results[("boot_consistency", "base")].outcome == "pass"
        assert judged.results[("boot_consistency", "cand")].outcome == outcome


def _served(records: list[RequestRecord], greedy_boots: int) -> list[RequestRecord]:
    """``records`` as a campaign timed at a sampled serving setting runs them: every record
    a timed ("serving") one, and the untimed greedy pass (the first pass's outputs) only on
    the first ``greedy_boots`` boots."""
    timed = [replace(r, mode="serving") for r in records]
    greedy = [replace(r, spec_verify_ct=None, output_tokens=None)
              for r in records if r.boot < greedy_boots and r.repetition == 0]
    return timed + greedy


def test_greedy_on_the_first_boot_only_still_compares_acceptance_over_every_boot() -> None:
    res = boot_consistency(_served(boots(3, accept={2: 1.2}), 1), "low", 0.05, 0.05)
    assert res.boots == 3 and res.output_boots == 1 and res.prompts == 0
    assert len(res.accept_flags) == 1 and "boot 3" in res.accept_flags[0]
    healthy = boot_consistency(_served(boots(3), 1), "low", 0.05, 0.05)
    assert healthy.ok and len(healthy.accept) == 3
    # Greedy outputs on two boots of three: those two are compared.
    two = boot_consistency(_served(boots(3, wrong_boot=1), 2), "low", 0.05, 0.05)
    assert two.output_boots == 2 and two.prompts == len(PROMPTS) and len(two.divergent) == 4


def test_the_gate_with_greedy_on_one_boot_reads_acceptance_and_skips_a_plain_server() -> None:
    pilot = make_pilot({"base": {"role": "baseline"},
                        "cand": {"role": "candidate", "speculation": {"algorithm": "NGRAM"}}},
                       target={"engine": "sglang", "model": "m"},
                       load={"levels": {"low": 1}, "boots_per_condition": 3},
                       sampling={"serving": {"temperature": 0.7}, "greedy_boots": 1},
                       decision={"early_stop": False})
    assert pilot.greedy_boots == 1
    base = [replace(r, condition="base", spec_verify_ct=None) for r in _served(boots(3), 1)]
    for accept, outcome in ((None, "pass"), ({2: 1.2}, "fail")):
        data = saved_campaign(base + _served(boots(3, accept=accept), 1))
        judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
        gate = judged.results[("boot_consistency", "cand")]
        assert gate.outcome == outcome, gate.summary
        assert "outputs not compared: greedy outputs on 1 of 3 boots" in gate.summary
        plain = judged.results[("boot_consistency", "base")]
        assert plain.outcome == "skip" and "no accept length" in plain.summary
