"""Group-sequential speed decisions (early stopping) and the latency model that calibrates them.

A campaign runs its prompt trace in blocks and looks at the data after each one. A fixed
one-sided test repeated at every look would inflate the false-keep rate, so the keep boundary
follows a Lan-DeMets O'Brien-Fleming alpha-spending function: very strict early, close to the
fixed-design critical value at the last look, with the total false-keep rate still ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import optimize, special, stats

from .stats import StatsError, prompt_log_ratios

FloatArray = npt.NDArray[np.float64]
Decision = Literal["keep", "drop", "continue"]

_GRID = 801  # odd: Simpson's rule; boundaries come out accurate to ~1e-5


@dataclass(frozen=True)
class SequentialPlan:
    """One-sided group-sequential design: z boundaries per look at information fractions."""

    looks: int
    alpha: float
    information: tuple[float, ...]
    boundaries: tuple[float, ...]


@dataclass(frozen=True)
class SequentialDecision:
    """What to do after ``look`` blocks: keep (ship), drop, or run another block."""

    look: int
    z: float
    boundary: float
    decision: Decision
    estimate: float


def obf_spending(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-like one-sided alpha spent by information fraction ``t``."""
    if t <= 0:
        return 0.0
    return float(2.0 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(t)))


def _normal_pdf(x: FloatArray, var: float) -> FloatArray:
    return np.asarray(np.exp(-x * x / (2 * var)) / math.sqrt(2 * math.pi * var), dtype=np.float64)


def _boundaries(information: Sequence[float], spent: Sequence[float]) -> list[float]:
    """z boundaries whose first-crossing probabilities under H0 equal the spent increments.

    Works on the score scale S(t) = Z(t) sqrt(t), a Brownian motion with independent
    increments: the sub-density of S at each look on the continuation region is carried
    forward by numerical convolution (Armitage-McPherson-Rowe recursion, Simpson's rule).
    """
    bounds = [float(stats.norm.isf(spent[0]))]
    grid = np.linspace(-8 * math.sqrt(information[0]), bounds[0] * math.sqrt(information[0]), _GRID)
    density = _normal_pdf(grid, information[0])
    for k in range(1, len(information)):
        t, step = information[k], information[k] - information[k - 1]
        weights = density * _simpson_weights(grid)
        target = spent[k] - spent[k - 1]
        c_k = float(
            optimize.brentq(
                _crossing, -10.0, 40.0, args=(t, step, grid, weights, target), xtol=1e-10
            )
        )
        bounds.append(c_k)
        new_grid = np.linspace(-8 * math.sqrt(t), c_k * math.sqrt(t), _GRID)
        density = _normal_pdf(new_grid[:, None] - grid[None, :], step) @ weights
        grid = new_grid
    return bounds


def _crossing(
    c: float, t: float, step: float, grid: FloatArray, weights: FloatArray, target: float
) -> float:
    """P(continue so far, then cross c at information t) minus the alpha to spend there."""
    cross = stats.norm.sf((c * math.sqrt(t) - grid) / math.sqrt(step))
    return float(weights @ cross) - target


def _simpson_weights(grid: FloatArray) -> FloatArray:
    w = np.ones(grid.size)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return np.asarray(w * (grid[1] - grid[0]) / 3.0, dtype=np.float64)


def obrien_fleming_plan(looks: int, alpha: float = 0.025) -> SequentialPlan:
    """Lan-DeMets O'Brien-Fleming plan with ``looks`` equally spaced looks, one-sided ``alpha``.

    Equal information means each block adds the same amount of data. When blocks only add
    repetitions of the same prompts, information grows more slowly than that (prompt-level
    variation does not average out); looks are then more correlated than planned, which by
    Slepian's inequality makes the plan conservative, not liberal.
    """
    if not 1 <= looks <= 50:
        raise StatsError(f"looks must be between 1 and 50, got {looks}")
    if not 0 < alpha < 0.5:
        raise StatsError(f"alpha must lie in (0, 0.5) for a one-sided plan, got {alpha}")
    info = [k / looks for k in range(1, looks + 1)]
    spent = [obf_spending(t, alpha) for t in info]
    spent[-1] = alpha  # exact by construction; avoids round-off at t = 1
    return SequentialPlan(looks, alpha, tuple(info), tuple(_boundaries(info, spent)))


