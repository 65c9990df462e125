"""A real concurrency sweep on the embedded engine: per-level speedups, in-flight load and the
crossover estimate the verdict carries (summary.json verdicts[].crossover).

Runs examples/pilot-sweep.yaml (or --pilot) through the library, as the plugin would, into a
fresh results folder, then prints per closed-loop level the drafter's speedup gate against the
baseline (estimate, CI, df), the in-flight load each condition held there (recomputed from the
records), and the crossover. The load average is printed before and after.

    python benchmarks/real_crossover.py [--pilot examples/pilot-sweep.yaml] [--results DIR]

Measured on the shared 2-core machine (16 prompts x 16 tokens, 2 passes, 514 s; load average
15.1 before, 4.5 after: noisy), tiny-drafter against the baseline (95% CI, df):

    c1 1.177 [0.812, 1.706] df 15    in flight 1.00 / 1.00 (baseline / drafter)
    c2 1.001 [0.799, 1.254] df 15    in flight 2.00 / 1.99
    c4 0.976 [0.758, 1.256] df 7     in flight 4.00 / 3.99
    c8 0.562 [0.358, 0.884] df 3     in flight 8.00 / 7.98

Crossover (threshold 1.2x): "pays_nowhere", monotone fit 1.18, 1.00, 0.98, 0.56, 95% CI of the
crossing [<= x1, x2.5]: the speedup falls with concurrency, and already at x1 it is not shown
to clear 1.2x on 16 prompts; verdict DROP.

Again on a quieter machine (191 s; load average 2.9 before, 3.9 after; the futility rule on the
t scale, the narrowed weak drafter's build):

    c1 1.344 [1.178, 1.533] df 15    in flight 1.00 / 1.00
    c2 1.001 [0.829, 1.209] df 15    in flight 2.00 / 2.00
    c4 0.861 [0.615, 1.204] df 7     in flight 4.00 / 3.99
    c8 0.831 [0.277, 2.492] df 3     in flight 8.00 / 8.00

Crossover: "speculation pays up to about x1.3 [<=1, 2.2] (95% CI of where its speedup falls to
1.2x)", status crosses; verdict INCONCLUSIVE (at the primary c8 the interval spans 1.2x).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.service.load import level_loads
from pytest_osprey.run.pilot_run import PilotRun, RunOptions

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pilot", type=Path, default=ROOT / "examples" / "pilot-sweep.yaml")
    ap.add_argument("--results", type=Path, default=None,
                    help="results folder, new or empty (default: a temporary one)")
    args = ap.parse_args()
    results = args.results or Path(tempfile.mkdtemp(prefix="osprey-sweep-")) / "res"
    load0, t0 = os.getloadavg(), time.perf_counter()
    run = PilotRun(args.pilot, RunOptions(results=results), cwd=Path.cwd())
    outcome = run.run()
    took, load1 = time.perf_counter() - t0, os.getloadavg()
    pilot = run.pilot
    print(f"{args.pilot.name}: {took:.0f} s, exit {outcome.exit_code}, {os.cpu_count()} CPUs; "
          f"load average {load0[0]:.2f} before, {load1[0]:.2f} after; results {results}")
    loads = {(lv.condition, lv.load): lv for lv in level_loads(run.campaign())}
    closed = {name: c for name, c in pilot.load.levels.items() if isinstance(c, int)}
    print(f"{'candidate':<16}{'level':>6}{'speedup':>9}{'95% CI':>18}{'df':>7}"
          f"{'in flight (base / cand)':>26}")
    for g in outcome.gates:
        s = g.spec
        if (s.kind != GateKind.SPEEDUP or s.slice is not None or s.load not in closed
                or s.reference != pilot.baseline):
            continue
        metric = g.details.get("metric")
        df = (g.details.get(metric) or {}).get("df") if isinstance(metric, str) else None
        held = [loads.get((c, s.load)) for c in (pilot.baseline, s.condition)]
        flight = " / ".join(f"{lv.mean:.2f}" if lv and lv.mean is not None else "-"
                            for lv in held)
        ci = f"[{g.ci_low:.3f}, {g.ci_high:.3f}]" if g.ci_low is not None else "-"
        print(f"{s.condition:<16}{s.load:>6}{(g.estimate or float('nan')):>9.3f}{ci:>18}"
              f"{df if df is None else round(float(df), 1)!s:>7}{flight:>26}")
    summary = json.loads((results / "summary.json").read_text("utf-8"))
    for v in summary.get("verdicts", []):
        cross = v.get("crossover")
        text = cross.get("text") if isinstance(cross, dict) else "no crossover (fewer than "\
            "three closed-loop levels)"
        print(f"{v.get('candidate')}: {v.get('verdict')}; {text}")
        if isinstance(cross, dict):
            keys = ("status", "concurrency", "ci", "fit")
            print(f"  crossover {json.dumps({k: cross.get(k) for k in keys})}")


if __name__ == "__main__":
    main()
