"""Fairness: conditions may differ in the drafter only (fingerprints, sampling, trace, prompts)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pytest_osprey.judgement.service.fairness import ADVICE, fairness_check
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_record


def fp(**over: Any) -> dict[str, Any]:
    base = {"engine": "transformers", "version": "5.24.0", "device": "cpu",
            "device_name": "x86_64", "dtype": "float32", "quantization": "none",
            "context_length": 1024, "chat_template": "none", "drafter": None, "threads": 2}
    return {**base, **over}


def meta(**fingerprints: dict[str, Any]) -> dict[str, Any]:
    return {
        "trace_hash": "abc",
        "sampling": {"greedy": True, "sampled": {"temperature": 0.8, "top_p": 1.0}, "seed": 0},
        "conditions": {name: {"role": "candidate", "error": None, "fingerprint": f}
                       for name, f in fingerprints.items()},
    }


def full(conds: list[str], pids: tuple[str, ...] = ("a", "b", "c")) -> list[RequestRecord]:
    return [make_record(c, p, load=load, mode=mode) for c in conds for p in pids
            for load, mode in (("low", "greedy"), ("concurrent", "greedy"), ("low", "sampled"))]


def test_same_setup_is_fair_even_with_a_different_drafter() -> None:
    m = meta(baseline=fp(), cand=fp(drafter="d", threads=4))  # drafter/threads not compared
    res = fairness_check(m, full(["baseline", "cand"]))
    assert res.ok and not res.differences and not res.not_shown
    assert res.compared["dtype"] == {"baseline": "float32", "cand": "float32"}
    assert res.compared["trace_hash"] == {"baseline": "abc", "cand": "abc"}
    assert "comparable" in res.summary


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("dtype", "bfloat16", "dtype differs: baseline='float32', cand='bfloat16'"),
        ("quantization", "int4", "quantization differs: baseline='none', cand='int4'"),
        ("device_name", "H100", "device_name differs: baseline='x86_64', cand='H100'"),
        ("version", "5.25.0", "version differs"),
        ("engine", "sglang", "engine differs"),
        ("context_length", 2048, "context_length differs: baseline=1024, cand=2048"),
        ("chat_template", "sha256:0123456789ab",
         "chat_template differs: baseline='none', cand='sha256:0123456789ab'"),
    ],
)
def test_a_fingerprint_difference_fails_naming_field_and_values(
    field: str, value: Any, shown: str
) -> None:
    res = fairness_check(meta(baseline=fp(), cand=fp(**{field: value})), full(["baseline", "cand"]))
    assert not res.ok
    assert any(shown in d for d in res.differences), res.differences
    assert ADVICE in res.summary


def test_dtype_aliases_are_the_same_precision() -> None:
    res = fairness_check(meta(b=fp(dtype="bf16"), c=fp(dtype="torch.bfloat16")), [])
    assert res.ok


def test_missing_fields_are_not_shown_not_failures() -> None:
    sglang = {"engine": "sglang", "version": "0.5.23", "device": "NVIDIA H100",
              "dtype": "bfloat16", "context_length": 4096, "chat_template": "none"}
    vllm_like = {"engine": "sglang", "version": "0.5.23", "dtype": "bfloat16",
                 "context_length": None, "chat_template": "none"}
    res = fairness_check(meta(base=sglang, cand=vllm_like), full(["base", "cand"]))
    assert res.ok, res.differences
    assert res.compared["device_name"] == {"base": "NVIDIA H100", "cand": None}
    assert "device_name not shown for cand" in res.not_shown
    assert "context_length not shown for cand" in res.not_shown
    assert "not shown" in res.summary


def test_sampling_and_trace_from_campaign_or_per_condition() -> None:
    m = meta(base=fp(), cand=fp())
    m["conditions"]["cand"]["sampling"] = {"greedy": True, "sampled": {"temperature": 1.0}}
    m["conditions"]["cand"]["trace_hash"] = "def"
    res = fairness_check(m, [])
    assert not res.ok
    assert any(d.startswith("sampling differs: base=") for d in res.differences)
    assert "trace_hash differs: base='abc', cand='def'" in res.differences


def test_conditions_that_did_not_run_are_left_out() -> None:
    m = meta(base=fp(), cand=fp(), broken={})
    m["conditions"]["broken"]["error"] = "not booted: OOM"
    res = fairness_check(m, full(["base", "cand"]))
    assert res.ok and res.not_compared == ["broken"]
    assert "broken" not in res.compared["dtype"]


def test_every_condition_must_be_sent_the_same_prompts_per_load_and_mode() -> None:
    records = full(["base", "cand"])
    records = [r for r in records
               if not (r.condition == "cand" and r.load == "concurrent" and r.prompt_id == "b")]
    records += [make_record("base", f"x{i}", mode="sampled") for i in range(7)]
    res = fairness_check(meta(base=fp(), cand=fp()), records)
    assert not res.ok
    assert ("load 'concurrent', greedy: cand has no request for 1 prompt(s) the others were "
            "sent: b") in res.differences
    sampled = next(d for d in res.differences if "sampled" in d)
    assert "cand has no request for 7 prompt(s)" in sampled and "(+2 more)" in sampled


def test_a_condition_seen_only_in_records_is_compared() -> None:
    res = fairness_check(meta(base=fp()), full(["base"]) + full(["ghost"], ("a",)))
    assert not res.ok
    assert "device_name not shown for ghost" in res.not_shown
    assert any("ghost has no request for 2 prompt(s)" in d for d in res.differences)


def test_a_single_condition_is_trivially_fair() -> None:
    res = fairness_check(meta(base=fp()), full(["base"]))
    assert res.ok and res.compared == {}


def test_input_is_not_modified() -> None:
    m = meta(base=fp(), cand=fp(dtype="float16"))
    before = copy.deepcopy(m)
    fairness_check(m, [])
    assert m == before


# --------------------------------------------------------------------------- running caps


def closed(conds: list[str], concurrency: int) -> list[RequestRecord]:
    return [make_record(c, p, load="heavy", concurrency=concurrency) for c in conds
            for p in ("a", "b")]


def test_a_running_cap_below_the_load_on_one_side_only_is_unfair() -> None:
    # SGLang 0.5.23: a speculative server runs at most 48 requests, the plain one 4096.
    m = meta(base=fp(max_running_requests=4096), cand=fp(max_running_requests=48))
    res = fairness_check(m, closed(["base", "cand"], 64))
    assert not res.ok
    (diff,) = res.differences
    assert "load 'heavy': up to 64 requests in flight, but cand runs at most 48" in diff
    assert "--max-running-requests" in diff
    assert res.compared["max_running_requests"] == {"base": 4096, "cand": 48}


@pytest.mark.parametrize(("base", "cand", "concurrency"), [
    (4096, 48, 32),  # both caps above the load: nobody queues
    (None, 4096, 64),  # one side says nothing, the other's cap does not bite
])
def test_running_caps_above_the_load_are_fair(
    base: int | None, cand: int, concurrency: int
) -> None:
    m = meta(base=fp(max_running_requests=base), cand=fp(max_running_requests=cand))
    assert fairness_check(m, closed(["base", "cand"], concurrency)).ok


@pytest.mark.parametrize(("base", "cand"), [(48, 48), (None, 48)])
def test_a_level_above_any_conditions_cap_is_unfair(base: int | None, cand: int) -> None:
    # Even with the same cap on both sides the level is not the load it names: the server
    # runs 48 and queues the rest.
    m = meta(base=fp(max_running_requests=base), cand=fp(max_running_requests=cand))
    res = fairness_check(m, closed(["base", "cand"], 64))
    assert not res.ok
    (diff,) = res.differences
    assert "load 'heavy': up to 64 requests in flight" in diff and "cand runs at most 48" in diff
    assert ("base runs at most" in diff) == (base == 48)
    assert "--max-running-requests of at least 64" in diff


def test_open_loop_caps_are_judged_on_what_was_in_flight() -> None:
    m = meta(base=fp(max_running_requests=4096), cand=fp(max_running_requests=2))

    def open_loop(starts: list[float]) -> list[RequestRecord]:
        return [make_record(c, f"p{i}", load="poisson", concurrency=0, rate=5.0,
                            started_at=t, e2e_s=1.0)
                for c in ("base", "cand") for i, t in enumerate(starts)]

    spread = open_loop([0.0, 1.5, 3.0, 4.5])  # one at a time: the cap of 2 never bites
    assert fairness_check(m, spread).ok
    burst = open_loop([0.0, 0.2, 0.4, 0.6])  # four at once
    res = fairness_check(m, burst)
    assert not res.ok and "up to 4 requests in flight, but cand runs at most 2" in (
        res.differences[0])


def test_in_flight_matches_the_overlap_counted_pair_by_pair() -> None:
    """The in-flight average from sorted spans and prefix sums equals the time overlap of
    every sent request with each measured one's decode window, summed pair by pair (random
    spans, fillers, a request whose first token is its last, one group of the records)."""
    import numpy as np

    from pytest_osprey.judgement.service.load import in_flight

    rng = np.random.default_rng(3)
    recs = []
    for i in range(300):
        start = 1.7e9 + float(rng.uniform(0, 50))  # epoch-sized times
        e2e = float(rng.uniform(0.1, 5.0))
        ttft = e2e if i % 50 == 0 else float(rng.uniform(0, e2e))
        recs.append(make_record("base", f"p{i}", started_at=start, e2e_s=e2e, ttft_s=ttft,
                                itl_s=[0.1], filler=i % 3 == 0))
    spans = [(r.started_at or 0.0, (r.started_at or 0.0) + (r.e2e_s or 0.0)) for r in recs]
    got = dict((id(r), v) for r, v in in_flight(recs))
    assert len(got) == sum(not r.filler for r in recs)
    for r in recs:
        if r.filler:
            continue
        a = (r.started_at or 0.0) + (r.ttft_s or 0.0)
        b = (r.started_at or 0.0) + (r.e2e_s or 0.0)
        if b > a:
            want = sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans) / (b - a)
        else:
            want = sum(s <= a < e for s, e in spans) + 1.0
        assert got[id(r)] == pytest.approx(want, rel=1e-6, abs=1e-6), (r.prompt_id, want)
