"""Calibration of the speed gate under the noise that breaks a unit-clustered test at low
load, by simulated campaigns (``testkit/speed_sim.py``, the real replay planner and the real
statistics, drift rule on).

Noise families (``low_load_models``): per-server stalls of 2-8 consecutive requests of one
condition at 5% and 10% onset, smooth drift of +-25% shared by both conditions over the
campaign, heavy-tailed (Pareto) stretch shocks, and their mixture. Designs: the shipped one
(21 prompts, 4 passes) and 50 prompts, 4 passes, decided at x1, x4 and x32 (one level).

Printed, as Markdown: false KEEP at a true speedup = threshold = 1.0 (with its s.e.; '!'
above alpha + 2 s.e.), the same with the serial term off (units as independent clusters,
what the variance read before), power at a true 1.5x, and at x32 power at 1.3x.

    python benchmarks/low_load_calibration.py                  # ~4 min on 2 shared cores
    python benchmarks/low_load_calibration.py --sims 400 --power-sims 200

``--beyond``: noise outside the calibrated families instead (stalls of 2-16 requests at 10%
onset, 8-24 at 5%, 3x at 5%; the +-25% shared drift at three periods over the campaign), at
x1, x4, x8 and x32: false KEEP, power at 1.5x, and how often the stall scan
names a stall longer than the serial term reaches (the gate then says its interval may be
too narrow), over all campaigns and over the false KEEPs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testkit

from pytest_osprey.judgement.speed import variance
from pytest_osprey.judgement.speed.stalls import stall_scan
from testkit.speed_sim import (
    DRIFT_25,
    KEEP,
    Campaigns,
    Design,
    Noise,
    fixed_outcomes,
    low_load_models,
    simulate,
)

ALPHA = 0.025


def rate(design: Design, model: str, truth: float, n: int, seed: int,
         noise: Noise | None = None) -> float:
    c = simulate(design, noise or low_load_models()[model], truth, n, seed=seed)
    return float(np.mean(fixed_outcomes(c, 1.0) == KEEP))


def beyond_models() -> dict[str, Noise]:
    """Noise outside the calibrated families: stalls longer or slower than 2-8 requests at
    2x, and the shared drift three times faster (three periods over the campaign)."""
    base = Noise(request_sd=0.10)
    return {"stalls10% 2-16": replace(base, stall_prob=0.10, stall_len=(2, 16)),
            "stalls5% 8-24": replace(base, stall_prob=0.05, stall_len=(8, 24)),
            "stalls5% 3x": replace(base, stall_prob=0.05, stall_factor=3.0),
            "drift25% 3 cycles": replace(base, drift_sd=DRIFT_25, drift_cycles=3.0)}


def outlasting(c: Campaigns) -> npt.NDArray[np.bool_]:
    """Campaigns where the scan names a stall longer than the serial term's reach."""
    lv = c.design.primary
    units = c.units[lv].reshape(c.units[lv].shape[0], -1)
    count = np.array([len(np.unique(u[u >= 0])) for u in units], dtype=np.float64)
    cells = (units >= 0).sum(axis=1) / count
    reach = variance.serial_span(cells, count)
    scan = stall_scan(c.reference[lv], c.candidate[lv], c.units[lv])
    return np.asarray(scan.found & (scan.length > reach) & (cells < variance.SERIAL_BELOW))


def beyond(n: int, m: int) -> None:
    s_e = math.sqrt(ALPHA * (1 - ALPHA) / n)
    print(f"Beyond the calibrated stalls: false KEEP at 1.0 ({n} campaigns; '!' above "
          f"{ALPHA + 2 * s_e:.4f}), power at 1.5x ({m}), and the share of campaigns (of "
          f"false KEEPs) where a stall is named longer than the serial term reaches.\n")
    print("| design | x | noise | false KEEP | flagged (of false KEEPs) | power 1.5x |")
    print("|---|---:|---|---:|---:|---:|")
    for prompts in (21, 50):
        for conc in (1, 4, 8, 32):
            design = Design(prompts=prompts, levels=(("low", conc),), primary="low", passes=4)
            for k, (name, noise) in enumerate(beyond_models().items()):
                seed = 5000 + 1000 * prompts + 10 * conc + k
                c = simulate(design, noise, 1.0, n, seed=seed)
                keep = fixed_outcomes(c, 1.0) == KEEP
                flag = outlasting(c)
                power = rate(design, name, 1.5, m, seed + 1, noise)
                mark = "!" if keep.mean() > ALPHA + 2 * s_e else ""
                of_keeps = f"{flag[keep].mean():.2f}" if keep.any() else "-"
                print(f"| {prompts} prompts, 4 passes | {conc} | {name} | {keep.mean():.4f}"
                      f"{mark} | {flag.mean():.3f} ({of_keeps}) | {power:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=2000, help="campaigns per false-KEEP cell")
    ap.add_argument("--power-sims", type=int, default=500, help="campaigns per power cell")
    ap.add_argument("--beyond", action="store_true", help="stalls beyond the calibrated ones")
    args = ap.parse_args()
    start, cpu = time.perf_counter(), time.process_time()
    n, m = args.sims, args.power_sims
    if args.beyond:
        beyond(n, m)
        print(f"\n{time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu:.0f} s "
              f"CPU, {' '.join(f'{x:.2f}' for x in os.getloadavg())} load average")
        return
    s_e = math.sqrt(ALPHA * (1 - ALPHA) / n)
    print(f"False KEEP at true = threshold = 1.0 ({n} campaigns per cell; s.e. at alpha "
          f"{s_e:.4f}; '!' above alpha + 2 s.e. = {ALPHA + 2 * s_e:.4f}), unit-clustered "
          f"(serial term off), power at 1.5x ({m} campaigns; s.e. at 0.8 "
          f"{math.sqrt(0.16 / m):.3f}; '!' below 0.8), and at x32 power at 1.3x. Drift rule "
          f"on, fixed design, per_prompt, one level decided.\n")
    print("| design | x | noise | false KEEP | unit-clustered | power 1.5x | power 1.3x |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for prompts in (21, 50):
        for conc in (1, 4, 32):
            design = Design(prompts=prompts, levels=(("low", conc),), primary="low", passes=4)
            for k, model in enumerate(low_load_models()):
                seed = 1000 * prompts + 10 * conc + k
                false = rate(design, model, 1.0, n, seed)
                saved = variance.SERIAL_BELOW
                variance.SERIAL_BELOW = 0
                try:
                    plain = rate(design, model, 1.0, n, seed)
                finally:
                    variance.SERIAL_BELOW = saved
                power = rate(design, model, 1.5, m, seed + 1)
                p13 = f"{rate(design, model, 1.3, m, seed + 2):.3f}" if conc == 32 else ""
                flag = "!" if false > ALPHA + 2 * s_e else ""
                low = "!" if power < 0.8 else ""
                print(f"| {prompts} prompts, 4 passes | {conc} | {model} | {false:.4f}{flag} | "
                      f"{plain:.4f} | {power:.3f}{low} | {p13} |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} load average")


if __name__ == "__main__":
    main()
