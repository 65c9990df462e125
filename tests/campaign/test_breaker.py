"""The circuit breaker: a condition whose requests keep timing out is stopped, named, and its
verdict withheld, while the campaign goes on (a real hanging server: testkit's
hostile_server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_osprey.campaign.requests import TimeoutBreaker
from testkit.hostile_server import hostile_server, run_campaign, strict_json


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_hanging_candidate_is_stopped_by_the_breaker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    timeout = 0.5
    with hostile_server("hang") as bad, hostile_server("impossible") as good:
        code, res = run_campaign(tmp_path, bad.url, good.url, prompts=6, passes=3,
                         request_timeout_s=timeout)
    output = capsys.readouterr()
    meta = strict_json(res / "campaign.json")[0]
    error = meta["conditions"]["cand"]["error"]
    assert error == ("stopped: 3 requests in a row timed out (load.request_timeout_s 0.5 s); "
                     "its other requests were not sent and its verdict is withheld")
    assert "cand" in output.out + output.err and "3 requests in a row timed out" in (
        output.out + output.err)
    records = strict_json(res / "records.jsonl")
    cand = [r for r in records if r["condition"] == "cand"]
    assert len(cand) == 3 and all(not r["ok"] for r in cand)  # 15 of 18 never sent
    assert all(r["e2e_s"] >= timeout for r in cand)
    base = [r for r in records if r["condition"] == "base"]
    assert len(base) == 18 and all(r["ok"] for r in base)  # the campaign went on
    # 18 hung requests would hold the candidate 9 s; the breaker ends it after 3 (1.5 s).
    spent = sum(e["ended"] - e["started"] for e in meta["schedule"] if e["condition"] == "cand")
    assert 3 * timeout <= spent < 6 * timeout
    summary = strict_json(res / "summary.json")[0]
    verdict = next(v for v in summary["verdicts"] if v["candidate"] == "cand")
    assert verdict["verdict"] != "DROP"
    assert any("no verdict" in r for r in verdict["reasons"]), verdict["reasons"]
    assert code != 0


def test_the_breaker_counts_timeouts_in_a_row_only() -> None:
    breaker = TimeoutBreaker()
    assert breaker.note(False, 1.0, 1.0) is None
    assert breaker.note(False, 1.0, 1.0) is None
    assert breaker.note(True, 0.1, 1.0) is None  # an answer resets it
    assert breaker.note(False, 1.0, 1.0) is None
    assert breaker.note(False, 0.2, 1.0) is None  # a failure that is not a timeout: no count
    assert breaker.note(False, 1.2, 1.0) is None
    assert breaker.note(False, 1.0, 1.0) is not None  # the third in a row
    wide = TimeoutBreaker()
    assert all(wide.note(False, 2.0, 1.0, in_flight=8) is None for _ in range(7))
    assert wide.note(False, 2.0, 1.0, in_flight=8) is not None  # all 8 in flight timed out


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_candidate_hanging_from_its_warm_up_is_stopped_before_any_timed_request(
        tmp_path: Path) -> None:
    with hostile_server("hang") as bad, hostile_server("impossible") as good:
        code, res = run_campaign(tmp_path, bad.url, good.url, prompts=3, warmup_requests=5,
                                 request_timeout_s=0.3)
    meta = strict_json(res / "campaign.json")[0]
    assert meta["conditions"]["cand"]["error"] == (
        "warm-up stopped: 3 requests in a row timed out (load.request_timeout_s 0.3 s); its "
        "other requests were not sent and its verdict is withheld")
    records = strict_json(res / "records.jsonl")
    assert [r for r in records if r["condition"] == "cand"] == []
    assert len([r for r in records if r["condition"] == "base" and r["ok"]]) == 3
    assert code != 0
