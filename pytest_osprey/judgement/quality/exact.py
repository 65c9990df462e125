"""Sampled tokens scored against the target's own next-token distribution, per position class.

Interface (the data the campaign saves and the judgement reads). Every sampled token of a
condition's sampled pass is scored by the *target* (the baseline server asked for the
prompt-plus-sample's logprobs, or the embedded target): at that position the target's raw
(temperature 1, untruncated) log-probabilities of its top-K tokens and of the token drawn.
From those the distribution the service should have sampled from (served temperature, top-p,
top-k, min-p) follows; the tail beyond K is bounded by its mass, not ignored.

Position classes: ``first`` (the token the target samples alone after the prefill),
``drafted`` (a token a verify step accepted from the drafter), ``bonus`` (the token a verify
step adds after its accepted drafts), ``later`` (positions 2+ where the engine does not say
which were drafted: SGLang and vLLM give per-request totals only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..stats.core import StatOutcome

PositionClass = Literal["first", "drafted", "bonus", "later"]
POSITION_CLASSES: tuple[PositionClass, ...] = ("first", "drafted", "bonus", "later")


@dataclass(frozen=True)
class ScoredToken:
    """One sampled token and the target's raw distribution where it was drawn."""

    token: int
    logprob: float  # the target's raw log-probability (T=1, untruncated) of ``token``
    top_ids: tuple[int, ...]  # the target's top-K token ids, most likely first
    top_logprobs: tuple[float, ...]  # their raw log-probabilities (K may be the whole vocab)
    klass: PositionClass


@dataclass(frozen=True)
class ScoredSample:
    """One sampled continuation of one prompt, every token scored."""

    prompt_id: str
    sample_index: int
    tokens: tuple[ScoredToken, ...]


@dataclass(frozen=True)
class Served:
    """The sampling the service applies (the distribution the samples should follow)."""

    temperature: float
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0


@dataclass(frozen=True)
class ClassResult:
    """The exact test of one position class."""

    klass: PositionClass
    n: int  # tokens scored
    score_z: float  # sum(log q(x) + H(q)) / sqrt(sum Var_q log q): 0 expected, < 0 off-mode
    pit_p: float  # randomised PIT, KS against U(0, 1)
    top1_observed: int  # draws of the target's most likely token
    top1_expected: float  # sum over positions of q(argmax)
    top1_z: float
    outside_support: int  # draws the served distribution gives probability 0 (top-p/k, min-p)
    temperature: float  # maximum-likelihood effective temperature of the draws
    temperature_ci: tuple[float, float]  # at the pilot's confidence; inf above the fit's range
    p_value: float  # the class's combined p (Bonferroni over its statistics)
    outcome: StatOutcome


@dataclass(frozen=True)
class ExactResult:
    """Per-position-class exact test of one condition's samples against the target."""

    outcome: StatOutcome
    p_value: float  # min over classes, Bonferroni-adjusted
    alpha: float
    served: Served
    classes: dict[str, ClassResult] = field(default_factory=dict)
    summary: str = ""  # one sentence that sizes the defect, e.g. "drafted positions sampled
    # at an effective temperature > 2.0 (served 0.8); first token as served"
    split_known: bool = True  # False: positions 2+ tested together ("later"), and said so


def exact_test(samples: Sequence[ScoredSample], served: Served, alpha: float,
               seed: int = 0) -> ExactResult:
    """Judge ``samples`` against the target's distribution under ``served``.

    Implemented in this module (see the issue's statistics): a score test, a randomised PIT,
    the top-1 rate against its expectation and a fitted effective temperature, per class.
    """
    raise NotImplementedError
