"""Sampled-output homogeneity: does a candidate sample from the same distribution as a reference?

Lossless speculative sampling leaves the distribution of every output sequence unchanged, so
for each prompt the candidate's sampled outputs and the reference's are two samples from one
distribution. The test compares whole sampled sequences, prompt by prompt, and combines the
prompts in one stratified permutation test.

**Statistic.** Per prompt, the unbiased squared maximum mean discrepancy (MMD^2, Gretton et
al. 2012) between the two sets of sequences under a sequence kernel, the mean of four
similarities in [0, 1] (each 1 for a sequence with itself):

* *tokens*: cosine of the two sequences' token counts (what is said, in any order);
* *bigrams*: cosine of their counts of adjacent token pairs (local content and phrasing);
* *positions*: the share of positions holding the same token (an ended sequence holds END);
* *length*: a Gaussian of the length difference (bandwidth: the median pooled difference).

A sampler error moves these similarities (a changed temperature or top-p changes how alike
a prompt's samples are; a changed vocabulary or phrasing moves the token and bigram terms;
lengths catch early or late stops), but the test is two-sided: it says *that* the samples
differ and by how much, never how the sampler errs (garbage sampling parameters can make
samples loop on one token in one run and near-uniform in the next). Where the target's
logprobs are available, the exact per-position test (:mod:`.exact`) says where and how.

MMD^2 is a difference of mean similarities (within the reference + within the candidate - 2 x
across), estimated without the self-similarities, so it is unbiased: about 0 for identical
samplers at any sample size.

**Test.** Under H0 the samples of one prompt are exchangeable between the conditions, so
relabelling them is exact. Each prompt is relabelled *independently* (a stratified
permutation): the b-th permutation draws a fresh split of every prompt, and the combined
statistic is the sum over prompts of each prompt's MMD^2 standardised by its own
permutation mean and SD (the constants are symmetric in the permutation rows, so the rows stay
exchangeable). With prompts relabelled jointly the number of distinct relabellings is the
product of the prompts' counts, so the smallest attainable p-value shrinks geometrically with
prompts (4 prompts x 4 + 4 samples: (2/70)^4 exactly, 1/(B + 1) with B random relabellings),
where one relabelling shared by all prompts stays at 2/70 whatever the number of prompts.
The Monte Carlo p-value ``(1 + #{T_b >= T_obs}) / (B + 1)`` is valid for any B.
:func:`smallest_p` gives the floor for a budget; a budget that cannot reach alpha cannot fail,
so the gate refuses it before the campaign (or reports "cannot detect at this budget" when a
saved campaign is judged), never a pass.

The two sides must be drawn independently (the campaign seeds every condition, prompt and
sample apart): draws that share their random numbers come out coupled, and the test then
loses most of its power.

**Effect size.** ``distance``: the mean over prompts of the unbiased MMD^2 (0 expected for
identical samplers, so it does not read 0 by construction at small samples), beside
``critical``: the (1 - alpha) quantile of the same mean under relabelling, the smallest
distance this budget flags. ``similarity_ratio``: the candidate's mean within-prompt
similarity over the reference's, a descriptive figure kept as data: the test does not judge
it, and the summary draws no direction from it.

"pass" means no difference was detected: evidence of sameness only as far as the budget has
power. benchmarks/distribution_power.py measures power and false alarms on real samples of a
target; tests/judgement/test_distribution.py establishes them by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from ...results.records import RequestRecord
from ..stats.core import FloatArray, StatOutcome, StatsError

END = -1  # what a position holds after the sequence ended
PERMUTATIONS = 999
# The kernel test holds a few (n x n) matrices per prompt, n the samples of both sides, and
# relabels them PERMUTATIONS times: 512 a side keeps a prompt under ~60 MB and seconds, and
# already detects far smaller differences than the test can be asked to (a seeded sub-sample
# of each side is compared beyond it; the attainable-p check uses the sizes compared).
MAX_SAMPLES_PER_SIDE = 512
KERNELS = ("tokens", "bigrams", "positions", "length")
DIVERSITY = ("tokens", "bigrams", "positions")  # the similarities the diversity view uses
Samples = Mapping[str, Sequence[Sequence[int]]]


@dataclass(frozen=True)
class PromptStat:
    """One prompt's comparison."""

    prompt_id: str
    n_reference: int
    n_candidate: int
    mmd2: float  # unbiased MMD^2, observed
    z: float  # standardised by its permutation mean and SD
    within_reference: float  # mean similarity of two reference samples
    within_candidate: float
    across: float  # mean similarity of a reference and a candidate sample
    mean_length: tuple[float, float]  # reference, candidate


