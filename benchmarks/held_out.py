"""The held-out check at scale, and the bias of a first-N sample.

1. Writes an adaptation set of ``--lines`` chat lines (JSONL, about 80 words each, over the
   shipped trace's own vocabulary, so that partial matches are common) into a temporary
   folder, with three of the shipped trace's prompts planted in it, then times the check of
   ``prompts/pilot.jsonl`` against it: wall time, lines per second, peak RSS (the process's
   high-water mark, generation included) and the load average, and whether the planted
   prompts were found.
2. Writes a one-line JSON array of ShareGPT conversations and, in a fresh process each,
   runs the held-out check (``--array-mib``, 57) and ``trace build`` (``--build-array-mib``,
   8: the build keeps every record) on it: wall time and peak RSS.
3. Simulates a source whose order correlates with difficulty (difficulty rising along the
   file, as in evaluation sets sorted easy to hard), and prints the mean difficulty of its
   first N, of the builder's sample (mean and spread over seeds) and the truth.

    python benchmarks/held_out.py [--lines 1000000] [--array-mib 57]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.pilot.trace import load_trace  # noqa: E402
from pytest_osprey.preflight.held_out import prompt_text, scan, words  # noqa: E402
from pytest_osprey.trace_build.sampling import stratified_sample  # noqa: E402

PLANTED = ("code-02", "finance-05", "legal-01")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_set(path: Path, lines: int, vocab: list[str], planted: dict[int, str]) -> None:
    rng = random.Random(0)
    sentences = [" ".join(rng.choices(vocab, k=rng.randint(12, 20))) + "." for _ in range(20_000)]
    with path.open("w", encoding="utf-8") as fh:
        for i in range(lines):
            user = planted.get(i) or " ".join(rng.choices(sentences, k=2))
            reply = " ".join(rng.choices(sentences, k=3))
            fh.write(json.dumps({"messages": [{"role": "user", "content": user},
                                              {"role": "assistant", "content": reply}]}) + "\n")


def held_out(lines: int) -> None:
    trace = load_trace([ROOT / "prompts" / "pilot.jsonl"])
    texts = {p.id: prompt_text(p) for p in trace.prompts}
    vocab = sorted({w for t in texts.values() for w in words(t)})
    step = lines // (len(PLANTED) + 1)
    planted = {step * (k + 1): texts[pid] for k, pid in enumerate(PLANTED)}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "adaptation.jsonl"
        start = time.perf_counter()
        write_set(data, lines, vocab, planted)
        made = time.perf_counter() - start
        size = data.stat().st_size / 2**20
        before = peak_rss_mib()
        start = time.perf_counter()
        found = scan(texts.items(), data)
        took = time.perf_counter() - start
    hits = sorted(m.id for m in found.overlapping(0.5))
    load = os.getloadavg()
    print(f"held-out check: {found.lines:,} lines ({size:,.0f} MiB, written in {made:.0f} s) "
          f"against {len(texts)} prompts in {took:.1f} s ({found.lines / took:,.0f} lines/s); "
          f"peak RSS {peak_rss_mib():.0f} MiB ({before:.0f} MiB before the check); "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"  planted {', '.join(PLANTED)}; found {', '.join(hits) or 'none'}")


_CHILD = """
import resource, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
start = time.perf_counter()
if {what!r} == "scan":
    from pytest_osprey.preflight.held_out import scan
    found = scan([("q", "Question 123456 about sails and ropes and knots here please")],
                 Path({path!r}))
    best = found.best.get("q")
    result = f"{{found.lines:,}} records, best containment {{best and best.containment}}"
else:
    from pytest_osprey.__main__ import main
    result = "exit " + str(main(["trace", "build", {path!r}, "--out", {out!r}]))
took = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{{result}}: {{took:.1f}} s, peak RSS {{rss:.0f}} MiB")
"""


def one_line_array(mib: int, what: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "share.json"
        rng = random.Random(3)
        words = ["sails", "ropes", "knots", "tides", "reefs", "gulls", "masts", "decks"]
        with path.open("w", encoding="utf-8") as fh:
            fh.write("[")
            i = 0
            while fh.tell() < mib * 2**20:
                text = f"Question {i} about " + " ".join(rng.choices(words, k=12))
                fh.write(("," if i else "") + json.dumps({"conversations": [
                    {"from": "human", "value": text}, {"from": "gpt", "value": "An answer."}]}))
                i += 1
            fh.write("]")
        size = path.stat().st_size / 2**20
        if True:
            code = _CHILD.format(root=str(ROOT), what=what, path=str(path),
                                 out=str(Path(tmp) / "t.jsonl"))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=False)
            load = os.getloadavg()
            last = (out.stdout.strip().splitlines() or [out.stderr.strip()])[-1]
            print(f"one-line JSON array, {size:.0f} MiB, {i:,} elements: "
                  f"{'held-out check' if what == 'scan' else 'trace build'}: {last}; "
                  f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def bias(n: int = 5000, size: int = 50, seeds: int = 200) -> None:
    rng = random.Random(1)
    # Difficulty rises along the file (easy first), with noise; two domains interleaved.
    difficulty = [min(1.0, max(0.0, i / n + rng.gauss(0, 0.1))) for i in range(n)]
    truth = sum(difficulty) / n
    first = sum(difficulty[:size]) / size
    strata = {("core", "a"): list(range(0, n, 2)), ("core", "b"): list(range(1, n, 2))}
    means = []
    for seed in range(seeds):
        drawn = stratified_sample(strata, size, seed)
        picked = [i for members in drawn.values() for i in members]
        means.append(sum(difficulty[i] for i in picked) / len(picked))
    mean = sum(means) / seeds
    spread = (sum((m - mean) ** 2 for m in means) / (seeds - 1)) ** 0.5
    print(f"sampling bias ({n} prompts, difficulty rising with position, {size} taken): "
          f"truth {truth:.3f}, first {size} {first:.3f}, builder's sample {mean:.3f} "
          f"(sd {spread:.3f} over {seeds} seeds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--array-mib", type=int, default=57, help="for the held-out check")
    parser.add_argument("--build-array-mib", type=int, default=8, help="for trace build")
    args = parser.parse_args()
    bias()
    one_line_array(args.array_mib, "scan")
    one_line_array(args.build_array_mib, "build")
    held_out(args.lines)


if __name__ == "__main__":
    main()
