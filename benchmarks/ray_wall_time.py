"""Wall time to a decision with 1 and 2 Ray shards, in one run, on this machine.

A local Ray cluster (ray.cluster_utils.Cluster) of two simulated nodes of one CPU each, one
shard slot per node; the embedded engine (tiny models, transformers, one thread); the shipped
pilot cut down (``--prompts`` prompts, ``--passes`` passes, early stopping on, the sampled
passes off). The same pilot runs as 1 shard, then as 2 shards; each is timed from the launch
to the merged verdict (a shard's boot and model load included). Prints both times, their
ratio and the load average before and after each (the machine is shared).

    python benchmarks/ray_wall_time.py                  # needs ray (pip install '.[ray]')
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testkit

from pytest_osprey.pilot import load_pilot
from pytest_osprey.shards.ray import SHARD_RESOURCE, launch
from testkit.factories import pilot_variant


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--no-early-stop", action="store_true",
                    help="Every pass runs (the same work on 1 and 2 shards)")
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="osprey-ray-wall-"))
    data = pilot_variant("cpu", "interleaved", args.prompts, args.passes, args.tokens)
    data["name"] = "ray-wall-time"
    data["sampling"]["sampled"]["enabled"] = False
    data["sampling"]["params"]["enabled"] = False
    data.setdefault("decision", {})["early_stop"] = not args.no_early_stop
    pilot_path = work / "pilot.yaml"
    pilot_path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    pilot = load_pilot(pilot_path)
    print(f"pilot: {args.prompts} prompts x {args.passes} passes, levels "
          f"{dict(pilot.load.levels)}, early stopping {'off' if args.no_early_stop else 'on'}; "
          f"{load()}")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={SHARD_RESOURCE: 1})
    ray.init(address=cluster.address, log_to_driver=False)
    times: dict[int, float] = {}
    try:
        for n in (1, 2):
            before = load()
            t0 = time.perf_counter()
            done = launch(pilot_path, pilot, n, work / f"out-{n}")
            times[n] = time.perf_counter() - t0
            summary = json.loads((work / f"out-{n}" / "summary.json").read_text())
            meta = json.loads((work / f"out-{n}" / "campaign.json").read_text())
            looks = {c: [x["decision"] for x in v] for c, v in meta["sequential"].items()}
            print(f"{n} shard(s): {times[n]:.1f} s to the decision "
                  f"{[v['verdict'] for v in summary['verdicts']]} (looks {looks}; "
                  f"dead {done.dead}); before: {before}; after: {load()}")
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"ratio 2 shards / 1 shard: {times[2] / times[1]:.2f} ({load()})")


if __name__ == "__main__":
    main()
