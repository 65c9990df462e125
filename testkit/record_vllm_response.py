"""Record raw per-request vLLM responses with their ``speculative_decoding`` stats.

Boots a real vLLM server through :class:`VLLMEngine` (the tiny target with the tiny drafter,
K = 4, ``--per-request-spec-decode-metrics summary`` as the engine passes it), then sends two
greedy /v1/completions requests and writes their bodies as the server sent them, byte for
byte: one not streamed, one streamed with the client's own request body (usage chunk
included). The /metrics page before and after goes beside them.

    OSPREY_VLLM_PYTHON=/path/to/python python -m testkit.record_vllm_response OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import httpx

from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.vllm.engine import VLLMEngine
from testkit.factories import make_pilot

MODELS = Path(os.environ.get("OSPREY_TINY_MODELS", Path(__file__).parents[1] / "fixtures" /
                             "models"))
PROMPTS = ("def fibonacci(n):\n    ", "class Stack:\n    def __init__(self):\n        ")
MAX_TOKENS = 24


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    python = os.environ.get("OSPREY_VLLM_PYTHON")
    if not python:
        print("error: set OSPREY_VLLM_PYTHON to a Python with vLLM installed", file=sys.stderr)
        return 4
    pilot = make_pilot(
        {"baseline": {"role": "baseline"},
         "cand": {"role": "candidate", "drafter": str(MODELS / "tiny-drafter"),
                  "speculation": {"num_draft_tokens": 4}}},
        target={"engine": "vllm", "model": str(MODELS / "tiny-target"), "python": python,
                "dtype": "float32", "context_length": 1024, "mem_fraction": 0.2,
                "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "boot_timeout_s": 600})
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    engine = VLLMEngine(pilot, "cand", BootSpec("cand", log_dir=out / "logs"))
    try:
        engine.start()
        assert engine.client is not None and engine.server is not None
        base = engine.client.pool.base_url
        with httpx.Client(base_url=base, timeout=300) as http:
            (out / "metrics_before.txt").write_text(http.get("/metrics").text)
            plain = engine.client.body(GenerationRequest("p0", PROMPTS[0], MAX_TOKENS,
                                                         want_margins=False))
            plain["stream"] = False
            del plain["stream_options"]
            (out / "request_plain.json").write_text(json.dumps(plain, indent=1) + "\n")
            r = http.post("/v1/completions", json=plain)
            (out / "response_plain.json").write_bytes(r.content)
            streamed = engine.client.body(GenerationRequest("p1", PROMPTS[1], MAX_TOKENS,
                                                            want_margins=False))
            (out / "request_streamed.json").write_text(json.dumps(streamed, indent=1) + "\n")
            with http.stream("POST", "/v1/completions", json=streamed) as s:
                (out / "response_streamed.txt").write_bytes(b"".join(s.iter_bytes()))
            (out / "metrics_after.txt").write_text(http.get("/metrics").text)
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
