"""Sampled-output homogeneity: does a candidate sample from the same distribution as a reference?

Lossless speculative sampling leaves the distribution of every output sequence unchanged, so
for each prompt the candidate's sampled outputs and the reference's are two samples from one
distribution. This module tests that, prompt by prompt, on two features:

* **tokens** at each of the first ``positions`` output positions (an ended sequence counts as
  the category ``END``). Position j's token depends on the sampled prefix, which differs
  between samples: what is compared is the *marginal* distribution of the token at position
  j (over the whole random prefix), which lossless speculative sampling leaves equal.
* **lengths** (number of output tokens), by the two-sample Cramer-von Mises statistic on the
  pooled empirical CDFs; ties, usual with discrete lengths, are fine under permutation.

Two token statistics per position, on the 2 x K table (condition x token):

* *omnibus*: Pearson's chi-square, for any change in the distribution;
* *concentration*: the difference in within-condition repeat rates, an unbiased estimate of
  sum(p_ref^2) - sum(p_cand^2). Temperature, top-p and top-k errors all make a sampler
  sharper or flatter, and this is far more powerful against them than an omnibus test.

Why permutation instead of the asymptotic chi-square with rare categories pooled ("expected
< 5 into other"): a small model samples from very flat distributions (the tiny test target's
entropy is about 6.5 nats), so with 32 samples nearly every token is seen once and pooling
would merge everything into "other" and see nothing. The evidence there is in *repeats*, which
the unpooled tables keep, and permutation makes the tests exact at any sample size. Permuting
whole samples between the conditions is exact under H0 (the samples of a prompt are
exchangeable), so the dependence between positions of one sample needs no model. The two sides
must be drawn independently (the campaign seeds each condition apart): draws that share their
random numbers come out coupled, and the test then loses most of its power.

Combination, with the family-wise error controlled exactly: per prompt the position
statistics are summed and standardised by their permutation mean and SD; the b-th permutation
of every prompt is taken jointly, so every combined statistic has an exact permutation null.
Four combined tests: omnibus-sum (sum of prompt z-scores: a diffuse change, e.g. a sampler
bug that touches every prompt), omnibus-max (max over prompts, Westfall-Young style: a change
confined to a few prompts, multiplicity over prompts included), concentration (|sum of signed
prompt z-scores|: sharper or flatter everywhere) and lengths (sum of prompt z-scores). Holm
over the informative ones (a test no permutation can change is dropped, which depends only on
the pooled data and so keeps the level) controls the false-alarm rate at ``alpha``. Monte
Carlo p-values ``(1 + #{T_b >= T_obs}) / (B + 1)`` are valid for any number B of permutations.
Fisher or Stouffer over per-prompt p-values would also be valid (prompts are independent) but
is coarse with Monte Carlo p-values and has no max-type view; the joint permutation does both.

"pass" means no difference was detected: evidence of sameness only as far as the budget had
power. ``tests/test_distribution.py`` establishes, for the default budget (16 prompts x 32
samples x 8 positions), power >= 0.8 against temperature 1.0 vs 0.8 and top-p 1.0 vs 0.9 for
chat-like samplers (mean next-token entropy about 1 nat); smaller budgets are flagged
``underpowered``. Power against top-p falls as the sampler flattens (0.8-0.9 at 1.8 nats,
0.25-0.55 at 3 nats): flat samplers, such as the tiny test target, need about 128 samples.

Effect sizes: ``tv_mean`` is the total-variation distance between the two token distributions
at each position (tokens expected fewer than 5 times per side pooled into "other", so it is
not pure sampling noise), averaged over prompts and positions, beside ``tv_null``, its mean
under permutation (what identical distributions show at this budget); ``repeat_ratio`` is the
candidate's within-condition repeat rate over the reference's (> 1: the candidate samples
more sharply, as with a lower temperature or top-p).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..results.records import RequestRecord
from .stats import FloatArray, StatsError, holm

END = -1  # category of a position after the sequence ended
DEFAULT_PROMPTS = 16
DEFAULT_SAMPLES = 32
DEFAULT_POSITIONS = 8
POOL_EXPECTED = 5.0
FAMILIES = ("omnibus-sum", "omnibus-max", "concentration", "lengths")
Samples = Mapping[str, Sequence[Sequence[int]]]


@dataclass(frozen=True)
class DistributionResult:
    """Homogeneity of sampled outputs, reference vs candidate (see the module docstring)."""

    outcome: Literal["pass", "fail"]
    min_adjusted_p: float
    worst_prompt: str | None
    worst_position: int | None  # None with a worst prompt: its output length
    worst_detail: str
    tv_mean: float
    tv_null: float
    repeat_ratio: float | None  # candidate repeat rate / reference's; None: no repeats at all
    n_tests: int  # informative (prompt, position) tables + informative length comparisons
    n_prompts: int
    samples_per_prompt: int  # fewest samples on either side of any compared prompt
    positions: int
    alpha: float
    permutations: int
    underpowered: bool
    adjusted_p: dict[str, float] = field(default_factory=dict)  # family -> Holm-adjusted p
    summary: str = ""


@dataclass
class _Prompt:
    """One prompt's statistics under permutation: row 0 observed, rows 1.. permuted."""

    pid: str
    chi: FloatArray  # (B+1, k) chi-square per position
    conc: FloatArray  # (B+1, k) repeat-rate difference per position
    tv: FloatArray  # (B+1, k) pooled total variation per position
    length: FloatArray  # (B+1,) Cramer-von Mises statistic
    repeats: FloatArray  # (2, k) observed repeat rate per position: reference, candidate


