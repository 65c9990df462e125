"""The embedded engine under real load: a campaign at x32 on the shipped trace gives a finite
speedup interval at the concurrency it names (the in-flight load recomputed from the records),
and the sweep example validates (its real run is benchmarks/real_crossover.py, not a test)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.service.load import STEADY_SHARE, level_loads
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.run.pilot_run import PilotRun, RunOptions
from testkit.factories import ROOT, TINY_DRAFTER, TINY_TARGET, dump_pilot, pilot_data

TRACE = ROOT / "prompts" / "pilot.jsonl"
SWEEP = ROOT / "examples" / "pilot-sweep.yaml"


def test_sweep_example_validates_with_three_or_more_closed_loop_levels() -> None:
    pilot = load_pilot(SWEEP)
    closed = {n: c for n, c in pilot.load.levels.items() if isinstance(c, int)}
    assert len(closed) >= 3, closed  # fewer and no crossover is estimated
    assert pilot.primary_load == max(closed, key=closed.__getitem__)
    assert pilot.target.engine == "transformers"


@pytest.mark.slow
@pytest.mark.skipif(not TINY_DRAFTER.is_dir(), reason="no tiny models")
def test_x32_campaign_on_fifty_prompts_gives_a_finite_interval(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    data = pilot_data(
        {"baseline": {"role": "baseline"},
         "cand": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                  "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        name="x32",
        target={"engine": "transformers", "model": str(TINY_TARGET), "context_length": 1024,
                "threads": 1},
        trace={"files": [str(TRACE)]},
        max_new_tokens_cap=8,
        sampling={"sampled": {"enabled": False}, "params": {"enabled": False}},
        load={"levels": {"x32": 32}, "warmup_requests": 2, "passes": 2},
        limits={"speedup_min": 1.0},
        decision={"primary_load": "x32", "early_stop": False},
    )  # fmt: skip
    path = dump_pilot(tmp_path / "pilot.yaml", data)
    run = PilotRun(path, RunOptions(results=tmp_path / "res"), cwd=tmp_path)
    outcome = run.run()
    assert outcome.campaign_error is None, outcome.notes
    assert run.trace is not None and len(run.trace.prompts) == 50
    gate = next(g for g in outcome.gates if g.spec.kind == GateKind.SPEEDUP
                and g.spec.condition == "cand" and g.spec.load == "x32" and g.spec.slice is None)
    metric = gate.details["metric"]
    assert gate.ci_low is not None and gate.ci_high is not None, gate.summary
    assert math.isfinite(gate.ci_low) and math.isfinite(gate.ci_high), gate.summary
    assert 0 < gate.ci_low <= (gate.estimate or 0) <= gate.ci_high, gate.summary
    assert gate.details[metric]["df"] > 0, gate.details
    held = {lv.condition: lv for lv in level_loads(run.campaign()) if lv.load == "x32"}
    assert set(held) == {"baseline", "cand"}, held
    for lv in held.values():
        assert lv.concurrency == 32 and lv.measured >= 50, lv
        assert lv.mean is not None and lv.mean >= STEADY_SHARE * 32, lv
    print(f"x32: speedup {gate.estimate:.3f} [{gate.ci_low:.3f}, {gate.ci_high:.3f}] "
          f"df {gate.details[metric]['df']:.1f}; in flight "
          + ", ".join(f"{c} {lv.mean:.2f}" for c, lv in held.items()))
