"""vLLM's own benchmark client (``vllm bench serve``'s request function) on a closed loop.

Run with the Python of an environment where vLLM is installed; it imports nothing from this
project. For each level ``CONCURRENCY:REQUESTS`` it sends ``CONCURRENCY`` warm-up requests
(not recorded: they open the connections), then ``REQUESTS`` requests from ``CONCURRENCY``
workers (worker i starts ``i * RAMP_S / CONCURRENCY`` late, in both phases), through
``async_request_openai_completions`` and an aiohttp session built the way ``vllm bench
serve`` builds it, on a plain asyncio loop as there. CPU time (``time.process_time``) covers
the recorded load only.

    python benchmarks/vllm_client_driver.py --url http://127.0.0.1:PORT \
        --levels 1:64,64:512 --tokens 30 [--ramp-s 0.32] --out vllm.json

Output JSON: ``{"vllm_version", "levels": [{"concurrency", "requests", "cpu_s", "wall_s",
"results": [{"success", "error", "ttft", "itl", "generated_text", "output_tokens",
"start_time"}]}]}``; ``ttft``/``itl`` are vLLM's (seconds; one ``itl`` entry per chunk after
the first, whatever the chunk's token count), ``start_time`` is its perf_counter at submission.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import aiohttp
import vllm
from vllm.benchmarks.lib.endpoint_request_func import (
    RequestFuncInput,
    RequestFuncOutput,
    async_request_openai_completions,
)

PROMPT = "Tell me a story about a fast fish."


async def closed_loop(
    session: aiohttp.ClientSession, make: Any, count: int, concurrency: int, ramp_s: float
) -> list[RequestFuncOutput]:
    out: list[RequestFuncOutput] = []
    left = count

    async def worker(i: int) -> None:
        nonlocal left
        await asyncio.sleep(i * ramp_s / concurrency)
        while left > 0:
            left -= 1
            out.append(await async_request_openai_completions(make(), session))

    await asyncio.gather(*(worker(i) for i in range(min(concurrency, count))))
    return out


async def level(
    url: str, concurrency: int, requests: int, tokens: int, ramp_s: float
) -> dict[str, Any]:
    # As vllm.benchmarks.serve builds its session (connection limit = max concurrency).
    connector = aiohttp.TCPConnector(
        limit=concurrency,
        limit_per_host=concurrency,
        ttl_dns_cache=300,
        use_dns_cache=True,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
        ssl=False,
    )
    async with aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)
    ) as session:

        def make() -> RequestFuncInput:
            return RequestFuncInput(
                prompt=PROMPT,
                api_url=f"{url}/v1/completions",
                prompt_len=len(PROMPT.split()),
                output_len=tokens,
                model="stub",
                ignore_eos=True,
            )

        await closed_loop(session, make, concurrency, concurrency, ramp_s)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        outputs = await closed_loop(session, make, requests, concurrency, ramp_s)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "concurrency": concurrency,
        "requests": requests,
        "cpu_s": cpu,
        "wall_s": wall,
        "results": [
            {
                "success": o.success,
                "error": o.error,
                "ttft": o.ttft,
                "itl": o.itl,
                "generated_text": o.generated_text,
                "output_tokens": o.output_tokens,
                "start_time": o.start_time,
            }
            for o in outputs
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--levels", default="1:64,64:512,256:1024")
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--ramp-s", type=float, default=0.0, help="spread of the workers' start")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    levels = []
    for spec in args.levels.split(","):
        conc, _, count = spec.partition(":")
        url = args.url.rstrip("/")
        levels.append(asyncio.run(level(url, int(conc), int(count), args.tokens, args.ramp_s)))
    with open(args.out, "w") as f:
        json.dump({"vllm_version": vllm.__version__, "levels": levels}, f)


if __name__ == "__main__":
    main()
