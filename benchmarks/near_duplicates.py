"""Near-duplicate collapse: recall per Jaccard level, and time on templated traffic.

1. Recall: ``--pairs`` planted pairs per level, each two texts of n distinct words with k
   of them replaced (Jaccard (n - k) / (n + k) exactly: 100-word texts, and the levels
   0.95, 0.86, 0.82 and 0.78 exactly), among unrelated texts; prints per level the share of
   pairs collapsed at the default threshold (0.8), and that every collapsed pair holds it.
2. Templated traffic: ``--templated`` prompts sharing a 21-word instruction (as RAG and
   support logs look) with 12 to 20 words of their own, 1% of them planted near-duplicates;
   times ``near_duplicates`` on them, counting exact comparisons, then ``trace build`` on the
   same prompts as a JSONL source (wall time, peak RSS and the load average).

    python benchmarks/near_duplicates.py [--pairs 1000] [--templated 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.__main__ import main as cli  # noqa: E402
from pytest_osprey.trace_build import dedupe  # noqa: E402

#: (words in a text, words replaced): J 0.95 ... 0.695; (78, 2), (93, 7), (91, 9) and (89, 11)
#: give 0.95, 0.86, 0.82 and 0.78 exactly.
LEVELS = ((78, 2), (100, 3), (100, 5), (93, 7), (100, 8), (91, 9), (100, 10), (100, 11),
          (89, 11), (100, 12), (100, 14), (100, 18))
TEMPLATE = ("You are a support assistant for our company and you answer the customer's "
            "question below politely briefly and only from the documents provided")


def load() -> str:
    a, b, c = os.getloadavg()
    return f"load average {a:.2f} {b:.2f} {c:.2f} on {os.cpu_count()} CPUs"


def recall(pairs: int) -> None:
    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(200_000)]
    print(f"recall at threshold 0.8 ({pairs} planted pairs per level):")
    for n, k in LEVELS:
        texts: list[str] = []
        for _ in range(pairs):
            words = rng.sample(vocab, n + k)
            a, b = words[:n], words[:n - k] + words[n:]
            rng.shuffle(b)
            texts += [" ".join(a), " ".join(b)]
        start = time.perf_counter()
        found = dedupe.near_duplicates(texts, 0.8)
        took = time.perf_counter() - start
        caught = sum(1 for j in range(1, len(texts), 2) if found.get(j) == j - 1)
        sets = [set(t.split()) for t in texts]
        low = min((dedupe.jaccard(sets[j], sets[i]) for j, i in found.items()), default=1.0)
        jac = (n - k) / (n + k)
        print(f"  J {jac:.3f} ({n} words, {k} replaced): {caught}/{pairs} collapsed "
              f"({caught / pairs:.2%}), other collapses {len(found) - caught}, "
              f"lowest J collapsed {low:.3f} ({took:.1f} s)")
    print(f"  ({load()})")


def templated(n: int) -> None:
    rng = random.Random(2)
    vocab = [f"term{i}" for i in range(50_000)]
    texts = [TEMPLATE + " " + " ".join(rng.sample(vocab, rng.randint(12, 20)))
             for _ in range(n)]
    planted = {}
    for k in range(0, n, 100):
        words = texts[k].split()
        words[-1] = "changed"
        texts.append(" ".join(words))
        planted[len(texts) - 1] = k
    calls = [0]
    exact = dedupe.jaccard

    def counted(a: set[str], b: set[str]) -> float:
        calls[0] += 1
        return exact(a, b)

    dedupe.jaccard = counted  # type: ignore[assignment]
    start, cpu = time.perf_counter(), time.process_time()
    found = dedupe.near_duplicates(texts, 0.8)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    dedupe.jaccard = exact  # type: ignore[assignment]
    hit = sum(1 for j, k in planted.items() if found.get(j) == k)
    print(f"templated traffic: {len(texts):,} prompts sharing a 21-word instruction: "
          f"near_duplicates in {took:.1f} s wall ({cpu:.1f} s CPU), {calls[0]:,} exact "
          f"comparisons "
          f"({calls[0] / len(texts):.2f} a prompt), planted {hit}/{len(planted)} collapsed, "
          f"{len(found) - hit} other collapses; {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "logs.jsonl"
        src.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts),
                       encoding="utf-8")
        start, cpu = time.perf_counter(), time.process_time()
        code = cli(["trace", "build", str(src), "--out", str(Path(tmp) / "t.jsonl")])
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"trace build on them: exit {code} in {took:.1f} s wall ({cpu:.1f} s CPU), peak RSS "
          f"{rss:.0f} MiB; "
          f"{load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--templated", type=int, default=20_000)
    args = parser.parse_args()
    if args.pairs:
        recall(args.pairs)
    templated(args.templated)


if __name__ == "__main__":
    main()
