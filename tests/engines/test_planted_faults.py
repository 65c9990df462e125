"""Planted verification faults: the embedded engine's speculative verification is exact without
one, and with one it samples its drafted positions from the faulty distribution it names (and
from the exact one after them), checked against distributions built independently."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from pytest_osprey.engines.base import GenerationRequest
from pytest_osprey.engines.embedded.batching import Batcher, Drafts, Flight
from pytest_osprey.engines.embedded.generation_hooks import OpenAIPenalties, sampling_warpers
from pytest_osprey.engines.embedded.planted_faults import (
    ENV,
    FAULTS,
    PlantedFault,
    PlantedFaultError,
    planted_fault,
)

V = 12
LOGITS = torch.tensor([3.0, 2.6, 2.2, 1.9, 1.5, 1.2, 0.8, 0.5, 0.1, -0.3, -0.8, -1.5])
PROMPT = [0, 0, 1]  # token 0 twice and 1 once: the penalties' targets
SERVED = GenerationRequest("p", "", 16, temperature=0.8, top_p=0.9, top_k=8, min_p=0.3,
                           repetition_penalty=1.3, frequency_penalty=0.4,
                           presence_penalty=0.2, seed=0)
DRAWS = 3000


def _processors(request: GenerationRequest) -> list[Any]:
    from transformers import RepetitionPenaltyLogitsProcessor

    out: list[Any] = []
    if request.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(request.repetition_penalty))
    if request.frequency_penalty or request.presence_penalty:
        out.append(OpenAIPenalties(0, request.frequency_penalty, request.presence_penalty))
    return out


def _served(request: GenerationRequest, context: list[int] = PROMPT) -> np.ndarray:
    """The distribution ``request`` samples from after ``context``."""
    ids = torch.tensor([context])
    scores = LOGITS[None].clone()
    for p in _processors(request) + sampling_warpers(request):
        scores = p(ids, scores)
    return torch.softmax(scores, dim=-1)[0].double().numpy()


def _emitted(fault: PlantedFault | None, seed: int = 1, draws: int = DRAWS,
             served: GenerationRequest = SERVED) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the drafted position's token, and of the bonus token after each accepted
    draft (rows: the draft), over ``DRAWS`` verify steps of one draft drawn from a drafter
    far from the target."""
    batcher = Batcher(None, None, 1, set(), lambda ids, stop: False, None,  # type: ignore[arg-type]
                      threading.Event(), fault=fault)
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.linspace(-1.0, 1.0, V), dim=-1)  # the drafter favours the tail
    drafted, bonus = np.zeros(V), np.zeros((V, V))
    raw = torch.stack([LOGITS, LOGITS])
    for _ in range(draws):
        f = Flight(served, 0.0, list(PROMPT), _processors(served), sampling_warpers(served), g,
                   on_done=lambda _: None)
        token = int(torch.multinomial(q, 1, generator=g))
        m, nxt = batcher._verify(f, Drafts(tokens=[token], probs=[q], proposed=1), raw)
        if m == 1:
            drafted[token] += 1
            bonus[token, nxt] += 1
        else:
            drafted[nxt] += 1
    return drafted, bonus


def _fits(counts: np.ndarray, p: np.ndarray) -> float:
    """Chi-square p of ``counts`` against ``p`` (cells p gives 0 must hold no draws)."""
    live = p > 1e-12
    assert counts[~live].sum() == 0, counts
    return float(stats.chisquare(counts[live], p[live] / p[live].sum() * counts.sum()).pvalue)


def _log_lr(counts: np.ndarray, p: np.ndarray, other: np.ndarray) -> float:
    """log likelihood of ``counts`` under ``p`` minus under ``other`` (+inf where ``other``
    cannot make a draw that was made: it is ruled out)."""
    live = counts > 0
    with np.errstate(divide="ignore"):
        return float((counts[live] * (np.log(p[live]) - np.log(other[live]))).sum())


# Temperature +-0.1 moves the served distribution little (L1 about 0.06 here): a chi-square
# fit cannot tell the two apart at a few thousand draws, a likelihood ratio at 12,000 can.
SMALL = 12_000


@pytest.mark.slow  # over a second on 2 busy cores
def test_verification_without_a_fault_samples_the_served_distribution() -> None:
    drafted, _ = _emitted(None, draws=SMALL)
    served = _served(SERVED)
    assert _fits(drafted, served) > 1e-3
    for hotter in (0.9, 0.7):  # the control: the planted faults' distributions lose
        assert _log_lr(drafted, served, _served(replace(SERVED, temperature=hotter))) > 3


