"""pytest hooks only: options, activation, collection of the suites, summary, teardown.

Without ``--osprey-config`` nothing here changes a pytest run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from .campaign import CampaignData, ProgressEvent
from .config import ConfigError, Pilot, load_pilot
from .decision import GateSpec, plan_gates
from .history import Comparison, Previous
from .judgement import Judgement
from .trace import Trace, TraceError, load_trace

SUITES_DIR = Path(__file__).resolve().parent / "suites"
if not SUITES_DIR.is_dir():  # running from a checkout without an install
    SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


@dataclass
class OspreyState:
    pilot: Pilot
    pilot_path: Path
    pilot_text: str
    trace: Trace
    conditions: list[str]
    results_dir: Path
    reuse: Path | None
    gates: list[GateSpec]
    preflight: dict[str, Any] | None = None
    dry_run: bool = False
    campaign: CampaignData | None = None
    campaign_error: str | None = None
    judgement: Judgement | None = None
    reports: list[Path] = field(default_factory=list)
    previous: Previous | None = None  # --osprey-compare: the earlier campaign
    comparison: Comparison | None = None


STATE = pytest.StashKey[OspreyState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("osprey", "speculative-decoding drafter pilot (pytest-osprey)")
    group.addoption("--osprey-config", metavar="PATH", default=None,
                    help="Pilot file (pilot.yaml); activates the drafter pilot and its suites")
    group.addoption("--osprey-results", metavar="DIR", default=None,
                    help="Results folder (default: a new timestamped folder under "
                         "osprey-results/)")
    group.addoption("--osprey-reuse", metavar="DIR", default=None,
                    help="Judge a saved campaign under the current pilot's limits; boot nothing")
    group.addoption("--osprey-dry-run", action="store_true", default=False,
                    help="Check the pilot, command lines and artifacts only; boot nothing")
    group.addoption("--osprey-conditions", metavar="A,B", default=None,
                    help="Run only these conditions (the baseline is always included)")
    group.addoption("--osprey-compare", metavar="DIR", default=None,
                    help="Compare with an earlier accepted campaign of the same trace and flag "
                         "regressions of the drafters kept there")


def _usage(msg: str) -> pytest.UsageError:
    return pytest.UsageError(msg)


def _select(pilot: Pilot, spec: str | None, source: str) -> list[str]:
    names = list(pilot.conditions)
    if not spec:
        return names
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in pilot.conditions]
    if unknown:
        raise _usage(f"--osprey-conditions: unknown condition(s) {', '.join(unknown)}; "
                     f"{source} defines: {', '.join(names)}")
    keep = {pilot.baseline, *wanted}
    return [n for n in names if n in keep]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "osprey(kind): an acceptance gate of pytest-osprey")
    if not config.pluginmanager.hasplugin("benchmark"):  # the latency-series suite's marker
        config.addinivalue_line("markers", "benchmark: pytest-benchmark settings (inactive)")
    path = config.getoption("osprey_config")
    if not path:
        return
    if hasattr(config, "workerinput") or (config.getoption("numprocesses", None) or 0):
        raise _usage("pytest-osprey runs one campaign per session and cannot be split over "
                     "xdist workers: drop -n / --numprocesses")
    invocation = Path(config.invocation_params.dir)
    pilot_path = Path(path) if Path(path).is_absolute() else invocation / path
    try:
        pilot = load_pilot(pilot_path)
        tspec = pilot.trace
        trace = load_trace(tspec.files).subset(
            ids=tspec.ids, slices=tspec.slices, limit_per_slice=tspec.limit_per_slice,
            limit=tspec.limit,
        )
    except (ConfigError, TraceError) as exc:
        raise _usage(str(exc)) from None
    conditions = _select(pilot, config.getoption("osprey_conditions"), path)
    reuse_opt = config.getoption("osprey_reuse")
    reuse = (invocation / reuse_opt) if reuse_opt else None
    if reuse is not None and not (reuse / "campaign.json").is_file():
        raise _usage(f"--osprey-reuse: {reuse}: no campaign.json there (not a results folder)")
    results_opt = config.getoption("osprey_results")
    if results_opt:
        results = invocation / results_opt
    elif reuse is not None:
        results = reuse
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        results = invocation / "osprey-results" / f"{pilot.name}-{stamp}"
    earlier = _previous(config.getoption("osprey_compare"), invocation, results, trace)
    config.stash[STATE] = OspreyState(
        pilot=pilot,
        pilot_path=pilot_path,
        pilot_text=pilot_path.read_text("utf-8"),
        trace=trace,
        conditions=conditions,
        results_dir=results,
        reuse=reuse,
        gates=plan_gates(pilot, conditions, dry_run=config.getoption("osprey_dry_run")),
        dry_run=config.getoption("osprey_dry_run"),
        previous=earlier,
    )
    from . import fixtures

    config.pluginmanager.register(fixtures, "osprey-fixtures")
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        config.add_cleanup(restore)
    # The acceptance suites are the tests of a pilot run, wherever pytest was started.
    suites = str(SUITES_DIR)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [suites]
    elif suites not in config.args:
        config.args.append(suites)


def _previous(
    option: str | None, invocation: Path, results: Path, trace: Trace
) -> Previous | None:
    """--osprey-compare: the earlier campaign, refused before anything boots if it cannot
    compare."""
    if not option:
        return None
    from .history import HistoryError, open_previous

    where = invocation / option
    if where.resolve() == results.resolve():
        raise _usage(f"--osprey-compare: {where} is this run's own results folder; name an "
                     "earlier campaign's folder")
    try:
        return open_previous(where, trace.sha256)
    except HistoryError as exc:
        raise _usage(f"--osprey-compare: {exc}") from None


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a CI cancel, timeout(1), kill) ends the session the way Ctrl-C does: booted
    servers are stopped and campaign.json says 'interrupted'."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # inside asyncio.run: cancels the campaign's task
    else:
        raise KeyboardInterrupt


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash.get(STATE, None)
    if "osprey_series" in metafunc.fixturenames and state is not None and not state.dry_run:
        from .latency_series import series_specs

        series = series_specs(state.pilot, state.conditions)
        metafunc.parametrize("osprey_series", series, ids=[s.id for s in series])
    if "osprey_history" in metafunc.fixturenames and state is not None \
            and state.previous is not None and not state.dry_run:
        kept = state.previous.kept or ["none-kept"]
        metafunc.parametrize("osprey_history", kept, ids=kept)
    if "osprey_gate" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("osprey")
    if state is None or marker is None:
        return
    kind = marker.kwargs.get("kind") or marker.args[0]
    specs = [s for s in state.gates if s.kind == kind]
    if specs:  # an unplanned gate stays unparametrized and is deselected below
        metafunc.parametrize("osprey_gate", specs, ids=[s.id for s in specs])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Gates this pilot does not plan (e.g. no latency limits, or a dry run) are deselected,
    not shown as empty skips."""
    if config.stash.get(STATE, None) is None:
        return
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
        if e.phase == "done":
            line = f"[osprey] {e.message}"
        elif e.phase in ("boot", "warmup", "error"):
            text = {"boot": "booting", "warmup": f"warming up ({e.total} requests)",
                    "error": f"FAILED: {e.message}"}[e.phase]
            line = f"[osprey] {e.condition}: {text}"
        else:
            eta = f", ETA {e.eta_s:.0f}s" if e.eta_s is not None and not finished else ""
            line = (f"[osprey] {e.condition} {e.phase} block {e.block + 1} load {e.load}: "
                    f"{e.done}/{e.total}{eta}")
        with _uncaptured(self.config):
            self.tr.write_line(line)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    from .report.figures import text_table

    tr = terminalreporter
    tr.section("osprey pilot")
    if state.campaign_error:
        tr.write_line(f"campaign error: {state.campaign_error}", red=True)
    judgement = state.judgement
    if judgement is None:
        tr.write_line("dry run: nothing was booted" if state.dry_run
                      else "no campaign was judged in this session")
        return
    for line in text_table(judgement.figures):
        tr.write_line(line)
    tr.write_line("")
    for v in judgement.verdicts:
        color = {"KEEP": "green", "DROP": "red", "INCONCLUSIVE": "yellow"}[v.verdict]
        tr.write_line(v.line(), **{color: True, "bold": True})
    if state.comparison is not None:
        comp = state.comparison
        tr.write_line(f"compared with {comp.previous_dir} (run {comp.previous_run_id}):")
        for f in comp.findings:
            tr.write_line(f"  {'REGRESSION ' if f.regression else ''}{f.text}",
                          red=f.regression)
        for note in comp.notes:
            tr.write_line(f"  {note}")
    for p in state.reports:
        tr.write_line(f"results: {p}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Backstop: whatever was booted is ended, whatever happened.
    if session.config.stash.get(STATE, None) is None:
        return
    with contextlib.suppress(ImportError):
        from .engines.process import stop_all

        stop_all()

