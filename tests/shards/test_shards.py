"""Sharded pilots: a disjoint share of the seeded plan per shard, every condition on every
shard; merging refuses what does not belong together and judges the pooled records."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_osprey.__main__ import main
from pytest_osprey.campaign.schedule import plan_replay
from pytest_osprey.run.pilot_run import PilotRun, RunOptions, UsageError
from pytest_osprey.shards.merge import MergeError, merge_shards
from pytest_osprey.shards.plan import Shard, ShardError, parse_shard, shard_plan
from testkit.factories import ROOT, write_pilot
from testkit.pilot_run import MARK, fake_sglang, kill_marked, run_two_shards

IDS = [f"p{i}" for i in range(12)]
STRATA = {pid: ("rare" if i % 4 == 3 else "core") for i, pid in enumerate(IDS)}


def _plan(passes: int = 4) -> Any:
    return plan_replay(IDS, ("base", "cand", "cur"), {"low": 1, "x4": 4}, passes,
                       strata=STRATA, seed=7)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shards_split_the_plan_into_disjoint_whole_passes(n: int) -> None:
    plan = _plan()
    cuts = [shard_plan(plan, Shard(k, n)) for k in range(1, n + 1)]
    got = [s for cut in cuts for s in cut.stretches]
    assert sorted(s.index for s in got) == [s.index for s in plan.stretches]  # disjoint, all
    for cut in cuts:
        passes = {s.pass_index for s in cut.stretches}
        assert passes and len({p % n for p in passes}) == 1
        for p in passes:  # a whole pass: every condition, every prompt of every slice
            mine = [s for s in cut.stretches if s.pass_index == p]
            assert {s.condition for s in mine} == {"base", "cand", "cur"}
            for level in ("low", "x4"):
                ids = {pid for s in mine if s.level == level for pid in s.prompt_ids}
                assert ids == set(IDS)
        indices = [s.index for s in cut.stretches]
        assert indices == sorted(indices)  # the plan's order


def test_a_shard_spec_is_k_of_n_and_needs_a_pass_each() -> None:
    assert parse_shard(" 2/4 ") == Shard(2, 4)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(ShardError):
            parse_shard(bad)
    with pytest.raises(ShardError, match="fewer than 4 shards"):
        shard_plan(_plan(passes=3), Shard(1, 4))


# --------------------------------------------------------------------------- real shards

def _pilot(folder: Path, passes: int = 4) -> Path:
    sections = fake_sglang(folder / "events", blocks=passes, order="interleaved",
                           levels={"low": 1})
    sections["load"].pop("block_prompts")
    sections["target"]["env"][MARK] = str(folder)
    return write_pilot(folder, sections.pop("conditions"), prompts=5, **sections)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards of a 4-pass pilot on the fake SGLang server, run in this process."""
    root = tmp_path_factory.mktemp("shards")
    pilot = _pilot(root)
    run_two_shards(root, pilot)
    return root


def _records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


@pytest.mark.slow  # over a second on 2 busy cores
def test_each_shard_is_an_ordinary_folder_naming_its_share(shards: Path) -> None:
    for k, passes in ((1, [0, 2]), (2, [1, 3])):
        meta = json.loads((shards / f"s{k}" / "campaign.json").read_text())
        assert meta["shard"]["index"] == k and meta["shard"]["passes"] == passes
        assert meta["shard"]["hardware"]["cand"]["engine"] == "sglang"
        assert meta["host"]["node"] and meta["status"] == "complete"
        greedy = Counter((r["condition"], r["repetition"]) for r in _records(shards / f"s{k}")
                         if r["mode"] == "greedy" and not r["filler"])
        assert greedy == {(c, p): 5 for c in ("baseline", "cand") for p in passes}
        assert (shards / f"s{k}" / "summary.json").is_file()
        assert not (shards / f"s{k}" / "run.lock").exists()  # the finished run let go


