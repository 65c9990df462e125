"""One pilot run, with or without pytest: preflight -> campaign -> judgement -> comparison ->
reports.

:class:`PilotRun` holds the whole run; each step runs once, on first use, and its result is
kept. The pytest plugin and ``python -m pytest_osprey run`` are two thin adapters over it::

    from .. import PilotRun, RunOptions

    run = PilotRun("pilot.yaml", RunOptions(results="out"))
    outcome = run.run()          # everything; outcome.exit_code is 0, 1 (a gate failed)
    for verdict in outcome.judgement.verdicts:
        print(verdict.line())

A run that is interrupted (Ctrl-C, SIGTERM) or stopped by an error still writes summary.json
and both reports, marked INTERRUPTED and with no verdict, before the interrupt goes on.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from ..campaign import Campaign, ProgressEvent, StopLook, StopRule
from ..campaign.requests import stop_reason
from ..campaign.signals import sigterm_interrupts
from ..campaign.size import CampaignSize, campaign_size, size_problem
from ..exit_codes import exit_code, gate_fails
from ..judgement import (
    PREFLIGHT,
    Comparison,
    GateResult,
    GateSpec,
    HistoryError,
    Judgement,
    Previous,
    Withheld,
    candidate_looks,
    compare,
    evaluate,
    judge,
    open_previous,
    plan_gates,
    sampling_budget_problem,
)
from ..pilot import ConfigError, Pilot, Trace, TraceError, load_pilot
from ..pilot.draw import Draw
from ..pilot.selection import select_trace
from ..preflight import run_preflight
from ..report.summary import write_reports
from ..results import Preflight, SavedCampaign, load_campaign
from ..results.campaign_file import (
    CampaignFile,
    CampaignFileError,
    incomplete_note,
    read_campaign_file,
    stopped_conditions,
    stopped_note,
)
from ..results.records import RequestRecord
from ..shards.plan import Shard, ShardCampaign, ShardError
from .folders import FolderError, default_results, fresh_results, one_line, release, writable
from .inputs import (
    ReusedCampaign,
    UsageError,
    bind_warning,
    register_secrets,
    reuse_saved,
    select_conditions,
)

Progress = Callable[[ProgressEvent], None]

__all__ = ["CampaignError", "PilotRun", "ReusedCampaign", "RunOptions", "RunOutcome",
           "UsageError", "sigterm_interrupts", "stop_servers"]


class CampaignError(RuntimeError):
    """The campaign could not run at all (the message says why)."""


@dataclass(frozen=True)
class RunOptions:
    """What a run does beyond the pilot file (the ``--osprey-*`` options)."""

    results: str | os.PathLike[str] | None = None
    """Results folder, new or empty (default: a new timestamped folder under
    ``osprey-results/``; with ``reuse``: ``<reuse>/rejudged-<UTC time>/``)."""
    reuse: str | os.PathLike[str] | None = None
    """Judge this saved campaign instead of measuring (boots nothing)."""
    conditions: Sequence[str] | None = None
    """Only these conditions (the baseline is always included)."""
    dry_run: bool = False
    """Preflight only: command lines and artifacts; boot nothing."""
    compare: str | os.PathLike[str] | None = None
    """An earlier campaign of the same trace to hold its kept drafters to."""
    reuse_hint: str = "--osprey-reuse DIR"
    """How the adapter's user re-judges a folder (named in the non-empty-folder error)."""
    shard: Shard | None = None
    """Replay only this shard of the plan (``--shard K/N``): a disjoint share of its passes,
    every condition (shards/plan.py); ``merge`` pools the shards' folders."""
    stop_rule: StopRule | None = None
    """The early-stopping rule, when something outside this run supplies it (a driver that
    looks at every shard's records); default: the pilot's ``decision.early_stop`` on this
    run's own records, and none for a shard (its records alone are not the plan's looks)."""


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
    partial: str | None = None


