"""benchmarks/gpu_run.py, the one script for a lent GPU machine: its plan (the GPU check and
the embedded pilot, on the device asked, within ten minutes) and the pilot it generates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_osprey.pilot.loading import load_pilot
from testkit.factories import embedded_pilot

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = yaml.safe_load((ROOT / "pilot.yaml").read_text("utf-8"))


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_plan_runs_the_gpu_check_and_the_pilot_on_the_device_within_ten_minutes(
        tmp_path: Path, device: str) -> None:  # fmt: skip
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_run.py"),
                           "--dry-run", "--device", device, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "gpu_run.json").read_text("utf-8"))
    stages = {s["stage"]: s for s in report["plan"]}
    assert list(stages) == ["gpu_check", "embedded_pilot"]
    check = stages["gpu_check"]["argv"]
    assert check[check.index("--device") + 1] == device
    assert f"--osprey-config={tmp_path / 'pilot' / 'pilot.yaml'}" in \
        stages["embedded_pilot"]["argv"]
    assert sum(s["timeout_s"] for s in report["plan"]) < 600
    assert report["missing"] == []  # this environment has every module the checkout needs
    assert not (tmp_path / "pilot").exists()  # a dry run runs nothing


@pytest.mark.parametrize("quick", [False, True])
def test_the_generated_pilot_is_the_shipped_one_on_the_device(tmp_path: Path,
                                                               quick: bool) -> None:
    path = tmp_path / "pilot.yaml"
    path.write_text(yaml.safe_dump(embedded_pilot("cuda", quick)), "utf-8")
    pilot = load_pilot(path)  # valid, its paths resolved from any folder
    assert pilot.target.device == "cuda" and pilot.target.threads is None
    assert set(pilot.conditions) == set(SHIPPED["conditions"])
    ids = SHIPPED["trace"]["ids"]
    if quick:
        assert pilot.trace.ids == ids[:4] and pilot.load.passes == 2
    else:  # every prompt, pass and level of the shipped pilot
        assert pilot.trace.ids == ids and pilot.load.passes == SHIPPED["load"]["passes"]
        assert dict(pilot.load.levels) == SHIPPED["load"]["levels"]
