"""The tiny target and drafter as transformers loads them, for tests that hold the embedded
engine to transformers' own batch-1 generate()."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .factories import ROOT, TINY_DRAFTER, TINY_TARGET, make_pilot


def need() -> ModuleType:
    """torch, where torch, transformers and the tiny models are all here; otherwise the calling
    test module is skipped (call it at module level)."""
    torch: ModuleType = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not TINY_DRAFTER.is_dir() or not TINY_TARGET.is_dir():
        pytest.skip("no tiny models", allow_module_level=True)
    return torch


def load(path: Path) -> Any:
    """A model in float32, in eval mode: the engine's numerics on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def tokenizer() -> Any:
    """The tokenizer the tiny target and drafter share."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TARGET)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread, as the pilot runs it: on a shared machine two spin against each other."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def drafted_pilot(**target: Any) -> Any:
    """The embedded pilot of the tiny target: a baseline and the tiny drafter (assisted, 4
    draft tokens) on the shipped trace; ``target`` adds target keys (threads, ...)."""
    return make_pilot(
        target={"model": str(TINY_TARGET), "context_length": 1024, **target},
        conditions={"baseline": {"role": "baseline"},
                    "drafted": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                                "speculation": {"algorithm": "assisted",
                                                "num_draft_tokens": 4}}},
        trace={"files": [str(ROOT / "prompts" / "pilot.jsonl")]},
    )  # fmt: skip


def started_engine(pilot: Any, name: str, folder: Path) -> Any:
    """``name``'s embedded engine of ``pilot``, booted, its log under ``folder/logs`` (the
    caller stops it)."""
    from pytest_osprey.engines.base import BootSpec
    from pytest_osprey.engines.embedded.engine import TransformersEngine

    engine = TransformersEngine(pilot, name, BootSpec(name, folder / "logs"))
    engine.start()
    return engine
