from __future__ import annotations

from enum import Enum


class SpeculativeAlgorithm(Enum):
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    STANDALONE = "STANDALONE"
    NGRAM = "NGRAM"

    @classmethod
    def from_string(cls, name: str) -> SpeculativeAlgorithm:
        return cls[name.upper()]
