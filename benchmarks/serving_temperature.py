"""The tiny drafter's speedup on the embedded engine at each serving temperature.

Timed as the campaign times a serving sampling: every request runs to its budget (ignore
end of sequence), seeded per prompt and temperature with the same seed for both conditions,
the baseline and the drafter interleaved per prompt so that drift on a shared machine hits
both alike. Printed per temperature: ms per output token of each, the speedup (ratio of
summed completion times) and the drafter's pooled accept length (tokens per target forward);
the load average before and after beside them.

    python benchmarks/serving_temperature.py [--temperatures 0 0.7] [--top-p 0.95]
        [--prompts 21] [--tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_osprey.campaign.requests import serving_seed
from pytest_osprey.engines import BootSpec, GenerationRequest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.pilot.schema import Condition, Pilot, Speculation, Target, TraceSpec
from pytest_osprey.pilot.trace import load_trace, render_prompt

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "fixtures" / "models")
    ap.add_argument("--trace", type=Path, default=ROOT / "prompts" / "pilot.jsonl")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--prompts", type=int, default=21)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    spec = Speculation(algorithm="assisted", num_draft_tokens=args.k)
    pilot = Pilot(
        target=Target(model=str(args.models / "tiny-target"), context_length=1024,
                      threads=args.threads),
        conditions={"baseline": Condition(role="baseline"),
                    "tiny-drafter": Condition(role="candidate",
                                              drafter=args.models / "tiny-drafter",
                                              speculation=spec)},
        trace=TraceSpec(files=[args.trace]),
    )
    prompts = load_trace([args.trace]).prompts[: args.prompts]
    engines = {}
    for name in pilot.conditions:
        engine = TransformersEngine(pilot, name, BootSpec(name, Path("/tmp")))
        engine.start()
        engines[name] = engine
    for engine in engines.values():
        asyncio.run(engine.generate(GenerationRequest("w", "def main():", 8, want_margins=False)))
    print(f"{len(prompts)} prompts x {args.tokens} tokens at most (sampled: fixed length, "
          f"top-p {args.top_p}), k={args.k}, {args.threads} thread(s)")
    print(f"{'temperature':>12}{'base ms/tok':>13}{'draft ms/tok':>14}{'speedup':>9}"
          f"{'accept':>8}  load average")
    try:
        for t in args.temperatures:
            load0, t0 = os.getloadavg()[0], time.perf_counter()
            e2e = {n: 0.0 for n in engines}
            tokens = {n: 0 for n in engines}
            verify = 0
            for p in prompts:
                for name, engine in engines.items():
                    request = GenerationRequest(
                        p.id, render_prompt(p, engine._tokenizer), args.tokens,
                        temperature=t, top_p=args.top_p if t > 0 else 1.0,
                        ignore_eos=t > 0, seed=serving_seed(0, p.id, 0, 0, 0) if t > 0 else None,
                        want_margins=False)
                    res = asyncio.run(engine.generate(request))
                    assert res.ok, res.error
                    e2e[name] += res.e2e_s or 0.0
                    tokens[name] += len(res.output_ids)
                    if name != "baseline":
                        verify += res.spec_verify_ct or 0
            ms = {n: e2e[n] / max(1, tokens[n]) * 1000 for n in engines}
            print(f"{t:>12g}{ms['baseline']:>13.2f}{ms['tiny-drafter']:>14.2f}"
                  f"{e2e['baseline'] / e2e['tiny-drafter']:>8.2f}x"
                  f"{tokens['tiny-drafter'] / max(1, verify):>8.2f}  {load0:.2f} -> "
                  f"{os.getloadavg()[0]:.2f} ({time.perf_counter() - t0:.0f}s)")
    finally:
        for engine in engines.values():
            engine.stop()


if __name__ == "__main__":
    main()
