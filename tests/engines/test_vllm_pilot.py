"""examples/pilot-vllm-cpu.yaml end to end through the plugin, cut to what it asserts: two
conditions (the plain server, booted again to score the samples, and the tiny drafter), one
load level, one pass, 8 prompts.

Slow (minutes). Needs ``OSPREY_VLLM_PYTHON`` (a Python with vllm-cpu; .ci/run builds one).
Checks: every condition booted once, no server process is left, the exact distribution test
ran on the candidate (served at temperature 0.8) and finds its drafted positions off the served
temperature while the first token and the plain server's own samples (the A/A control) are on
it, so the candidate is dropped; the speculation it ran (read back from the server) is the one
the pilot asked for and its acceptance counts agree with vLLM's counters; and the tiny
drafter's accept length under vLLM agrees with the embedded engine's on the same prompts
within 10%. Speed verdicts are not asserted here (real timings on a shared machine): the
example's full design (the weak drafter, two levels, two passes) is what users run; its fault
is also kept as a recorded case (testkit/recorded/, tests/judgement/test_vllm_recorded.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.judgement.service.speculation import speculation_differences
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.trace import load_trace, render_prompt
from testkit.example_pilots import shrunk_example
from testkit.factories import ROOT
from testkit.pilot_run import servers_left

PILOT = ROOT / "examples" / "pilot-vllm-cpu.yaml"
PYTHON = os.environ.get("OSPREY_VLLM_PYTHON")

# The example's conditions and sampled budget (what the exact test needs), with the speed design
# cut to one level and one pass over 8 prompts of its trace (all its domains but legal and
# multilingual): the speed passes assert nothing here that the mechanics checks need twice.
CANDIDATES = ("tiny-drafter",)
SHRUNK_IDS = ["chat-01", "chat-03", "code-01", "code-02", "commonsense-01", "finance-01",
              "math-01", "clinical-01"]


def shrunk(folder: Path) -> Path:
    return shrunk_example(PILOT, folder, conditions=CANDIDATES, ids=SHRUNK_IDS,
                          load={"levels": {"low": 1}, "passes": 1, "warmup_requests": 1})


pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        not PYTHON, reason="set OSPREY_VLLM_PYTHON to a Python with vLLM (CPU build) installed"
    ),
]


def embedded_accept_length(prompt_ids: list[str]) -> float:
    """Pooled accept length of the same drafter, same prompts, greedy, in-process."""
    pilot = load_pilot(PILOT)
    cond = pilot.conditions["tiny-drafter"]
    assert cond.speculation is not None
    # The same drafter and draft length through transformers' assisted generation.
    spec = cond.speculation.model_copy(update={"algorithm": "assisted"})
    pilot = pilot.model_copy(update={
        "target": pilot.target.model_copy(update={
            "engine": "transformers", "python": None, "env": {}}),
        "conditions": {**pilot.conditions,
                       "tiny-drafter": cond.model_copy(update={"speculation": spec})},
    })
    engine = TransformersEngine(pilot, "tiny-drafter", BootSpec("tiny-drafter", Path("/tmp")))
    engine.start()
    prompts = load_trace(pilot.trace.files).by_id()
    tokens = verify = 0
    try:
        for pid in prompt_ids:
            res = asyncio.run(engine.generate(GenerationRequest(
                pid, render_prompt(prompts[pid]), pilot.max_new_tokens_cap or 32,
                want_margins=False,
            )))
            assert res.ok, res.error
            tokens += len(res.output_ids)
            verify += res.spec_verify_ct or 0
    finally:
        engine.stop()
    return tokens / verify


def test_vllm_cpu_pilot(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        f"--osprey-config={shrunk(pytester.path)}", "--osprey-results=res",
        "-p", "no:cacheprovider", timeout=2400,
    )
    out = result.stdout.str()
    res = pytester.path / "res"
    meta = json.loads((res / "campaign.json").read_text())
    conditions = meta["conditions"]
    pids, alive = servers_left(conditions)
    assert pids and not alive, f"server processes left: {alive}"
    assert all(c["error"] is None for c in conditions.values()), conditions
    assert all(c["boot_s"] for c in conditions.values()), "each condition boots exactly once"
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "DROP tiny-drafter" in out, out  # by its quality, whatever the speed

    records = [json.loads(line) for line in (res / "records.jsonl").read_text().splitlines()]
    drafted = [r for r in records if r["condition"] == "tiny-drafter" and r["ok"]
               and r["mode"] == "greedy" and r["load"] == "low" and r["accept_length"]]
    assert drafted, "vLLM reported no per-request accept length"
    tokens = sum(r["output_tokens"] for r in drafted)
    vllm_al = tokens / sum(r["output_tokens"] / r["accept_length"] for r in drafted)
    ids = sorted({r["prompt_id"] for r in drafted})
    embedded_al = embedded_accept_length(ids)
    summary = json.loads((res / "summary.json").read_text())
    verdicts = {v["candidate"]: v["verdict"] for v in summary["verdicts"]}
    # Served at temperature 0.8, so the distribution check runs on every candidate: it must
    # have been able to fail (its outcome is what this vLLM build does, printed below) ...
    gates = {(g["kind"], g["id"]): g for g in summary["gates"]}
    for cand in CANDIDATES:
        dist = gates[("distribution", f"{cand}-vs-baseline")]
        assert dist["outcome"] != "skip" and dist["evidence"] != "not_evaluable", dist
    for v in summary["verdicts"]:
        assert "sampled distribution" not in [u["check"] for u in v["unchecked"]], v
    # ... scored by the plain server itself (prompt_logprobs), whose own samples are as
    # served, while the drafted positions of this CPU build are not (verification reads
    # uninitialised memory for the temperature: vLLM #55005): positions 2+ fail (the garbage
    # differs from run to run: near-uniform, loops of unlikely tokens, or a mixture whose best
    # single temperature is near the served one, so the summary names what it saw and never a
    # direction), and the first token, which the target samples alone, is as served.
    for cand in CANDIDATES:
        dist = gates[("distribution", f"{cand}-vs-baseline")]
        details = dist["details"]
        assert details["method"] == "exact" and details["scorer"] == "baseline", details
        assert details["control"]["outcome"] == "pass", details["control"]
        classes = details["candidate"]["classes"]
        assert classes["later"]["outcome"] == "fail", classes
        assert classes["first"]["outcome"] == "pass", classes
        assert dist["outcome"] == "fail" and "positions 2+" in dist["summary"], dist
        assert "served 0.8" in dist["summary"], dist
        assert not re.search(r"less varied|more varied", dist["summary"]), dist
    # ... and the speculation each condition ran is the one the pilot pinned, its acceptance
    # counts agreeing with vLLM's own counters in every stretch.
    fairness = [g for (kind, _), g in gates.items() if kind == "fairness"]
    assert fairness
    for g in fairness:
        details = g["details"]
        spec = details["speculation"]
        assert spec, details
        for name, facts in spec.items():
            asked, ran = facts["asked"], facts["ran"]
            # Read back from the server (dev mode on loopback), not the pilot's own words.
            assert ran["num_draft_tokens"] == asked["num_draft_tokens"] == 4, facts
            assert ran["algorithm"] == asked["algorithm"] and not ran["adaptive"], facts
            assert speculation_differences(name, facts) == [], facts
            assert not [d for d in details["differences"] if d.startswith(f"{name}: ")], details
        rec = details["reconciliation"]
        assert rec and not [r for r in rec if r["mismatch"]], rec
    boots = {n: round(c["boot_s"], 1) for n, c in conditions.items()}
    dist_p = {c: gates[("distribution", f"{c}-vs-baseline")]["p_value"]
              for c in CANDIDATES}
    speedups = {g["id"]: (g["estimate"], g["ci"]) for g in summary["gates"]
                if g["kind"] == "speedup" and g["gating"]}
    print(f"\nvLLM CPU pilot: boots {boots}; accept length vLLM {vllm_al:.3f} vs embedded "
          f"{embedded_al:.3f}; verdicts {verdicts}; distribution p {dist_p}; "
          f"speedups {speedups}")
    assert abs(vllm_al - embedded_al) / embedded_al <= 0.10
