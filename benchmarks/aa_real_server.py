"""A/A on a real engine: several boots of the same plain server (speculation off in every
condition), each judged by the exact distribution gate against the baseline as a candidate
would be. Nothing differs but the boot, so every gate must pass at its alpha: the false-alarm
row of docs/quality-calibration.md for a real server.

The pilot is the engine's CPU example (examples/pilot-{vllm,sglang}-cpu.yaml: its target,
engine arguments and environment) with its conditions replaced by the baseline and
``--copies`` plain candidates, one pass at x1, and a sampled pass of ``--prompts`` x
``--samples`` x ``--tokens``. Needs the engine's venv (OSPREY_VLLM_PYTHON or
OSPREY_SGLANG_PYTHON).

    python benchmarks/aa_real_server.py --engine vllm --copies 3 --out /tmp/aa-vllm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.example_pilots import aa_example  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pilot = aa_example(ROOT / "examples" / f"pilot-{args.engine}-cpu.yaml", args.out,
                       copies=args.copies, prompts=args.prompts, samples=args.samples,
                       tokens=args.tokens)
    results = args.out / "results"
    start, cpu = time.monotonic(), time.process_time()
    proc = subprocess.run([sys.executable, "-m", "pytest_osprey", "run", str(pilot),
                           "--results", str(results)], cwd=ROOT, check=False)
    wall = time.monotonic() - start
    summary = json.loads((results / "summary.json").read_text("utf-8"))
    print(f"engine {args.engine}, {args.copies} plain copies vs the baseline, sampled pass "
          f"{args.prompts}x{args.samples}x{args.tokens}; exit {proc.returncode}")
    for g in summary["gates"]:
        if g["kind"] != "distribution":
            continue
        d = g.get("details") or {}
        classes = (d.get("candidate") or {}).get("classes") or {}
        figures = "; ".join(
            f"{k}: n {c.get('n')}, score z {c.get('score_z', 0):+.2f}, PIT p "
            f"{c.get('pit_p', 1):.2g}, T {c.get('temperature', float('nan')):.2f}"
            for k, c in classes.items())
        print(f"{g['condition']}: {g['outcome']} p {g.get('p_value')} (alpha "
              f"{g.get('threshold')}), control {(d.get('control') or {}).get('outcome')}; "
              f"{figures}")
    print(f"({wall:.0f} s wall, {time.process_time() - cpu:.0f} s CPU here, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
