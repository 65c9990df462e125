"""The drafter's pinned files (``pins.sha256``) hashed again while a campaign runs: recorded
in campaign.json beside the condition, so that a file swapped after preflight is caught where
it was served."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..pilot.schema import Pilot
from .campaign_file import PinCheck


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def recheck_pins(pilot: Pilot, name: str, when: str) -> list[PinCheck]:
    """The condition's pinned drafter files hashed again (``when``: at a boot, after the
    campaign): a file swapped after preflight is caught where it was served."""
    cond = pilot.conditions[name]
    if cond.drafter is None:
        return []
    out = []
    for rel, expected in cond.pins.sha256.items():
        path = Path(cond.drafter) / rel
        try:
            found = sha256_file(path) if path.is_file() else "missing"
        except OSError:
            found = "missing"
        out.append(PinCheck(file=rel, when=when, expected=expected, found=found))
    return out
