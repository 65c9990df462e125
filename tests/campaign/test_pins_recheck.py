"""Pinned drafter files are hashed again at each boot and after the campaign: a file swapped
after preflight fails the artifact gate, naming the file, and is never served under the pin."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.judgement import judge, plan_gates
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.results.preflight_file import Preflight
from testkit.factories import endpoint_conditions, make_pilot, write_trace
from testkit.fake_server import Reply, ScriptedServer, sglang_routes


def _reply(_body: Any) -> Reply:
    meta = {"prompt_tokens": 2, "completion_tokens": 2, "finish_reason": "length"}
    return Reply(events=[(0, {"text": "ab", "output_ids": [5, 6], "meta_info": meta})])


def _run(tmp_path: Path, swap_when: str) -> tuple[Any, Any]:
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    weights = drafter / "model.safetensors"
    weights.write_bytes(b"the weights preflight checked")
    pin = hashlib.sha256(weights.read_bytes()).hexdigest()
    trace = write_trace(tmp_path / "trace.jsonl", 4)

    def swapping(body: Any) -> Reply:
        # The baseline's server swaps the candidate's weights while it is being measured,
        # i.e. after preflight and (for "before boot") before the candidate boots.
        weights.write_bytes(b"other weights")
        return _reply(body)

    with ScriptedServer(routes=sglang_routes(swapping if swap_when == "before boot"
                                             else _reply)) as a, \
            ScriptedServer(routes=sglang_routes(swapping if swap_when == "during"
                                                else _reply)) as b:
        conds = endpoint_conditions({"base": a.url, "cand": b.url})
        conds["cand"] |= {"drafter": str(drafter), "pins": {"sha256": {"model.safetensors": pin}}}
        pilot = make_pilot(conds, target={"engine": "endpoint", "model": "m"},
                           trace={"files": [str(trace)]},
                           load={"levels": {"low": 1}, "warmup_requests": 0, "passes": 1,
                                 "order": "sequential"},
                           report={"html": False})
        data = Campaign(pilot, load_trace([trace]), tmp_path / "res", ["base", "cand"]).run()
    results = judge(pilot, plan_gates(pilot, ["base", "cand"]), data, Preflight())
    return data, results


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_file_swapped_before_its_boot_is_not_served(tmp_path: Path) -> None:
    data, judged = _run(tmp_path, "before boot")
    info = data.meta.conditions["cand"]
    assert info.error is not None and "pinned model.safetensors changed (boot 1)" in info.error
    assert not data.of("cand")  # nothing measured on the swapped file
    artifact = judged.results[("artifact", "cand")]
    assert artifact.outcome == "fail" and "model.safetensors" in artifact.summary
    assert judged.verdicts[0].verdict == "DROP"


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_file_swapped_during_the_campaign_fails_the_artifact_gate(tmp_path: Path) -> None:
    data, judged = _run(tmp_path, "during")
    checks = data.meta.conditions["cand"].pins
    assert [(c.when, c.ok) for c in checks] == [("boot 1", True), ("after the campaign", False)]
    artifact = judged.results[("artifact", "cand")]
    assert artifact.outcome == "fail"
    assert artifact.summary.startswith("pinned model.safetensors changed (after the campaign)")
    assert judged.verdicts[0].verdict == "DROP"


@pytest.mark.slow  # over a second on 2 busy cores
def test_unchanged_pins_keep_the_gate_as_preflight_judged(tmp_path: Path) -> None:
    data, judged = _run(tmp_path, "never")
    assert all(c.ok for c in data.meta.conditions["cand"].pins)
    assert len(data.meta.conditions["cand"].pins) == 2
    assert judged.results[("artifact", "cand")].outcome == "skip"  # no preflight report given
