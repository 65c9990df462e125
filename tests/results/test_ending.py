"""How a campaign ended, read from campaign.json and the records alone."""

from __future__ import annotations

from typing import Any

from pytest_osprey.results.ending import campaign_end, stop_text
from testkit.factories import make_record, saved_campaign


def _records(passes: int) -> list[Any]:
    return [make_record(c, f"p{i}", repetition=r, mode="greedy")
            for c in ("base", "cand") for r in range(passes) for i in range(4)]


def _plan(passes: int) -> dict[str, Any]:
    return {"passes": passes, "looks": passes, "blocks": {"low": [["p0", "p1"], ["p2", "p3"]]}}


def test_an_early_stop_says_which_way_and_what_it_cost() -> None:
    data = saved_campaign(_records(1), plan=_plan(4), status="complete", stopped_after_block=1,
                          sequential={"cand": [{"look": 1, "decision": "keep"}]})
    end = campaign_end(data)
    assert (end.passes_planned, end.passes_run, end.stopped_early) == (4, 1, True)
    assert end.stopped_after_pass == 1 and end.decisions == {"cand": "keep"}
    assert end.units == {"low": 2}
    assert "drift between passes" in end.not_measured
    assert end.text.startswith("stopped after pass 1 of 4: speed cleared the early-KEEP "
                               "boundary; not measured: drift between passes")
    assert end.as_dict()["stopped_early"] is True


def test_candidates_decided_differently_are_each_named() -> None:
    recs = _records(2) + [make_record("other", f"p{i}", repetition=r, mode="greedy")
                          for r in range(2) for i in range(4)]
    data = saved_campaign(recs, plan=_plan(4), status="complete", stopped_after_block=2,
                          sequential={"cand": [{"decision": "continue"}, {"decision": "keep"}],
                                      "other": [{"decision": "drop"}]})
    end = campaign_end(data)
    assert end.passes_run == 2 and end.not_measured == []
    assert "cand: speed cleared the early-KEEP boundary" in end.text
    assert "other: speed crossed the early-DROP boundary" in end.text


def test_a_full_run_and_an_interrupted_one() -> None:
    full = campaign_end(saved_campaign(_records(4), plan=_plan(4), status="complete"))
    assert not full.stopped_early and full.text == "ran 4 of 4 passes"
    cut = campaign_end(saved_campaign(_records(2), plan=_plan(4), status="interrupted"))
    assert not cut.stopped_early and cut.passes_run == 2
    assert cut.text.startswith("interrupted after 2 of 4 passes")


def test_the_progress_line_at_an_early_stop_says_it_as_the_ending_does() -> None:
    data = saved_campaign(_records(1), plan=_plan(4), status="complete", stopped_after_block=1,
                          sequential={"cand": [{"look": 1, "decision": "drop"}]})
    said = stop_text(1, 4, {"cand": "drop"})
    assert said == ("stopped after pass 1 of 4: speed crossed the early-DROP boundary; not "
                    "measured: drift between passes, near-tie control (a second greedy pass of the "
                    "baseline)")
    assert campaign_end(data).text.startswith(said)
    assert stop_text(2, 4, {"a": "keep", "b": "drop"}) == (
        "stopped after pass 2 of 4: a: speed cleared the early-KEEP boundary; b: speed "
        "crossed the early-DROP boundary")


def test_one_untimed_greedy_pass_beside_sampled_timed_passes_lists_the_missing_control() -> None:
    """Served sampled, the greedy pass runs once per boot: four timed passes measure drift,
    but greedy identity has no rerun of the reference to compare near-ties with."""
    timed = [make_record(c, f"p{i}", repetition=r, mode="serving")
             for c in ("base", "cand") for r in range(4) for i in range(4)]
    greedy = [make_record(c, f"p{i}", repetition=0, mode="greedy")
              for c in ("base", "cand") for i in range(4)]
    end = campaign_end(saved_campaign(timed + greedy, plan=_plan(4), status="complete"))
    assert end.not_measured == ["near-tie control (a second greedy pass of the baseline)"]
    assert end.text == ("ran 4 of 4 passes; not measured: near-tie control (a second greedy "
                        "pass of the baseline)")
    # Two boots each ran the greedy pass: the reference's second boot is the control.
    reboot = [make_record(c, f"p{i}", repetition=0, mode="greedy", boot=1)
              for c in ("base", "cand") for i in range(4)]
    assert campaign_end(saved_campaign(timed + greedy + reboot, plan=_plan(4),
                                       status="complete")).not_measured == []
