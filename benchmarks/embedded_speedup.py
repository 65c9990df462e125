"""Accept length and wall-clock speedup of the tiny drafters on the shipped trace (greedy, k=4),
pooled and per domain and slice.

Targets on a 2-core CPU: tiny-drafter accept length >= 2.5 and speedup >= 1.3x over
speculation off; tiny-drafter-weak accept length <= 1.5 and speedup < 1.0. Accept length is
the embedded engine's: output tokens per target forward (the prefill verifies the first
drafts). Speedup is the ratio of summed completion times (baseline / condition); conditions are
interleaved per prompt so that drift on a shared machine hits all alike.

    python benchmarks/embedded_speedup.py [--tokens 48] [--prompts 50] [--models fixtures/models]
        [--threads 1] [--drafter NAME=DIR ...]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

from pytest_osprey.engines import GenerationRequest
from pytest_osprey.pilot.trace import load_trace, render_prompt
from testkit import embedded_bench


def main() -> None:
    ap = embedded_bench.parser(__doc__, prompts=50, threads=None)
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=DIR",
                    help="a further drafter, interleaved with the shipped ones (repeatable)")
    args = ap.parse_args()
    more: dict[str, Path] = {}
    for item in args.drafter:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_dir():
            ap.error(f"--drafter {item}: expected NAME=DIR, DIR a model directory")
        if name in more or name in ("baseline", "tiny-drafter", "tiny-drafter-weak"):
            ap.error(f"--drafter {item}: the name {name} is taken")
        more[name] = Path(path)
    conds = embedded_bench.conditions(args, "tiny-drafter", "tiny-drafter-weak", more=more)
    prompts = load_trace([args.trace]).prompts[: args.prompts]
    engines = embedded_bench.start(args, conds)
    # Warm-up, then interleave conditions per prompt so drift hits all alike.
    per: dict[str, list[float]] = {n: [] for n in engines}
    tokens: dict[str, list[int]] = {n: [] for n in engines}
    verify: dict[str, list[int]] = {n: [] for n in engines}
    outputs: dict[str, list[list[int]]] = {n: [] for n in engines}
    for eng in engines.values():
        asyncio.run(eng.generate(GenerationRequest("w", "def main():", 8, want_margins=False)))
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    for p in prompts:
        for name, eng in engines.items():
            text = render_prompt(p, eng.tokenizer)
            res = asyncio.run(eng.generate(
                GenerationRequest(p.id, text, args.tokens, want_margins=False)
            ))
            assert res.ok, res.error
            per[name].append(res.e2e_s or 0.0)
            tokens[name].append(len(res.output_ids))
            verify[name].append(res.spec_verify_ct or 0)
            outputs[name].append(res.output_ids)
    base_ms = sum(per["baseline"]) / sum(tokens["baseline"]) * 1000
    import torch

    print(f"{len(prompts)} prompts x {args.tokens} tokens, k={args.k}, "
          f"{torch.get_num_threads()} threads, "
          f"{time.perf_counter() - t0:.0f}s total, load average {load0[0]:.2f} -> "
          f"{os.getloadavg()[0]:.2f}; drafting: "
          + ", ".join(f"{n} {e.fingerprint()['draft_loop']}" for n, e in engines.items()
                      if n != "baseline"))
    print(f"{'condition':<20}{'ms/token':>10}{'speedup':>10}{'accept(pooled)':>16}"
          f"{'accept(mean)':>14}{'identical':>11}")
    for name in engines:
        ms = sum(per[name]) / sum(tokens[name]) * 1000
        pooled = sum(tokens[name]) / max(1, sum(verify[name]))
        mean = statistics.mean(t / v for t, v in zip(tokens[name], verify[name], strict=True) if v)
        same = sum(a == b for a, b in zip(outputs[name], outputs["baseline"], strict=True))
        print(f"{name:<20}{ms:>10.2f}{base_ms / ms:>9.2f}x{pooled:>16.2f}{mean:>14.2f}"
              f"{same:>8}/{len(prompts)}")
    groups: dict[str, list[int]] = {f"{p.slice}/{p.domain}": [] for p in prompts}
    for i, p in enumerate(prompts):
        groups[f"{p.slice}/{p.domain}"].append(i)
    for sl in sorted({p.slice for p in prompts}):
        groups[f"{sl} (all)"] = [i for i, p in enumerate(prompts) if p.slice == sl]
    groups["pooled"] = list(range(len(prompts)))
    drafted = [n for n in engines if n != "baseline"]
    print(f"\n{'domain':<24}{'n':>4}" + "".join(f"{n + ' accept':>26}{'speedup':>9}"
                                                  for n in drafted))
    for group, idx in groups.items():
        row = f"{group:<24}{len(idx):>4}"
        base = sum(per["baseline"][i] for i in idx)
        for n in drafted:
            acc = sum(tokens[n][i] for i in idx) / max(1, sum(verify[n][i] for i in idx))
            row += f"{acc:>26.2f}{base / sum(per[n][i] for i in idx):>8.2f}x"
        print(row)


if __name__ == "__main__":
    main()