def _under(base: Path, path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p if p.is_absolute() else base / p


def _previous(option: str | os.PathLike[str] | None, cwd: Path, results: Path | None,
              trace_hash: str) -> Previous | None:
    """--osprey-compare: the earlier campaign, refused before anything boots if it cannot
    compare."""
    if not option:
        return None
    where = _under(cwd, option)
    if results is not None and where.resolve() == results.resolve():
        raise UsageError(f"--osprey-compare: {where} is this run's own results folder; "
                         "name an earlier campaign's folder")
    try:
        return open_previous(where, trace_hash)
    except HistoryError as exc:
        raise UsageError(f"--osprey-compare: {exc}") from None


class PilotRun:
    """A pilot run: built from a pilot file and options (usage problems raise
    :class:`UsageError` before anything runs), or from a saved campaign
    (:meth:`from_saved`); then each step on demand."""

    size: CampaignSize | None  # what the pilot asks for (a measured run; None re-judged)
    trace_draw: Draw | None  # trace.limit's seeded draw, where the pilot sets a limit

    def __init__(
        self,
        pilot_path: str | os.PathLike[str],
        options: RunOptions | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        progress: Progress | None = None,
    ) -> None:
        options = options or RunOptions()
        here = Path(cwd) if cwd is not None else Path.cwd()
        path = _under(here, pilot_path)
        try:
            # A dry run checks the command lines where the drafters may not be (a CI machine
            # for a GPU deployment): their absence is the artifact check's finding.
            pilot = load_pilot(path, absent_drafters=options.dry_run)
            pilot_text = path.read_text("utf-8-sig")
            trace, trace_draw = select_trace(pilot, path)
        except (ConfigError, TraceError) as exc:
            raise UsageError(str(exc)) from None
        except (OSError, ValueError) as exc:
            raise UsageError(one_line(exc, f"{pilot_path}: cannot read")) from None
        register_secrets(pilot)
        # A gate that could never fail is refused before anything runs, never passed.
        budget = sampling_budget_problem(pilot, len(trace.prompts))
        if budget:
            raise UsageError(f"{pilot_path}: {budget}")
        conditions = select_conditions(pilot, options.conditions, str(pilot_path))
        size = campaign_size(pilot, trace, len(conditions), here / "osprey-results")
        too_big = size_problem(size)
        if too_big:
            raise UsageError(f"{pilot_path}: {too_big}")
        if options.shard is not None and pilot.load.passes < options.shard.count:
            raise UsageError(f"{pilot_path}: load.passes is {pilot.load.passes}, fewer than the "
                             f"{options.shard.count} shards of --shard {options.shard.text} "
                             "(each shard replays whole passes)")
        warning = bind_warning(pilot)
        reuse = (reuse_saved(_under(here, options.reuse), str(path)) if options.reuse
                 else None)
        results: Path | None = None
        try:
            if options.results:
                results = fresh_results(_under(here, options.results), options.reuse_hint)
            elif reuse is not None:
                writable(reuse.directory)  # the re-judged copy goes inside it, made when judged
            elif not options.dry_run:  # a dry run's folder is made only if something needs it
                results = default_results(here, pilot.name)
        except FolderError as exc:
            raise UsageError(str(exc)) from None
        self._begin(options=options, cwd=here, progress=progress, pilot_path=path, pilot=pilot,
                    pilot_text=pilot_text, trace=trace, conditions=conditions,
                    notes=[warning] if warning else [], reuse=reuse, results=results,
                    previous=_previous(options.compare, here, results, trace.sha256))
        self.size = size
        self.trace_draw = trace_draw

    @classmethod
    def from_saved(cls, saved: ReusedCampaign, pilot: Pilot,
                   compare_with: Path | None = None, *, results: Path | None = None) -> PilotRun:
        """A run judging ``saved`` under ``pilot``'s limits (any pilot: its paths need not
        exist, nothing is measured); its conditions are those the campaign ran. ``results``:
        the reports go there, as a campaign's own (a merged campaign's folder), instead of
        into a marked ``rejudged-<time>/`` copy."""
        previous = None
        if compare_with is not None:
            try:
                previous = open_previous(compare_with, str(saved.data.meta.trace_hash))
            except HistoryError as exc:
                raise UsageError(f"--compare: {exc}") from None
        run = cls.__new__(cls)
        run._begin(options=RunOptions(reuse=saved.directory), cwd=Path.cwd(), progress=None,
                   pilot_path=saved.directory / "campaign.json", pilot=pilot,
                   pilot_text=saved.data.meta.pilot_text or "", trace=None,
                   conditions=[c for c in pilot.conditions if c in saved.data.meta.conditions],
                   notes=[], reuse=saved, results=results, previous=previous)
        if results is not None:
            run.rejudged = None
        return run

    def _begin(self, *, options: RunOptions, cwd: Path, progress: Progress | None,
               pilot_path: Path, pilot: Pilot, pilot_text: str, trace: Trace | None,
               conditions: list[str], notes: list[str], reuse: ReusedCampaign | None,
               results: Path | None, previous: Previous | None) -> None:
        """Every attribute of a run, however it was built; no step has run yet."""
        self.options = options
        self.size, self.trace_draw = None, None
        self.cwd = cwd
        self.progress = progress
        self.pilot_path = pilot_path
        self.pilot = pilot
        self.pilot_text = pilot_text
        self.trace = trace  # None: built from a saved campaign, the run never measures
        self.conditions = conditions
        self.notes = notes
        self.reuse = reuse.directory if reuse is not None else None
        self.saved = reuse.data if reuse is not None else None
        # Why the campaign (or a condition) is incomplete; ``incomplete``: the campaign itself.
        self.partial = reuse.partial if reuse is not None else None
        self.incomplete = self.partial is not None
        self.rejudged: dict[str, Any] | None = None
        if reuse is not None:
            if reuse.partial:
                self.notes.insert(0, f"{reuse.directory}: INTERRUPTED: {reuse.partial}; judged "
                                     "as measured, no verdict")
            self.notes += reuse.data.notes
            self.rejudged = {"at": datetime.now(UTC).isoformat(timespec="seconds"),
                             "pilot": reuse.limits_from, "source": str(reuse.directory)}
        self._preflight = reuse.preflight if reuse is not None else None
        self._results = results
        self.gates: list[GateSpec] = plan_gates(pilot, conditions, dry_run=options.dry_run)
        self.previous = previous
        self._campaign: SavedCampaign | None = None
        self.judged_data: SavedCampaign | None = None
        """What the judgement was made from (also a partial campaign's records)."""
        self._judgement: Judgement | None = None
        self.comparison: Comparison | None = None
        self.reports: list[Path] = []
        self.campaign_error: str | None = None
        self.write_error: str | None = None

    @property
    def results_dir(self) -> Path:
        """Where this run writes (a re-judged copy's folder is made on first use)."""
        if self._results is None:
            from .folders import rejudged_results

            self._results = (rejudged_results(self.reuse) if self.reuse is not None
                             else default_results(self.cwd, self.pilot.name))
        return self._results

    def release(self) -> None:
        if self._results is not None:  # the run is over: its folder's lock goes
            release(self._results)

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
            self._preflight = run_preflight(self.pilot, self.conditions)
            # A dry run measures nothing: it leaves no results folder behind unless one was
            # named (then preflight.json goes there, e.g. as a CI artifact).
            if not self.dry_run or self._results is not None:
                try:
                    self._preflight.save(self.results_dir)
                except (OSError, ValueError, FolderError) as exc:
                    self._write_failed(exc, "preflight.json not written")
        return self._preflight

    @property
    def checked(self) -> Preflight | None:
        """The preflight if it has been made (no step runs)."""
        return self._preflight

    def campaign(self) -> SavedCampaign:
        """The measured campaign: run once (or loaded with ``reuse``); a condition whose
        preflight failed is not booted. Raises :class:`CampaignError` if it cannot run; an
        interrupt goes on after the partial reports are written."""
        if self._campaign is not None:
            return self._campaign
        if self.campaign_error:
            raise CampaignError(self.campaign_error)
        if self.saved is not None:
            self._campaign = self.saved
            return self._campaign
        trace = self.trace
        assert trace is not None, "a run built from a saved campaign never measures"
        preflight = self.preflight()
        shard = self.options.shard
        try:
            campaign = (Campaign if shard is None else partial(ShardCampaign, shard=shard))(
                self.pilot, trace, self.results_dir, self.conditions, preflight.failed(),
                progress=self.progress, config_text=self.pilot_text,
                stop_rule=self._stop_rule(), trace_draw=self.trace_draw, size=self.size)
        except ShardError as exc:
            self.campaign_error = str(exc)
            raise CampaignError(self.campaign_error) from None
        try:
            self._campaign = campaign.run()
        except KeyboardInterrupt as exc:
            self._partial_reports(campaign, trace, exc)
            raise
        except Exception as exc:  # an error ends the campaign: what it measured is reported
            self.campaign_error = one_line(exc, "campaign stopped")
            self._partial_reports(campaign, trace, exc)
            raise CampaignError(self.campaign_error) from None
        try:
            shutil.copyfile(self.pilot_path, self.results_dir / "pilot.yaml")
        except OSError as exc:
            self._write_failed(exc, "pilot.yaml copy not written")
        return self._campaign

    def _partial_reports(self, campaign: Campaign, trace: Trace, exc: BaseException) -> None:
        """summary.json and both reports of an interrupted campaign, marked INTERRUPTED, with
        no verdict (never raises: the interrupt or error that stopped it goes on)."""
        meta = CampaignFile(status="interrupted", stop_reason=stop_reason(exc),
                            prompt_ids=[p.id for p in trace.prompts],
                            load_levels=dict.fromkeys(self.pilot.load.levels, 0),
                            blocks=self.pilot.load.passes,
                            conditions={c: {} for c in self.conditions})
        done, mode = campaign.measured, campaign.timed_mode
        measured = sum(1 for r in done if r.mode == mode)
        self.partial = incomplete_note(meta, measured)
        self.incomplete = True
        try:
            data = load_campaign(self.results_dir)
            data.prompts = trace.by_id()
            # Said as it is, even where campaign.json could not be saved (a full disk).
            data.meta.status, data.meta.stop_reason = "interrupted", meta.stop_reason
            self._judge(data, plots=False)
        except Exception as err:  # a full disk, an unreadable file: said, not raised
            self.notes.append(one_line(err, "the interrupted run's reports were not written"))

    def _stop_rule(self) -> StopRule | None:
        """Early stopping: the rule supplied (``RunOptions.stop_rule``), else with
        ``decision.early_stop`` the group-sequential look after a pass on this run's records
        (none for a shard: the looks span every shard)."""
        if self.options.stop_rule is not None:
            return self.options.stop_rule
        if not self.pilot.decision.early_stop or self.options.shard is not None:
            return None
        pilot = self.pilot

        def rule(records: list[RequestRecord], look_index: int) -> StopLook:
            data = SavedCampaign(self.results_dir, self._meta(), records)
            return StopLook(*candidate_looks(pilot, data, list(self.conditions), look_index))

        return rule

    def _meta(self) -> CampaignFile:
        """campaign.json as the campaign has written it so far (its replay plan)."""
        try:
            return read_campaign_file(self.results_dir / "campaign.json")
        except CampaignFileError:
            return CampaignFile()

    def judgement(self) -> Judgement:
        """Every gate judged, the verdicts, the comparison; reports written (a partial
        campaign's verdicts withheld)."""
        if self._judgement is None:
            self._judge(self.campaign())
        assert self._judgement is not None
        return self._judgement

    def _judge(self, data: SavedCampaign, plots: bool = True) -> None:
        withheld = Withheld(self.partial) if self.partial else None
        if withheld is None:  # a server that crashed mid-campaign: what involves it is partial
            counts: dict[str, int] = {}
            mode = data.timed_mode
            for r in data.records:
                if r.mode == mode:
                    counts[r.condition] = counts.get(r.condition, 0) + 1
            self.partial = stopped_note(data.meta, counts)
            if self.partial:
                withheld = Withheld(self.partial, stopped_conditions(data.meta))
        judgement = judge(self.pilot, self.gates, data, self.preflight(), withheld)
        if self.previous is not None:
            self.comparison = compare(self.pilot, data, judgement, self.previous,
                                      self.pilot.decision.regression_tolerance)
        self._judgement = judgement
        self.judged_data = data
        try:
            self.reports = write_reports(
                self.results_dir, judgement, data, self.pilot, self.comparison,
                partial=self.partial, rejudged=self.rejudged, plots=plots,
                warn=self.notes.append)
        except (OSError, ValueError, FolderError) as exc:
            self._write_failed(exc, "reports not written")

    def _write_failed(self, exc: BaseException, what: str) -> None:
        self.write_error = self.write_error or one_line(exc, what)
        self.notes.append(one_line(exc, what))

    def gate_result(self, spec: GateSpec) -> GateResult:
        """One gate's result: preflight gates without booting anything."""
        if spec.kind in PREFLIGHT:
            return evaluate(spec, self.pilot, None, self.preflight())
        return self.judgement().result(spec)

    def fails(self, result: GateResult) -> bool:
        """Whether this gate fails the run (:func:`pytest_osprey.exit_codes.gate_fails`)."""
        return gate_fails(result, self.pilot.decision)

    def exit_code(self, results: Sequence[GateResult] | None = None) -> int:
        """The run's status (:mod:`..exit_codes`); by default every planned gate judged."""
        judged = [self.gate_result(s) for s in self.gates] if results is None else results
        return exit_code(judged, self.pilot.decision,
                         incomplete=self.incomplete and not self.campaign_error,
                         failed_outside_gates=self.failed_outside_gates)

    @property
    def failed_outside_gates(self) -> bool:
        """The run fails whatever its gates say: no campaign, a partial one, lost results."""
        return bool(self.campaign_error or self.partial or self.write_error)

    def run(self) -> RunOutcome:
        """Everything, in order; never raises for a failed gate or campaign (see exit_code);
        an interrupt (KeyboardInterrupt) goes on once the partial reports are written."""
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
        self.release()
        return RunOutcome(preflight, judgement, self.comparison, self.reports, results,
                          self.exit_code(results), self.campaign_error, self.notes, self.partial)


def stop_servers(grace_s: float | None = None) -> None:
    """Backstop: every server this process started is ended (``grace_s``: an interrupted
    run's short SIGTERM grace)."""
    import sys

    process = sys.modules.get("pytest_osprey.engines.process")
    if process is not None:  # not imported: no server was ever started
        process.stop_all(grace_s)
