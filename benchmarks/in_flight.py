"""The in-flight load each level of a saved campaign actually ran under, from its records.

    python -m pytest_osprey run pilot.yaml --results /tmp/res
    python benchmarks/in_flight.py /tmp/res

One row per condition and level: the level's concurrency, the measured requests' in-flight
load (mean and lowest of the per-request time averages, share within +-5% of the
concurrency), the fillers sent, the achieved request rate; beside them the host's load
average over the level's stretches (campaign.json), which tells a busy machine apart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.judgement.service.load import level_loads  # noqa: E402
from pytest_osprey.results.folder import load_campaign  # noqa: E402


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print("folder\tcondition\tload\tc\tmeasured\tfillers\tmean\tmin\twithin5%\treq/s\tloadavg1")
    for folder in args.folders:
        data = load_campaign(folder)
        for lv in level_loads(data):
            loads = [e.loadavg[0] for e in data.meta.schedule
                     if e.condition == lv.condition and e.load == lv.load and e.mode == "greedy"
                     and e.loadavg]
            print("\t".join([folder.name, lv.condition, lv.load, str(lv.concurrency),
                             str(lv.measured), str(lv.fillers), _num(lv.mean), _num(lv.min),
                             _num(lv.within), _num(lv.achieved_rate),
                             _num(float(np.mean(loads)) if loads else None)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
