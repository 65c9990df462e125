"""A condition that never ran: its candidate's verdict says so, once, and claims nothing
about speed or quality that was never measured."""

from __future__ import annotations

from pytest_osprey.judgement import judge, plan_gates
from pytest_osprey.judgement.verdict.diagnosis import diagnose_all
from pytest_osprey.report.headline import headline
from pytest_osprey.results.preflight_file import Preflight
from testkit.factories import make_pilot, make_record, saved_campaign

CONDITIONS = {"base": {"role": "baseline"}, "cand": {"role": "candidate", "drafter": "/m/d"}}


def _judged(errors: dict[str, str | None]) -> tuple[list[str], list[str], list[str]]:
    pilot = make_pilot(conditions=CONDITIONS)
    ran = [c for c, e in errors.items() if e is None]
    recs = [make_record(c, f"p{i}", repetition=r) for c in ran for r in range(2)
            for i in range(6)]
    data = saved_campaign(recs, conditions={c: {"error": e} for c, e in errors.items()},
                          load_levels={"low": 1}, status="complete")
    j = judge(pilot, plan_gates(pilot, list(errors)), data, Preflight())
    diags = diagnose_all(pilot, j.verdicts, list(j.results.values()), j.figures, data)
    return ([v.verdict for v in j.verdicts], [headline(d) for d in diags],
            [r.text for d in diags for r in d.reasons])


def test_a_candidate_that_never_booted_is_dropped_for_that_alone() -> None:
    verdicts, (line,), reasons = _judged({"base": None, "cand": "server not healthy after 5 s"})
    assert verdicts == ["DROP"]
    assert line == ("DROP cand: cand did not run: server not healthy after 5 s; speed and "
                    "quality not measured")
    assert "quality" not in line.split(";")[0] and "worse" not in line
    assert reasons == ["cand did not run: server not healthy after 5 s"]


def test_a_baseline_that_never_booted_leaves_the_candidate_uncompared() -> None:
    verdicts, (line,), reasons = _judged({"base": "exited with code 1", "cand": None})
    assert verdicts == ["INCONCLUSIVE"]
    assert line.startswith("INCONCLUSIVE cand: reference base did not run: exited with code 1")
    assert reasons == ["reference base did not run: exited with code 1"]


def test_both_running_is_judged_on_the_measurements() -> None:
    verdicts, (line,), _ = _judged({"base": None, "cand": None})
    assert verdicts[0] in ("KEEP", "DROP", "INCONCLUSIVE") and "did not run" not in line
