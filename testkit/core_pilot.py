"""A whole pilot against two serving twins (a plain server and an EAGLE-3-like one), run by
``python -m pytest_osprey run`` in a child process: what a CI job that only talks to a running
server does. .ci/run runs it from a venv with the core install alone (no torch); the tests run
it with torch refused (testkit.without_torch).

``python -m testkit.core_pilot OUT [--refuse-torch]`` exits with the run's exit code and
leaves the pilot and the results folder in OUT."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from testkit.factories import dump_pilot, pilot_data
from testkit.serving_twin import TwinProcess

ROOT = Path(__file__).resolve().parents[1]


def write_pilot(folder: Path, base_url: str, cand_url: str, prompts: int = 6) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trace.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "domain": ("chat", "code")[i % 2],
                    "prompt": f"{i:02d} Tell me about serving twins, briefly.",
                    "max_new_tokens": 24}) + "\n" for i in range(prompts)))
    data = pilot_data(
        {"base": {"role": "baseline", "endpoint": {"url": base_url, "protocol": "sglang"}},
         "cand": {"role": "candidate", "endpoint": {"url": cand_url, "protocol": "sglang"}}},
        name="core-only", target={"engine": "endpoint", "model": "twin"},
        trace={"files": ["trace.jsonl"]},
        load={"levels": {"low": 1}, "warmup_requests": 1, "passes": 1},
        report={"html": True})
    return dump_pilot(folder / "pilot.yaml", data)


def run(out: Path, refuse_torch: bool = False) -> int:
    with TwinProcess("plain", seed=1) as base, TwinProcess("eagle3-like", seed=2) as cand:
        pilot = write_pilot(out, base.url, cand.url)
        entry = ["-m", "testkit.without_torch"] if refuse_torch else ["-m", "pytest_osprey"]
        proc = subprocess.run([sys.executable, *entry, "run", str(pilot), "--results",
                               str(out / "results")], cwd=ROOT, check=False)
    return proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.core_pilot")
    parser.add_argument("out", type=Path)
    parser.add_argument("--refuse-torch", action="store_true")
    args = parser.parse_args()
    return run(args.out, args.refuse_torch)


if __name__ == "__main__":
    sys.exit(main())
