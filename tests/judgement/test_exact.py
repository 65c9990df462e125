"""The exact per-position distribution test: calibration by simulation (tokens within a sample
depend on the token before; the top-K leaves an unknown tail), each planted fault caught, the
effective temperature's interval coverage, and sentences that name the class and property.

False alarms must stay at or below alpha + 2 standard errors; distributional checks (the
score z against N(0, 1), PIT p-values against U(0, 1), interval coverage) use tests at the
0.1% level. Everything is seeded, so a failure means the method, not the dice, is off.
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.quality.exact import (
    ScoredSample,
    ScoredToken,
    Served,
    exact_test,
    judge_positions,
    positions_from,
)
from pytest_osprey.judgement.quality.exact_power import (
    FAULTS,
    VOCAB,
    Budget,
    Positions,
    analytic_temperature_power,
    budget_problem,
    detectable_temperature_shift,
    power_against,
    simulate,
    to_positions,
    what_the_budget_sees,
)
from pytest_osprey.judgement.stats.core import StatsError
from testkit.exact_sim import scored_samples, to_samples

SIG = 0.001
PLAIN = Served(0.8)
TRUNCATED = Served(0.8, top_p=0.95, top_k=40, min_p=0.02, frequency_penalty=0.3,
                   presence_penalty=0.2)


def replicates(budget: Budget, served: Served, fault: str | None, n: int, seed: int,
               family: str = "tiny") -> list[Positions]:
    draws = simulate(budget, served, fault, replicates=n, seed=seed, family=family)
    pos = to_positions(draws, served)
    per = budget.prompts * budget.samples * budget.tokens
    fields = Positions.__dataclass_fields__
    return [Positions(*(getattr(pos, f)[r * per:(r + 1) * per] for f in fields))
            for r in range(n)]


# --------------------------------------------------------------------------- calibration


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("served", "family", "logprobs"), [
    (PLAIN, "tiny", 20), (TRUNCATED, "tiny", 20), (PLAIN, "chat", VOCAB),
    (Served(1.3, top_p=0.9), "chat", 10)])
def test_false_alarms_at_most_alpha_on_honest_dependent_samples(
        served: Served, family: str, logprobs: int) -> None:
    """Honest samples (each token depends on the one before; prompts differ): the test fails
    at most alpha of the time, and its score statistic is standard normal."""
    budget = Budget(4, 8, 24, logprobs)
    reps = 150
    results = [judge_positions(p, served, 0.05, seed=i, fit_temperature=False)
               for i, p in enumerate(replicates(budget, served, None, reps, seed=7, family=family))]
    for alpha in (0.01, 0.05):
        hits = sum(r.p_value < alpha for r in results)
        # At most alpha + 2 standard errors (seeded: a failure is the method, not the dice).
        assert hits / reps <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / reps), (
            f"{served.words()} {family} K={logprobs}: {hits}/{reps} false alarms at {alpha}")
    z = [r.classes["drafted"].score_z for r in results]
    assert stats.kstest(z, "norm").pvalue > SIG, (np.mean(z), np.std(z))
    pit = [r.classes["drafted"].pit_p for r in results]
    assert stats.kstest(pit, "uniform").pvalue > SIG


def test_exact_test_matches_the_array_path_with_penalties() -> None:
    """ScoredSamples (penalties computed from each sample's earlier tokens) and the
    simulator's own arrays give the same statistics."""
    draws = simulate(Budget(3, 4, 16), TRUNCATED, seed=3)
    a = exact_test(to_samples(draws), TRUNCATED, 0.01, seed=5, vocab=draws.vocab)
    b = judge_positions(to_positions(draws, TRUNCATED), TRUNCATED, 0.01, seed=5)
    for k, c in a.classes.items():
        assert c.score_z == pytest.approx(b.classes[k].score_z)
        assert c.penalty_llr == pytest.approx(b.classes[k].penalty_llr, nan_ok=True)
        assert c.temperature == pytest.approx(b.classes[k].temperature, rel=1e-4)
    assert a.outcome == "pass"


# --------------------------------------------------------------------------- power


CAUGHT = {"hotter": ("effective temperature", "served 0.8"),
          "colder": ("effective temperature", "served 0.8"),
          "top_p_ignored": ("outside the served top-p 0.9", "top-p ignored?"),
          "top_k_ignored": ("outside the served top-k 10", "top-k ignored?"),
          "min_p_ignored": ("outside the served min-p 0.1", "min-p ignored?"),
          "greedy": ("sampled near greedily", "effective temperature 0.00"),
          "garbage": ("not sampled at the served temperature nor at any single one",),
          "penalties_dropped": ("penalties ignored?",)}


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_is_caught_and_named(fault: str) -> None:
    """At 8 prompts x 8 samples x 24 tokens (top-20 logprobs; temperature shifts of 0.2):
    power >= 0.8 at alpha 0.01, and the failing sentence names the class and the property,
    never a direction the statistics do not measure."""
    budget = Budget(8, 8, 24)
    shift = 0.2
    assert power_against(fault, budget, PLAIN, 0.01, shift=shift, replicates=20) >= 0.8
    served = {"top_p_ignored": Served(0.8, top_p=0.9), "top_k_ignored": Served(0.8, top_k=10),
              "min_p_ignored": Served(0.8, min_p=0.1),
              "penalties_dropped": Served(0.8, frequency_penalty=0.5, presence_penalty=0.5),
              }.get(fault, PLAIN)
    res = exact_test(scored_samples(budget, served, fault, seed=12, shift=shift), served, 0.01,
                     vocab=VOCAB)
    assert res.outcome == "fail", res.summary
    assert "first token as served" in res.summary
    drafted = res.summary.split("; ")[0]
    assert drafted.startswith("drafted positions"), res.summary
    for words in CAUGHT[fault]:
        assert words in drafted, (fault, res.summary)
    for wrong in ("less varied", "more varied", "less diverse", "more diverse"):
        assert wrong not in res.summary


def test_garbage_at_drafted_positions_spares_first_and_bonus() -> None:
    res = exact_test(scored_samples(Budget(8, 8, 24), PLAIN, "garbage", seed=2), PLAIN, 0.01)
    assert res.classes["drafted"].outcome == "fail"
    assert res.classes["first"].outcome == res.classes["bonus"].outcome == "pass"


def test_a_shipped_size_budget_sees_greedy_verification() -> None:
    """4 x 8 x 24 (the shipped sampled pass): greedy verification at every simulated campaign."""
    assert power_against("greedy", Budget(4, 8, 24), PLAIN, 0.01, replicates=30) == 1.0


# --------------------------------------------------------------------------- temperature


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("fault", "truth"), [(None, 0.8), ("hotter", 0.9)])
def test_temperature_interval_covers_the_truth(fault: str | None, truth: float) -> None:
    """The drafted positions' effective temperature: its 95% profile interval covers the
    temperature they were sampled at about 95% of the time."""
    reps = 60
    covered = 0
    for i, pos in enumerate(replicates(Budget(4, 8, 24), PLAIN, fault, reps, seed=21)):
        c = judge_positions(pos, PLAIN, 0.01, seed=i).classes["drafted"]
        covered += c.temperature_ci[0] <= truth <= c.temperature_ci[1]
    assert stats.binomtest(covered, reps, 0.95, alternative="less").pvalue > SIG, covered


