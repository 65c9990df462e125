"""Greedy identity against a reference, with near-ties judged against an identical-condition
control.

Greedy speculative decoding is lossless: the candidate's greedy output should be the
reference's, token for token. Numerics can still flip a token where the reference's top two
are nearly tied (batch composition, kernel shapes), and a lossy acceptance rule flips exactly
such tokens too, only more often. So a divergence is judged where it first happens (after it,
the two outputs continue from different prefixes):

* a **near-tie** when the candidate's token is the reference's runner-up there and the
  reference's own top-1 minus top-2 logprob is <= epsilon (the engines record the top-2 ids
  beside the margin); a token the reference did not rank second, or a divergence without
  recorded ids, is **genuine**;
* near-ties are a **rate per compared token** (the tokens up to and including the first
  divergence, or the whole output when none), judged against an **identical-condition
  control** already in the campaign: the reference's own later passes, compared with its
  first output of the same prompt and load level exactly as the candidate's outputs are
  (other batch compositions, another moment). Every output is compared with the reference's
  first one at its level. Per prompt, the runs are grouped in slots (a condition's pass,
  summed over load levels); under H0 ("the candidate reproduces the reference as the
  reference reproduces itself") the slots of a prompt are exchangeable, so the exact test
  relabels which slots are the control's, independently per prompt, and the candidate fails
  when its excess of near-tie flips is significant (one-sided at alpha). Prompts are the
  units: nothing assumes a prompt's comparisons independent. The control sees one boot of
  the reference: an engine whose numerics change from boot to boot shows it against the
  candidate. Without a control (a single pass) the candidate's rate is held to a fixed
  ``max_near_tie_rate`` by an exact Poisson test. Both rates are reported with exact
  (Garwood) bounds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scipy import stats as sps

from ...results.records import RequestRecord

Key = tuple[str, str]  # (prompt id, load level)


@dataclass(frozen=True)
class Divergence:
    prompt_id: str
    position: int
    reference_token: int | None
    candidate_token: int | None
    margin: float | None  # reference's top-1 minus top-2 logprob at that position
    runner_up: int | None  # reference's top-2 token id there (None: not recorded)
    near_tie: bool
    reference_text: str
    candidate_text: str
    load: str = ""


@dataclass
class Comparison:
    """Greedy outputs compared with the reference's: divergences and the tokens compared."""

    compared: int = 0  # outputs compared
    identical: int = 0
    tokens: int = 0  # compared tokens (exposure)
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def genuine(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.near_tie]

    @property
    def near_ties(self) -> list[Divergence]:
        return [d for d in self.divergences if d.near_tie]

    @property
    def rate(self) -> float:
        return len(self.near_ties) / self.tokens if self.tokens else 0.0

    def add(self, ref: RequestRecord, other: RequestRecord, epsilon: float) -> bool:
        """Compare one output with the reference's; True when it flipped at a near-tie."""
        self.compared += 1
        pos = first_divergence(ref.output_ids, other.output_ids)
        if pos is None:
            self.identical += 1
            self.tokens += len(ref.output_ids)
            return False
        self.tokens += pos + 1
        d = classify(ref, other, pos, epsilon)
        self.divergences.append(d)
        return d.near_tie


@dataclass(frozen=True)
class Stratum:
    """One prompt: near-tie flips per run slot (a condition's boot and pass, over load levels)."""

    prompt_id: str
    control: tuple[int, ...]  # the reference condition's later passes
    candidate: tuple[int, ...]  # the candidate's passes


@dataclass(frozen=True)
class RateTest:
    """The candidate's near-tie rate against the control's (or a fixed rate)."""

    outcome: str  # pass | fail
    p_value: float
    method: str  # "control" | "fixed"
    fixed_rate: float | None