def records_to_samples(
    records: Iterable[RequestRecord], condition: str
) -> dict[str, list[list[int]]]:
    """Prompt id -> output token ids of ``condition``'s completed sampled requests."""
    kept = sorted(
        (r for r in records if r.condition == condition and r.mode == "sampled" and r.ok),
        key=lambda r: (r.prompt_id, r.sample_index, r.boot, r.repetition, r.started_at or 0.0),
    )
    out: dict[str, list[list[int]]] = {}
    for r in kept:
        out.setdefault(r.prompt_id, []).append(list(r.output_ids))
    return out


def _z(stat: FloatArray) -> FloatArray:
    """Standardise along axis 0 by the permutation mean/SD (all rows, the observed included).

    The constants are symmetric in the B+1 rows, so the rows stay exchangeable under H0. A
    statistic no permutation changes carries no information: its z is 0.
    """
    sd = stat.std(axis=0)
    scale = 1e-12 * np.maximum(1.0, np.abs(stat).max(axis=0))
    return np.where(sd > scale, (stat - stat.mean(axis=0)) / np.where(sd > scale, sd, 1.0), 0.0)


def _p(stat: FloatArray) -> float:
    """Monte Carlo permutation p-value of row 0 (large is extreme), ties counted against."""
    tol = 1e-9 * max(1.0, abs(float(stat[0])))
    return float(np.count_nonzero(stat >= stat[0] - tol) / stat.shape[0])


def _varies(stat: FloatArray) -> bool:
    return bool(np.ptp(stat) > 1e-9 * max(1.0, float(np.abs(stat).max())))


def _one_prompt(
    pid: str, seqs: Sequence[Sequence[int]], n_a: int, k: int, groups: FloatArray
) -> _Prompt:
    n = len(seqs)
    n_b = n - n_a
    tokens = np.full((n, k), END, dtype=np.int64)
    for i, s in enumerate(seqs):
        m = min(len(s), k)
        tokens[i, :m] = np.asarray(s[:m], dtype=np.int64)
    # Sort each position's samples by category: a category's reference-group count under
    # every permutation is then one gather and one reduceat over its run of samples.
    order = np.argsort(tokens, axis=0, kind="stable")
    sorted_tok = np.take_along_axis(tokens, order, axis=0)
    new = np.ones((n, k), dtype=bool)
    new[1:] = sorted_tok[1:] != sorted_tok[:-1]
    run = np.cumsum(new.T.ravel()) - 1  # category index of each (position, sorted sample)
    t_all = np.bincount(run).astype(np.float64)
    pos_all = np.repeat(np.arange(k), new.sum(axis=0))
    # Tokens seen once (most of them, from a flat sampler) enter every statistic linearly,
    # so per position only their count in the reference group is needed: a small matmul.
    single_cell = (t_all[run] == 1).reshape(k, n)  # position-major, sorted order
    singles = np.zeros((n, k))
    singles[order.T[single_cell], np.nonzero(single_cell)[0]] = 1.0
    s_a = groups @ singles  # (B+1, k)
    s_n = singles.sum(axis=0)
    multi = t_all >= 2
    keep = multi[run]
    a = groups[:, :0]
    if keep.any():
        kept_run = run[keep]
        starts = np.flatnonzero(np.r_[True, kept_run[1:] != kept_run[:-1]])
        a = np.add.reduceat(groups[:, order.T.ravel()[keep]], starts, axis=1)
    t, pos = t_all[multi], pos_all[multi]
    to_pos = np.zeros((t.size, k))
    to_pos[np.arange(t.size), pos] = 1.0
    b = t - a
    norm = n * n / (n_a * n_b)
    chi = ((a - n_a * t / n) ** 2 / t) @ to_pos * norm
    chi += ((n_a / n) ** 2 * s_n + (1 - 2 * n_a / n) * s_a) * norm
    rep_a = (a * (a - 1) / (n_a * (n_a - 1))) @ to_pos
    rep_b = (b * (b - 1) / (n_b * (n_b - 1))) @ to_pos
    share = a / n_a - b / n_b
    rare = t * min(n_a, n_b) / n < POOL_EXPECTED
    common = np.abs(share[:, ~rare]) @ to_pos[~rare]
    other = share[:, rare] @ to_pos[rare] + s_a * (1 / n_a + 1 / n_b) - s_n / n_b
    lengths = np.array([len(s) for s in seqs], dtype=np.float64)
    values, counts = np.unique(lengths, return_counts=True)
    a_cum = groups @ (lengths[:, None] <= values[None, :]).astype(np.float64)
    gap = a_cum / n_a - (counts.cumsum() - a_cum) / n_b
    return _Prompt(
        pid=pid,
        chi=chi,
        conc=rep_a - rep_b,
        tv=0.5 * (common + np.abs(other)),
        length=(gap**2 * counts).sum(axis=1),
        repeats=np.vstack([rep_a[0], rep_b[0]]),
    )


