"""Re-judging a saved results folder (``python -m pytest_osprey report DIR``).

The limits come from ``--config`` when given, else from the pilot text campaign.json saved
(the pilot the campaign ran with; ``pilot.yaml`` in the folder for older campaigns). The
judged copy goes to a new ``DIR/rejudged-<UTC time>/`` folder, marked as such: the original
summary and reports are never rewritten. A partial campaign (interrupted, killed, still
running) is said first and gets no verdict.
"""

from __future__ import annotations

from pathlib import Path

from ..pilot import ConfigError, Pilot
from ..pilot.loading import load_pilot_text, load_pilot_unchecked
from ..results import Preflight, SavedCampaign, read_preflight
from ..results.campaign_file import text_sha256
from .folders import FolderError, writable
from .inputs import ReusedCampaign, UsageError, open_saved
from .pilot_run import PilotRun


def _saved_pilot(directory: Path, data: SavedCampaign, config: Path | None) -> tuple[Pilot, str]:
    """The pilot whose limits apply, and where it came from."""
    meta = data.meta
    try:
        if config is not None:
            pilot = load_pilot_unchecked(config)
            _related(pilot, data, str(config))
            return pilot, str(config)
        if meta.pilot_text:
            if meta.pilot_text_sha256 and text_sha256(meta.pilot_text) != meta.pilot_text_sha256:
                raise UsageError(
                    f"{directory / 'campaign.json'}: pilot_text was changed after the run (its "
                    "sha256 no longer matches pilot_text_sha256); to judge under other limits, "
                    "give that pilot deliberately with --config PILOT")
            source = f"{directory / 'campaign.json'} (the pilot it ran with)"
            return load_pilot_text(meta.pilot_text, source), "the pilot saved in campaign.json"
        copy = directory / "pilot.yaml"
        if copy.is_file():
            return load_pilot_unchecked(copy), str(copy)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    raise UsageError(f"{directory}: campaign.json holds no pilot text and there is no "
                     "pilot.yaml: give the limits with --config PILOT")


def _related(pilot: Pilot, data: SavedCampaign, source: str) -> None:
    """Refuse a pilot that cannot judge this campaign: another baseline, or none of its
    candidates (it would judge no gate, and no gate failing is not a verdict)."""
    meta = data.meta
    if meta.baseline and pilot.baseline != meta.baseline:
        raise UsageError(f"{source}: its baseline {pilot.baseline!r} is not the campaign's "
                         f"({meta.baseline!r}); it is not a pilot of this campaign")
    saved = set(meta.candidates) | ({meta.current} if meta.current else set())
    if saved and not saved & set(pilot.conditions):
        raise UsageError(f"{source}: names none of the campaign's conditions "
                         f"({', '.join(sorted(saved))}); it is not a pilot of this campaign")


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
    return PilotRun.from_saved(ReusedCampaign(directory, data, partial, preflight, source),
                               pilot, compare_with)