# Each truncation alone binds (where several do, the tightest hides the others).
ONE = {"top_p": 1.0, "top_k": None, "min_p": 0.0}


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("fault", "base", "as_served"), [
    (PlantedFault("temperature", 0.1), {}, {"temperature": 0.9}),
    (PlantedFault("temperature", -0.1), {}, {"temperature": 0.7}),
    (PlantedFault("top_p_ignored"), {**ONE, "top_p": 0.8}, {"top_p": 1.0}),
    (PlantedFault("top_k_ignored"), {**ONE, "top_k": 3}, {"top_k": None}),
    (PlantedFault("min_p_ignored"), {**ONE, "min_p": 0.3}, {"min_p": 0.0}),
    (PlantedFault("penalties_dropped"), {}, {"repetition_penalty": 1.0,
                                             "frequency_penalty": 0.0, "presence_penalty": 0.0}),
])
def test_a_fault_samples_drafted_positions_as_the_parameter_it_names(
        fault: PlantedFault, base: dict[str, Any], as_served: dict[str, Any]) -> None:
    request = replace(SERVED, **base)
    drafted, _ = _emitted(fault, draws=SMALL if fault.name == "temperature" else DRAWS,
                          served=request)
    faulty, served = _served(replace(request, **as_served)), _served(request)
    assert np.abs(faulty - served).sum() > 0.02  # the fault changes what is served here
    assert _fits(drafted, faulty) > 1e-3
    if (served[faulty > 0] > 0).all():
        assert _log_lr(drafted, faulty, served) > 3
    else:  # draws the served distribution cannot give: decisive
        assert drafted[served == 0].sum() > 0


@pytest.mark.slow  # over a second on 2 busy cores
def test_greedy_verification_emits_the_argmax_at_every_drafted_position() -> None:
    drafted, _ = _emitted(PlantedFault("greedy_verification"))
    # the most likely token of the target as served (its penalties included)
    assert drafted[int(np.argmax(_served(SERVED)))] == DRAWS


@pytest.mark.slow  # over a second on 2 busy cores
def test_garbage_parameters_are_far_from_served_but_the_bonus_token_is_exact() -> None:
    drafted, _ = _emitted(PlantedFault("garbage_params"))
    served = _served(SERVED)
    # negative temperatures reach the tail the served truncation cuts off; near-zero ones
    # pile onto the most likely token
    assert drafted[served == 0].sum() > 0.1 * DRAWS
    assert drafted[int(np.argmax(served))] > 1.2 * served.max() * DRAWS


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("fault", [PlantedFault("top_p_ignored"),
                                   PlantedFault("garbage_params")])
def test_the_token_after_accepted_drafts_stays_exact_under_a_fault(
        fault: PlantedFault) -> None:
    _, bonus = _emitted(fault, seed=3)
    assert bonus.sum() > 200
    # Its context holds the accepted draft (which the penalties count): per draft, the
    # served distribution after prompt + draft; pooled over drafts, its mixture.
    expected = sum(bonus[t].sum() * _served(SERVED, [*PROMPT, t]) for t in range(V))
    assert _fits(bonus.sum(axis=0), np.asarray(expected)) > 1e-3


@pytest.mark.parametrize(("raw", "expected"), [
    ("", None), ("  ", None),
    ("greedy_verification", PlantedFault("greedy_verification")),
    ("temperature:0.1", PlantedFault("temperature", 0.1)),
    ("temperature:-0.1", PlantedFault("temperature", -0.1)),
])
def test_the_variable_names_a_fault(raw: str, expected: PlantedFault | None) -> None:
    assert planted_fault({ENV: raw}) == expected
    assert planted_fault({}) is None


@pytest.mark.parametrize("raw", ["nope", "temperature", "temperature:x", "temperature:0",
                                 "top_p_ignored:1"])
def test_a_bad_fault_is_one_line_naming_the_variable(raw: str) -> None:
    with pytest.raises(PlantedFaultError) as info:
        planted_fault({ENV: raw})
    assert ENV in str(info.value) and "\n" not in str(info.value)


def test_every_fault_is_named_in_the_list() -> None:
    assert {"temperature", "greedy_verification", "garbage_params",
            "drafts_unverified"} <= set(FAULTS)


def test_unverified_drafts_are_all_accepted_greedy_or_sampled() -> None:
    """Every draft emitted as proposed, then the target's own token: a greedy request drafted
    off the target's argmax keeps the wrong tokens, which an honest verifier rejects."""
    batcher = Batcher(None, None, 1, set(), lambda ids, stop: False, None,  # type: ignore[arg-type]
                      threading.Event(), fault=PlantedFault("drafts_unverified"))
    honest = Batcher(None, None, 1, set(), lambda ids, stop: False, None,  # type: ignore[arg-type]
                     threading.Event())
    greedy = GenerationRequest("p", "", 16)
    raw = torch.stack([LOGITS] * 4)
    wrong = [5, 7, 9]  # none is the argmax (token 0)
    for request, g in ((greedy, None), (SERVED, torch.Generator().manual_seed(0))):
        f = Flight(request, 0.0, list(PROMPT), _processors(request),
                   sampling_warpers(request) if g is not None else [], g, on_done=lambda _: None)
        probs = [torch.full((V,), 1.0 / V)] * 3 if g is not None else []
        drafts = Drafts(tokens=list(wrong), probs=probs, proposed=3)
        assert batcher._verify(f, drafts, raw)[0] == 3
    f = Flight(greedy, 0.0, list(PROMPT), [], [], None, on_done=lambda _: None)
    assert honest._verify(f, Drafts(tokens=list(wrong), proposed=3), raw) == (0, 0)
