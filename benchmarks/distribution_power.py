"""Power and false-alarm rate of the sampled-distribution check on real sampled trajectories.

The tests (tests/test_distribution.py) simulate draws at fixed prefixes from the tiny target's
exact distributions. Here the tiny target really samples whole continuations (batched
``generate``, top-k off, as the engines sample), so each position's token follows a sampled
prefix, as in a campaign. Per realization: 16 prompts x 32 samples x 8 positions per side
(the default budget), independent seeds per side.

    python benchmarks/distribution_power.py --realizations 40

Slow on CPU: about 100 s per realization and case on 2 cores (a GPU makes it practical).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.judgement.distribution import (  # noqa: E402
    DEFAULT_POSITIONS,
    DEFAULT_PROMPTS,
    DEFAULT_SAMPLES,
    distribution_check,
)
from pytest_osprey.pilot.trace import render_prompt  # noqa: E402
from pytest_osprey.pilot.trace_file import load_trace  # noqa: E402

Samples = dict[str, list[list[int]]]


def draw(model: torch.nn.Module, tok: object, prompts: list[tuple[str, torch.Tensor]],
         temperature: float, top_p: float, seed: int) -> Samples:
    out: Samples = {}
    torch.manual_seed(seed)
    for pid, ids in prompts:
        with torch.inference_mode():
            seqs = model.generate(  # type: ignore[operator]
                ids.repeat(DEFAULT_SAMPLES, 1), attention_mask=torch.ones_like(ids).repeat(
                    DEFAULT_SAMPLES, 1), do_sample=True, temperature=temperature, top_p=top_p,
                top_k=0, max_new_tokens=DEFAULT_POSITIONS, pad_token_id=tok.pad_token_id,  # type: ignore[attr-defined]
            )
        eos = tok.eos_token_id  # type: ignore[attr-defined]
        rows = []
        for row in seqs[:, ids.shape[1]:].tolist():
            rows.append(row[: row.index(eos) + 1] if eos in row else row)
        out[pid] = rows
    return out


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realizations", type=int, default=40)
    parser.add_argument("--alpha", type=float, default=0.01)
    args = parser.parse_args()
    torch.set_num_threads(2)
    path = ROOT / "fixtures/models/tiny-target"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    trace = load_trace([ROOT / "prompts/pilot.jsonl"]).prompts[:DEFAULT_PROMPTS]
    prompts = [(p.id, tok(render_prompt(p, tok), return_tensors="pt").input_ids) for p in trace]
    cases = {"null (0.8 vs 0.8)": (0.8, 1.0), "temperature 1.0 vs 0.8": (1.0, 1.0),
             "top_p 0.9 vs 1.0 (at T 0.8)": (0.8, 0.9)}
    t0 = time.perf_counter()
    print(f"| case | realizations | rejected at alpha {args.alpha} | rate |\n|---|---|---|---|")
    for name, (temp, top_p) in cases.items():
        hits = 0
        for r in range(args.realizations):
            ref = draw(model, tok, prompts, 0.8, 1.0, seed=2 * r)
            cand = draw(model, tok, prompts, temp, top_p, seed=2 * r + 1)
            res = distribution_check(ref, cand, alpha=args.alpha, seed=r)
            hits += res.outcome == "fail"
        print(f"| {name} | {args.realizations} | {hits} | {hits / args.realizations:.2f} |",
              flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
