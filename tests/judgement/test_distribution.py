"""Sampled-distribution homogeneity: exact statistics, attainability, calibration at the null
(with dependent noise) and power, on the synthetic chains of testkit/sim_lm.py.

Monte Carlo rates are judged with exact binomial tests at the 0.1% level (as in
test_stats_simulation.py), so a seeded failure means the method, not the dice, is off; power
claims must also hold as point estimates. Real samples of the tiny target are measured by
benchmarks/distribution_power.py (too slow here).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.campaign.requests import sample_seed
from pytest_osprey.judgement.quality.distribution import (
    KERNELS,
    budget_problem,
    distribution_check,
    kernel_means,
    kernel_parts,
    records_to_samples,
    smallest_p,
)
from pytest_osprey.judgement.quality.gates import sampling_budget_problem, sampling_budget_sees
from pytest_osprey.judgement.stats.core import StatsError
from pytest_osprey.results.records import RequestRecord
from pytest_osprey.run.pilot_run import PilotRun, UsageError
from testkit.factories import dump_pilot, make_pilot, make_record, pilot_data
from testkit.sim_lm import CHAT_LIKE, FLAT, MarkovLM

SIG = 0.001


def assert_rate_at_most(hits: int, n: int, alpha: float, what: str) -> None:
    p = stats.binomtest(hits, n, alpha, alternative="greater").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly above {alpha}"


# --------------------------------------------------------------------------- exactness


def test_kernel_parts_are_similarities() -> None:
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(0, 6, rng.integers(1, 9))) for _ in range(12)] + [[]]
    parts = kernel_parts(seqs)
    assert set(parts) == set(KERNELS)
    for name, k in parts.items():
        assert np.allclose(k, k.T), name
        assert k.min() >= -1e-12 and k.max() <= 1 + 1e-12, name
        assert np.linalg.eigvalsh(k).min() > -1e-9, name  # a kernel: no negative MMD^2
    assert np.allclose(np.diag(parts["tokens"])[:-1], 1.0)
    # Token counts (2, 1) and (1, 1) over tokens 1 and 2: their cosine.
    k = kernel_parts([[1, 1, 2], [1, 2]])["tokens"]
    assert k[0, 1] == pytest.approx((2 * 1 + 1 * 1) / (math.sqrt(5) * math.sqrt(2)))
    assert kernel_parts([[1, 2, 3], [1, 5, 3]])["positions"][0, 1] == pytest.approx(2 / 3)


def test_unbiased_mmd_rows_match_the_direct_formula() -> None:
    rng = np.random.default_rng(1)
    n_a, n_b = 5, 7
    x = rng.random((n_a + n_b, 4))
    k = x @ x.T
    k0 = k.copy()
    np.fill_diagonal(k0, 0.0)
    groups = np.vstack([np.arange(n_a + n_b) < n_a,
                        rng.permutation(np.arange(n_a + n_b) < n_a)]).astype(np.float64)
    w_a, w_b, ab = kernel_means(k0, groups, n_a)
    for row in range(2):
        a, b = groups[row] == 1, groups[row] == 0
        kaa, kbb = k[np.ix_(a, a)], k[np.ix_(b, b)]
        direct = ((kaa.sum() - np.trace(kaa)) / (n_a * (n_a - 1))
                  + (kbb.sum() - np.trace(kbb)) / (n_b * (n_b - 1))
                  - 2 * k[np.ix_(a, b)].mean())
        assert w_a[row] + w_b[row] - 2 * ab[row] == pytest.approx(direct)


def test_smallest_p_counts_the_joint_relabellings() -> None:
    assert smallest_p([(4, 4)], 10**9) == pytest.approx(2 / 70, rel=1e-6)
    assert smallest_p([(4, 4)] * 4, 999) == pytest.approx((1 + 999 * (2 / 70) ** 4) / 1000)
    assert smallest_p([(3, 5)], 10**9) == pytest.approx(1 / math.comb(8, 3), rel=1e-6)
    assert smallest_p([(1, 4)]) == 1.0  # nothing comparable
    # Exhaustively for one prompt of 3 + 3: the most extreme MMD^2 is reached by the observed
    # split and its mirror only.
    seqs = [[1, 1], [1, 1], [1, 1], [2, 2], [2, 2], [2, 2]]
    k0 = sum(kernel_parts(seqs).values()) / len(KERNELS)
    np.fill_diagonal(k0, 0.0)
    splits = np.array([[i in c for i in range(6)] for c in itertools.combinations(range(6), 3)],
                      dtype=np.float64)
    w_a, w_b, ab = kernel_means(k0, splits, 3)
    mmd = w_a + w_b - 2 * ab
    assert np.sum(mmd >= mmd.max() - 1e-12) / len(mmd) == pytest.approx(smallest_p([(3, 3)],
                                                                                10**12))


# --------------------------------------------------------------------------- behaviour


def test_the_shipped_budget_can_fail_on_the_faults_the_old_check_passed() -> None:
    """4 prompts x 4 samples per side (the old embedded pilot): always token 5 vs always 7, a
    candidate stuck on one token, lengths 2 vs 16: each now fails at alpha 0.01."""
    rng = np.random.default_rng(2)
    ids = [f"p{i}" for i in range(4)]
    cases = {
        "5 vs 7": ({p: [[5] * 8] * 4 for p in ids}, {p: [[7] * 8] * 4 for p in ids}),
        "stuck": ({p: [list(rng.integers(0, 100, 8)) for _ in range(4)] for p in ids},
                  {p: [[3] * 8] * 4 for p in ids}),
        "lengths": ({p: [list(rng.integers(0, 9, 2)) for _ in range(4)] for p in ids},
                    {p: [list(rng.integers(0, 9, 16)) for _ in range(4)] for p in ids}),
    }
    for name, (ref, cand) in cases.items():
        res = distribution_check(ref, cand, alpha=0.01)
        assert res.outcome == "fail" and res.p_value <= 0.01, (name, res.summary)
    same = {p: [[1, 2, 3]] * 4 for p in ids}
    res = distribution_check(same, same)
    assert res.outcome == "pass" and res.p_value == 1.0 and res.distance == pytest.approx(0)


def test_a_budget_that_cannot_reach_alpha_is_never_a_pass() -> None:
    ref, cand = {"p": [[5] * 8] * 4}, {"p": [[7] * 8] * 4}
    res = distribution_check(ref, cand, alpha=0.01)
    assert res.outcome == "inconclusive" and res.smallest_p > 0.01
    assert res.summary.startswith("cannot detect at this budget")
    why = budget_problem(1, 4, 0.01)
    assert why is not None and "samples_per_prompt >= 5" in why and "prompts >= 2" in why
    assert budget_problem(4, 4, 0.01) is None and budget_problem(3, 1, 0.01) is not None
    pilot = make_pilot(
        target={"model": "m"}, trace={"files": ["t.jsonl"]},
        conditions={"b": {"role": "baseline"}, "c": {"role": "candidate"}},
        sampling={"sampled": {"enabled": True, "samples_per_prompt": 4, "prompts": 1}})
    problem = sampling_budget_problem(pilot, trace_prompts=20)
    assert problem is not None and "sampling.sampled.samples_per_prompt" in problem
    assert "sampling.sampled.prompts" in problem
    assert sampling_budget_problem(pilot, trace_prompts=1) is not None


def test_effect_size_is_centred_at_zero_and_sees_diversity() -> None:
    lm = MarkovLM(CHAT_LIKE, seed=5)
    rng = np.random.default_rng(6)
    base, sharp = lm.sampler(1.0), lm.sampler(0.5)
    nulls = [distribution_check(lm.draw(base, 8, 8, 16, rng), lm.draw(base, 8, 8, 16, rng),
                                permutations=199, alpha=0.05).distance for _ in range(30)]
    assert abs(np.mean(nulls)) < 3 * np.std(nulls) / np.sqrt(len(nulls)) + 1e-3
    res = distribution_check(lm.draw(base, 8, 8, 16, rng), lm.draw(sharp, 8, 8, 16, rng))
    assert res.outcome == "fail" and res.distance > res.critical
    assert res.similarity_ratio is not None and res.similarity_ratio > 1.2


def test_a_budget_beyond_the_cap_is_judged_on_a_sub_sample(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """More samples than the kernel holds: a seeded sub-sample of each side is compared (the
    memory stays bounded), said in the summary; a planted sharper sampler is still caught and
    equal samplers are not flagged."""
    from pytest_osprey.judgement.quality import distribution as module

    monkeypatch.setattr(module, "MAX_SAMPLES_PER_SIDE", 24)
    lm = MarkovLM(CHAT_LIKE, seed=9)
    rng = np.random.default_rng(10)
    base, sharp = lm.sampler(1.0), lm.sampler(0.5)
    caught = distribution_check(lm.draw(base, 4, 200, 12, rng), lm.draw(sharp, 4, 200, 12, rng),
                                permutations=199, alpha=0.05)
    assert caught.outcome == "fail" and caught.samples_per_prompt == 24
    assert "sub-sample of 24 samples a side" in caught.summary
    same = [distribution_check(lm.draw(base, 4, 200, 12, rng), lm.draw(base, 4, 200, 12, rng),
                               permutations=199, alpha=0.05, seed=k).outcome for k in range(8)]
    assert same.count("fail") <= 2


def test_results_are_seeded() -> None:
    rng = np.random.default_rng(7)
    ref = {f"p{i}": [list(rng.integers(0, 9, 4)) for _ in range(6)] for i in range(3)}
    cand = {f"p{i}": [list(rng.integers(0, 9, 4)) for _ in range(5)] for i in range(3)}
    a, b = distribution_check(ref, cand, seed=4), distribution_check(ref, cand, seed=4)
    assert a == b and a.samples_per_prompt == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"alpha": 0.0}, "alpha"), ({"positions": 0}, "positions"),
     ({"permutations": 49}, "permutations cannot reach")],
)
def test_bad_settings_raise(kwargs: dict[str, float], message: str) -> None:
    data = {"p": [[1], [2]]}
    with pytest.raises(StatsError, match=message):
        distribution_check(data, data, **kwargs)  # type: ignore[arg-type]


def test_nothing_to_compare_raises() -> None:
    with pytest.raises(StatsError, match="no prompt has at least 2"):
        distribution_check({"a": [[1], [2]]}, {"b": [[1], [2]], "a": [[1]]})


def test_records_to_samples_keeps_ok_sampled_records_of_the_condition() -> None:
    def rec(cond: str, pid: str, mode: str, index: int, ok: bool = True) -> RequestRecord:
        return make_record(cond, pid, measured=False, mode=mode, sample_index=index, ok=ok,
                           output_ids=[index, 9])

    records = [rec("c", "p", "sampled", 1), rec("c", "p", "sampled", 0),
               rec("c", "p", "sampled", 2, ok=False), rec("c", "p", "greedy", 0),
               rec("other", "p", "sampled", 0), rec("c", "q", "sampled", 0)]
    assert records_to_samples(records, "c") == {"p": [[0, 9], [1, 9]], "q": [[0, 9]]}


def test_sample_seeds_differ_per_condition_prompt_and_sample() -> None:
    seeds = {sample_seed(0, c, p, i) for c in ("a", "b") for p in ("x", "y") for i in range(50)}
    assert len(seeds) == 200
    assert sample_seed(0, "a", "x", 3) == sample_seed(0, "a", "x", 3)
    assert all(0 <= s < 2**31 for s in seeds)


# --------------------------------------------------------------------------- calibration


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("regime", "exponents"), [("chat-like", CHAT_LIKE), ("flat", FLAT)])
def test_false_alarm_rate_at_most_alpha(regime: str, exponents: tuple[float, float]) -> None:
    """Self vs self with unequal sample counts (failed requests) and prompts that differ in
    how sharply they sample (a per-prompt temperature shared by both sides: the samples of
    a prompt are alike, prompts are not): rejections <= alpha."""
    lm = MarkovLM(exponents, seed=11)
    rng = np.random.default_rng(12)
    pilots = 120
    p = []
    for i in range(pilots):
        temps = rng.uniform(0.6, 1.2, size=6)
        ref, cand = {}, {}
        for j, t in enumerate(temps):
            cdf = lm.sampler(float(t))
            ref[f"p{j}"] = lm.draw(cdf, 1, 7, 6, rng)["p00"]
            cand[f"p{j}"] = lm.draw(cdf, 1, 5, 6, rng)["p00"]
        p.append(distribution_check(ref, cand, permutations=199, alpha=0.05, seed=i).p_value)
    for alpha in (0.05, 0.1, 0.2):
        hits = int((np.array(p) <= alpha).sum())
        assert_rate_at_most(hits, pilots, alpha, f"{regime} false alarms at alpha={alpha}")


# --------------------------------------------------------------------------- power


@pytest.mark.slow  # over a second on 2 busy cores
def test_power_against_temperature_on_chat_like_chains() -> None:
    """8 prompts x 16 samples x 32 tokens, temperature 1.0 vs 0.8 (measured 1.0 over 40)."""
    lm = MarkovLM(CHAT_LIKE, seed=21)
    rng = np.random.default_rng(22)
    base, alt = lm.sampler(1.0), lm.sampler(0.8)
    pilots = 10
    hits = sum(distribution_check(lm.draw(base, 8, 16, 32, rng), lm.draw(alt, 8, 16, 32, rng),
                                  seed=i).outcome == "fail" for i in range(pilots))
    assert hits / pilots >= 0.8, f"power {hits}/{pilots}"


def test_a_run_refuses_a_budget_that_cannot_fail(tmp_path: Path) -> None:
    """Before anything runs: a usage error naming the keys, never a campaign that passes."""
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps({"id": f"p{i}", "domain": "chat", "prompt": f"Hi {i}"}) + "\n"
                for i in range(3)))
    (tmp_path / "m").mkdir()
    def pilot(prompts: int) -> Path:
        return dump_pilot(tmp_path / "pilot.yaml", pilot_data(
            {"b": {"role": "baseline"}, "c": {"role": "candidate"}}, target={"model": "m"},
            trace={"files": ["t.jsonl"]},
            sampling={"sampled": {"enabled": True, "samples_per_prompt": 4, "prompts": prompts}}))

    pilot(1)
    with pytest.raises(UsageError, match=r"sampling\.sampled\.samples_per_prompt") as err:
        PilotRun(tmp_path / "pilot.yaml", cwd=tmp_path)
    assert "smallest attainable p = 0.0295" in str(err.value)
    pilot(2)
    assert PilotRun(tmp_path / "pilot.yaml", cwd=tmp_path).pilot.sampling.sampled.prompts == 2


def test_the_diagnosis_sizes_a_difference_and_claims_no_direction() -> None:
    """Sharper and flatter candidates both fail; the sentence gives the statistic and its flag
    level and says whole outputs differ, never which way (the test is two-sided)."""
    lm = MarkovLM(CHAT_LIKE, seed=31)
    rng = np.random.default_rng(32)
    base = lm.sampler(1.0)
    for temperature in (0.5, 2.0):
        res = distribution_check(lm.draw(base, 6, 8, 16, rng),
                                 lm.draw(lm.sampler(temperature), 6, 8, 16, rng))
        assert res.outcome == "fail", res.summary
        assert res.summary.startswith(
            f"sampled outputs differ from the reference's: distance (mean MMD^2) "
            f"{res.distance:.4f}, flagged from {res.critical:.4f}")
        assert "exact per-position test" in res.summary
        for wrong in ("less varied", "more varied", "less diverse", "more diverse", "sharper",
                      "flatter"):
            assert wrong not in res.summary


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_sampled_pass_that_cannot_see_greedy_verification_is_refused() -> None:
    """The MMD budget rule passes 2 prompts x 5 samples, but one token each is too few for
    the exact test to see drafts verified greedily: refused before anything boots, naming
    the keys; a budget that sees it says, with its power, what else it sees."""
    base: dict[str, Any] = {
        "target": {"model": "m"}, "trace": {"files": ["t.jsonl"]},
        "conditions": {"b": {"role": "baseline"}, "c": {"role": "candidate"}}}
    small = make_pilot(**base, sampling={"sampled": {
        "enabled": True, "samples_per_prompt": 5, "prompts": 2, "max_new_tokens": 1}})
    assert budget_problem(2, 5, 0.01) is None
    problem = sampling_budget_problem(small, trace_prompts=20)
    assert problem is not None and "greedy verification" in problem
    assert "sampling.sampled.prompts" in problem
    shipped = make_pilot(**base, sampling={"sampled": {
        "enabled": True, "samples_per_prompt": 8, "prompts": 4, "max_new_tokens": 24}})
    assert sampling_budget_problem(shipped, trace_prompts=20) is None
    sees = sampling_budget_sees(shipped, trace_prompts=20)
    assert sees is not None and "4x8x24" in sees and "80% power" in sees
    assert re.search(r"temperature shift of 0\.\d+", sees)
    bigger = sampling_budget_sees(make_pilot(**base, sampling={"sampled": {
        "enabled": True, "samples_per_prompt": 8, "prompts": 16, "max_new_tokens": 24}}), 20)
    shift = float(re.search(r"shift of ([\d.]+)", sees).group(1))  # type: ignore[union-attr]
    assert bigger is not None and float(
        re.search(r"shift of ([\d.]+)", bigger).group(1)) < shift  # type: ignore[union-attr]
