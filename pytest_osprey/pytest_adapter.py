"""The pytest adapter of an active pilot run: fixtures and hooks over one :class:`PilotRun`.

Registered by ``plugin.py`` only when ``--osprey-config`` is given; nothing of the run lives
here but turning its steps and gate results into fixtures, tests and terminal lines.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .campaign import ProgressEvent
from .engines import BootSpec, Engine, EngineError, make_engine
from .judgement import GateResult, GateSpec, Judgement
from .judgement.gates import PREFLIGHT
from .pilot import Pilot
from .report.terminal import text_table
from .results import Preflight, SavedCampaign
from .run import CampaignError, PilotRun, stop_servers

RUN = pytest.StashKey[PilotRun]()


def pilot_run(config: pytest.Config) -> PilotRun:
    """The session's pilot run (only while ``--osprey-config`` is active)."""
    return config.stash[RUN]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def osprey_config(request: pytest.FixtureRequest) -> Pilot:
    """The validated pilot (pilot.yaml), paths resolved against its folder."""
    return pilot_run(request.config).pilot


@pytest.fixture(scope="session")
def osprey_preflight(request: pytest.FixtureRequest) -> Preflight:
    """Before anything boots: each condition's command line, each drafter's artifact check.

    Saved as preflight.json; with ``--osprey-reuse`` the saved one is judged.
    """
    return pilot_run(request.config).preflight()


@pytest.fixture(scope="session")
def osprey_campaign(request: pytest.FixtureRequest, osprey_preflight: Preflight) -> SavedCampaign:
    """The measured campaign: run once per session (or loaded with ``--osprey-reuse``).

    A condition whose artifact check or command line failed is not booted; its gates fail
    with the reason.
    """
    try:
        return pilot_run(request.config).campaign()
    except CampaignError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def osprey_results(request: pytest.FixtureRequest, osprey_campaign: SavedCampaign) -> Judgement:
    """Every gate judged and the verdicts, with summary.json and the reports written."""
    return pilot_run(request.config).judgement()


@pytest.fixture
def osprey_gate_result(request: pytest.FixtureRequest, osprey_gate: GateSpec) -> GateResult:
    """The judged result of this test's gate (preflight gates without booting anything)."""
    run = pilot_run(request.config)
    if osprey_gate.kind not in PREFLIGHT:
        request.getfixturevalue("osprey_results")
    return run.gate_result(osprey_gate)


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
    if result.evidence != "tested":
        # Passed, but could hardly (or not at all) have failed: never a plain green pass.
        pytest.skip(f"passed without the evidence to fail ({result.evidence}): {text}")


@pytest.fixture(scope="session")
def osprey_server(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Engine]]:
    """A started engine for a condition, for your own live tests: ``osprey_server("candidate")``.

    Each condition boots at most once per session and is stopped when the session ends.
    """
    run = pilot_run(request.config)
    engines: dict[str, Engine] = {}

    def get(condition: str) -> Engine:
        if condition not in run.pilot.conditions:
            raise pytest.UsageError(
                f"osprey_server: unknown condition {condition!r}; "
                f"defined: {', '.join(run.pilot.conditions)}"
            )
        if condition not in engines:
            log_dir = run.results_dir / "logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            env = {**run.pilot.target.env, **run.pilot.conditions[condition].env}
            engine = make_engine(run.pilot, condition, BootSpec(condition, log_dir, env))
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


# --------------------------------------------------------------------------- hooks


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    run = metafunc.config.stash.get(RUN, None)
    if run is None:
        return
    if "osprey_series" in metafunc.fixturenames and not run.dry_run:
        from .report.series import series_specs

        series = series_specs(run.pilot, run.conditions)
        metafunc.parametrize("osprey_series", series, ids=[s.id for s in series])
    if "osprey_history" in metafunc.fixturenames and run.previous is not None \
            and not run.dry_run:
        kept = run.previous.kept or ["none-kept"]
        metafunc.parametrize("osprey_history", kept, ids=kept)
    if "osprey_gate" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("osprey")
    if marker is None:
        return
    kind = marker.kwargs.get("kind") or marker.args[0]
    specs = [s for s in run.gates if s.kind == kind]
    if specs:  # an unplanned gate stays unparametrized and is deselected below
        metafunc.parametrize("osprey_gate", specs, ids=[s.id for s in specs])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Gates this pilot does not plan (e.g. no latency limits, or a dry run) are deselected,
    not shown as empty skips."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        unplanned = item.get_closest_marker("osprey") is not None and not (
            "osprey_gate" in params or "osprey_series" in params or "osprey_history" in params)
        (drop if unplanned else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN, None)
    if run is None:
        return
    tr = terminalreporter
    tr.section("osprey pilot")
    if run.campaign_error:
        tr.write_line(f"campaign error: {run.campaign_error}", red=True)
    judgement = run.judged
    if judgement is None:
        tr.write_line("dry run: nothing was booted" if run.dry_run
                      else "no campaign was judged in this session")
        return
    for line in text_table(judgement.figures):
        tr.write_line(line)
    tr.write_line("")
    for v in judgement.verdicts:
        color = {"KEEP": "green", "DROP": "red", "INCONCLUSIVE": "yellow"}[v.verdict]
        tr.write_line(v.line(), **{color: True, "bold": True})
    if run.comparison is not None:
        comp = run.comparison
        tr.write_line(f"compared with {comp.previous_dir} (run {comp.previous_run_id}):")
        for f in comp.findings:
            tr.write_line(f"  {'REGRESSION ' if f.regression else ''}{f.text}",
                          red=f.regression)
        for note in comp.notes:
            tr.write_line(f"  {note}")
    for p in run.reports:
        tr.write_line(f"results: {p}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Backstop: whatever was booted is ended, whatever happened.
    stop_servers()


# --------------------------------------------------------------------------- progress


@contextlib.contextmanager
def _uncaptured(config: pytest.Config) -> Iterator[None]:
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


class ProgressPrinter:
    """Campaign progress in the terminal: a line per phase, then a few per replay."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.tr = config.pluginmanager.getplugin("terminalreporter")
        self.last: tuple[str, str, str, int] | None = None
        self.last_t = 0.0

    def __call__(self, e: ProgressEvent) -> None:
        if self.tr is None:
            return
        key = (e.condition, e.phase, e.load, e.block)
        now = time.monotonic()
        first = key != self.last
        finished = e.total and e.done == e.total
        if not (first or finished or now - self.last_t > 10):
            return
        self.last, self.last_t = key, now
        with _uncaptured(self.config):
            self.tr.write_line(e.line(finished=bool(finished)))