@dataclass(frozen=True)
class DistributionResult:
    """Homogeneity of sampled outputs, reference vs candidate (see the module docstring)."""

    outcome: StatOutcome
    p_value: float
    smallest_p: float  # the floor this budget allows (smallest_p())
    alpha: float
    distance: float  # mean unbiased MMD^2 over prompts
    critical: float  # (1 - alpha) permutation quantile of distance: smallest flagged
    similarity_ratio: float | None  # candidate within-similarity / reference's
    n_prompts: int
    samples_per_prompt: int  # fewest samples on either side of any compared prompt
    positions: int | None  # tokens compared per sample (None: whole outputs)
    permutations: int
    prompts: list[PromptStat] = field(default_factory=list)
    p_parts: dict[str, float] = field(default_factory=dict)  # each view's own p-value
    worst: str = ""
    summary: str = ""


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


# --------------------------------------------------------------------------- attainability


def smallest_p(sizes: Sequence[tuple[int, int]], permutations: int = PERMUTATIONS) -> float:
    """The smallest p-value the test can report for prompts of ``(n_ref, n_cand)`` samples.

    Exactly, the most extreme relabelling is one of prod_i C(n_i, n_ref_i) equally likely
    ones (two with equal sides: swapping the sides gives the same MMD^2); with B random
    relabellings the p-value of that data is about ``(1 + B * exact) / (B + 1)``.
    """
    log_exact = 0.0
    for n_a, n_b in sizes:
        if n_a < 2 or n_b < 2:
            continue  # not compared
        log_exact += math.log(2 if n_a == n_b else 1) - math.log(math.comb(n_a + n_b, n_a))
    if not any(a >= 2 and b >= 2 for a, b in sizes):
        return 1.0
    exact = math.exp(log_exact)
    return min(1.0, (1 + permutations * exact) / (permutations + 1))


def budget_problem(
    prompts: int, samples_per_prompt: int, alpha: float, permutations: int = PERMUTATIONS
) -> str | None:
    """Why a budget of ``prompts`` x ``samples_per_prompt`` (per side) cannot fail at
    ``alpha``, or None when it can."""
    if samples_per_prompt < 2:
        return (f"{samples_per_prompt} sample(s) per prompt: at least 2 per side are needed to "
                "compare a prompt's samples")
    floor = smallest_p([(samples_per_prompt, samples_per_prompt)] * prompts, permutations)
    if floor <= alpha:
        return None
    need = next((s for s in range(samples_per_prompt, 10_001)
                 if smallest_p([(s, s)] * prompts, permutations) <= alpha), None)
    more_prompts = next((p for p in range(prompts, 1_001)
                         if smallest_p([(samples_per_prompt, samples_per_prompt)] * p,
                                       permutations) <= alpha), None)
    fix = []
    if need is not None:
        fix.append(f"samples_per_prompt >= {need}")
    if more_prompts is not None:
        fix.append(f"prompts >= {more_prompts}")
    return (f"{prompts} prompt(s) x {samples_per_prompt} samples per side cannot reach p <= "
            f"{alpha:g} (smallest attainable p = {floor:.3g}): the distribution check could "
            f"never fail; use {' or '.join(fix) or 'a larger budget'}")


# --------------------------------------------------------------------------- the kernel


def _bag(seqs: Sequence[Sequence[int]], order: int) -> sparse.csr_matrix:
    """Row-normalised counts of each sequence's n-grams of this ``order``."""
    index: dict[tuple[int, ...], int] = {}
    rows: list[int] = []
    cols: list[int] = []
    for i, s in enumerate(seqs):
        for j in range(len(s) - order + 1):
            rows.append(i)
            cols.append(index.setdefault(tuple(s[j: j + order]), len(index)))
    counts = sparse.csr_matrix(
        (np.ones(len(rows)), (rows, cols)), shape=(len(seqs), max(1, len(index)))
    )
    counts.sum_duplicates()
    norms = np.sqrt(np.asarray(counts.multiply(counts).sum(axis=1)).ravel())
    scale = sparse.diags(np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0))
    return sparse.csr_matrix(scale @ counts)


