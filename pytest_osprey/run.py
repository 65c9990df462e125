"""One pilot run, with or without pytest: preflight -> campaign -> judgement -> comparison ->
reports.

:class:`PilotRun` holds the whole run; each step runs once, on first use, and its result is
kept. The pytest plugin and ``python -m pytest_osprey run`` are two thin adapters over it::

    from pytest_osprey import PilotRun, RunOptions

    run = PilotRun("pilot.yaml", RunOptions(results="out"))
    outcome = run.run()          # everything; outcome.exit_code is 0, 1 (a gate failed)
    for verdict in outcome.judgement.verdicts:
        print(verdict.line())
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType

from .campaign import Campaign, ProgressEvent, StopLook
from .judgement import GateResult, GateSpec, Judgement, judge, plan_gates
from .judgement.gates import PREFLIGHT, evaluate, sequential_look
from .judgement.history import Comparison, HistoryError, Previous, compare, open_previous
from .judgement.quality_gates import sampling_budget_problem
from .pilot import ConfigError, Pilot, Trace, TraceError, load_pilot, load_trace
from .pilot.loading import load_pilot_unchecked
from .preflight import run_preflight
from .report.summary import write_reports
from .results import Preflight, SavedCampaign, load_campaign, read_preflight
from .results.campaign_file import CampaignFile, CampaignFileError
from .results.records import RecordsError, RequestRecord

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_USAGE = 4  # pytest's ExitCode.USAGE_ERROR

Progress = Callable[[ProgressEvent], None]


class UsageError(ValueError):
    """Input the run cannot start from (pilot, trace, options); one line naming the source."""


class CampaignError(RuntimeError):
    """The campaign could not run at all (the message says why)."""


@dataclass(frozen=True)
class RunOptions:
    """What a run does beyond the pilot file (the ``--osprey-*`` options)."""

    results: str | os.PathLike[str] | None = None
    """Results folder (default: a new timestamped folder under ``osprey-results/``)."""
    reuse: str | os.PathLike[str] | None = None
    """Judge this saved campaign instead of measuring (boots nothing)."""
    conditions: Sequence[str] | None = None
    """Only these conditions (the baseline is always included)."""
    dry_run: bool = False
    """Preflight only: command lines and artifacts; boot nothing."""
    compare: str | os.PathLike[str] | None = None
    """An earlier campaign of the same trace to hold its kept drafters to."""


@dataclass
class RunOutcome:
    """What a finished run returns."""

    preflight: Preflight
    judgement: Judgement | None  # None for a dry run
    comparison: Comparison | None
    reports: list[Path]
    gates: list[GateResult]
    exit_code: int
    campaign_error: str | None = None
    notes: list[str] = field(default_factory=list)


def _under(base: Path, path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p if p.is_absolute() else base / p


class PilotRun:
    """A pilot run: built from a pilot file and options (usage problems raise
    :class:`UsageError` before anything runs), then each step on demand."""

    def __init__(
        self,
        pilot_path: str | os.PathLike[str],
        options: RunOptions | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.options = options or RunOptions()
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.progress = progress
        self.pilot_path = _under(self.cwd, pilot_path)
        source = str(pilot_path)
        try:
            self.pilot: Pilot = load_pilot(self.pilot_path)
            self.pilot_text = self.pilot_path.read_text("utf-8")
            spec = self.pilot.trace
            self.trace: Trace = load_trace(spec.files).subset(
                ids=spec.ids, slices=spec.slices, limit_per_slice=spec.limit_per_slice,
                limit=spec.limit,
            )
        except (ConfigError, TraceError) as exc:
            raise UsageError(str(exc)) from None
        # A gate that could never fail is refused before anything runs, never passed.
        budget = sampling_budget_problem(self.pilot, len(self.trace.prompts))
        if budget:
            raise UsageError(f"{source}: {budget}")
        self.conditions = self._select(self.options.conditions, source)
        self.reuse = _under(self.cwd, self.options.reuse) if self.options.reuse else None
        if self.reuse is not None and not (self.reuse / "campaign.json").is_file():
            raise UsageError(f"--osprey-reuse: {self.reuse}: no campaign.json there "
                             "(not a results folder)")
        if self.options.results:
            self.results_dir = _under(self.cwd, self.options.results)
        elif self.reuse is not None:
            self.results_dir = self.reuse
        else:
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            self.results_dir = self.cwd / "osprey-results" / f"{self.pilot.name}-{stamp}"
        self.gates: list[GateSpec] = plan_gates(self.pilot, self.conditions,
                                                dry_run=self.options.dry_run)
        self.previous = self._previous(self.options.compare)
        self._preflight: Preflight | None = None
        self._campaign: SavedCampaign | None = None
        self._judgement: Judgement | None = None
        self.comparison: Comparison | None = None
        self.reports: list[Path] = []
        self.campaign_error: str | None = None

    # -- set-up -----------------------------------------------------------------------------
    def _select(self, wanted: Sequence[str] | None, source: str) -> list[str]:
        names = list(self.pilot.conditions)
        if not wanted:
            return names
        wanted = [w.strip() for w in wanted if w.strip()]
        unknown = [w for w in wanted if w not in self.pilot.conditions]
        if unknown:
            raise UsageError(f"--osprey-conditions: unknown condition(s) {', '.join(unknown)}; "
                             f"{source} defines: {', '.join(names)}")
        keep = {self.pilot.baseline, *wanted}
        return [n for n in names if n in keep]

    def _previous(self, option: str | os.PathLike[str] | None) -> Previous | None:
        """--osprey-compare: the earlier campaign, refused before anything boots if it cannot
        compare."""
        if not option:
            return None
        where = _under(self.cwd, option)
        if where.resolve() == self.results_dir.resolve():
            raise UsageError(f"--osprey-compare: {where} is this run's own results folder; "
                             "name an earlier campaign's folder")
        try:
            return open_previous(where, self.trace.sha256)
        except HistoryError as exc:
            raise UsageError(f"--osprey-compare: {exc}") from None

    @property
    def dry_run(self) -> bool:
        return self.options.dry_run

    @property
    def judged(self) -> Judgement | None:
        """The judgement if it has been made (no step runs)."""
        return self._judgement

    # -- the steps --------------------------------------------------------------------------
    def preflight(self) -> Preflight:
        """Command lines and artifacts, before anything boots (saved as preflight.json; with
        a reused campaign, the saved one)."""
        if self._preflight is None:
            saved = read_preflight(self.reuse / "preflight.json") if self.reuse else None
            if saved is not None:
                self._preflight = saved
            else:
                self._preflight = run_preflight(self.pilot, self.conditions)
                self.results_dir.mkdir(parents=True, exist_ok=True)
                self._preflight.save(self.results_dir)
        return self._preflight

    def campaign(self) -> SavedCampaign:
        """The measured campaign: run once (or loaded with ``reuse``); a condition whose
        preflight failed is not booted. Raises :class:`CampaignError` if it cannot run."""
        if self._campaign is not None:
            return self._campaign
        if self.campaign_error:
            raise CampaignError(self.campaign_error)
        try:
            if self.reuse is not None:
                self._campaign = load_campaign(self.reuse)
            else:
                campaign = Campaign(
                    self.pilot, self.trace, self.results_dir, self.conditions,
                    self.preflight().failed(), progress=self.progress,
                    config_text=self.pilot_text, stop_rule=self._stop_rule(),
                )
                self._campaign = campaign.run()
                shutil.copyfile(self.pilot_path, self.results_dir / "pilot.yaml")
        except (OSError, ValueError, CampaignFileError, RecordsError) as exc:
            self.campaign_error = f"campaign could not run: {exc}"
            raise CampaignError(self.campaign_error) from None
        return self._campaign

    def _stop_rule(self) -> Callable[[list[RequestRecord], int], StopLook] | None:
        """Early stopping (``decision.early_stop``): the group-sequential look after a block."""
        if not self.pilot.decision.early_stop:
            return None
        pilot = self.pilot

        def rule(records: list[RequestRecord], block: int) -> StopLook:
            data = SavedCampaign(self.results_dir, CampaignFile(), records)
            decided, looks = True, {}
            for cand in pilot.candidates:
                if cand not in self.conditions:
                    continue
                look = sequential_look(pilot, data, cand)
                if isinstance(look, str):
                    decided = False
                    continue
                looks[cand] = {"look": look.look, "z": look.z, "boundary": look.boundary,
                               "decision": look.decision, "estimate": look.estimate}
                decided = decided and look.decision != "continue"
            return StopLook(decided, looks)

        return rule

    def judgement(self) -> Judgement:
        """Every gate judged, the verdicts, the comparison; reports written."""
        if self._judgement is None:
            data = self.campaign()
            self._judgement = judge(self.pilot, self.gates, data, self.preflight())
            if self.previous is not None:
                self.comparison = compare(self.pilot, data, self._judgement, self.previous,
                                          self.pilot.decision.regression_tolerance)
            self.results_dir.mkdir(parents=True, exist_ok=True)
            self.reports = write_reports(self.results_dir, self._judgement, data, self.pilot,
                                         self.comparison)
        return self._judgement

    def gate_result(self, spec: GateSpec) -> GateResult:
        """One gate's result: preflight gates without booting anything."""
        if spec.kind in PREFLIGHT:
            return evaluate(spec, self.pilot, None, self.preflight())
        return self.judgement().result(spec)

    def fails(self, result: GateResult) -> bool:
        """Whether this gate fails the run: a gating fail, or a gating INCONCLUSIVE when the
        pilot says so (``decision.inconclusive: fail``)."""
        if not result.spec.gating:
            return False
        return result.outcome == "fail" or (
            result.outcome == "inconclusive" and self.pilot.decision.inconclusive == "fail")

    def run(self) -> RunOutcome:
        """Everything, in order; never raises for a failed gate or campaign (see exit_code)."""
        preflight = self.preflight()
        judgement = None
        results: list[GateResult] = []
        if self.dry_run:
            results = [self.gate_result(s) for s in self.gates]
        else:
            try:
                judgement = self.judgement()
                results = [judgement.result(s) if s.kind not in PREFLIGHT
                           else self.gate_result(s) for s in self.gates]
            except CampaignError:
                results = [self.gate_result(s) for s in self.gates if s.kind in PREFLIGHT]
        failed = self.campaign_error is not None or any(self.fails(r) for r in results)
        return RunOutcome(preflight, judgement, self.comparison, self.reports, results,
                          EXIT_GATE_FAILED if failed else EXIT_OK, self.campaign_error)


