"""The Osprey-against-EAGLE-3 example end to end against three serving twins, over seeds.

Each seed runs one campaign through ``python -m pytest_osprey run`` (testkit/twin_example.py:
the example's conditions, levels, limits and decision; three TwinProcess servers; every cost
times ``--time-scale``), one campaign at a time, and prints per level and pair the speed
gate's estimate, CI, the twins' truth and whether the CI covers it; the candidate's verdict
and whether it is right against the truth; the crossover interval against the true crossover;
the client's per-request cost at x1 (measured latency minus the twin's virtual-time latency)
and the bias it puts on each x1 ratio; then coverage over the seeds. The load average is
printed beside every timing.

    python benchmarks/twin_example.py                       # 3 seeds, six-boot plan
    python benchmarks/twin_example.py --seeds 1 --plan shipped --prompts 12
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: testkit

import numpy as np  # noqa: E402

from testkit.twin_example import (  # noqa: E402
    LEVELS,
    OUTPUTS,
    PLANS,
    PROFILE_OF,
    PROMPT_TOKENS,
    CampaignResult,
    run_campaign,
    truths,
)
from testkit.twin_model import closed_loop_e2e, profile  # noqa: E402


def x1_latency(condition: str, time_scale: float) -> float:
    """Mean virtual-time x1 completion latency over the output lengths (s)."""
    prof = profile(PROFILE_OF[condition], time_scale)
    return float(np.mean([np.mean(closed_loop_e2e(prof, 1, PROMPT_TOKENS, n,
                                                  20 if prof.steps else 1))
                          for n in OUTPUTS]))


def show(r: CampaignResult, time_scale: float) -> None:
    print(f"seed {r.seed}: campaign {r.wall_s:.0f} s wall, CLI process CPU "
          f"{r.client_cpu_s:.1f} s, exit {r.exit_code}, load average "
          f"{', '.join(f'{x:.1f}' for x in r.load_average)}")
    for p in r.pairs:
        print(f"  {p.condition} vs {p.reference} @ {p.level} (x{LEVELS[p.level]}): "
              f"{p.estimate:.3f} [{p.ci[0]:.3f}, {p.ci[1]:.3f}], true {p.truth:.3f}, "
              f"{'covered' if p.covered else 'MISSED'}; gate {p.outcome}")
    print(f"  verdict {r.verdict} ({'right' if r.verdict_right else 'WRONG'} against the "
          f"truth)")
    cx = r.crossover
    print(f"  crossover: {cx.get('status')} {cx.get('ci')} ({cx.get('text', '')}); "
          f"true: {r.true_crossover}")
    lat = {c: x1_latency(c, time_scale) for c in r.overhead_s}
    for c, d in sorted(r.overhead_s.items()):
        print(f"  x1 per-request excess (median) {c}: {1000 * d:+.1f} ms on {lat[c]:.2f} s")
    for cond, ref in (("osprey", "baseline"), ("osprey", "eagle3")):
        if cond in r.overhead_s and ref in r.overhead_s:
            bias = ((lat[ref] + r.overhead_s[ref]) / (lat[cond] + r.overhead_s[cond])
                    / (lat[ref] / lat[cond]))
            print(f"  x1 ratio bias {cond} vs {ref} from the excess: {100 * (bias - 1):+.2f}%")


def crossover_covered(r: CampaignResult) -> bool:
    """The interval holds the true crossover: past the highest level when the truth pays
    everywhere (an open upper end), below the lowest when it pays nowhere."""
    if r.crossover.get("status") in (None, "not_estimable"):
        return False
    ci = r.crossover.get("ci") or [None, None]
    top, bottom = max(LEVELS.values()), min(LEVELS.values())
    if r.true_crossover == "pays_everywhere":
        return ci[1] is None and (ci[0] is None or ci[0] <= top)
    if r.true_crossover == "pays_nowhere":
        return ci[0] is None and (ci[1] is None or ci[1] >= bottom)
    return False  # a crossing inside the range: not the example's truth (see truths())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--plan", choices=sorted(PLANS), default="six-boot")
    ap.add_argument("--keep", type=Path, help="keep each campaign's folder under this one")
    args = ap.parse_args()
    truth = truths(args.time_scale)
    print(f"plan {args.plan} {PLANS[args.plan]}, {args.prompts} prompts of {PROMPT_TOKENS} "
          f"tokens, outputs {OUTPUTS}, time scale {args.time_scale}")
    for (cond, ref, level), t in truth.items():
        print(f"  truth {cond} vs {ref} @ x{LEVELS[level]}: {t:.3f}")
    results: list[CampaignResult] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        for i in range(args.seeds):
            seed = args.first_seed + 10 * i
            r = run_campaign(base / f"seed{seed}", seed=seed, time_scale=args.time_scale,
                             prompts=args.prompts, plan=args.plan, truth=truth)
            show(r, args.time_scale)
            results.append(r)
    n = len(results)
    print(f"over {n} seeds ({time.perf_counter() - start:.0f} s):")
    for key in sorted({(p.condition, p.reference, p.level) for r in results for p in r.pairs},
                      key=lambda k: (k[0], k[1], LEVELS[k[2]])):
        hits = [p for r in results for p in r.pairs
                if (p.condition, p.reference, p.level) == key]
        est = math.exp(float(np.mean([math.log(p.estimate) for p in hits])))
        print(f"  {key[0]} vs {key[1]} @ x{LEVELS[key[2]]}: covered "
              f"{sum(p.covered for p in hits)}/{len(hits)}, mean estimate {est:.3f} "
              f"(true {hits[0].truth:.3f}, {100 * (est / hits[0].truth - 1):+.1f}%)")
    estimated = sum(r.crossover.get("status") not in (None, "not_estimable") for r in results)
    print(f"  crossover estimated {estimated}/{n}")
    print(f"  verdicts right {sum(r.verdict_right for r in results)}/{n} "
          f"({', '.join(r.verdict for r in results)}); crossover interval covers the truth "
          f"{sum(crossover_covered(r) for r in results)}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
