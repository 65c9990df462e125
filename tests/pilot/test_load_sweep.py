"""The load sweep shorthand: `load.sweep: {max: N}` expands to closed-loop levels x1, x2, x4,
... up to N named c1, c2, c4, ...; the primary load defaults to the highest; errors name the
key, in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_osprey.pilot.levels import Load, Sweep
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import ConfigError
from testkit.factories import ROOT, pilot_layout

PILOT_TEXT = (ROOT / "pilot.yaml").read_text(encoding="utf-8")
LEVELS_LINE = "  levels: {low: 1, concurrent: 4}\n"


def _pilot(tmp_path: Path, load_lines: str, drop_primary: bool = False) -> Path:
    assert LEVELS_LINE in PILOT_TEXT
    text = PILOT_TEXT.replace(LEVELS_LINE, load_lines)
    if drop_primary:
        text = text.replace("  primary_load: concurrent\n", "")
    data: dict[str, Any] = yaml.safe_load(PILOT_TEXT)
    path = pilot_layout(tmp_path / "proj", data) / "pilot.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_sweep_expands_to_doubling_levels() -> None:
    assert Sweep(max=32).levels() == {"c1": 1, "c2": 2, "c4": 4, "c8": 8, "c16": 16, "c32": 32}
    assert Sweep(max=48, min=4).levels() == {"c4": 4, "c8": 8, "c16": 16, "c32": 32, "c48": 48}
    load = Load.model_validate({"sweep": {"max": 8}})
    assert load.levels == {"c1": 1, "c2": 2, "c4": 4, "c8": 8}  # not the default levels
    assert load.heaviest() == "c8" and load.lightest() == "c1"
    assert Load.model_validate(load.model_dump()).levels == load.levels  # reads back alike


def test_sweep_adds_to_given_levels_in_a_pilot_file(tmp_path: Path) -> None:
    pilot = load_pilot(_pilot(tmp_path, LEVELS_LINE + "  sweep: {max: 16}\n",
                              drop_primary=True))
    # One level per concurrency: x1 and x4 are there already, under their own names.
    assert pilot.load.levels == {"low": 1, "concurrent": 4, "c2": 2, "c8": 8, "c16": 16}
    assert pilot.primary_load == "c16"  # the highest concurrency, as without a sweep
    assert pilot.load.block_size("c16") == 16


@pytest.mark.parametrize(("sweep", "key", "says"), [
    ("{max: 1}", "load.sweep.max", "greater than or equal to 2"),
    ("{max: 100000}", "load.sweep.max", "less than or equal to 4096"),
    ("{max: 8, min: 8}", "load.sweep", "min (8) must be below max (8)"),
    ("{maximum: 8}", "load.sweep.maximum", "did you mean 'max'"),
    ("{max: 8, low: 1}", "load.sweep.low", "unknown key"),
    ("32", "load.sweep", "Sweep"),
])
def test_sweep_errors_name_the_key(tmp_path: Path, sweep: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_pilot(_pilot(tmp_path, f"{LEVELS_LINE}  sweep: {sweep}\n"))
    lines = [ln for ln in str(err.value).splitlines() if f": {key}" in ln]
    assert lines and says in lines[0], str(err.value)


def test_sweep_level_taken_by_another_level_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_pilot(_pilot(tmp_path, "  levels: {low: 1, concurrent: 4, c8: 3}\n"
                                    "  sweep: {max: 8}\n"))
    message = str(err.value)
    assert "load: sweep: its level 'c8' (x8) is also in levels, as 3" in message, message
    assert len(message.splitlines()) == 1
