"""Stop strings in the embedded engine, with and without a drafter of the same tokenizer
(transformers' own stop_strings refuses that pair): the text ends before the first stop
string, generation ends there, and both conditions agree."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from testkit.factories import ROOT
from testkit.tiny_models import drafted_pilot

pytest.importorskip("torch")
pytest.importorskip("transformers")
MODELS = ROOT / "fixtures" / "models"
pytestmark = [
    pytest.mark.slow,  # boots the tiny models
    pytest.mark.skipif(not (MODELS / "tiny-drafter").is_dir(), reason="no tiny models"),
]


def test_stop_strings_with_and_without_a_drafter(tmp_path: Path) -> None:
    pilot = drafted_pilot()
    prompt = "def read_config(path):\n"
    engines = {n: TransformersEngine(pilot, n, BootSpec(n, tmp_path)) for n in pilot.conditions}
    try:
        for engine in engines.values():
            engine.start()
        free = asyncio.run(engines["baseline"].generate(GenerationRequest("p", prompt, 40)))
        assert free.ok and len(free.output_ids) == 40, free.error
        words = free.output_text.split()
        stop = next(w for w in words[len(words) // 3:] if len(w) >= 3)
        cut = free.output_text[: free.output_text.find(stop)]
        outputs = []
        for name, engine in engines.items():
            res = asyncio.run(engine.generate(GenerationRequest("p", prompt, 40, stop=(stop,))))
            assert res.ok, (name, res.error)
            assert res.output_text == cut and res.finish_reason == "stop", (name, res)
            # The tokens end with the one that completes the stop string, drafts past it
            # dropped: both conditions give the same tokens.
            assert len(res.output_ids) < 40, name
            outputs.append(res.output_ids)
        assert outputs[0] == outputs[1] == free.output_ids[: len(outputs[0])]
    finally:
        for engine in engines.values():
            engine.stop()
