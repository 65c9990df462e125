"""The analyses beside the gates: environment stability (a planted slowdown must be flagged,
a steady machine must not be), per-domain speed, acceptance per draft position, the set-up
block and what a load level means for each engine."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_osprey.judgement.figures.analyses import domain_rows
from pytest_osprey.judgement.quality.acceptance import per_position_acceptance
from pytest_osprey.judgement.speed.stability import DRIFT_WARN, stability
from pytest_osprey.report.setup import hardware, load_meaning, memory_basis, setup_rows
from pytest_osprey.results.campaign_file import CampaignFile
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_record

DOMAINS = {"p1": "chat", "p2": "chat", "p3": "chat", "p4": "code", "p5": "code", "p6": "code"}


def rec(cond: str, pid: str, block: int, e2e: float, **kw: Any) -> RequestRecord:
    fields: dict[str, Any] = {
        "block": block, "load": "busy", "concurrency": 4, "domain": DOMAINS.get(pid, "d"),
        "ok": True, "e2e_s": e2e, "ttft_s": 0.1 * e2e, "output_tokens": 30,
        "started_at": 100.0 * block}
    fields.update(kw)
    return make_record(cond, pid, measured=False, **fields)


def meta(**kw: Any) -> dict[str, Any]:
    base = {"run_id": "r", "baseline": "baseline", "candidates": ["cand"],
            "load_levels": {"busy": 4}, "blocks": 2,
            "conditions": {"baseline": {"role": "baseline"}, "cand": {"role": "candidate"}},
            "host": {"machine": "x86_64", "cpus": 2}}
    return base | kw


def noisy_baseline(slowdown: float, seed: int) -> SavedCampaign:
    """The baseline over 20 prompts in 2 blocks, 5% lognormal noise per request; block 2
    runs ``slowdown`` times slower (a machine that got busy)."""
    rng = np.random.default_rng(seed)
    effect = {f"q{i}": rng.lognormal(0, 0.5) for i in range(20)}
    recs = [rec("baseline", pid, b, e * (slowdown if b else 1.0) * rng.lognormal(0, 0.05))
            for b in range(2) for pid, e in effect.items()]
    return SavedCampaign(Path("."), meta(), recs)


def test_planted_slowdown_is_flagged_and_measured() -> None:
    st = stability(noisy_baseline(1.73, seed=1))
    (drift,) = st.drift
    assert (drift.load, drift.block, drift.prompts) == ("busy", 2, 20)
    assert drift.ratio == pytest.approx(1.73, rel=0.05)
    assert st.max_drift == pytest.approx(0.73, abs=0.06)
    (warning,) = st.warnings
    assert "ran 7" in warning and "slower in pass 2" in warning


def test_a_steady_machine_is_not_flagged() -> None:
    flagged = sum(bool(stability(noisy_baseline(1.0, seed=s)).warnings) for s in range(50))
    assert flagged == 0  # 5% request noise over 20 prompts stays far inside the 10% rule
    assert DRIFT_WARN == 0.10


def test_load_average_beyond_the_cpus_is_flagged() -> None:
    data = noisy_baseline(1.0, seed=2)
    data.meta = CampaignFile.model_validate(meta(schedule=[
        {"block": 0, "condition": "baseline", "load": "busy", "mode": "greedy",
         "started": 0.0, "ended": 50.0, "loadavg": [1.0, 1.0, 1.0],
         "loadavg_end": [1.5, 1.0, 1.0]},
        {"block": 1, "condition": "baseline", "load": "busy", "mode": "greedy",
         "started": 100.0, "ended": 150.0, "loadavg": [7.9, 3.0, 2.0], "pass_index": 1},
    ]))
    st = stability(data)
    assert [x.loadavg_1m for x in st.load] == [1.5, 7.9]
    assert any("load average up to 7.9 on 2 CPUs (pass 2" in w for w in st.warnings)


def test_domain_speedup_and_accept_length() -> None:
    # code runs 2x faster with the candidate, chat 1.25x; the drafter accepts more on code.
    recs = []
    for b in range(2):
        for pid, dom in DOMAINS.items():
            base = 1.0 + 0.1 * int(pid[1:])
            speed = 2.0 if dom == "code" else 1.25
            recs.append(rec("baseline", pid, b, base))
            recs.append(rec("cand", pid, b, base / speed,
                            spec_verify_ct=10 if dom == "code" else 20))
    rows = {r.domain: r for r in domain_rows(SavedCampaign(Path("."), meta(), recs),
                                             "baseline", "cand", "busy")}
    assert rows["code"].speedup == pytest.approx(2.0)
    assert rows["chat"].speedup == pytest.approx(1.25)
    assert rows["code"].accept_length == pytest.approx(3.0)
    assert rows["chat"].accept_length == pytest.approx(1.5)
    assert rows["code"].prompts == 3 and rows["code"].ci_low == pytest.approx(2.0)


def test_per_position_acceptance_from_what_engines_record() -> None:
    # 10 + 30 verify steps; position 1 accepted in 8 + 16, position 2 in 5 + 9.
    a = rec("cand", "p1", 0, 1.0, spec_drafts=10, spec_accepted_per_position=[8, 5])
    b = rec("cand", "p2", 0, 1.0, spec_drafts=30, spec_accepted_per_position=[16, 9])
    failed = rec("cand", "p3", 0, 1.0, ok=False, spec_drafts=10,
                 spec_accepted_per_position=[10, 10])
    assert per_position_acceptance([a, b, failed]) == pytest.approx([0.6, 0.35])
    assert per_position_acceptance([rec("cand", "p1", 0, 1.0)]) is None


FP = {"engine": "transformers", "version": "4.57.1", "torch": "2.13.0", "device": "cpu",
      "device_name": "x86_64", "dtype": "float32", "threads": 2, "context_length": 1024,
      "memory": {"kind": "host", "basis": "weights"},
      "memory_method": "weights + buffers of the loaded models"}


def test_setup_block_says_what_ran_and_what_load_means() -> None:
    m = CampaignFile.model_validate(meta(
        blocks=2, order="abba", warmup_requests=3, load_levels={"low": 1, "concurrent": 4},
        block_order=[["baseline", "cand"], ["cand", "baseline"]], prompt_ids=["a", "b"],
        started_at=1_767_225_600.0,
        conditions={"baseline": {"role": "baseline", "fingerprint": FP},
                    "cand": {"role": "candidate", "fingerprint": {
                        **FP, "drafter": "models/d", "num_draft_tokens": 4}},
                    "looped": {"role": "candidate", "fingerprint": {
                        **FP, "drafter": "models/e", "num_draft_tokens": 3,
                        "draft_loop": "engine"}}}))
    rows = dict(setup_rows(m))
    assert rows["engine"] == "transformers 4.57.1 (torch 2.13.0)"
    assert rows["hardware"] == "x86_64 (2 CPUs)" == hardware(m)
    assert rows["dtype"] == "float32" and rows["threads"] == "2"
    assert rows["replay"] == "2 block(s) interleaved"  # recorded before replay plans
    assert rows["warm-up"].startswith("3 request(s)")
    assert "one request at a time" in rows["load levels"] and "queueing" in rows["load levels"]
    assert rows["drafter of cand"] == "d, 4 tokens drafted per step"  # its folder's name
    assert rows["drafter of looped"] == ("e, 3 tokens drafted per step "
                                         "(the engine's draft loop)")
    assert rows["started"] == "2026-01-01 00:00 UTC"
    label, short, _ = memory_basis(m)
    assert label == "weights MiB" and "not a peak" in short and "weights MiB" in rows


@pytest.mark.parametrize(("engine", "says"), [
    ("sglang", "batches them together"), ("vllm", "batches them together"),
    ("endpoint/openai", "endpoint"), ("transformers", "one request at a time")])
def test_load_meaning_per_engine(engine: str, says: str) -> None:
    m = CampaignFile.model_validate(meta(conditions={"b": {"fingerprint": {"engine": engine}}},
                                         load_levels={"p": {"rate": 2.0}}))
    text = load_meaning(m)
    assert says in text and "Poisson" in text


def test_the_batching_embedded_engine_is_not_said_to_queue() -> None:
    fp = {"engine": "transformers", "batching": "continuous", "max_batch": 128}
    text = load_meaning(CampaignFile.model_validate(meta(conditions={"b": {"fingerprint": fp}})))
    assert "batches them together" in text and "one request at a time" not in text


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_domain_interval_from_few_prompts_covers_the_true_speedup() -> None:
    """Per-domain intervals from 3 to 6 prompts, by simulation against a known speedup
    (1.3x): the t interval stays near its 95% where a percentile bootstrap of the same
    prompts covers some 60-70%; below 3 prompts there is none. Noise: heavy-tailed (Laplace)
    prompt effects, each carrying 30% of the one before (not independent)."""
    from pytest_osprey.judgement.figures.analyses import DOMAIN_MIN_PROMPTS, domain_interval

    rng = np.random.default_rng(11)
    true = math.log(1.3)
    assert domain_interval([0.2, 0.3]) is None and DOMAIN_MIN_PROMPTS == 3
    sims = 1500
    for n in (3, 4, 6):
        hits = boot_hits = 0
        for _ in range(sims):
            e = rng.laplace(0, 0.1, n)
            for i in range(1, n):
                e[i] += 0.3 * e[i - 1]
            x = true + e
            low, high = domain_interval(x) or (math.nan, math.nan)
            hits += low <= 1.3 <= high
            draws = x[rng.integers(0, n, (500, n))].mean(axis=1)
            blow, bhigh = np.exp(np.percentile(draws, [2.5, 97.5]))
            boot_hits += blow <= 1.3 <= bhigh
        # The correlated prompts cost the t interval a few points at n=6 (about 89%); the
        # bootstrap, the planted fault, misses three to four times as often.
        assert hits / sims >= 0.87, (n, hits / sims)
        assert boot_hits / sims <= hits / sims - 0.15, (n, boot_hits / sims, hits / sims)
