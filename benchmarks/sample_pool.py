"""A pool of real sampled continuations from a target model, for the distribution benchmarks.

The tiny target samples whole continuations of the pilot's own sampled prompts (rendered as
the engines render them, top-k off, as the engines sample) at each temperature, once; the
benchmarks then draw many pilots from the pool. Drawing without replacement from a pool is
drawing from its empirical distribution, so a self-vs-self pilot is an exact null and a
0.8-vs-1.0 pilot is the real temperature change (up to the pool's size).

    python benchmarks/sample_pool.py --out /tmp/pool.npz [--model fixtures/models/tiny-target]

Cost on 2 shared CPU cores: about 10 minutes for 8 prompts x 256 samples x 32 tokens x 2
temperatures (a GPU: seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.pilot.trace import render_prompt  # noqa: E402
from testkit.pilot_prompts import pilot_prompts  # noqa: E402

PAD = -2  # after the end of a sequence (EOS itself is kept)


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=ROOT / "fixtures/models/tiny-target")
    parser.add_argument("--pilot", type=Path, default=ROOT / "pilot.yaml")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--temperatures", default="0.8,1.0")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    eos = int(tok.eos_token_id)
    temps = [float(t) for t in args.temperatures.split(",")]
    prompts = pilot_prompts(args.pilot, args.prompts)
    pool = np.full((len(temps), len(prompts), args.samples, args.tokens), PAD, dtype=np.int32)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    for ti, temp in enumerate(temps):
        for pi, (pid, prompt) in enumerate(prompts):
            ids = tok(render_prompt(prompt, tok), return_tensors="pt").input_ids  # type: ignore[arg-type]
            done = 0
            while done < args.samples:
                b = min(args.batch, args.samples - done)
                with torch.inference_mode():
                    seqs = model.generate(
                        ids.repeat(b, 1), attention_mask=torch.ones_like(ids).repeat(b, 1),
                        do_sample=True, temperature=temp, top_p=1.0, top_k=0,
                        max_new_tokens=args.tokens, pad_token_id=tok.pad_token_id,
                    )
                for r, row in enumerate(seqs[:, ids.shape[1]:].tolist()):
                    row = row[: row.index(eos) + 1] if eos in row else row
                    pool[ti, pi, done + r, : len(row)] = row
                done += b
            print(f"[{time.perf_counter() - t0:6.0f}s] T={temp} {pid}: {done} samples",
                  flush=True)
    meta = {"model": str(args.model), "prompts": [p for p, _ in prompts], "temperatures": temps,
            "tokens": args.tokens, "eos": eos, "seed": args.seed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, pool=pool, meta=json.dumps(meta))
    print(f"wrote {args.out} in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
