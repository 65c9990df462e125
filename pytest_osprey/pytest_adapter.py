"""The pytest adapter of an active pilot run: fixtures and hooks over one :class:`PilotRun`.

Registered by ``plugin.py`` only when ``--osprey-config`` is given; nothing of the run lives
here but turning its steps and gate results into fixtures, tests and terminal lines.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from .campaign import ProgressEvent
from .engines import BootSpec, Engine, EngineError, make_engine
from .exit_codes import EXIT_OK, exit_code, gate_fails
from .judgement import PREFLIGHT, GateResult, GateSpec, Judgement, design_sees, sampling_budget_sees
from .pilot import Pilot
from .report.console import Line, closing_lines, dry_run_lines
from .report.sections import evidence_words
from .results import Preflight, SavedCampaign
from .results.redact import scrub
from .run.pilot_run import CampaignError, PilotRun, stop_servers

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
        pytest.fail(scrub(str(exc)), pytrace=False)


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


SKIP_WIDTH = 160
"""A skip reason's width at most: pytest's ``-rs`` line adds the test's location (about 40
columns), so each stays under 200; the whole summary is in report.md."""


def skip_reason(prefix: str, first: str) -> str:
    """``prefix: first``, without a repeated "not evaluable", cut to SKIP_WIDTH columns."""
    for said in ("not evaluable: ", "INCONCLUSIVE "):
        if said.strip(" (:") in prefix and first.lower().startswith(said.lower()):
            first = first[len(said):].lstrip(" (")
    text = f"{prefix}: {first}" if first else prefix
    if len(text) <= SKIP_WIDTH:
        return text
    return text[: SKIP_WIDTH - 17].rstrip() + " ... (report.md)"


def assert_gate(result: GateResult, pilot: Pilot) -> None:
    """Turn a gate's outcome into the test's outcome (INCONCLUSIVE as the pilot says)."""
    text = scrub(f"{result.spec.kind}[{result.spec.id}]: {result.summary}")
    # A skip's reason is one line: pytest's short summary (-rs) lists it beside the others.
    first = text.splitlines()[0] if text else ""
    if result.outcome == "skip":
        pytest.skip(skip_reason("could not have failed (not evaluable)", first))
    if not result.spec.gating and result.outcome != "pass":
        # Reported beside the verdict (other load levels, the unusual slice), never deciding it.
        pytest.skip(skip_reason(f"reported only (not gating), {result.outcome.upper()}", first))
    if gate_fails(result, pilot.decision):  # the rule exit_code applies to the whole run
        pytest.fail(("INCONCLUSIVE " if result.outcome == "inconclusive" else "") + text,
                    pytrace=False)
    if result.outcome == "inconclusive":
        if pilot.decision.inconclusive == "skip":
            pytest.skip(skip_reason("INCONCLUSIVE", first))
        return
    if result.evidence != "tested":
        # Passed, but could hardly (or not at all) have failed: never a plain green pass.
        pytest.skip(skip_reason("could not have failed (not evaluable)", first)
                    if result.evidence == "not_evaluable" else skip_reason(
                        f"passed, {evidence_words(result.evidence)} ({result.evidence})", first))


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
                pytest.fail(scrub(str(exc)), pytrace=False)
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
    not shown as empty skips; so are the latency series unless a benchmark output is asked
    for (``--benchmark-json``, ``--benchmark-autosave``, ``--benchmark-compare``,
    ``--osprey-benchmark-tables``)."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    series = benchmark_tables_wanted(config)
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        unplanned = item.get_closest_marker("osprey") is not None and not (
            "osprey_gate" in params or (series and "osprey_series" in params)
            or "osprey_history" in params)
        (drop if unplanned else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _write(tr: Any, line: Line) -> None:
    markup = {word: True for word in line.style.split()}
    tr.write_line(scrub(line.text), **markup)


_SHOWN = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN, None)
    if run is None:
        return
    tr = terminalreporter

    def line(text: str, **markup: bool) -> None:
        tr.write_line(scrub(text), **markup)

    tr.section("osprey pilot")
    if run.partial:
        line(f"INTERRUPTED: {run.partial}; judged as measured, no verdict", red=True, bold=True)
    for note in run.notes[config.stash.get(_SHOWN, 0):]:
        line(f"warning: {note}", yellow=True)
    if run.campaign_error:
        line(f"campaign error: {run.campaign_error}", red=True)
    judgement = run.judged
    if judgement is None:
        if run.dry_run and run.checked is not None:
            for row in dry_run_lines(run.checked, run.conditions):
                _write(tr, row)
        else:
            line("no campaign was judged in this session")
        for p in run.reports:
            line(f"results: {p}")
        return
    data = run.judged_data
    assert data is not None  # judged, so judged from something
    for row in closing_lines(run.pilot, judgement, data, run.comparison,
                             run.reports):
        _write(tr, row)


# pytest-benchmark's own output (its header line, its tables) is shown only when a benchmark
# output was asked for: the latency series are then run as benchmarks, else deselected.
BENCHMARK_OPTIONS = ("benchmark_json", "benchmark_autosave", "benchmark_save",
                     "benchmark_compare", "benchmark_only", "benchmark_histogram")


def benchmark_tables_wanted(config: pytest.Config) -> bool:
    if config.getoption("osprey_benchmark_tables", False):
        return True
    return any(config.getoption(name, None) for name in BENCHMARK_OPTIONS)  # [] when unset


@pytest.hookimpl(wrapper=True)
def pytest_report_header(config: pytest.Config) -> Generator[None, Any, Any]:
    """pytest-benchmark's banner only when its output was asked for; said first: a partial
    saved campaign, a server bound to the network."""
    lines = yield
    if not benchmark_tables_wanted(config):
        lines = [row for row in lines
                 if not (isinstance(row, str) and row.startswith("benchmark: "))]
    run = config.stash.get(RUN, None)
    if run is None:
        return lines
    config.stash[_SHOWN] = len(run.notes)
    size = [f"osprey {run.size.line()}"] if run.size is not None else []
    sees = sampling_budget_sees(run.pilot, len(run.trace.prompts)) if size and run.trace else None
    size += [f"osprey quality: {sees}"] if sees else []
    if size and run.trace:
        size.append(f"osprey speed: {design_sees(run.pilot, len(run.trace.prompts)).line()}")
    return [*lines, *size, *(scrub(f"osprey warning: {note}") for note in run.notes)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Backstop: whatever was booted is ended, whatever happened (quickly when interrupted).
    from .engines.stopping import INTERRUPT_GRACE_S

    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    stop_servers(INTERRUPT_GRACE_S if interrupted else None)
    run = session.config.stash.get(RUN, None)
    if run is not None:
        run.release()
    # The session ends as every other entry point would end this run (exit_code): a partial
    # campaign or lost results never pass, nor does a judgement some gate test left unseen.
    if run is not None and exitstatus == pytest.ExitCode.OK and (
            run.failed_outside_gates or (run.judged is not None and exit_code(
                run.judged, run.pilot.decision) != EXIT_OK)):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if interrupted:
        # Results are written and servers stopped: what is left in memory (models, the
        # campaign) is released by the exit below; full collections of it at unconfigure
        # cost seconds a CI runner does not give after its SIGTERM.
        gc.freeze()
        session.config.stash[_FAST_EXIT] = True


_FAST_EXIT = pytest.StashKey[bool]()


_FULL_TRACE: list[bool] = []  # --full-trace of this session (the hook below has no config)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _FULL_TRACE[:] = [bool(session.config.option.fulltrace)]
    # Before pytest writes its first line: a reader that goes away (``| head -1``) silences
    # the terminal, never the run (its records and reports are written, its exit status
    # the gates'), as on the command line.
    writer = getattr(session.config.pluginmanager.getplugin("terminalreporter"), "_tw", None)
    stream = getattr(writer, "_file", None)
    if stream is not None and not isinstance(stream, QuietOnClose):
        writer._file = QuietOnClose(stream)  # type: ignore[union-attr]


class QuietOnClose:
    """A text stream whose writes stop, silently, once its reader has gone: the descriptor
    is pointed at /dev/null, so that the interpreter's own flush at exit is quiet too."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.closed_under_us = False

    def _gone(self) -> None:
        self.closed_under_us = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        if self.closed_under_us:
            return len(text)
        try:
            return int(self._stream.write(text))
        except (BrokenPipeError, ValueError):  # ValueError: a stream closed under us
            self._gone()
            return len(text)

    def flush(self) -> None:
        if self.closed_under_us:
            return
        try:
            self._stream.flush()
        except (BrokenPipeError, ValueError):
            self._gone()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@pytest.hookimpl(tryfirst=True)