@dataclass
class IdentityResult:
    candidate: Comparison
    control: Comparison | None  # the reference's later passes against its first
    test: RateTest
    strata: list[Stratum] = field(default_factory=list)

    @property
    def compared(self) -> int:
        return self.candidate.compared

    @property
    def identical(self) -> int:
        return self.candidate.identical

    @property
    def genuine(self) -> list[Divergence]:
        return self.candidate.genuine

    @property
    def near_ties(self) -> list[Divergence]:
        return self.candidate.near_ties


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token; a length difference counts at the shorter end."""
    if len(a) == len(b) and a == b:  # the common case, compared at C speed
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _context(text: str, ids: Sequence[int], pos: int, width: int = 60) -> str:
    # Token->char offsets are engine-specific; approximate by the proportional position.
    if not ids:
        return text[:width]
    at = int(len(text) * pos / max(1, len(ids)))
    return text[max(0, at - width // 2) : at + width // 2]


def classify(
    reference: RequestRecord, candidate: RequestRecord, pos: int, epsilon: float
) -> Divergence:
    """The divergence at ``pos``: a near-tie only where the candidate's token is the
    reference's recorded runner-up and the reference's margin there is <= epsilon."""
    r_ids, c_ids = reference.output_ids, candidate.output_ids
    margin = None
    if reference.top2_margin is not None and pos < len(reference.top2_margin):
        margin = reference.top2_margin[pos]
    runner_up = None
    if reference.top2_ids is not None and pos < len(reference.top2_ids):
        top = reference.top2_ids[pos]
        runner_up = top[1] if len(top) > 1 else None
    token = c_ids[pos] if pos < len(c_ids) else None
    near = (margin is not None and margin <= epsilon and runner_up is not None
            and token == runner_up)
    return Divergence(
        prompt_id=reference.prompt_id, position=pos,
        reference_token=r_ids[pos] if pos < len(r_ids) else None, candidate_token=token,
        margin=margin, runner_up=runner_up, near_tie=near,
        reference_text=_context(reference.output_text, r_ids, pos),
        candidate_text=_context(candidate.output_text, c_ids, pos), load=reference.load,
    )


def _greedy_runs(records: Sequence[RequestRecord]) -> dict[Key, list[RequestRecord]]:
    """(prompt, load) -> completed greedy records, earliest boot and pass first."""
    out: dict[Key, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: (r.boot, r.repetition, r.started_at or 0.0)):
        if r.ok and r.mode == "greedy":
            out.setdefault((r.prompt_id, r.load), []).append(r)
    return out


def rerun_greedy(records: Sequence[RequestRecord]) -> dict[str, RequestRecord]:
    """Prompt id -> a rerun of its first greedy output (:func:`first_ok_greedy`): the next
    completed greedy record at the same load level, else at another level."""
    first = first_ok_greedy(records)
    runs = _greedy_runs(records)
    out: dict[str, RequestRecord] = {}
    for pid, rec in first.items():
        same = [r for r in runs.get((pid, rec.load), []) if r is not rec]
        other = [r for (p, _), v in runs.items() if p == pid for r in v if r.load != rec.load]
        if same or other:
            out[pid] = (same or other)[0]
    return out


def relabel_p(strata: Sequence[Stratum]) -> float:
    """Exact one-sided p-value of the candidate's excess near-tie flips, relabelling the run
    slots of each prompt independently.

    Per prompt with a control and b candidate slots, the statistic is a x (candidate flips) -
    b x (control flips); under H0 every choice of which a of the a + b slots are the
    control's is equally likely. The sum's exact distribution is a convolution over prompts.
    """
    dist: dict[int, float] = {0: 1.0}
    observed = 0
    for st in strata:
        a, b = len(st.control), len(st.candidate)
        if not a or not b:
            continue
        slots = [*st.control, *st.candidate]
        total = sum(slots)
        values: dict[int, float] = {}
        labelings = list(itertools.combinations(range(a + b), a))
        for chosen in labelings:
            ctrl = sum(slots[i] for i in chosen)
            v = a * (total - ctrl) - b * ctrl
            values[v] = values.get(v, 0.0) + 1 / len(labelings)
        observed += a * sum(st.candidate) - b * sum(st.control)
        nxt: dict[int, float] = {}
        for s0, p0 in dist.items():
            for v, pv in values.items():
                nxt[s0 + v] = nxt.get(s0 + v, 0.0) + p0 * pv
        dist = nxt
    return float(min(1.0, sum(p for v, p in dist.items() if v >= observed - 1e-9)))


def garwood(events: int, exposure: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided Poisson (Garwood) bounds of a rate per unit of exposure."""
    if exposure <= 0:
        return 0.0, math.inf
    a = (1 - confidence) / 2
    low = 0.0 if events == 0 else sps.chi2.ppf(a, 2 * events) / 2 / exposure
    high = sps.chi2.ppf(1 - a, 2 * events + 2) / 2 / exposure
    return float(low), float(high)


def greedy_identity(
    reference: Sequence[RequestRecord],
    candidate: Sequence[RequestRecord],
    epsilon: float,
    alpha: float = 0.025,
    max_near_tie_rate: float = 0.002,
) -> IdentityResult:
    """Compare every greedy output of the candidate, and the reference's later passes (the
    control), with the reference's first output of the same prompt and load level; test the
    candidate's near-tie flips against the control's (module docstring)."""
    ref_runs, cand_runs = _greedy_runs(reference), _greedy_runs(candidate)
    cand, control = Comparison(), Comparison()
    slots: dict[str, dict[tuple[str, int, int], int]] = {}
    for key, runs in ref_runs.items():
        first = runs[0]
        theirs = [("control", r) for r in runs[1:]]
        theirs += [("candidate", r) for r in cand_runs.get(key, [])]
        for side, other in theirs:
            flipped = (control if side == "control" else cand).add(first, other, epsilon)
            per = slots.setdefault(first.prompt_id, {})
            slot = (side, other.boot, other.repetition)
            per[slot] = per.get(slot, 0) + flipped
    strata = [Stratum(pid, tuple(v for (s, *_), v in sorted(per.items()) if s == "control"),
                      tuple(v for (s, *_), v in sorted(per.items()) if s == "candidate"))
              for pid, per in sorted(slots.items())]
    if control.compared:
        p = relabel_p(strata)
        test = RateTest("fail" if p <= alpha else "pass", p, "control", None)
        return IdentityResult(cand, control, test, strata)
    events = len(cand.near_ties)
    p = 1.0 if events == 0 else float(sps.poisson.sf(events - 1, max_near_tie_rate * cand.tokens))
    test = RateTest("fail" if p <= alpha else "pass", p, "fixed", max_near_tie_rate)
    return IdentityResult(cand, None, test, strata)


def first_ok_greedy(records: Sequence[RequestRecord]) -> dict[str, RequestRecord]:
    """Prompt id -> its first completed greedy record (earliest boot and pass, then start
    time)."""
    out: dict[str, RequestRecord] = {}
    for r in sorted(records, key=lambda r: (r.boot, r.repetition, r.started_at or 0.0)):
        if r.ok and r.mode == "greedy" and r.prompt_id not in out:
            out[r.prompt_id] = r
    return out
