"""Public fixtures, registered only when ``--osprey-config`` is given."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import pytest

from .artifact import check_all
from .campaign import Campaign, CampaignData, load_campaign
from .config import Pilot
from .decision import PREFLIGHT, GateResult, GateSpec, evaluate
from .dryrun import check_command_lines
from .engines import BootSpec, Engine, EngineError, make_engine
from .history import compare
from .judgement import Judgement, judge
from .plugin import STATE, OspreyState, ProgressPrinter
from .records import write_json_atomic
from .report.summary import write_reports


def _state(request: pytest.FixtureRequest) -> OspreyState:
    return request.config.stash[STATE]


@pytest.fixture(scope="session")
def osprey_config(request: pytest.FixtureRequest) -> Pilot:
    """The validated pilot (pilot.yaml), paths resolved against its folder."""
    return _state(request).pilot


@pytest.fixture(scope="session")
def osprey_preflight(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Before anything boots: each condition's command line, each drafter's artifact check.

    Saved as preflight.json; with ``--osprey-reuse`` the saved one is judged.
    """
    state = _state(request)
    if state.preflight is None:
        saved = (state.reuse / "preflight.json") if state.reuse else None
        if saved is not None and saved.is_file():
            state.preflight = json.loads(saved.read_text("utf-8"))
        else:
            reports = check_all(state.pilot, state.conditions)
            commands = check_command_lines(state.pilot, state.conditions)
            state.preflight = {
                "artifacts": {
                    name: {"ok": rep.ok, "checks": [asdict(c) for c in rep.checks]}
                    for name, rep in reports.items()
                },
                "command_lines": {name: asdict(c) for name, c in commands.items()},
            }
            state.results_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(state.results_dir / "preflight.json", state.preflight)
    return state.preflight


@pytest.fixture(scope="session")
def osprey_campaign(
    request: pytest.FixtureRequest, osprey_preflight: dict[str, Any]
) -> CampaignData:
    """The measured campaign: run once per session (or loaded with ``--osprey-reuse``).

    A condition whose artifact check or command line failed is not booted; its gates fail
    with the reason.
    """
    state = _state(request)
    if state.campaign is not None:
        return state.campaign
    if state.campaign_error:
        pytest.fail(state.campaign_error, pytrace=False)
    try:
        if state.reuse is not None:
            state.campaign = load_campaign(state.reuse)
        else:
            skipped = {
                name: f"{what} check failed"
                for what, key in (("artifact", "artifacts"), ("command line", "command_lines"))
                for name, rep in osprey_preflight[key].items()
                if not rep["ok"]
            }
            campaign = Campaign(
                state.pilot, state.trace, state.results_dir, state.conditions, skipped,
                progress=ProgressPrinter(request.config), config_text=state.pilot_text,
            )
            state.campaign = campaign.run()
            shutil.copyfile(state.pilot_path, state.results_dir / "pilot.yaml")
    except (OSError, ValueError) as exc:
        state.campaign_error = f"campaign could not run: {exc}"
        pytest.fail(state.campaign_error, pytrace=False)
    return state.campaign


@pytest.fixture(scope="session")
def osprey_results(
    request: pytest.FixtureRequest, osprey_campaign: CampaignData, osprey_preflight: dict[str, Any]
) -> Judgement:
    """Every gate judged and the verdicts, with summary.json and report.md written."""
    state = _state(request)
    if state.judgement is None:
        state.judgement = judge(state.pilot, state.gates, osprey_campaign, osprey_preflight)
        if state.previous is not None:
            state.comparison = compare(state.pilot, osprey_campaign, state.judgement,
                                       state.previous, state.pilot.decision.regression_tolerance)
        state.results_dir.mkdir(parents=True, exist_ok=True)
        state.reports = write_reports(
            state.results_dir, state.judgement, osprey_campaign, state.pilot, state.comparison
        )
    return state.judgement


@pytest.fixture
def osprey_gate_result(request: pytest.FixtureRequest, osprey_gate: GateSpec) -> GateResult:
    """The judged result of this test's gate (preflight gates without booting anything)."""
    if osprey_gate.kind in PREFLIGHT:
        preflight = request.getfixturevalue("osprey_preflight")
        return evaluate(osprey_gate, _state(request).pilot, None, preflight)
    judgement: Judgement = request.getfixturevalue("osprey_results")
    return judgement.result(osprey_gate)


def assert_gate(result: GateResult, pilot: Pilot) -> None:
    """Turn a gate's outcome into the test's outcome (INCONCLUSIVE as the pilot says)."""
    text = f"{result.spec.kind}[{result.spec.id}]: {result.summary}"
    if result.outcome == "skip":
        pytest.skip(text)
    if not result.spec.gating and result.outcome != "pass":
        # Reported beside the verdict (other load levels, the unusual slice), never deciding it.
        pytest.skip(f"reported only (not gating), {result.outcome.upper()}: {text}")
    if result.outcome == "inconclusive":
        policy = pilot.decision.inconclusive
        if policy == "skip":
            pytest.skip("INCONCLUSIVE " + text)
        if policy == "fail":
            pytest.fail("INCONCLUSIVE " + text, pytrace=False)
        return
    if result.outcome == "fail":
        pytest.fail(text, pytrace=False)


@pytest.fixture(scope="session")
def osprey_server(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Engine]]:
    """A started engine for a condition, for your own live tests: ``osprey_server("candidate")``.

    Each condition boots at most once per session and is stopped when the session ends.
    """
    state = _state(request)
    engines: dict[str, Engine] = {}

    def get(condition: str) -> Engine:
        if condition not in state.pilot.conditions:
            raise pytest.UsageError(
                f"osprey_server: unknown condition {condition!r}; "
                f"defined: {', '.join(state.pilot.conditions)}"
            )
        if condition not in engines:
            log_dir = state.results_dir / "logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            env = {**state.pilot.target.env, **state.pilot.conditions[condition].env}
            engine = make_engine(state.pilot, condition, BootSpec(condition, log_dir, env))
            try:
                engine.start()
            except EngineError as exc:
                engine.stop()
                pytest.fail(str(exc), pytrace=False)
            engines[condition] = engine
        return engines[condition]

    try:
        yield get
    finally:
        for engine in engines.values():
            engine.stop()