def kernel_parts(
    seqs: Sequence[Sequence[int]], positions: int | None = None
) -> dict[str, FloatArray]:
    """Each similarity of the sequence kernel (``KERNELS``) as a matrix over ``seqs``. Each
    depends on the pooled samples only through label-free quantities (the length bandwidth),
    so relabelling stays exact."""
    cut = [list(s[:positions]) if positions else list(s) for s in seqs]
    n = len(cut)
    parts: list[FloatArray] = []
    for order in (1, 2):
        x = _bag(cut, order)
        parts.append(np.asarray((x @ x.T).toarray(), dtype=np.float64))
    width = max((len(s) for s in cut), default=0)
    if width:
        tokens = np.full((n, width), END, dtype=np.int64)
        for i, s in enumerate(cut):
            tokens[i, : len(s)] = s
        same = np.zeros((n, n))
        for j in range(width):
            same += tokens[:, j, None] == tokens[None, :, j]
        parts.append(same / width)
    else:
        parts.append(np.ones((n, n)))
    lengths = np.array([len(s) for s in cut], dtype=np.float64)
    gaps = np.abs(lengths[:, None] - lengths[None, :])
    nonzero = gaps[gaps > 0]
    band = float(np.median(nonzero)) if nonzero.size else 1.0
    parts.append(np.exp(-0.5 * (gaps / band) ** 2))
    return dict(zip(KERNELS, parts, strict=True))


def gram(seqs: Sequence[Sequence[int]], positions: int | None = None) -> FloatArray:
    """The sequence kernel's matrix over ``seqs``: the mean of its similarities."""
    parts = kernel_parts(seqs, positions)
    return np.asarray(sum(parts.values()) / len(parts), dtype=np.float64)


