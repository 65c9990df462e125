"""Aggregate tokens/s of the embedded engine's continuous batch at x1 and at xN, in one run.

Target on a 2-core CPU with one torch thread (pilot.yaml): the baseline's aggregate tokens/s at
x4 >= 1.8x its x1 figure. Also what the tiny drafter's speedup over the baseline does at x1 and
at xN (less gain is expected in a batch: the target's forward over more sequences costs little
more, so verifying drafts saves less). Each level is a closed loop that keeps N requests in
flight until the prompts run out; levels and conditions alternate within every repeat so that
drift on a shared machine hits them alike; the load average is printed beside the figures.
Greedy outputs at xN are checked against x1 (token-identical).

    python benchmarks/embedded_batching.py [--prompts 16] [--tokens 48] [--concurrency 4]
        [--repeats 3] [--threads 1] [--models fixtures/models]

Measured on a shared 2-core machine (12 prompts x 48 tokens, 3 repeats, load average 7.5 before
and 11.7 after: the figures are noisy): baseline x4 / x1 1.86 median (per repeat 1.56, 1.86,
2.29); tiny-drafter speedup 1.59 at x1 and 1.36 at x4; greedy outputs identical across levels
and conditions. A lighter run (8 prompts x 32 tokens, 1 repeat, load 2.3, before the cache
appended in place) gave 1.36: a prefill (about a fifth of a request at x1 on these prompts)
is not batched, and the target's own forward over 4 sequences costs about 1.6x one here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

from pytest_osprey.engines import BootSpec, GenerationRequest
from pytest_osprey.engines.transformers import TransformersEngine
from pytest_osprey.pilot.schema import Condition, Pilot, Speculation, Target, TraceSpec
from pytest_osprey.pilot.trace import load_trace, render_prompt

ROOT = Path(__file__).resolve().parent.parent


async def _closed_loop(engine: TransformersEngine, requests: list[GenerationRequest],
                       concurrency: int) -> tuple[float, list[list[int]]]:
    """Seconds to serve ``requests`` with ``concurrency`` in flight, and the outputs."""
    gate = asyncio.Semaphore(concurrency)

    async def one(r: GenerationRequest) -> list[int]:
        async with gate:
            res = await engine.generate(r)
        if not res.ok:
            raise RuntimeError(f"{r.prompt_id}: {res.error}")
        return res.output_ids

    t0 = time.perf_counter()
    outs = await asyncio.gather(*(one(r) for r in requests))
    return time.perf_counter() - t0, list(outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "fixtures" / "models")
    ap.add_argument("--trace", type=Path, default=ROOT / "prompts" / "pilot.jsonl")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    spec = Speculation(algorithm="assisted", num_draft_tokens=4)
    pilot = Pilot(
        target=Target(model=str(args.models / "tiny-target"), context_length=1024,
                      threads=args.threads),
        conditions={"baseline": Condition(role="baseline"),
                    "tiny-drafter": Condition(role="candidate",
                                              drafter=args.models / "tiny-drafter",
                                              speculation=spec)},
        trace=TraceSpec(files=[args.trace]),
    )
    engines = {}
    for name in pilot.conditions:
        engines[name] = TransformersEngine(pilot, name, BootSpec(name, Path("/tmp")))
        engines[name].start()
    prompts = load_trace([args.trace]).prompts[: args.prompts]
    requests = {n: [GenerationRequest(p.id, render_prompt(p, e.tokenizer), args.tokens,
                                      want_margins=False) for p in prompts]
                for n, e in engines.items()}
    levels = (1, args.concurrency)
    for name, eng in engines.items():  # warm-up
        asyncio.run(_closed_loop(eng, requests[name][:2], 2))
    seconds: dict[tuple[str, int], list[float]] = {(n, c): [] for n in engines for c in levels}
    tokens: dict[str, int] = {}
    identical = True
    load0 = os.getloadavg()
    for rep in range(args.repeats):
        order = [(n, c) for n in engines for c in levels]
        if rep % 2:
            order.reverse()
        outs: dict[tuple[str, int], list[list[int]]] = {}
        for name, c in order:
            s, outs[(name, c)] = asyncio.run(_closed_loop(engines[name], requests[name], c))
            seconds[(name, c)].append(s)
            tokens[name] = sum(len(o) for o in outs[(name, c)])
        identical &= all(outs[(n, 1)] == outs[(n, args.concurrency)] for n in engines)
        identical &= outs[("baseline", 1)] == outs[("tiny-drafter", 1)]
    load1 = os.getloadavg()
    for eng in engines.values():
        eng.stop()
    print(f"{len(prompts)} prompts x {args.tokens} tokens, {args.repeats} repeats, "
          f"{args.threads} torch thread(s), {os.cpu_count()} CPUs; load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after")
    print(f"{'condition':<14}{'level':>6}{'tok/s (median)':>16}{'per repeat':>34}")
    rate = {}
    for (name, c), took in seconds.items():
        per = [tokens[name] / x for x in took]
        rate[(name, c)] = statistics.median(per)
        print(f"{name:<14}{'x' + str(c):>6}{rate[(name, c)]:>16.1f}"
              f"{'  '.join(f'{v:.1f}' for v in per):>34}")
    n = args.concurrency
    ratios = [seconds[("baseline", 1)][i] / seconds[("baseline", n)][i]
              for i in range(args.repeats)]
    print(f"baseline aggregate tok/s x{n} / x1: {statistics.median(ratios):.2f} "
          f"(per repeat {', '.join(f'{r:.2f}' for r in ratios)}; target >= 1.8)")
    for c in levels:
        sp = [seconds[("baseline", c)][i] / seconds[("tiny-drafter", c)][i]
              for i in range(args.repeats)]
        print(f"tiny-drafter speedup at x{c}: {statistics.median(sp):.2f} "
              f"(per repeat {', '.join(f'{r:.2f}' for r in sp)})")
    print(f"greedy outputs identical across levels and conditions: {identical}")


if __name__ == "__main__":
    main()