def rejudge(directory: Path, config: Path | None = None,
            compare_with: Path | None = None) -> PilotRun:
    """A run over a saved results folder: its campaign judged again under ``config``'s
    limits (default: the pilot saved in the folder)."""
    pilot_file = config or directory / "pilot.yaml"
    try:
        data = load_campaign(directory)
        load_pilot_unchecked(pilot_file)
    except (ConfigError, CampaignFileError, RecordsError, OSError) as exc:
        raise UsageError(str(exc)) from None
    return _SavedRun(directory, pilot_file, data, compare_with)


class _SavedRun(PilotRun):
    """A run whose campaign is already saved: limits from any pilot, paths not required."""

    def __init__(self, directory: Path, pilot_file: Path, data: SavedCampaign,
                 compare_with: Path | None) -> None:
        self.options = RunOptions(reuse=directory, results=directory)
        self.cwd = Path.cwd()
        self.progress = None
        self.pilot_path = pilot_file
        try:
            self.pilot = load_pilot_unchecked(pilot_file)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        self.pilot_text = pilot_file.read_text("utf-8")
        self.reuse = self.results_dir = directory
        self.conditions = [c for c in self.pilot.conditions if c in data.meta.conditions]
        self.gates = plan_gates(self.pilot, self.conditions)
        self._preflight = read_preflight(directory / "preflight.json") or Preflight()
        self._campaign = data
        self._judgement = None
        self.comparison = None
        self.reports = []
        self.campaign_error = None
        self.previous = None
        if compare_with is not None:
            try:
                self.previous = open_previous(compare_with, str(data.meta.trace_hash))
            except HistoryError as exc:
                raise UsageError(f"--compare: {exc}") from None


# --------------------------------------------------------------------------- interrupts


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a CI cancel, timeout(1), kill) ends the run the way Ctrl-C does: booted
    servers are stopped and campaign.json says 'interrupted'."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # inside asyncio.run: cancels the campaign's task
    else:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within: SIGTERM acts as Ctrl-C (main thread only; a handler already set is kept)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_servers() -> None:
    """Backstop: every server this process started is ended."""
    from .engines.process import stop_all

    stop_all()