def kernel_means(
    k0: FloatArray, groups: FloatArray, n_a: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """For every labelling row of ``groups`` (1 = reference): the mean similarity within the
    reference, within the candidate and across, self-pairs excluded (``k0``: zero diagonal).
    Unbiased MMD^2 = within_ref + within_cand - 2 x across."""
    n_b = k0.shape[0] - n_a
    gk = groups @ k0
    s_aa = (gk * groups).sum(axis=1)
    s_ab = gk.sum(axis=1) - s_aa
    s_bb = k0.sum() - s_aa - 2 * s_ab
    return (np.asarray(s_aa / (n_a * (n_a - 1)), dtype=np.float64),
            np.asarray(s_bb / (n_b * (n_b - 1)), dtype=np.float64),
            np.asarray(s_ab / (n_a * n_b), dtype=np.float64))


def _p(stat: FloatArray) -> float:
    """Monte Carlo permutation p-value of row 0 (large is extreme), ties counted against."""
    tol = 1e-9 * max(1.0, abs(float(stat[0])))
    return float(np.count_nonzero(stat >= stat[0] - tol) / stat.size)


def _z(stat: FloatArray) -> FloatArray:
    """Standardise by the mean/SD over all rows (the observed included): symmetric in the
    rows, so they stay exchangeable under H0. A statistic no relabelling changes: 0."""
    sd = float(stat.std())
    if sd <= 1e-12 * max(1.0, float(np.abs(stat).max())):
        return np.zeros_like(stat)
    return np.asarray((stat - stat.mean()) / sd, dtype=np.float64)


# --------------------------------------------------------------------------- the check


def _at_most(samples: Sequence[Sequence[int]], rng: np.random.Generator
             ) -> Sequence[Sequence[int]]:
    """``samples``, or a seeded sub-sample of MAX_SAMPLES_PER_SIDE of them (order kept)."""
    if len(samples) <= MAX_SAMPLES_PER_SIDE:
        return samples
    keep = np.sort(rng.choice(len(samples), MAX_SAMPLES_PER_SIDE, replace=False))
    return [samples[int(i)] for i in keep]


def distribution_check(
    reference: Samples,
    candidate: Samples,
    alpha: float = 0.01,
    *,
    positions: int | None = None,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
) -> DistributionResult:
    """Test that ``candidate`` samples like ``reference`` (module docstring).

    ``reference``/``candidate`` map prompt id -> sampled outputs (token-id sequences); prompts
    with at least 2 samples on each side are compared (``positions``: only their first
    tokens). "fail" when the p-value is <= ``alpha``; "inconclusive" when this budget's
    smallest attainable p-value exceeds ``alpha`` (it could not have failed); else "pass".
    Deterministic for a given ``seed``. Raises :class:`StatsError` on bad settings or when
    nothing can be compared.
    """
    if not 0 < alpha < 1:
        raise StatsError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    if positions is not None and positions < 1:
        raise StatsError(f"positions must be >= 1, got {positions}")
    if (permutations + 1) * alpha < 1:
        raise StatsError(f"{permutations} permutations cannot reach p <= {alpha:g}; use at "
                         f"least {math.ceil(1 / alpha) - 1}")
    ids = sorted(p for p in set(reference) & set(candidate)
                 if len(reference[p]) >= 2 and len(candidate[p]) >= 2)
    if not ids:
        raise StatsError("no prompt has at least 2 sampled outputs in both reference and candidate")
    rng = np.random.default_rng(seed)
    z_mmd = np.zeros(permutations + 1)
    z_div = np.zeros(permutations + 1)
    raw_sum = np.zeros(permutations + 1)
    stats: list[PromptStat] = []
    within = np.zeros(2)
    capped = 0
    for pid in ids:
        ref, cand = _at_most(reference[pid], rng), _at_most(candidate[pid], rng)
        capped += (len(ref), len(cand)) != (len(reference[pid]), len(candidate[pid]))
        n_a, n_b = len(ref), len(cand)
        parts = kernel_parts([*ref, *cand], positions)
        # Row 0: the observed labelling; then an independent relabelling of this prompt.
        ranks = rng.random((permutations, n_a + n_b)).argsort(axis=1).argsort(axis=1)
        groups = np.vstack([np.arange(n_a + n_b) < n_a, ranks < n_a]).astype(np.float64)
        k_all = np.asarray(sum(parts.values()) / len(parts), dtype=np.float64)
        np.fill_diagonal(k_all, 0.0)
        w_a, w_b, across = kernel_means(k_all, groups, n_a)
        mmd2 = w_a + w_b - 2 * across
        k_div = np.asarray(sum(parts[c] for c in DIVERSITY) / len(DIVERSITY), dtype=np.float64)
        np.fill_diagonal(k_div, 0.0)
        d_a, d_b, _ = kernel_means(k_div, groups, n_a)
        z = _z(mmd2)
        z_mmd += z
        z_div += _z(d_b - d_a)
        raw_sum += mmd2
        within += (w_a[0], w_b[0])
        stats.append(PromptStat(
            pid, n_a, n_b, float(mmd2[0]), float(z[0]), float(w_a[0]), float(w_b[0]),
            float(across[0]),
            (float(np.mean([len(s) for s in ref])), float(np.mean([len(s) for s in cand]))),
        ))
    # One test of both views: the larger of the (re-standardised) sums, its null from the
    # same relabellings, so no multiplicity correction is needed.
    combined = np.maximum(_z(z_mmd), np.abs(_z(z_div)))
    p = _p(combined)
    p_parts = {"content": _p(z_mmd), "diversity": _p(np.abs(z_div))}
    floor = smallest_p([(s.n_reference, s.n_candidate) for s in stats], permutations)
    distance = float(raw_sum[0] / len(ids))
    critical = float(np.quantile(raw_sum[1:] / len(ids), 1 - alpha))
    ratio = float(within[1] / within[0]) if within[0] > 0 else None
    outcome: StatOutcome = "fail" if p <= alpha else "pass"
    if outcome == "pass" and floor > alpha:
        outcome = "inconclusive"
    samples = min(min(s.n_reference, s.n_candidate) for s in stats)
    top = max(stats, key=lambda s: s.z)
    worst = (f"{top.prompt_id}: MMD^2 {top.mmd2:.4f} (z={top.z:.1f}); within-sample similarity "
             f"{top.within_reference:.3f} vs {top.within_candidate:.3f}, mean length "
             f"{top.mean_length[0]:.1f} vs {top.mean_length[1]:.1f} tokens")
    verdict = {"fail": "differ from the reference's", "pass": "show no detected difference",
               "inconclusive": "cannot be told apart at this budget"}[outcome]
    # Sized by the statistic the test judges (MMD^2 against its flag level); no direction:
    # the test is two-sided and the exact test names the property where logprobs exist.
    summary = (
        f"sampled outputs {verdict}: distance (mean MMD^2) {distance:.4f}, flagged from "
        f"{critical:.4f}; p={p:.3g} (alpha {alpha:g}; smallest attainable {floor:.2g}; "
        f"content {p_parts['content']:.3g}, within-prompt similarity "
        f"{p_parts['diversity']:.3g}) over {len(ids)} prompts x >= {samples} samples"
        + (f" x {positions} tokens" if positions else "")
        + f"; most different: {worst}"
    )
    if outcome == "fail":
        summary += ("; whole outputs compared: where and how they differ needs the exact "
                    "per-position test (target logprobs)")
    if capped:
        summary += (f"; {capped} prompt(s) compared on a seeded sub-sample of "
                    f"{MAX_SAMPLES_PER_SIDE} samples a side")
    if outcome == "inconclusive":
        summary = ("cannot detect at this budget: " + summary)
    return DistributionResult(
        outcome=outcome, p_value=p, smallest_p=floor, alpha=alpha, distance=distance,
        critical=critical, similarity_ratio=ratio, n_prompts=len(ids),
        samples_per_prompt=samples, positions=positions, permutations=permutations,
        prompts=stats, p_parts=p_parts, worst=worst, summary=summary,
    )


__all__ = ["END", "KERNELS", "PERMUTATIONS", "DistributionResult", "PromptStat",
           "budget_problem", "distribution_check", "gram", "kernel_parts", "records_to_samples",
           "smallest_p"]