def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Ctrl-C/SIGTERM: pytest shows only where the interrupt landed (unless --full-trace),
    yet renders the whole traceback first, reading and parsing the source of every frame
    of the campaign (over a second here). Only the shown frame is kept."""
    if len(excinfo.traceback) > 1 and not any(_FULL_TRACE):
        excinfo.traceback = excinfo.traceback[-1:]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An interrupted run ends here, once every plugin has unconfigured: the interpreter's
    own teardown (torch's above all) takes seconds more, after a CI runner's SIGTERM."""
    if config.stash.get(_FAST_EXIT, False) and not config.option.fulltrace:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(pytest.ExitCode.INTERRUPTED))


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
    """Campaign progress in the terminal: a line when a phase starts and when it ends, and
    at most one every 30 s in between."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.last: tuple[str, str, str, int, str] | None = None
        self.last_t = 0.0

    def __call__(self, e: ProgressEvent) -> None:
        # Looked up when needed: the terminal reporter registers itself after this plugin's
        # pytest_configure, where the printer is made.
        tr = self.config.pluginmanager.getplugin("terminalreporter")
        if tr is None:
            return
        key = e.key
        now = time.monotonic()
        first = key != self.last
        finished = e.total and e.done == e.total
        if not (first or finished or now - self.last_t > 30):
            return
        self.last, self.last_t = key, now
        with _uncaptured(self.config):
            tr.write_line(scrub(e.line(finished=bool(finished))))
            tr.flush()  # seen as it happens, also when the output is a file
