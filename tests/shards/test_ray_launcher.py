"""The Ray launcher on a local cluster of simulated nodes (ray.cluster_utils.Cluster), one
shard per node, the fake SGLang server (and the embedded engine) as the engine: shards stop
together once the looks across them decide, and a node killed mid-run is named in a partial
merge."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.__main__ import main
from pytest_osprey.pilot import load_pilot
from testkit.factories import dump_pilot, pilot_variant, write_pilot
from testkit.pilot_run import MARK, fake_sglang, kill_marked

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from pytest_osprey.shards.ray import SHARD_RESOURCE, launch  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A head without CPUs and two nodes of one CPU each, each offering one shard slot."""
    c = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        c.add_node(num_cpus=1, resources={SHARD_RESOURCE: 1})
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _pilot(folder: Path, early_stop: bool, delay_s: str) -> Path:
    sections = fake_sglang(folder / "events", blocks=4, order="interleaved",
                           levels={"low": 1}, base_env={"OSPREY_FAKE_DELAY_S": delay_s})
    sections["load"].pop("block_prompts")
    sections["target"]["env"][MARK] = str(folder)
    sections["decision"]["early_stop"] = early_stop
    return write_pilot(folder, sections.pop("conditions"), prompts=5, **sections)


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow  # over a second on 2 busy cores
def test_shards_run_as_tasks_and_stop_together(cluster: Any, tmp_path: Path) -> None:
    # The baseline answers 0.3 s slower: a clear speedup, decided at the first look.
    pilot = _pilot(tmp_path, early_stop=True, delay_s="0.3")
    try:  # the command line, in this process (Ray is up: the launcher joins it)
        code = main(["ray", str(pilot), "--shards", "2", "--results", str(tmp_path / "out")])
    finally:
        kill_marked(str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "out-shards").iterdir()) == ["shard-1", "shard-2"]
    meta = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert [m["status"] for m in meta["merged"]] == ["complete", "complete"]
    looks = meta["sequential"]["cand"]
    assert looks[0]["decision"] == "keep" and looks[0]["shards"] == 2
    # Every shard stopped after its first pass: the look pooled passes 1 and 2.
    records = [json.loads(line) for line in
               (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    passes = {(r["shard"], r["repetition"]) for r in records if r["mode"] == "greedy"}
    assert passes == {(1, 0), (2, 1)}
    assert _summary(tmp_path / "out")["verdicts"][0]["verdict"] == "KEEP"
    assert code == (0 if all(v["verdict"] == "KEEP" for v in
                             _summary(tmp_path / "out")["verdicts"]) else 1)


def _embedded(folder: Path) -> Path:
    """The shipped embedded pilot cut down (3 prompts, 2 passes, 8 tokens), run to the end."""
    data = pilot_variant("cpu", "interleaved", 3, 2, 8)
    data["decision"] = {**data.get("decision", {}), "early_stop": False}
    return dump_pilot(folder / "pilot.yaml", data)


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("engine", [
    "fake-sglang", pytest.param("embedded", marks=pytest.mark.slow)])  # it boots the tiny models
def test_a_node_killed_mid_run_is_named_and_no_verdict_claimed(cluster: Any, tmp_path: Path,
                                                               engine: str) -> None:
    # The embedded engine runs inside the shard's Ray worker: the node takes it down with it.
    pilot = (_pilot(tmp_path, early_stop=False, delay_s="0.15") if engine == "fake-sglang"
             else _embedded(tmp_path))
    started = time.time()
    node = cluster.list_all_nodes()[-1]
    killed: list[bool] = []

    def kill_when_measuring() -> None:
        deadline = time.monotonic() + 240  # the embedded engine loads its models first
        while time.monotonic() < deadline:
            for f in Path("/tmp").glob("osprey-shard-*/shard-*/records.jsonl"):
                if f.stat().st_mtime >= started and f.stat().st_size > 0:
                    cluster.remove_node(node, allow_graceful=False)
                    killed.append(True)
                    return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_when_measuring)
    killer.start()
    try:
        done = launch(pilot, load_pilot(pilot), 2, tmp_path / "out")
    finally:
        killer.join()
        kill_marked(str(tmp_path))
        cluster.add_node(num_cpus=1, resources={SHARD_RESOURCE: 1})
    assert killed
    assert len(done.dead) == 1 and "worker died" in next(iter(done.dead.values()))
    lost = next(iter(done.dead))
    summary = _summary(tmp_path / "out")
    assert f"shard {lost} of 2" in summary["partial"]
    assert [s["status"] for s in summary["shards"] if s["index"] == lost] == ["missing"]
    assert all(v["verdict"] == "INCONCLUSIVE" for v in summary["verdicts"])
    assert done.exit_code == 2  # a partial merge: no verdict
    assert f"shard {lost}" in (tmp_path / "out" / "report.md").read_text()