def test_greedy_served_and_its_violation() -> None:
    """Served at temperature 0: argmax draws pass; any other draw is decisive."""
    greedy = Served(0.0)
    draws = simulate(Budget(2, 4, 12), greedy, seed=4)
    ok = exact_test(to_samples(draws), greedy, 0.01)
    assert ok.outcome == "pass", ok.summary
    bad = exact_test(to_samples(simulate(Budget(2, 4, 12), PLAIN, seed=4)), greedy, 0.01)
    assert bad.outcome == "fail" and bad.p_value == 0.0
    assert "outside the served greedy choice" in bad.summary


# --------------------------------------------------------------------------- edges


def token(drawn: int, logprob: float, ids: tuple[int, ...], lps: tuple[float, ...],
          klass: str = "first") -> ScoredToken:
    return ScoredToken(drawn, logprob, ids, lps, klass)  # type: ignore[arg-type]


def test_a_draw_outside_top_k_counts_only_beyond_the_tolerance() -> None:
    """Top-k 1: a second token within the tolerance of the first is a rounding matter (left
    out); one clearly below is decisive."""
    near = [ScoredSample("p", 0, (token(2, math.log(0.499), (1, 2), (math.log(0.5),
                                                                        math.log(0.499))),))]
    res = exact_test(near, Served(0.8, top_k=1), 0.01)
    c = res.classes["first"]
    assert (c.outside_support, c.boundary, res.outcome) == (0, 1, "pass")
    far = [ScoredSample("p", 0, (token(2, math.log(0.3), (1, 2), (math.log(0.6),
                                                                     math.log(0.3))),))]
    res = exact_test(far, Served(0.8, top_k=1), 0.01)
    assert res.classes["first"].outside_support == 1 and res.outcome == "fail"
    assert "top-k 1" in res.summary


def test_unknown_split_is_tested_together_and_said() -> None:
    draws = simulate(Budget(4, 4, 16), PLAIN, "greedy", seed=8)
    res = exact_test(to_samples(draws, split_known=False), PLAIN, 0.01)
    assert set(res.classes) == {"first", "later"} and not res.split_known
    assert res.summary.startswith("positions 2+ (drafted and bonus not told apart) sampled "
                                  "near greedily")
    assert res.summary.endswith("not told apart (tested together)")


