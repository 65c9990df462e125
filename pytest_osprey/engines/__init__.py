"""Engines behind one protocol: the embedded transformers engine, booted servers, endpoints."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .base import BootSpec, Engine, EngineError, GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot

__all__ = [
    "BootSpec",
    "Engine",
    "EngineError",
    "GenerationRequest",
    "GenerationResult",
    "make_engine",
]

# engine name -> "module:Class"; imported lazily so torch loads only when it is used.
_ENGINES = {
    "transformers": "pytest_osprey.engines.embedded.engine:TransformersEngine",
    "sglang": "pytest_osprey.engines.sglang.engine:SGLangEngine",
    "vllm": "pytest_osprey.engines.vllm.engine:VLLMEngine",
    "endpoint": "pytest_osprey.engines.endpoint.engine:EndpointEngine",
}


def make_engine(pilot: Pilot, condition: str, boot: BootSpec) -> Engine:
    """The engine serving ``condition``: an endpoint if it names one, else the target's engine."""
    cond = pilot.conditions[condition]
    kind = "endpoint" if cond.endpoint is not None else pilot.target.engine
    module, cls = _ENGINES[kind].split(":")
    engine: Engine = getattr(import_module(module), cls)(pilot, condition, boot)
    return engine