def _at(seqs: Sequence[Sequence[int]], j: int) -> npt.NDArray[np.int64]:
    return np.array([s[j] if j < len(s) else END for s in seqs], dtype=np.int64)


def _detail(ref: Sequence[Sequence[int]], cand: Sequence[Sequence[int]], j: int) -> str:
    """The category whose share differs most at position j, e.g. 'token 42: 12/32 vs 3/32'."""
    ra, ca = _at(ref, j), _at(cand, j)
    cats = np.union1d(ra, ca)
    na = (ra[:, None] == cats).sum(axis=0)
    nb = (ca[:, None] == cats).sum(axis=0)
    c = int(np.argmax(np.abs(na / len(ref) - nb / len(cand))))
    name = "END" if cats[c] == END else f"token {int(cats[c])}"
    return f"{name}: {int(na[c])}/{len(ref)} vs {int(nb[c])}/{len(cand)}"


def distribution_check(
    reference: Samples,
    candidate: Samples,
    positions: int = DEFAULT_POSITIONS,
    alpha: float = 0.01,
    *,
    permutations: int = 999,
    seed: int = 0,
) -> DistributionResult:
    """Test that ``candidate`` samples like ``reference``, prompt by prompt (module docstring).

    ``reference``/``candidate`` map prompt id -> sampled outputs (token-id sequences). Prompts
    with at least 2 samples on each side are compared. "fail" when the smallest Holm-adjusted
    p-value of the combined tests is <= ``alpha``. Deterministic for a given ``seed``. Raises
    :class:`StatsError` when nothing can be compared or the settings cannot reach ``alpha``.
    """
    if not 0 < alpha < 1:
        raise StatsError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    if positions < 1:
        raise StatsError(f"positions must be >= 1, got {positions}")
    if (permutations + 1) * alpha / len(FAMILIES) < 1:
        raise StatsError(
            f"{permutations} permutations cannot reach p <= alpha/{len(FAMILIES)} = "
            f"{alpha / len(FAMILIES):g}; use at least {math.ceil(len(FAMILIES) / alpha) - 1}"
        )
    ids = sorted(p for p in set(reference) & set(candidate)
                 if len(reference[p]) >= 2 and len(candidate[p]) >= 2)
    if not ids:
        raise StatsError("no prompt has at least 2 sampled outputs in both reference and candidate")
    rng = np.random.default_rng(seed)
    cache: dict[tuple[int, int], FloatArray] = {}
    prompts = []
    for pid in ids:
        n_a, n_b = len(reference[pid]), len(candidate[pid])
        groups = cache.get((n_a, n_b))
        if groups is None:  # one permutation set shared by prompts: the joint null stays exact
            ranks = rng.random((permutations, n_a + n_b)).argsort(axis=1).argsort(axis=1)
            groups = np.vstack([np.arange(n_a + n_b) < n_a, ranks < n_a]).astype(np.float64)
            cache[(n_a, n_b)] = groups
        seqs = [*reference[pid], *candidate[pid]]
        prompts.append(_one_prompt(pid, seqs, n_a, positions, groups))
    return _judge(prompts, reference, candidate, positions, alpha, permutations)


