"""How often the greedy-identity gate fails lossy and harmless candidates (simulated campaigns).

Campaigns of the shipped pilot's shape (21 prompts, 2 load levels, 2 blocks) are simulated
with testkit/sim_greedy.py: the baseline's greedy path with its top-1/top-2 margins, the
baseline's own second block (the identical-condition control) with the engine's numerics,
and a candidate that is either

* **harmless**: numerics exactly as variable as the baseline's own (sigma 0.01 nats, half of
  the variance shared by a whole request) - it should pass;
* **relaxed acceptance (tau 0.05)**: a verify rule that accepts the drafter's runner-up
  whenever it is within 0.05 nats of the top-1 - every flip it causes is a near-tie, only too
  many; it should fail;
* **bf16-like verify**: numerics five times the baseline's (sigma 0.05), as a candidate that
  verifies at lower precision than the baseline runs: a precision change, reported too.

Margins come from a chat-like model (P(m <= 0.05) about 1.6 %) and, with ``--model``, from the
target's own greedy paths on the pilot's prompts (resampled).

    python benchmarks/near_tie_power.py --campaigns 200 [--model fixtures/models/tiny-target]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.judgement.quality.identity import greedy_identity  # noqa: E402
from testkit.sim_greedy import HARMLESS, MarginModel, Run, campaign, chat_like, empirical  # noqa: E402

CANDIDATES = {"harmless": HARMLESS, "relaxed tau 0.05": Run(sigma=0.01, tau=0.05),
              "bf16-like verify": Run(sigma=0.05)}


def target_margins(model_dir: Path, pilot: Path, tokens: int) -> np.ndarray:
    """Top-1 minus top-2 logprob along the target's greedy paths on the pilot's prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pytest_osprey.pilot.trace import render_prompt
    from testkit.pilot_prompts import pilot_prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for _, prompt in pilot_prompts(pilot, 1000):
        ids = tok(render_prompt(prompt, tok), return_tensors="pt").input_ids  # type: ignore[arg-type]
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=tokens, return_dict_in_generate=True,
                                 output_logits=True, pad_token_id=tok.pad_token_id)
        top = torch.log_softmax(torch.stack(gen.logits)[:, 0].float(), -1).topk(2, -1).values
        out += (top[:, 0] - top[:, 1]).tolist()
    return np.array(out)


def fail_rate(margins: MarginModel, cand: Run, tokens: int, campaigns: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(campaigns):
        recs = campaign(rng, margins, cand, tokens=tokens)
        res = greedy_identity([r for r in recs if r.condition == "base"],
                              [r for r in recs if r.condition == "cand"], 0.05)
        fails += res.test.outcome == "fail" or bool(res.genuine)
    ci = stats.binomtest(fails, campaigns).proportion_ci(0.95, method="exact")
    return f"{fails / campaigns:.3f} [{ci.low:.2f}, {ci.high:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaigns", type=int, default=200)
    parser.add_argument("--tokens", default="48,256")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--pilot", type=Path, default=ROOT / "pilot.yaml")
    args = parser.parse_args()
    token_counts = [int(t) for t in args.tokens.split(",")]
    models: dict[str, MarginModel] = {"chat-like": chat_like}
    if args.model is not None:
        values = target_margins(args.model, args.pilot, max(token_counts))
        models[f"{args.model.name} (P(m<=0.05) = {np.mean(values <= 0.05):.3f})"] = (
            empirical(values))
    print(f"failure rate of the greedy-identity gate over {args.campaigns} simulated campaigns "
          "(95% CI); 21 prompts x 2 levels x 2 blocks\n")
    print("| margins | tokens | " + " | ".join(CANDIDATES) + " |")
    print("|---|---|" + "---|" * len(CANDIDATES))
    t0 = time.perf_counter()
    for name, margins in models.items():
        for tokens in token_counts:
            cells = [fail_rate(margins, cand, tokens, args.campaigns, seed=k)
                     for k, cand in enumerate(CANDIDATES.values())]
            print(f"| {name} | {tokens} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