def test_merge_pools_the_shards_into_one_judged_folder(shards: Path, tmp_path: Path) -> None:
    code = main(["merge", str(tmp_path / "m"), str(shards / "s2"), str(shards / "s1")])
    assert code in (0, 1)
    out = tmp_path / "m"
    for name in ("campaign.json", "records.jsonl", "summary.json", "report.md"):
        assert (out / name).is_file(), name
    records = [r for r in _records(out) if r["mode"] == "greedy" and not r["filler"]]
    assert Counter((r["shard"], r["repetition"]) for r in records) == {
        (1, 0): 10, (2, 1): 10, (1, 2): 10, (2, 3): 10}
    assert len({r["run_id"] for r in _records(out)}) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is None and summary["status"] == "complete"
    assert [s["status"] for s in summary["shards"]] == ["complete", "complete"]
    gate = next(g for g in summary["gates"] if g["kind"] == "speedup")
    assert "4 passes" in gate["summary"]  # judged over every shard's passes
    assert code == (0 if all(v["verdict"] == "KEEP" for v in summary["verdicts"]) else 1)
    assert "Merged from 2 shards" in (out / "report.md").read_text()


def _copy(src: Path, dst: Path, **changes: Any) -> Path:
    shutil.copytree(src, dst)
    meta = json.loads((dst / "campaign.json").read_text())
    for key, value in changes.items():
        where = meta
        *path, last = key.split("__")
        for part in path:
            where = where[part]
        where[last] = value
    (dst / "campaign.json").write_text(json.dumps(meta))
    if "run_id" in changes:  # the copy's records are that run's too (else it has none)
        rows = [json.loads(line) for line in (dst / "records.jsonl").read_text().splitlines()
                if line.strip()]
        (dst / "records.jsonl").write_text("".join(
            json.dumps({**row, "run_id": changes["run_id"]}) + "\n" for row in rows))
        _stamp(dst)
    return dst


def _stamp(folder: Path) -> None:
    """campaign.json's records hash made the rewritten records' (as a run that had written
    them would have left it)."""
    meta = json.loads((folder / "campaign.json").read_text())
    meta["records_sha256"] = hashlib.sha256((folder / "records.jsonl").read_bytes()).hexdigest()
    (folder / "campaign.json").write_text(json.dumps(meta))


def _other_pilot(src: Path, dst: Path) -> Path:
    """A copy of a shard as if run with another pilot (its text, hash and digest alike)."""
    from pytest_osprey.pilot.loading import load_pilot_text

    meta = json.loads((src / "campaign.json").read_text())
    data = yaml.safe_load(meta["pilot_text"])
    data.setdefault("decision", {})["inconclusive"] = "pass"
    text = yaml.safe_dump(data)
    return _copy(src, dst, pilot_text=text,
                 pilot_text_sha256=hashlib.sha256(text.encode()).hexdigest(),
                 config_hash=load_pilot_text(text, "t").digest())


