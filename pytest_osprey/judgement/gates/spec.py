"""What a gate is: its kind and what it compares, planned from the pilot (see :mod:`.plan`)."""

from __future__ import annotations

from dataclasses import dataclass

from .kinds import GateKind


@dataclass(frozen=True)
class GateSpec:
    kind: GateKind
    condition: str
    reference: str | None = None
    load: str | None = None
    slice: str | None = None
    index: int | None = None  # which latency limit
    gating: bool = True  # False: reported, never decides the verdict

    def __post_init__(self) -> None:
        # A kind given by name (a re-read file, a hand-built spec) becomes its member.
        object.__setattr__(self, "kind", GateKind(self.kind))

    @property
    def id(self) -> str:
        parts = [self.condition]
        if self.reference:
            parts.append(f"vs-{self.reference}")
        if self.load:
            parts.append(self.load)
        if self.slice:
            parts.append(self.slice)
        if self.index is not None:
            parts.append(f"limit{self.index}")
        return "-".join(parts)
