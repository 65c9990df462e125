"""The one small protocol every engine implements (in-process, booted server, or endpoint)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..results.records import Measurement


class EngineError(RuntimeError):
    """An engine could not start or serve; the message names the condition and the cause."""


@dataclass(frozen=True)
class GenerationRequest:
    prompt_id: str
    prompt: str
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    want_margins: bool = True  # top-1 minus top-2 logprob per output position
    timeout_s: float = 300.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# The engines' result is the saved record's measured part: one declaration.
GenerationResult = Measurement


@dataclass(frozen=True)
class BootSpec:
    """Everything an engine needs to stand up one condition."""

    condition: str
    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """One condition's engine. ``start`` boots/loads once; ``stop`` must always be safe."""

    condition: str

    def start(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def fingerprint(self) -> dict[str, Any]:
        """Engine + version, device, dtype, context length, resolved args, KV capacity..."""
        ...

    def memory_mb(self) -> float | None:
        """Current memory of what serves this condition (GPU if any, else resident), in MiB."""
        ...

    def flush(self) -> None:
        """Drop caches between blocks so blocks are independent (no-op where meaningless)."""
        ...

    def stop(self) -> None: ...