def test_merge_refuses_what_does_not_belong_together(shards: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    s1, s2 = shards / "s1", shards / "s2"
    cases = {
        "missing": ([s1], "shard 2 of 2 missing"),
        "twice": ([s1, s1, s2], "given twice"),
        "same shard": ([s1, _copy(s1, tmp_path / "again", run_id="other"), s2],
                       "shard 1 given twice"),
        "config": ([s1, _other_pilot(s2, tmp_path / "cfg")], "different config"),
        "config hash alone": ([s1, _copy(s2, tmp_path / "cfg0", config_hash="0" * 64)],
                              "not the pilot the run digested"),
        "trace": ([s1, _copy(s2, tmp_path / "trc", trace_hash="f" * 64)], "different trace"),
        "pilot": ([s1, _copy(s2, tmp_path / "plt", pilot_name="other")], "different pilot"),
        "hardware": ([s1, _copy(s2, tmp_path / "hw", shard__hardware__cand__version="9.9")],
                     "different machines or software"),
        "digest": ([s1, _copy(s2, tmp_path / "dg",
                              shard__hardware__baseline__model_digest="abc")], "model_digest"),
        "whole run": ([s1, _copy(s2, tmp_path / "whole", shard=None)], "not a shard"),
        "interrupted": ([s1, _copy(s2, tmp_path / "int", status="interrupted")],
                        "shard 2 incomplete"),
    }
    for name, (folders, reason) in cases.items():
        capsys.readouterr()
        code = main(["merge", str(tmp_path / f"out-{name.replace(' ', '-')}"),
                     *map(str, folders)])
        err = capsys.readouterr().err.strip()
        assert code == 4, name
        assert reason in err and len(err.splitlines()) == 1, (name, err)
        assert not (tmp_path / f"out-{name}" / "summary.json").exists()


def test_a_partial_merge_is_labelled_and_claims_no_verdict(shards: Path, tmp_path: Path) -> None:
    merged = merge_shards(tmp_path / "m", [shards / "s1"], partial=True)
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert "shard 2 of 2 missing" in (summary["partial"] or "")
    assert [s["status"] for s in summary["shards"]] == ["complete", "missing"]
    assert all(v["verdict"] == "INCONCLUSIVE" for v in summary["verdicts"])
    assert merged.exit_code == 2  # a partial campaign's code, as `report` gives it
    assert "shard 2" in (tmp_path / "m" / "report.md").read_text()


def test_a_partial_merge_exits_as_its_report_does(shards: Path, tmp_path: Path) -> None:
    assert main(["merge", "--partial", str(tmp_path / "m"), str(shards / "s1")]) == 2
    assert main(["report", str(tmp_path / "m")]) == 2


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("policy", ["pass", "fail"])
def test_every_reader_gives_one_folder_one_exit_code(shards: Path, tmp_path: Path,
                                                     policy: str) -> None:
    """merge, report, a re-judging run: one status, from the gates under the pilot's policy."""
    merged = main(["merge", str(tmp_path / "m"), str(shards / "s1"), str(shards / "s2")])
    assert main(["report", str(tmp_path / "m")]) == merged
    meta = json.loads((shards / "s1" / "campaign.json").read_text())
    data = yaml.safe_load(meta["pilot_text"])
    data.setdefault("decision", {})["inconclusive"] = policy
    config = shards / f"pilot-{policy}.yaml"  # beside the pilot, whose relative paths it keeps
    config.write_text(yaml.safe_dump(data))
    reported = main(["report", str(tmp_path / "m"), "--config", str(config)])
    rejudged = PilotRun(config, RunOptions(reuse=tmp_path / "m",
                                           results=tmp_path / "again")).run().exit_code
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    gating = [g["outcome"] for g in summary["gates"] if g["gating"]]
    expected = int("fail" in gating or (policy == "fail" and "inconclusive" in gating))
    assert reported == rejudged == expected, (gating, policy)


def test_heterogeneous_shards_merge_when_allowed_and_say_so(shards: Path, tmp_path: Path) -> None:
    other = _copy(shards / "s2", tmp_path / "hw", host__cpus=64)
    with pytest.raises(MergeError, match=r"host\.cpus"):
        merge_shards(tmp_path / "refused", [shards / "s1", other])
    merge_shards(tmp_path / "m", [shards / "s1", other], heterogeneous=True)
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert "host.cpus 64" in summary["merge_note"]
    assert summary["partial"] is None


def test_more_shards_than_passes_is_a_usage_error(tmp_path: Path) -> None:
    pilot = _pilot(tmp_path, passes=2)
    with pytest.raises(UsageError, match="fewer than the 3 shards"):
        PilotRun(pilot, RunOptions(results=tmp_path / "r", shard=Shard(1, 3)))
    assert main(["run", str(pilot), "--shard", "4/3", "--dry-run"]) == 4


def test_the_ray_command_refuses_bad_usage_in_a_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pilot = _pilot(tmp_path, passes=2)
    assert main(["ray", str(pilot), "--shards", "0"]) == 4
    assert main(["ray", str(pilot), "--shards", "3"]) == 4  # more shards than passes
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--shards 0" in err[0] and "fewer than the 3 shards" in err[1]


@pytest.mark.slow  # over a second on 2 busy cores
def test_the_pytest_option_runs_a_shard(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from testkit.pilot_run import QUIET

    pilot = _pilot(tmp_path, passes=2)
    root = ROOT
    env = {**os.environ, "PYTHONPATH": str(root)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *QUIET, f"--osprey-config={pilot}",
             "--osprey-shard", "2/2", "--osprey-results", str(tmp_path / "s2")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
        bad = subprocess.run(
            [sys.executable, "-m", "pytest", *QUIET, f"--osprey-config={pilot}",
             "--osprey-shard", "2of2"], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=120, check=False)
    finally:
        kill_marked(str(tmp_path))
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    meta = json.loads((tmp_path / "s2" / "campaign.json").read_text())
    assert meta["shard"] == {**meta["shard"], "index": 2, "count": 2, "passes": [1]}
    assert {r["repetition"] for r in _records(tmp_path / "s2") if r["mode"] == "greedy"} == {1}
    assert bad.returncode == 4 and "expected K/N" in bad.stderr


def _plant(src: Path, dst: Path, speedup: float, **changes: Any) -> Path:
    """A copy of a shard whose measured latencies give the candidate ``speedup`` against the
    baseline: each prompt's own latency, and a pass-to-pass wobble of the ratio (+-5% in log,
    cancelling over the shard's two passes)."""
    _copy(src, dst, **changes)
    rows = _records(dst)
    passes = sorted({r["repetition"] for r in rows if r["mode"] == "greedy"})
    for r in rows:
        if r["mode"] != "greedy" or r["filler"] or r["e2e_s"] is None:
            continue
        base = 0.5 + 0.1 * (sum(map(ord, r["prompt_id"])) % 7)  # the prompt's own latency
        wobble = 0.05 if passes.index(r["repetition"]) % 2 == 0 else -0.05
        r["e2e_s"] = base if r["condition"] == "baseline" else \
            base / (speedup * math.exp(wobble))
    (dst / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _stamp(dst)
    return dst


def test_each_machine_reports_its_own_speedup(shards: Path, tmp_path: Path) -> None:
    """A machine x drafter interaction: the drafter gains 1.31x on one box and 1.12x on the
    other; the merged campaign reports each as planted (the gates still pool both)."""
    s1 = _plant(shards / "s1", tmp_path / "p1", 1.31)
    s2 = _plant(shards / "s2", tmp_path / "p2", 1.12, host__cpus=64)
    merge_shards(tmp_path / "m", [s1, s2], heterogeneous=True)
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    got = [s["speedup"] for s in summary["shards"]]
    assert [set(g) for g in got] == [{"cand"}, {"cand"}]
    assert got[0]["cand"] == pytest.approx(1.31, rel=1e-6)
    assert got[1]["cand"] == pytest.approx(1.12, rel=1e-6)
    report = (tmp_path / "m" / "report.md").read_text()
    assert "machine speedups: shard 1 1.31x, shard 2 1.12x" in report
    # Homogeneous shards: the figures are still in summary.json, the line stays short.
    merge_shards(tmp_path / "same", [s1, _plant(shards / "s2", tmp_path / "q2", 1.12)])
    same = json.loads((tmp_path / "same" / "summary.json").read_text())
    assert [s["speedup"]["cand"] for s in same["shards"]] == pytest.approx([1.31, 1.12])
    assert "machine speedups" not in (tmp_path / "same" / "report.md").read_text()
    # A missing shard has no pair: null.
    merge_shards(tmp_path / "part", [s1], partial=True)
    part = json.loads((tmp_path / "part" / "summary.json").read_text())
    assert [s["speedup"]["cand"] for s in part["shards"]][1] is None


def test_report_says_the_stability_warnings_before_the_verdict(
        shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_osprey.judgement.verdict import judge as judging

    steady = judging.stability  # where the judgement measures it, once

    def unsteady(data: Any) -> Any:
        return steady(data).model_copy(update={"warnings": [
            "the baseline ran 52% slower in pass 2 than in pass 1"]})

    merge_shards(tmp_path / "m", [shards / "s1", shards / "s2"])
    capsys.readouterr()
    monkeypatch.setattr(judging, "stability", unsteady)
    main(["report", str(tmp_path / "m")])
    out = capsys.readouterr().out.splitlines()
    warned = out.index("WARNING: the baseline ran 52% slower in pass 2 than in pass 1")
    verdicts = [i for i, line in enumerate(out) if line.startswith(("KEEP", "DROP", "INCONC"))]
    assert verdicts and warned < min(verdicts), out


def test_merge_keeps_the_targets_scores_of_the_sampled_pass(shards: Path, tmp_path: Path) -> None:
    from pytest_osprey.results.scores import ScoredPosition, ScoreLine, read_scores

    s1 = shutil.copytree(shards / "s1", tmp_path / "s1")
    run_id = json.loads((s1 / "campaign.json").read_text())["run_id"]
    position = ScoredPosition(1, -0.5, (1, 2), (-0.5, -1.0))
    lines = [ScoreLine(c, "p0", 0, "baseline", (position,), ("first",), run_id)
             for c in ("baseline", "cand")]
    (s1 / "scores.jsonl").write_text("".join(x.to_json() + "\n" for x in lines))
    merge_shards(tmp_path / "m", [s1, shards / "s2"])
    back = read_scores(tmp_path / "m" / "scores.jsonl")
    assert [(x.condition, x.prompt_id) for x in back] == [("baseline", "p0"), ("cand", "p0")]
    merged_id = json.loads((tmp_path / "m" / "campaign.json").read_text())["run_id"]
    assert {x.run_id for x in back} == {merged_id} != {run_id}
