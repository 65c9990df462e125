"""Real SGLang 0.5.23 on CPU for integration tests: pilots, boots, and raw HTTP.

Needs ``OSPREY_SGLANG_PYTHON``: the python of an environment built by
``python -m pytest_osprey.engines.sglang.cpu.build_env VENV``. Models come from
``OSPREY_TINY_MODELS`` (default ``fixtures/models``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from pytest_osprey.engines.base import BootSpec
from pytest_osprey.engines.sglang.engine import SGLangEngine
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import make_pilot

ROOT = Path(__file__).resolve().parents[1]
PYTHON = os.environ.get("OSPREY_SGLANG_PYTHON")
# The tests that boot real SGLang servers run where an environment is built (CI builds one).
NEEDS_SGLANG = pytest.mark.skipif(
    not PYTHON,
    reason="set OSPREY_SGLANG_PYTHON to the python of an environment built by "
    "python -m pytest_osprey.engines.sglang.cpu.build_env VENV",
)
MODELS = Path(os.environ.get("OSPREY_TINY_MODELS") or ROOT / "fixtures" / "models")
EAGLE3 = Path(os.environ.get("OSPREY_TINY_EAGLE3") or MODELS / "tiny-eagle3")

# CPU mode is opt-in; torch_native serves plain decoding. A small KV pool keeps each server's
# memory (and its boot, which fills the pool) small on a shared 2-core machine.
CPU_ARGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--skip-server-warmup",
    "--max-total-tokens", "8192",
]  # fmt: skip
# Draft and verify need the CPU kernel backend; the plain --attention-backend intel_amx is
# rewritten to torch_native on CPUs without AMX, so both phases are named.
SPEC_ARGS = ["--prefill-attention-backend", "intel_amx", "--decode-attention-backend", "intel_amx"]

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "The quick brown fox",
]
MAX_TOKENS = 32


def pilot(condition: dict[str, Any] | None = None, **target: Any) -> Pilot:
    """A pilot serving the tiny target on CPU with one condition ``cond`` (baseline if None)."""
    conditions: dict[str, Any] = {"baseline": {"role": "baseline"}}
    if condition is not None:
        conditions["cond"] = {"role": "candidate", **condition}
    return make_pilot(
        conditions,
        target={
            "engine": "sglang",
            "model": str(MODELS / "tiny-target"),
            "python": PYTHON,
            "dtype": "float32",
            "mem_fraction": 0.3,
            # One OpenMP thread: SGLang's CPU path runs several processes (HTTP, scheduler,
            # detokenizer) beside the test client, and on 2 shared cores two spinning
            # OpenMP threads were 10x slower per token than one.
            "env": {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"},
            "engine_args": CPU_ARGS,
            "boot_timeout_s": 600,
            **target,
        },
        trace={"files": ["unused.jsonl"]},
    )


def standalone(topk: int = 1, steps: int = 3, *, extra: list[str] | None = None) -> dict[str, Any]:
    """A STANDALONE condition with the tiny drafter (topk 1: a chain of ``steps`` drafts)."""
    spec: dict[str, Any] = {"algorithm": "STANDALONE", "num_steps": steps, "eagle_topk": topk}
    if topk > 1:
        spec["num_draft_tokens"] = 2 * steps
    return {
        "drafter": str(MODELS / "tiny-drafter"),
        "speculation": spec,
        "engine_args": SPEC_ARGS + (extra or []),
    }


@contextmanager
def booted(p: Pilot, condition: str, log_dir: Path) -> Iterator[SGLangEngine]:
    """A started engine, stopped (its whole process group) on the way out."""
    engine = SGLangEngine(p, condition, BootSpec(condition, log_dir=log_dir))
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


def base_url(engine: SGLangEngine) -> str:
    assert engine.client is not None
    return str(engine.client.pool.base_url)


def generate(engine: SGLangEngine, prompt: str, n: int = MAX_TOKENS, **params: Any) -> Any:
    """One non-streamed greedy /generate (the JSON answer)."""
    body = {"text": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0, **params}}
    r = httpx.post(f"{base_url(engine)}/generate", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def stream_chunks(engine: SGLangEngine, prompt: str, n: int = MAX_TOKENS) -> list[dict[str, Any]]:
    """Every SSE chunk of one streamed greedy /generate with logprobs (``[DONE]`` checked)."""
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": n, "temperature": 0},
        "stream": True,
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    chunks: list[dict[str, Any]] = []
    done = False
    with httpx.stream("POST", f"{base_url(engine)}/generate", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                continue
            chunks.append(json.loads(data))
    assert done, "the stream must end with data: [DONE]"
    return chunks


def still_alive(pids: set[int]) -> set[int]:
    """The pids among ``pids`` still alive (zombies count as gone)."""
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def group_alive(pgid: int) -> set[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    alive = set()
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.add(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive
