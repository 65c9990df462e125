"""Gates and verdicts on synthetic campaigns with a known truth (no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_osprey.campaign.runner import block_order
from pytest_osprey.judgement import judge
from pytest_osprey.judgement.gates import GateSpec, plan_gates, sequential_look
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.records import RequestRecord


def make_pilot(tmp_path: Path, **over: Any) -> Pilot:
    data: dict[str, Any] = {
        "target": {"model": str(tmp_path)},
        "conditions": {
            "base": {"role": "baseline"},
            "cand": {"role": "candidate", "drafter": str(tmp_path)},
        },
        "trace": {"files": [str(tmp_path / "t.jsonl")]},
        "load": {"levels": {"low": 1, "high": 4}, "blocks": 4},
        "limits": {"speedup_min": 1.0},
    }
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value}
    return Pilot.model_validate(data)


def campaign(
    speedup: float, *, prompts: int = 20, blocks: int = 4, seed: int = 0,
    tokens: tuple[list[int], list[int]] | None = None, fail_cand: int = 0,
) -> SavedCampaign:
    """Lognormal latencies with prompt effects; the candidate is ``speedup`` times faster."""
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.0, 0.5, prompts)
    records = []
    for b in range(blocks):
        for load in ("low", "high"):
            for cond, factor in (("base", 1.0), ("cand", 1.0 / speedup)):
                for i in range(prompts):
                    e2e = float(base[i] * factor * rng.lognormal(0.0, 0.1))
                    ok = not (cond == "cand" and i < fail_cand)
                    ids = (tokens[0] if cond == "base" else tokens[1]) if tokens else [1, 2, 3]
                    records.append(RequestRecord(
                        run_id="r", condition=cond, block=b, repetition=b, load=load,
                        concurrency=1, prompt_id=f"p{i}", slice="core" if i % 4 else "unusual",
                        domain="d", mode="greedy", sample_index=0, ok=ok,
                        error=None if ok else "HTTP 500", ttft_s=e2e / 10, e2e_s=e2e,
                        output_tokens=len(ids), output_ids=ids, top2_margin=[1.0] * len(ids),
                        spec_verify_ct=1, started_at=float(b),
                    ))
    meta = {"conditions": {"base": {"error": None}, "cand": {"error": None}},
            "load_levels": {"low": 1, "high": 4}}
    return SavedCampaign(Path("."), meta, records)


def outcomes(pilot: Pilot, data: SavedCampaign) -> dict[tuple[str, str], str]:
    specs = plan_gates(pilot, ["base", "cand"])
    judged = judge(pilot, specs, data, Preflight())
    return {k: v.outcome for k, v in judged.results.items()}


def test_plan_names_and_primary(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path)
    ids = {(s.kind, s.id, s.gating) for s in plan_gates(pilot, ["base", "cand"])}
    assert ("speedup", "cand-vs-base-high", True) in ids  # primary: highest concurrency
    assert ("speedup", "cand-vs-base-low", False) in ids
    assert ("speedup", "cand-vs-base-high-unusual", False) in ids
    assert ("completed", "base-low", True) in ids
    dry = plan_gates(pilot, ["base", "cand"], dry_run=True)
    assert {s.kind for s in dry} == {"command_line", "artifact"}


def test_clear_speedup_keeps(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path)
    data = campaign(1.5)
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    assert [v.verdict for v in judged.verdicts] == ["KEEP"]
    gate = judged.results[("speedup", "cand-vs-base-high")]
    assert gate.ci_low is not None and gate.ci_high is not None
    assert 1.3 < gate.estimate < 1.7 and gate.ci_low > 1.0


def test_slowdown_drops_with_reason(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path)
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), campaign(0.7), Preflight())
    verdict = judged.verdicts[0]
    assert verdict.verdict == "DROP"
    assert any("speedup[cand-vs-base-high]" in r for r in verdict.reasons)


def test_straddling_is_inconclusive_with_more_pairs(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path, limits={"speedup_min": 1.05})
    data = campaign(1.05, prompts=6, blocks=1)
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    gate = judged.results[("speedup", "cand-vs-base-high")]
    assert gate.outcome == "inconclusive"
    assert "more paired prompts" in gate.summary
    assert judged.verdicts[0].verdict == "INCONCLUSIVE"


def test_failed_requests_fail_completed_gate(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path)
    got = outcomes(pilot, campaign(1.5, fail_cand=2))
    assert got[("completed", "cand-low")] == "fail"
    assert got[("completed", "base-low")] == "pass"


def test_greedy_divergence_is_genuine_and_fails(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path)
    got = outcomes(pilot, campaign(1.5, tokens=([1, 2, 3], [1, 9, 3])))
    assert got[("greedy_identity", "cand-vs-base")] == "fail"
    assert outcomes(pilot, campaign(1.5))[("greedy_identity", "cand-vs-base")] == "pass"


def test_condition_error_fails_its_gates(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path)
    data = campaign(1.5)
    data.meta.conditions["cand"].error = "cand: boot timed out after 600 s"
    judged = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    gate = judged.results[("speedup", "cand-vs-base-high")]
    assert gate.outcome == "fail" and "boot timed out" in gate.summary
    assert judged.verdicts[0].verdict == "DROP"


def test_rejudging_is_deterministic(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path)
    data = campaign(1.2, seed=3)
    assert outcomes(pilot, data) == outcomes(pilot, data)


def test_sequential_look_stops_early_on_clear_effect(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path, decision={"early_stop": True})
    data = campaign(2.0, blocks=2)
    look = sequential_look(pilot, data, "cand")
    assert not isinstance(look, str)
    assert look.look == 2 and look.decision == "keep"
    slow = sequential_look(pilot, campaign(0.5, blocks=2), "cand")
    assert not isinstance(slow, str) and slow.decision == "drop"  # futility at 1.0
    single = sequential_look(pilot, campaign(1.0, prompts=1, blocks=1), "cand")
    assert isinstance(single, str)


def test_holm_downgrades_weak_claims(tmp_path: Path) -> None:
    from pytest_osprey.judgement.gates import GateResult
    from pytest_osprey.judgement.judge import apply_holm

    pilot = make_pilot(tmp_path)
    spec_a = GateSpec("speedup", "cand", reference="base", load="high")
    spec_b = GateSpec("speedup", "cand", reference="current", load="high")
    strong = GateResult(spec_a, "pass", "a", p_value=0.02)
    stronger = GateResult(spec_b, "pass", "b", p_value=0.001)
    apply_holm(pilot, [strong, stronger])  # 0.001*2 and then 0.02*1: both hold at 0.025
    assert (strong.outcome, stronger.outcome) == ("pass", "pass")
    assert stronger.details["p_holm"] == pytest.approx(0.002)
    a = GateResult(spec_a, "pass", "a", p_value=0.02)
    b = GateResult(spec_b, "pass", "b", p_value=0.02)
    apply_holm(pilot, [a, b])  # each alone would pass; together 0.02*2 > 0.025
    assert a.outcome == b.outcome == "inconclusive" and "Holm-adjusted" in a.summary
    alone = GateResult(spec_a, "pass", "a", p_value=0.02)
    apply_holm(pilot, [alone])
    assert alone.outcome == "pass"
    # A quality gate's p-value tests for harm (small fails it): never in the family.
    quality = GateResult(GateSpec("correctness", "cand", reference="base"), "pass", "c",
                         p_value=1.0)
    claim = GateResult(spec_a, "pass", "a", p_value=0.02)
    apply_holm(pilot, [claim, quality])
    assert claim.outcome == "pass" and "p_holm" not in quality.details


def test_block_order_abba() -> None:
    assert block_order(["a", "b"], 4, "abba") == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert block_order(["a", "b"], 2, "sequential") == [["a", "b"], ["a", "b"]]


def test_memory_gate_limits(tmp_path: Path) -> None:
    pilot = make_pilot(tmp_path, limits={"memory": {"max_peak_mb": 100, "max_increase_pct": 20}})
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
