"""Re-judging a saved results folder (``python -m pytest_osprey report DIR``).

The limits come from ``--config`` when given, else from the pilot text campaign.json saved
(the pilot the campaign ran with; ``pilot.yaml`` in the folder for older campaigns). The
judged copy goes to a new ``DIR/rejudged-<UTC time>/`` folder, marked as such: the original
summary and reports are never rewritten. A partial campaign (interrupted, killed, still
running) is said first and gets no verdict.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from .judgement import HistoryError, open_previous, plan_gates
from .pilot import ConfigError, Pilot
from .pilot.loading import load_pilot_text, load_pilot_unchecked
from .results import Preflight, SavedCampaign, read_preflight
from .run import PilotRun, RunOptions, UsageError, open_saved
from .run_folders import FolderError, writable


def _saved_pilot(directory: Path, data: SavedCampaign, config: Path | None) -> tuple[Pilot, str]:
    """The pilot whose limits apply, and where it came from."""
    try:
        if config is not None:
            return load_pilot_unchecked(config), str(config)
        if data.meta.pilot_text:
            source = f"{directory / 'campaign.json'} (the pilot it ran with)"
            return load_pilot_text(data.meta.pilot_text, source), "the pilot saved in campaign.json"
        copy = directory / "pilot.yaml"
        if copy.is_file():
            return load_pilot_unchecked(copy), str(copy)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    raise UsageError(f"{directory}: campaign.json holds no pilot text and there is no "
                     "pilot.yaml: give the limits with --config PILOT")


def rejudge(directory: Path, config: Path | None = None,
            compare_with: Path | None = None) -> PilotRun:
    """A run over a saved results folder: its campaign judged again under ``config``'s
    limits (default: the pilot saved with the campaign)."""
    if not (directory / "campaign.json").is_file():
        raise UsageError(f"{directory}: no campaign.json there (not a results folder)")
    data, partial = open_saved(directory)
    pilot, source = _saved_pilot(directory, data, config)
    try:
        writable(directory)
    except FolderError as exc:
        raise UsageError(f"{exc} (the re-judged copy is written inside it)") from None
    try:
        preflight = read_preflight(directory / "preflight.json") or Preflight()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _SavedRun(directory, pilot, source, data, partial, preflight, compare_with)


class _SavedRun(PilotRun):
    """A run whose campaign is already saved: limits from any pilot, paths not required."""

    def __init__(self, directory: Path, pilot: Pilot, source: str, data: SavedCampaign,
                 partial: str | None, preflight: Preflight,
                 compare_with: Path | None) -> None:
        self.options = RunOptions(reuse=directory)
        self.cwd = Path.cwd()
        self.progress = None
        self.pilot_path = directory / "campaign.json"
        self.pilot = pilot
        self.pilot_text = data.meta.pilot_text or ""
        self.notes = [f"{directory}: INTERRUPTED: {partial}; judged as measured, no "
                      "verdict"] if partial else []
        self.reuse = directory
        self.saved = data
        self.partial = partial
        self.incomplete = partial is not None
        self.rejudged = {"at": datetime.now(UTC).isoformat(timespec="seconds"),
                         "pilot": source, "source": str(directory)}
        self._results = None
        self.conditions = [c for c in self.pilot.conditions if c in data.meta.conditions]
        self.gates = plan_gates(self.pilot, self.conditions)
        self._preflight = preflight
        self._init_steps()
        self._campaign = data
        self.previous = None
        if compare_with is not None:
            try:
                self.previous = open_previous(compare_with, str(data.meta.trace_hash))
            except HistoryError as exc:
                raise UsageError(f"--compare: {exc}") from None
