"""The embedded engine honours a serving sampling's top-k, min-p and ignore-EOS, with and
without a drafter: each is checked by what ignoring it would change."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.embedded.engine import MAX_BATCH, TransformersEngine
from testkit.factories import ROOT
from testkit.tiny_models import drafted_pilot

pytest.importorskip("torch")
pytest.importorskip("transformers")
MODELS = ROOT / "fixtures" / "models"
pytestmark = pytest.mark.skipif(not (MODELS / "tiny-drafter").is_dir(), reason="no tiny models")
PROMPT, N = "def read_config(path):\n", 16


@pytest.mark.slow  # two engines, seven requests each: over 20 s on a busy 2-core machine
def test_top_k_min_p_and_ignore_eos_are_honoured(tmp_path: Path) -> None:
    pilot = drafted_pilot(threads=1)
    engines = {n: TransformersEngine(pilot, n, BootSpec(n, tmp_path)) for n in pilot.conditions}

    def gen(engine: TransformersEngine, **kw: object) -> list[int]:
        res = asyncio.run(engine.generate(GenerationRequest("p", PROMPT, N, want_margins=False,
                                                            **kw)))  # type: ignore[arg-type]
        assert res.ok, res.error
        return res.output_ids

    try:
        for engine in engines.values():
            engine.start()
            # Its batch's cap, where the fairness gate reads every engine's running cap.
            assert engine.fingerprint()["max_running_requests"] == MAX_BATCH
        greedy = gen(engines["baseline"])
        assert len(greedy) == N
        for name, engine in engines.items():
            # Top-k 1 leaves only the most likely token: sampling at T 1 is greedy.
            assert gen(engine, temperature=1.0, top_k=1, seed=3) == greedy, name
            # Min-p 0.999 at T 5 keeps (nearly) only the top token; without it, T 5 samples
            # all over the vocabulary.
            assert gen(engine, temperature=5.0, min_p=0.999, seed=3) == greedy, name
            assert gen(engine, temperature=5.0, seed=3) != greedy, name
            # Make the greedy output's second token an end of sequence: a request ends on
            # it, unless it ignores end of sequence.
            batcher = engine._batcher
            assert batcher is not None
            batcher.eos = {*batcher.eos, greedy[1]}
            assert gen(engine) == greedy[: greedy.index(greedy[1]) + 1], name
            assert gen(engine, ignore_eos=True) == greedy, name
    finally:
        for engine in engines.values():
            engine.stop()