def _judge(
    prompts: list[_Prompt], reference: Samples, candidate: Samples, k: int, alpha: float,
    permutations: int,
) -> DistributionResult:
    chi_z = np.stack([_z(p.chi.sum(axis=1)) for p in prompts], axis=1)  # (B+1, prompts)
    conc_z = np.stack([_z(p.conc.sum(axis=1)) for p in prompts], axis=1)
    len_z = np.stack([_z(p.length) for p in prompts], axis=1)
    combined = {
        "omnibus-sum": chi_z.sum(axis=1),
        "omnibus-max": chi_z.max(axis=1),
        "concentration": np.abs(conc_z.sum(axis=1)),
        "lengths": len_z.sum(axis=1),
    }
    tested = [f for f in FAMILIES if _varies(combined[f])]
    adjusted = dict(zip(tested, holm([_p(combined[f]) for f in tested]), strict=True))
    min_adj = min(adjusted.values(), default=1.0)
    # The single most different comparison, by the permutation z of its observed statistic.
    chi = np.stack([p.chi for p in prompts], axis=1)  # (B+1, prompts, k)
    chi_varies = np.ptp(chi, axis=0) > 1e-9 * np.maximum(1.0, np.abs(chi).max(axis=0))
    len_varies = np.array([_varies(p.length) for p in prompts])
    n_tests = int(chi_varies.sum() + len_varies.sum())
    cell_z = np.where(chi_varies, _z(chi)[0], -np.inf)
    len_cell = np.where(len_varies, len_z[0], -np.inf)
    worst: _Prompt | None = None
    wpos: int | None = None
    worst_z = max(float(cell_z.max()), float(len_cell.max()))
    if not np.isfinite(worst_z):
        detail = "no position or length varies: nothing tells the conditions apart"
    elif worst_z > cell_z.max():
        worst = prompts[int(np.argmax(len_cell))]
        means = [np.mean([len(s) for s in side[worst.pid]]) for side in (reference, candidate)]
        detail = (f"{worst.pid} output length: mean {means[0]:.1f} vs {means[1]:.1f} tokens "
                  f"(z={worst_z:.1f})")
    else:
        i, wpos = (int(v) for v in np.unravel_index(int(np.argmax(cell_z)), cell_z.shape))
        worst = prompts[i]
        found = _detail(reference[worst.pid], candidate[worst.pid], wpos)
        detail = f"{worst.pid} position {wpos}: {found} (z={worst_z:.1f})"
    tv_obs = float(np.mean([p.tv[0].mean() for p in prompts]))
    tv_null = float(np.mean([p.tv[1:].mean() for p in prompts]))
    # Repeat rates over the positions that vary (a position every sample shares is no news).
    repeats = np.stack([p.repeats for p in prompts], axis=1)  # (2, prompts, k)
    rep_ref, rep_cand = (float(v) for v in np.where(chi_varies, repeats, 0.0).sum(axis=(1, 2)))
    ratio = rep_cand / rep_ref if rep_ref > 0 else None
    samples = min(min(len(reference[p.pid]), len(candidate[p.pid])) for p in prompts)
    under = len(prompts) < DEFAULT_PROMPTS or samples < DEFAULT_SAMPLES or k < DEFAULT_POSITIONS
    outcome: Literal["pass", "fail"] = "fail" if min_adj <= alpha else "pass"
    summary = (
        f"sampled outputs {'differ' if outcome == 'fail' else 'show no detected difference'}: "
        f"min Holm-adjusted p={min_adj:.3g} (alpha {alpha:g}; "
        + (", ".join(f"{f} {v:.3g}" for f, v in adjusted.items()) or "nothing varies")
        + f") over {len(prompts)} prompts x >= {samples} samples x {k} positions; "
        f"TV {tv_obs:.3f} per position ({tv_null:.3f} by chance alone); repeat ratio "
        + (f"{ratio:.2f}" if ratio is not None else "n/a")
        + f"; most different: {detail}"
    )
    if under:
        summary += (f"; underpowered: below the validated budget of {DEFAULT_PROMPTS} prompts x "
                    f"{DEFAULT_SAMPLES} samples x {DEFAULT_POSITIONS} positions")
    return DistributionResult(
        outcome=outcome, min_adjusted_p=min_adj, worst_prompt=worst.pid if worst else None,
        worst_position=wpos, worst_detail=detail, tv_mean=tv_obs, tv_null=tv_null,
        repeat_ratio=ratio, n_tests=n_tests, n_prompts=len(prompts), samples_per_prompt=samples,
        positions=k, alpha=alpha, permutations=permutations, underpowered=under,
        adjusted_p=adjusted, summary=summary,
    )