@pytest.mark.parametrize(("samples", "served", "message"), [
    ([ScoredSample("p", 0, (token(1, -0.1, (1, 2), (-0.1,)),))], PLAIN, "equal length"),
    ([ScoredSample("p", 0, (token(1, -0.1, (1, 2), (-0.1, -0.2)),))], PLAIN, "sum to"),
    ([ScoredSample("p", 0, (token(1, -0.1, (1,), (-0.1,), "middle"),))], PLAIN, "klass"),
    ([ScoredSample("p", 0, (token(1, -0.1, (1,), (-0.1,)),))], Served(0.8, top_p=0), "top_p"),
    ([ScoredSample("p", 0, (token(1, -0.1, (1,), (-0.1,)),))], Served(-1), "temperature"),
    ([ScoredSample("p", 0, (token(1, -0.1, (1,), (-0.1,)),))],
     Served(0.8, repetition_penalty=1.2), "logit offsets"),
    ([], PLAIN, "no scored tokens"),
])
def test_bad_input_raises_naming_the_field(samples: list[ScoredSample], served: Served,
                                           message: str) -> None:
    with pytest.raises(StatsError, match=message):
        exact_test(samples, served, 0.01)


@pytest.mark.slow  # over a second on 2 busy cores
def test_large_campaigns_are_judged_in_seconds() -> None:
    """About 10^5 scored tokens with top-20 logprobs, temperature fit included."""
    draws = simulate(Budget(48, 48, 48), PLAIN, seed=1)
    pos = to_positions(draws, PLAIN)
    start = time.process_time()
    res = judge_positions(pos, PLAIN, 0.01)
    assert time.process_time() - start < 10
    assert sum(c.n for c in res.classes.values()) > 100_000 and res.outcome == "pass"
    assert positions_from  # the ScoredSample path is timed by the benchmark


# --------------------------------------------------------------------------- preflight API


@pytest.mark.slow  # over a second on 2 busy cores
def test_detectable_shift_shrinks_with_the_budget_and_is_not_overstated() -> None:
    small, large = Budget(4, 8, 24), Budget(16, 8, 24)
    d_small = detectable_temperature_shift(small, PLAIN)
    d_large = detectable_temperature_shift(large, PLAIN)
    assert d_large <= d_small < math.inf
    # The analytic power is a lower bound: simulation at that shift reaches the power too.
    for f in ("hotter", "colder"):
        assert power_against(f, large, PLAIN, 0.01, shift=d_large, replicates=20) >= 0.7
    assert analytic_temperature_power(large, PLAIN, 0.8) < 0.05  # no shift: alpha-sized
    start = time.perf_counter()
    detectable_temperature_shift(small, PLAIN)  # cached
    assert time.perf_counter() - start < 0.1


def test_preflight_states_what_a_budget_sees_and_refuses_a_blind_one() -> None:
    said = what_the_budget_sees(Budget(16, 8, 24), PLAIN)
    assert "detects a temperature shift of 0.1 at the speculative positions with 80% power" \
        in said
    assert budget_problem(Budget(4, 8, 24), PLAIN) is None
    blind = budget_problem(Budget(1, 1, 2), PLAIN)
    assert blind is not None and "greedy verification" in blind
    assert budget_problem(Budget(1, 1, 2), Served(0.0)) is None


@pytest.mark.parametrize(("family", "bound"), [("tiny", r"> \d+\.\d\d"),
                                               ("chat", r"> 20, the top of the fit's range")])
def test_near_uniform_drafted_positions_read_as_a_hot_effective_temperature(
        family: str, bound: str) -> None:
    """Drafted and bonus positions sampled at temperature 50 (served 0.8): the sentence gives
    the interval's lower end, or the fit's range where the whole interval lies above it."""
    res = exact_test(scored_samples(Budget(4, 8, 24), PLAIN, "hotter", seed=1, shift=50.0,
                                    family=family), PLAIN, 0.01, vocab=VOCAB)
    first = res.summary.split("; ")[0]
    assert re.fullmatch(rf"drafted positions sampled at an effective temperature {bound} "
                        r"\(served 0\.8\)", first), res.summary
    assert res.summary.endswith("first token as served")


def test_a_token_the_target_never_gives_is_decisive() -> None:
    sample = ScoredSample("p", 0, (token(1, -0.1, (1,), (-0.1,)),
                                   token(7, -math.inf, (1, 2), (-0.1, -2.4), "drafted")))
    res = exact_test([sample], PLAIN, 0.01)
    assert res.outcome == "fail" and res.classes["drafted"].outside_by == {"probability 0": 1}
    assert res.summary.startswith("drafted positions: 1 of 1 draws outside the served "
                                  "distribution (the target gives them probability 0)")


def test_a_class_no_temperature_fits_still_names_the_served_one_and_no_nan() -> None:
    """Garbage parameters can leave nothing to fit (every draw at a point mass: no score
    variance, no temperature): the summary says what failed and the served temperature, never
    a 'nan'."""
    import dataclasses

    from pytest_osprey.judgement.quality.exact import describe

    res = exact_test(scored_samples(Budget(8, 8, 24), PLAIN, "garbage", seed=2), PLAIN, 0.01)
    drafted = res.classes["drafted"]
    assert drafted.outcome == "fail"
    nothing = dataclasses.replace(
        drafted, score_z=math.nan, temperature=math.nan, temperature_ci=(math.nan, math.nan),
        inverse_temperature=math.nan, inverse_temperature_ci=(math.nan, math.nan),
        outside_support=0, decisive="score")
    text = describe(nothing, PLAIN)
    assert "nan" not in text.lower(), text
    assert "not drawn from the served distribution" in text and "served 0.8" in text, text
