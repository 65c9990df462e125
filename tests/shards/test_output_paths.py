"""An output never replaces an input, and shard options are checked where it is cheap:
`k8s --out` onto the pilot, its trace, its adaptation data or an existing file, more shards
than the pilot's passes, and an empty or malformed --shard (an unset $SHARD in CI) on the CLI
and the pytest entry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_osprey.__main__ import EXIT_USAGE, main
from testkit.factories import ROOT, write_pilot
from testkit.pilot_run import MARK, QUIET, fake_sglang


def _k8s(pilot: Path, *more: str) -> list[str]:
    return ["k8s", str(pilot), "--shards", "2", "--image", "img:1", *more]


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip()


def _pilot(folder: Path, passes: int) -> Path:
    sections = fake_sglang(folder / "events", blocks=passes, order="interleaved",
                           levels={"low": 1})
    sections["load"].pop("block_prompts")
    sections["target"]["env"][MARK] = str(folder)
    return write_pilot(folder, sections.pop("conditions"), prompts=3, **sections)


def test_k8s_never_writes_over_its_pilot(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    pilot = tmp_path / "pilot.yaml"
    pilot.write_bytes((ROOT / "pilot.yaml").read_bytes())
    before = pilot.read_bytes()
    for out in (pilot, tmp_path / "." / "pilot.yaml"):
        for force in ((), ("--force",)):
            capsys.readouterr()
            assert main(_k8s(pilot, "--out", str(out), *force)) == EXIT_USAGE
            err = _err(capsys)
            assert "an output never replaces an input" in err and len(err.splitlines()) == 1
    link = tmp_path / "link.yaml"
    link.symlink_to(pilot)
    assert main(_k8s(pilot, "--out", str(link), "--force")) == EXIT_USAGE
    assert pilot.read_bytes() == before


def test_k8s_never_writes_over_what_the_pilot_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its trace (named relative to the pilot) and its adaptation data, a file in that folder
    included, are inputs: --force replaces an earlier manifest, never one of them."""
    pilot = _pilot(tmp_path, passes=2)
    data = yaml.safe_load(pilot.read_text())
    data["trace"]["files"] = ["trace.jsonl"]
    data["conditions"]["cand"]["held_out"] = {"adaptation_data": "adapt"}
    pilot.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "adapt").mkdir()
    kept = [tmp_path / "trace.jsonl", tmp_path / "adapt" / "a.jsonl"]
    kept[1].write_text('{"text": "adaptation"}\n')
    before = [p.read_bytes() for p in kept]
    for out, what in ((kept[0], "it is the pilot's trace file"),
                      (tmp_path / "." / "trace.jsonl", "it is the pilot's trace file"),
                      (kept[1], "it lies inside condition cand's adaptation data"),
                      (tmp_path / "adapt" / "new.yaml", "it lies inside condition cand's")):
        capsys.readouterr()
        assert main(_k8s(pilot, "--out", str(out), "--force")) == EXIT_USAGE
        err = _err(capsys)
        assert what in err and "an output never replaces an input" in err, err
        assert len(err.splitlines()) == 1
    assert [p.read_bytes() for p in kept] == before
    assert sorted(os.listdir(tmp_path / "adapt")) == ["a.jsonl"]
    assert main(_k8s(pilot, "--out", str(tmp_path / "osprey.yaml"))) == 0


def test_k8s_replaces_an_existing_file_only_when_forced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "osprey.yaml"
    out.write_text("mine\n")
    assert main(_k8s(ROOT / "pilot.yaml", "--out", str(out))) == EXIT_USAGE
    assert "already exists; give --force" in _err(capsys)
    assert out.read_text() == "mine\n"
    assert main(_k8s(ROOT / "pilot.yaml", "--out", str(out), "--force")) == 0
    assert "kind: Job" in out.read_text()
    assert main(_k8s(ROOT / "pilot.yaml", "--out", str(tmp_path))) == EXIT_USAGE
    assert "not a regular file" in _err(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["osprey.yaml"]  # no temporary file left


def test_k8s_refuses_more_shards_than_the_pilots_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "osprey.yaml"
    args = ["k8s", str(ROOT / "pilot.yaml"), "--image", "img:1", "--out", str(out)]
    passes = yaml.safe_load((ROOT / "pilot.yaml").read_text("utf-8"))["load"]["passes"]
    assert main([*args, "--shards", str(passes + 1)]) == EXIT_USAGE
    err = _err(capsys)
    assert f"--shards {passes + 1}: the pilot has {passes} passes" in err
    assert len(err.splitlines()) == 1
    assert not out.exists()
    assert main([*args, "--shards", str(passes)]) == 0


@pytest.mark.parametrize("spec", ["", " ", "1/", "1/2/3", "\u0661/\u0662", "2of2"])
def test_an_empty_or_malformed_shard_is_a_usage_error(
        spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pilot = _pilot(tmp_path, passes=2)
    assert main(["run", str(pilot), "--shard", spec, "--dry-run"]) == EXIT_USAGE
    err = _err(capsys)
    assert "--shard" in err and "expected K/N" in err and len(err.splitlines()) == 1
    if not spec.strip():
        assert "empty" in err


@pytest.mark.slow  # over a second on 2 busy cores
def test_an_empty_shard_on_the_pytest_entry_is_refused(tmp_path: Path) -> None:
    pilot = _pilot(tmp_path, passes=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *QUIET, f"--osprey-config={pilot}",
         "--osprey-shard", "", "--osprey-results", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "expected K/N" in done.stderr and "empty" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing measured: not the whole campaign

