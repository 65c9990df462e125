"""Timing fidelity of the streaming clients against a server whose truth is known.

Starts the timing stub (``testkit/timed_stream.py``) in its own process (so the client's CPU
is measured alone), then at each concurrency runs a closed loop (a warm-up of CONCURRENCY
requests, then REQUESTS requests from CONCURRENCY workers whose first requests are spread over
one scripted request duration) through:

- ``osprey-sglang``: ``SGLangClient.generate`` (native /generate, incremental SSE as the
  engine boots SGLang);
- ``osprey-openai``: ``OpenAIClient.generate`` (/v1/completions, the vLLM engine's path);
- ``vllm-bench``: vLLM's own benchmark request function, in ``vllm_client_driver.py`` under
  ``--vllm-python`` (skipped without it).

Each client's TTFT is compared with the stub's log: "vs stub" is the first chunk's write
minus the request's receipt, "vs script" the scheduled TTFT. ITL is compared per chunk (one
decoding step), where both clients are comparable: vLLM's client keeps one entry per chunk;
ours splits a chunk's gap evenly over its tokens (one entry per token after the first, the
first chunk's extra tokens at 0), so its entries are summed back per chunk with the stub's
chunk sizes (exact, as the split is even). Our clients run as the campaign runs them: the
garbage collector frozen and off during the recorded load. CPU is ``time.process_time`` over
the recorded load,
per content chunk received. Errors count failed requests, outputs that match no request, and
wrong token counts, ids or text. The JSON also has, on the one clock all processes share, the
request path (submission to the stub's receipt) and each chunk's lag (client stamp minus the
stub's write): TTFT error vs stub = request path + first chunk's lag.

    python benchmarks/fidelity.py --out fidelity.json \
        [--vllm-python /path/to/venv/bin/python] [--levels 1:64,64:1024,256:2048]

About 2 minutes on 2 cores. The stub, the client and anything else running share the CPUs:
read the load average printed at the end with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testkit

from pytest_osprey.engines.base import GenerationRequest, GenerationResult
from pytest_osprey.engines.sglang.engine import SGLangClient
from pytest_osprey.engines.vllm.engine import OpenAIClient
from testkit.stream_fidelity import (
    ClientRun,
    Outcome,
    Stub,
    analyse,
    merged,
    read_vllm_output,
    table,
    verdicts,
)
from testkit.timed_stream import schedule_args, schedule_from

HERE = Path(__file__).resolve().parent
PROMPT = "Tell me a story about a fast fish."  # as vllm_client_driver.py


class _Client(Protocol):
    async def generate(self, req: GenerationRequest) -> GenerationResult: ...


# --------------------------------------------------------------------------- loads


async def _closed_loop(
    client: _Client, req: GenerationRequest, count: int, concurrency: int, ramp_s: float
) -> list[Outcome]:
    out: list[Outcome] = []
    left = count

    async def worker(i: int) -> None:
        nonlocal left
        await asyncio.sleep(i * ramp_s / concurrency)
        while left > 0:
            left -= 1
            t_start = time.perf_counter()  # TokenClock starts microseconds later
            r = await client.generate(req)
            out.append(
                Outcome(
                    ok=r.ok,
                    error=r.error or "",
                    ttft_s=r.ttft_s,
                    itl_s=list(r.itl_s),
                    text=r.output_text,
                    tokens=len(r.output_ids),
                    ids=list(r.output_ids),
                    t_start=t_start,
                )
            )

    await asyncio.gather(*(worker(i) for i in range(min(concurrency, count))))
    return out


def run_osprey(
    name: str, url: str, concurrency: int, requests: int, tokens: int, ramp_s: float
) -> ClientRun:
    """One level through our client, on a fresh loop (hence fresh connections)."""
    client: SGLangClient | OpenAIClient
    if name == "osprey-sglang":
        client, api = SGLangClient(url, "fidelity"), "sglang"
    else:
        client, api = OpenAIClient(url, "fidelity", "stub"), "openai"
    # No logprobs: the same payload as vLLM's client asks for.
    req = GenerationRequest("fidelity", PROMPT, tokens, want_margins=False, timeout_s=300.0)

    async def go() -> tuple[list[Outcome], float, float]:
        await _closed_loop(client, req, concurrency, concurrency, ramp_s)
        # As the campaign replays a pass: what exists frozen, the collector off.
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            outcomes = await _closed_loop(client, req, requests, concurrency, ramp_s)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        finally:
            gc.unfreeze()
            gc.enable()
        await client.pool.aclose()
        return outcomes, cpu, wall

    outcomes, cpu, wall = asyncio.run(go())
    return ClientRun(name, api, concurrency, True, cpu, wall, outcomes)


def run_vllm(
    python: str, url: str, levels: Sequence[tuple[int, int]], tokens: int, ramp_s: float
) -> tuple[list[ClientRun], str | None]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "vllm.json"
        spec = ",".join(f"{c}:{n}" for c, n in levels)
        subprocess.run(
            [python, str(HERE / "vllm_client_driver.py"), "--url", url, "--levels", spec,
             "--tokens", str(tokens), "--ramp-s", repr(ramp_s), "--out", str(out)],
            check=True,
        )  # fmt: skip
        return read_vllm_output(out)


# --------------------------------------------------------------------------- main


def parse_levels(spec: str) -> list[tuple[int, int]]:
    out = []
    for part in spec.split(","):
        conc, _, count = part.partition(":")
        out.append((int(conc), int(count)))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    ap.add_argument("--levels", default="1:64,64:1024,256:2048", help="CONCURRENCY:REQUESTS,...")
    ap.add_argument("--tokens", type=int, default=30, help="tokens per request")
    ap.add_argument("--vllm-python", help="a Python with vLLM installed (else vLLM is skipped)")
    ap.add_argument(
        "--clients", default="osprey-sglang,osprey-openai,vllm-bench", help="which to run"
    )
    ap.add_argument(
        "--no-ramp", dest="ramp", action="store_false", help="start all workers at once"
    )
    ap.add_argument("--rounds", type=int, default=1,
                    help="each level this many times, the clients taking turns")
    schedule_args(ap)
    args = ap.parse_args(argv)
    schedule = schedule_from(args)
    levels = parse_levels(args.levels)
    clients = args.clients.split(",")
    # Workers start spread over one request's duration: started together, their requests
    # reach the stub in one burst, and its receipt stamps lag by its own queueing, an error
    # no client made.
    ramp_s = schedule.duration(args.tokens) if args.ramp else 0.0
    stub = Stub(schedule)
    runs: list[ClientRun] = []
    version = None
    started = time.perf_counter()
    loads: dict[int, list[float]] = {}
    try:
        # Level by level, the clients in turn (rounds times): the machine's load drifts, and
        # each client of a level meets about the same.
        for c, n in levels:
            loads[c] = [round(os.getloadavg()[0], 2)]
            for _ in range(args.rounds):
                for name in ("osprey-sglang", "osprey-openai"):
                    if name in clients:
                        runs.append(run_osprey(name, stub.url, c, n, args.tokens, ramp_s))
                if "vllm-bench" in clients and args.vllm_python:
                    vllm_runs, version = run_vllm(args.vllm_python, stub.url, [(c, n)],
                                                  args.tokens, ramp_s)
                    runs += vllm_runs
            loads[c].append(round(os.getloadavg()[0], 2))
        log = stub.log()
    finally:
        stub.close()
    rows = [analyse(r, log) for r in merged(runs)]
    rows.sort(key=lambda r: (r["concurrency"], r["client"]))
    report: dict[str, Any] = {
        "schedule": {
            "ttft_ms": schedule.ttft_s * 1e3,
            "gap_ms": schedule.gap_s * 1e3,
            "chunks": list(schedule.chunks),
            "jitter": schedule.jitter,
            "seed": schedule.seed,
            "tokens": args.tokens,
            "ramp_s": ramp_s,
        },
        "vllm_version": version,
        "load_average": os.getloadavg(),
        "load_average_per_level": {str(c): v for c, v in loads.items()},  # at start, at end
        "cpus": os.cpu_count(),
        "elapsed_s": time.perf_counter() - started,
        "rows": rows,
        "verdicts": verdicts(rows),
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(table(rows))
    print()
    for line in report["verdicts"]:
        print(line)
    per_level = ", ".join(f"c={c}: {a:.2f} -> {b:.2f}" for c, (a, b) in loads.items())
    print(
        f"\nvLLM {version or '(not run)'}; load average {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} CPUs (per level, 1-minute: {per_level}); {report['elapsed_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
