"""Monte-Carlo validation: error rates at the null and power at the declared effect.

Every test simulates pilots from ``LatencyModel`` (seeded) and runs the real functions.
Rates are judged with exact binomial tests at the 0.1% level, so a seeded run that fails
means the method, not the dice, is off: "at most alpha" fails only if the observed count is
significantly above alpha; "at least the prediction" only if significantly below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.speed.across_runs import paired_speedup
from pytest_osprey.judgement.stats.core import FloatArray
from pytest_osprey.judgement.stats.noninferiority import mcnemar_noninferiority

SIG = 0.001  # significance of the Monte-Carlo checks themselves


@dataclass(frozen=True)
class LatencyModel:
    """Independent-noise latency model for the run-to-run comparison (history) statistics.

    Per prompt: a lognormal base latency (``prompt_sd``; cancels in the pairing) and a
    lognormal prompt-specific speedup around the true one (``interaction_sd``: acceptance
    varies by prompt). Per request: log-noise ``noise_sd`` x Student-t(``noise_df``),
    standardised (``noise_df=inf``: normal), and with probability ``spike_prob`` a stall
    multiplying the latency by 1 + Pareto(``spike_shape``).
    The true speedup s (geometric mean over prompts) divides candidate latencies.
    """

    base_s: float = 2.0
    prompt_sd: float = 0.6
    interaction_sd: float = 0.1
    noise_sd: float = 0.25
    noise_df: float = 5.0
    spike_prob: float = 0.03
    spike_shape: float = 1.5

    def sample(
        self, rng: np.random.Generator, n_sims: int, n_prompts: int, n_reps: int, speedup: float
    ) -> tuple[FloatArray, FloatArray]:
        """(reference, candidate) latencies, each of shape (n_sims, n_prompts, n_reps)."""
        log_base = math.log(self.base_s) + self.prompt_sd * rng.standard_normal(
            (n_sims, n_prompts, 1)
        )
        log_gain = math.log(speedup) + self.interaction_sd * rng.standard_normal(
            (n_sims, n_prompts, 1)
        )
        shape = (n_sims, n_prompts, n_reps)
        return self._noisy(rng, log_base, shape), self._noisy(rng, log_base - log_gain, shape)

    def _noisy(
        self, rng: np.random.Generator, log_mu: FloatArray, shape: tuple[int, ...]
    ) -> FloatArray:
        if math.isinf(self.noise_df):
            noise = self.noise_sd * rng.standard_normal(shape)
        else:
            df = self.noise_df  # needs df > 2 for a finite variance to standardise by
            noise = self.noise_sd * rng.standard_t(df, shape) / math.sqrt(df / (df - 2))
        spikes = np.where(
            rng.random(shape) < self.spike_prob, rng.pareto(self.spike_shape, shape), 0.0
        )
        return np.asarray(np.exp(log_mu + noise) * (1.0 + spikes), dtype=np.float64)

    def log_ratio_sd(self, n_reps: int, n: int = 200_000, seed: int = 12345) -> float:
        """SD of a prompt's pooled log-ratio with ``n_reps`` repetitions (by simulation)."""
        ref, cand = self.sample(np.random.default_rng(seed), 1, n, n_reps, 1.0)
        d = np.log(ref).mean(axis=-1) - np.log(cand).mean(axis=-1)
        return float(d.std())



def assert_rate_at_most(hits: int, n: int, alpha: float, what: str) -> None:
    p = stats.binomtest(hits, n, alpha, alternative="greater").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly above {alpha}"


def assert_rate_at_least(hits: int, n: int, target: float, what: str) -> None:
    p = stats.binomtest(hits, n, target, alternative="less").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly below {target:.4f}"


def _mapping(latencies: FloatArray) -> dict[str, list[float]]:
    return {f"p{i}": row.tolist() for i, row in enumerate(latencies)}


def _run_fixed(
    model: LatencyModel, speedup: float, threshold: float, n_sims: int, seed: int
) -> dict[str, int]:
    ref, cand = model.sample(np.random.default_rng(seed), n_sims, 20, 2, speedup)
    counts = {"pass": 0, "fail": 0, "inconclusive": 0}
    for i in range(n_sims):
        res = paired_speedup(_mapping(ref[i]), _mapping(cand[i]), threshold=threshold, seed=i)
        counts[res.outcome] += 1
    return counts


# --------------------------------------------------------------------------- paired speedup


@pytest.mark.slow  # over a second on 2 busy cores
def test_paired_speedup_false_pass_at_threshold_heavy_tails() -> None:
    """True speedup == threshold (1.1), 20 prompts x 2 reps, Student-t noise + Pareto stalls."""
    n_sims, alpha = 2000, (1 - 0.95) / 2
    counts = _run_fixed(LatencyModel(), speedup=1.1, threshold=1.1, n_sims=n_sims, seed=101)
    assert_rate_at_most(counts["pass"], n_sims, alpha, "false pass")
    assert_rate_at_most(counts["fail"], n_sims, alpha, "false fail")


@pytest.mark.slow  # over a second on 2 busy cores
def test_paired_speedup_power_at_declared_effect() -> None:
    """Speedup 1.3 vs threshold 1.0, 20 prompts x 2 reps, lognormal noise (log-SD 0.35).

    The analytic prediction is the one-sided t-test's power (noncentral t) with the model's
    true SD of per-prompt log-ratios: sqrt(interaction^2 + 2 * noise^2 / reps).
    """
    model = replace(LatencyModel(), noise_sd=0.35, noise_df=math.inf, spike_prob=0.0)
    sd = math.sqrt(model.interaction_sd**2 + 2 * model.noise_sd**2 / 2)
    n, alpha = 20, 0.025
    predicted = stats.nct.sf(
        stats.t.ppf(1 - alpha, n - 1), n - 1, math.sqrt(n) * math.log(1.3) / sd
    )
    assert 0.8 < predicted < 0.9  # the scenario is informative: neither trivial nor hopeless
    n_sims = 1000
    counts = _run_fixed(model, speedup=1.3, threshold=1.0, n_sims=n_sims, seed=202)
    assert_rate_at_least(counts["pass"], n_sims, predicted, "power")
    assert counts["fail"] == 0



LOOKS, PROMPTS = 4, 20  # a block replays 20 prompts once per condition


def _fixed_t_passes(d: FloatArray) -> int:
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(d.shape[1]))
    return int(np.sum(t > stats.t.ppf(0.975, d.shape[1] - 1)))


# --------------------------------------------------------------------------- other tests


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("p_loss", "n"), [(0.1, 80), (0.05, 100)])
def test_mcnemar_size_at_the_margin(p_loss: float, n: int) -> None:
    """p_cand - p_ref == -margin exactly: declaring non-inferiority happens <= alpha.

    p_loss = margin is the hardest case: the candidate never gains, so every discordant
    pair is a loss and few pairs are discordant.
    """
    n_sims, margin, alpha = 1500, 0.05, 0.05
    p_gain = p_loss - margin
    rng = np.random.default_rng(808)
    cells = rng.choice(3, size=(n_sims, n), p=[p_gain, p_loss, 1 - p_gain - p_loss])
    passes = 0
    for row in cells:
        ref = (row != 0).tolist()  # gains: reference failed, candidate passed
        cand = (row != 1).tolist()  # losses: reference passed, candidate failed
        passes += mcnemar_noninferiority(ref, cand, margin, alpha).outcome == "pass"
    assert_rate_at_most(passes, n_sims, alpha, "McNemar false non-inferiority")