def _merge(blocks: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    merged: dict[str, list[float]] = {}
    for block in blocks:
        for pid, values in block.items():
            merged.setdefault(pid, []).extend(values)
    return merged


def _t_to_z(t: float, df: int) -> float:
    """Map a t statistic to the normal quantile with the same tail probability.

    The boundaries assume normal statistics; comparing a t statistic from 20 prompts to them
    directly would be liberal. Matching tail probabilities keeps the error rate.
    """
    if t >= 0:  # work in the tail that is small, where the quantiles stay precise
        return -float(special.ndtri(special.stdtr(df, -t)))
    return float(special.ndtri(special.stdtr(df, t)))


def _z_against(d: FloatArray, log_threshold: float) -> float:
    shift = float(d.mean()) - log_threshold
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return math.copysign(math.inf, shift) if shift else 0.0
    return _t_to_z(shift / (sd / math.sqrt(d.size)), d.size - 1)


def sequential_speedup(
    blocks_reference: Sequence[Mapping[str, Sequence[float]]],
    blocks_candidate: Sequence[Mapping[str, Sequence[float]]],
    threshold: float,
    plan: SequentialPlan,
    futility_threshold: float | None = None,
) -> SequentialDecision:
    """Decide after the latest block: keep, drop, or continue.

    The data of all blocks so far are pooled per prompt (see ``prompt_log_ratios``); z is the
    one-sided t statistic over prompts of mean log-ratio - log(threshold), mapped to the normal
    scale. Keep when z >= the plan's boundary at this look (look = number of blocks).

    Futility (non-binding, so it never raises the false-keep rate): with
    ``futility_threshold`` F given, drop early when the data show the speedup is below F with
    the same strength the keep rule demands (z against log F <= -boundary). Pass the speedup
    the candidate must reach to be worth having; at that true speedup an early drop has
    probability <= alpha, so power drops by at most alpha. Without F nothing is dropped early.
    At the final look the decision is keep or drop.
    """
    if len(blocks_reference) != len(blocks_candidate):
        raise StatsError(
            f"reference has {len(blocks_reference)} blocks, candidate {len(blocks_candidate)}"
        )
    look = len(blocks_reference)
    if not 1 <= look <= plan.looks:
        raise StatsError(f"got {look} blocks; the plan has looks 1..{plan.looks}")
    for name, value in (("threshold", threshold), ("futility_threshold", futility_threshold)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise StatsError(f"{name} must be a positive speedup, got {value}")
    _, d, _ = prompt_log_ratios(_merge(blocks_reference), _merge(blocks_candidate))
    if d.size < 2:
        raise StatsError("need at least 2 paired prompts for a sequential test, got 1")
    z = _z_against(d, math.log(threshold))
    boundary = plan.boundaries[look - 1]
    futile = futility_threshold is not None and (
        _z_against(d, math.log(futility_threshold)) <= -boundary
    )
    decision: Decision = "continue"
    if z >= boundary:
        decision = "keep"
    elif look == plan.looks or futile:
        decision = "drop"
    return SequentialDecision(look, z, boundary, decision, math.exp(float(d.mean())))


# --------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class LatencyModel:
    """Latency model used to validate the statistics (tests, benchmarks/stats_calibration.py).

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


def as_blocks(latencies: FloatArray, reps_per_block: int) -> list[dict[str, list[float]]]:
    """Split one pilot's (n_prompts, n_reps) latencies into blocks of ``reps_per_block``."""
    n_prompts, n_reps = latencies.shape
    return [
        {f"p{i}": latencies[i, start : start + reps_per_block].tolist() for i in range(n_prompts)}
        for start in range(0, n_reps, reps_per_block)
    ]
