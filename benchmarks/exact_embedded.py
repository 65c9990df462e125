"""The exact distribution gate end to end on the embedded engine and the tiny models: samples
drawn by the baseline and by the drafter (honest, or with a planted verification fault), the
target scoring them (the engine's score capability), the gate judging them as a campaign's
would (the baseline's own samples its A/A control). Prints each condition's per-class
figures, the gate's outcome and summary, and wall/CPU time beside the load average.

    python benchmarks/exact_embedded.py --prompts 4 --samples 16 --tokens 16 \
        --faults none greedy_verification garbage_params temperature:0.3 top_k_ignored
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.engines.base import BootSpec, GenerationRequest  # noqa: E402
from pytest_osprey.engines.embedded.engine import TransformersEngine  # noqa: E402
from pytest_osprey.engines.embedded.planted_faults import ENV  # noqa: E402
from pytest_osprey.judgement.gates.kinds import GateKind  # noqa: E402
from pytest_osprey.judgement.gates.spec import GateSpec  # noqa: E402
from pytest_osprey.judgement.quality.gates import judge_distribution  # noqa: E402
from pytest_osprey.pilot.schema import Pilot  # noqa: E402
from pytest_osprey.report.exact_table import HEADER, rows  # noqa: E402
from pytest_osprey.results.folder import SavedCampaign  # noqa: E402
from pytest_osprey.results.scores import ScoreLine, classes_of  # noqa: E402
from testkit.factories import TINY_DRAFTER, TINY_TARGET, make_pilot  # noqa: E402


def pilot(args: argparse.Namespace) -> Pilot:
    return make_pilot(
        target={"model": str(TINY_TARGET), "context_length": 512, "threads": args.threads},
        conditions={"base": {"role": "baseline"},
                    "cand": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                             "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        sampling={"sampled": {"enabled": True, "temperature": args.temperature,
                              "score_top_k": args.top_k}})


async def sample(engine: TransformersEngine, scorer: TransformersEngine, name: str,
                 args: argparse.Namespace, seed: int) -> list[ScoreLine]:
    prompts = [f"Tell me about item {i}." for i in range(args.prompts)]
    requests = [GenerationRequest(f"p{i}", p, args.tokens, temperature=args.temperature,
                                  seed=seed + 1000 * i + j, ignore_eos=True, want_margins=False)
                for i, p in enumerate(prompts) for j in range(args.samples)]
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    lines = []
    for i, p in enumerate(prompts):
        mine = results[i * args.samples:(i + 1) * args.samples]
        scored = await scorer.score(p, [r.output_ids for r in mine], args.top_k)
        lines += [ScoreLine(name, f"p{i}", j, "base", tuple(s), tuple(classes_of(r)),
                            vocab=scorer.vocab_size)
                  for j, (r, s) in enumerate(zip(mine, scored, strict=True))]
    return lines


def started(p: Pilot, name: str, logs: Path) -> TransformersEngine:
    engine = TransformersEngine(p, name, BootSpec(name, logs))
    engine.start()
    return engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--faults", nargs="+", default=["none", "greedy_verification",
                                                     "garbage_params"])
    args = ap.parse_args()
    p = pilot(args)
    spec = GateSpec(GateKind.DISTRIBUTION, "cand", "base")
    logs = Path(tempfile.mkdtemp(prefix="exact-embedded-"))
    t0, c0 = time.perf_counter(), time.process_time()
    os.environ.pop(ENV, None)
    base = started(p, "base", logs)
    control = asyncio.run(sample(base, base, "base", args, 0))
    print(f"{args.prompts} prompts x {args.samples} samples x {args.tokens} tokens at T "
          f"{args.temperature}, top-{args.top_k} logprobs")
    for fault in args.faults:
        if fault == "none":
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = fault
        cand = started(p, "cand", logs)
        try:
            lines = asyncio.run(sample(cand, base, "cand", args, 10**6))
        finally:
            cand.stop()
        data = SavedCampaign(Path("."), {"conditions": {"base": {}, "cand": {}}}, [],
                             scores=[*control, *lines])
        gate = judge_distribution(spec, p, data)
        print(f"\n== drafter, fault {fault}: {gate.outcome.upper()} (p {gate.p_value:.3g})")
        print(f"   {gate.summary}")
        for who in ("control", "candidate"):
            test = gate.details.get(who)
            if test is None:
                continue
            print(f"   {who}: " + " | ".join(HEADER))
            for row in rows(test):
                print("     " + " | ".join(row))
    base.stop()
    print(f"\nwall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
