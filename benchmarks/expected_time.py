"""The expected time stated before a campaign against the time it took: a short embedded run
of the shipped pilot (tiny models, a few prompts), twice in one osprey-results/ folder, so the
second run's expectation comes from the first run's records.

    PYTHONPATH=$PWD python benchmarks/expected_time.py [--prompts 4]

Prints per run: the expectation's source, expected and actual seconds, their ratio, and the
load average (a shared machine runs slower than its model says)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    pilot = yaml.safe_load((ROOT / "pilot.yaml").read_text("utf-8"))
    pilot["name"] = "expected-time-bench"
    pilot["target"]["model"] = str(ROOT / pilot["target"]["model"])
    for cond in pilot["conditions"].values():
        if "drafter" in cond:
            cond["drafter"] = str(ROOT / cond["drafter"])
    pilot["trace"] = {"files": [str(ROOT / f) for f in pilot["trace"]["files"]],
                      "ids": pilot["trace"]["ids"][:: max(1, 21 // args.prompts)][:args.prompts]}
    pilot["load"]["passes"] = 2
    pilot["sampling"]["sampled"] = {"enabled": True, "samples_per_prompt": 4, "prompts": 2,
                                    "max_new_tokens": 16}
    pilot["sampling"]["params"] = {"enabled": False}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pilot.yaml"
        path.write_text(yaml.safe_dump(pilot), "utf-8")
        for run in (1, 2):
            res = subprocess.run([sys.executable, "-m", "pytest_osprey", "run", str(path)],
                                 cwd=tmp, capture_output=True, text=True, timeout=1800)
            if not (Path(tmp) / "osprey-results").is_dir():
                sys.exit(f"run {run} left no results (exit {res.returncode}): "
                         f"{res.stderr.strip()[-500:]}")
            folder = max((Path(tmp) / "osprey-results").glob("expected-time-bench-*"),
                         key=lambda p: p.stat().st_mtime)
            meta = json.loads((folder / "campaign.json").read_text("utf-8"))
            expected = (meta.get("size") or {}).get("expected") or {}
            actual = float(meta["ended_at"]) - float(meta["started_at"])
            seconds = expected.get("seconds")
            ratio = f"{seconds / actual:.2f}" if seconds else "n/a"
            print(f"run {run}: status {meta['status']}; expected {seconds} s "
                  f"[{expected.get('source')}], actual {actual:.1f} s, expected/actual {ratio}; "
                  f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
