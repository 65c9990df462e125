"""Engines behind one protocol: the embedded transformers engine, booted servers, endpoints."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .base import BootSpec, Engine, EngineError, GenerationRequest, GenerationResult
from .kinds import serving_kind

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

def make_engine(pilot: Pilot, condition: str, boot: BootSpec) -> Engine:
    """The engine serving ``condition``: an endpoint if it names one, else the target's engine."""
    # imported only now, so that torch loads only when the embedded engine is used
    module, cls = serving_kind(pilot, condition).engine_class.split(":")
    engine: Engine = getattr(import_module(module), cls)(pilot, condition, boot)
    return engine
