"""What a run starts from, checked before anything runs: the pilot's secrets and exposure,
the conditions asked for, a saved campaign to judge instead of measuring. Anything it cannot
start from is a :class:`UsageError`, one line naming the source."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..engines.kinds import target_kind
from ..pilot import Pilot
from ..results import Preflight, SavedCampaign, load_campaign, read_preflight
from ..results.campaign_file import CampaignFileError, incomplete_note
from ..results.records import RecordsError
from ..results.redact import register
from .folders import one_line


class UsageError(ValueError):
    """Input the run cannot start from (pilot, trace, options, folders); one line naming the
    source."""


def register_secrets(pilot: Pilot) -> None:
    """The values of the secrets the pilot names, scrubbed from everything written or shown."""
    names = {pilot.target.api_key_env, *(c.endpoint.api_key_env for c in
                                         pilot.conditions.values() if c.endpoint)}
    env = {**os.environ, **pilot.target.env}
    for cond in pilot.conditions.values():
        for name in names:
            if name:
                register(cond.env.get(name) or env.get(name))


def bind_warning(pilot: Pilot) -> str | None:
    """A server engine bound to anything but loopback is reachable from the network."""
    import ipaddress

    host = pilot.target.host
    if not target_kind(pilot).server or host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:
        pass
    keyed = "an API key" if pilot.target.api_key_env else "no API key (anyone can use them)"
    return (f"target.host is {host}: the engine servers will accept connections from the "
            f"network, with {keyed}; 127.0.0.1 keeps them on this machine")


def select_conditions(pilot: Pilot, wanted: Sequence[str] | None, source: str) -> list[str]:
    """The conditions a run measures, in the pilot's order (the baseline always included)."""
    names = list(pilot.conditions)
    if not wanted:
        return names
    wanted = [w.strip() for w in wanted if w.strip()]
    unknown = [w for w in wanted if w not in pilot.conditions]
    if unknown:
        raise UsageError(f"--osprey-conditions: unknown condition(s) {', '.join(unknown)}; "
                         f"{source} defines: {', '.join(names)}")
    keep = {pilot.baseline, *wanted}
    return [n for n in names if n in keep]


def open_saved(directory: Path) -> tuple[SavedCampaign, str | None]:
    """A saved campaign and, when it is partial, why (UsageError when it cannot be read)."""
    try:
        data = load_campaign(directory)
    except (CampaignFileError, RecordsError) as exc:
        raise UsageError(f"{exc}; not a results folder this version can judge") from None
    except (OSError, ValueError) as exc:
        raise UsageError(one_line(exc, f"{directory}: cannot read the saved campaign")) from None
    mode = data.timed_mode
    measured = sum(1 for r in data.records if r.mode == mode)
    return data, incomplete_note(data.meta, measured)


@dataclass(frozen=True)
class ReusedCampaign:
    """A saved campaign that a run judges instead of measuring."""

    directory: Path
    data: SavedCampaign
    partial: str | None  # why it is incomplete (interrupted, killed, still running)
    preflight: Preflight | None  # None: none was saved, the run checks its pilot's now
    limits_from: str  # where the pilot judging it comes from (said in the re-judged copy)


def reuse_saved(directory: Path, limits_from: str) -> ReusedCampaign:
    """``--osprey-reuse``: the saved campaign and its preflight, read now, so that a folder
    that cannot be judged is refused before anything runs."""
    if not (directory / "campaign.json").is_file():
        raise UsageError(f"{directory}: no campaign.json there (not a results folder)")
    data, partial = open_saved(directory)
    try:
        preflight = read_preflight(directory / "preflight.json")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return ReusedCampaign(directory, data, partial, preflight, limits_from)
