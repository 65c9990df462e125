"""One verdict per sampling parameter, at the drafted positions against the baseline.

Sources (:mod:`pytest_osprey.pilot.probes`): each sampled probe's samples, scored by the
target, judged by the exact test (:mod:`.exact`) under that request's own sampling, at the
drafted positions ("later" where the engine does not tell them apart); the baseline's own
samples of the probe are the A/A control (where they fail, the scores do not describe what
the server samples from, and the parameter is not tested); the seed probe (one seeded request
twice); and the greedy probes of the penalties. A parameter the candidate refuses while the
baseline accepts it (an error "unsupported ...", HTTP 400) is "refused under speculation",
not a wrong output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ...pilot.probes import PARAMETERS, SAMPLED_PROBES, SEED_PROBE, SampledProbe
from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ...results.scores import ScoreLine
from .exact import ClassResult, ExactResult, ScoredSample, ScoredToken, Served, describe, exact_test
from .identity import first_divergence

Status = Literal["honoured", "not_honoured", "refused", "not_tested"]
_RANK: dict[Status, int] = {"not_honoured": 0, "refused": 1, "honoured": 2, "not_tested": 3}
_TRUNCATION = {"top_p": "top-p", "top_k": "top-k", "min_p": "min-p"}


@dataclass(frozen=True)
class ParamVerdict:
    """What the campaign shows of one parameter under speculation."""

    parameter: str  # the request field ("top_p")
    label: str  # its words ("top-p")
    status: Status
    why: str  # the sizing sentence, the refusal, or why it was not tested
    ignored: bool = False  # the evidence names this parameter (draws outside its support,
    # the penalties' own statistic), not only a distribution that differs
    p_value: float | None = None

    def clause(self) -> str:
        """The verdict in words ("top-p ignored at drafted positions (...)")."""
        if self.status == "not_honoured":
            if self.parameter == "seed":
                return f"seed not reproducible under speculation ({self.why})"
            what = "ignored" if self.ignored else "not honoured"
            return f"{self.label} {what} at drafted positions ({self.why})"
        if self.status == "refused":
            return f"{self.label} refused under speculation ({self.why})"
        if self.status == "honoured":
            # Not proof: the probe found no drop at its budget, which `why` sizes.
            return f"{self.label}: no fault found" + (f" ({self.why})" if self.why else "")
        return f"{self.label} not tested ({self.why})"

    def as_dict(self) -> dict[str, object]:
        return {"status": self.status, "why": self.why, "ignored": self.ignored,
                "p_value": self.p_value, "verdict": self.clause()}


def is_refusal(error: str | None) -> bool:
    """An engine that declines a parameter, as opposed to a request that broke."""
    e = (error or "").lower()
    return e.startswith("unsupported") or "http 400" in e or "not supported" in e


def combine(parameter: str, label: str, verdicts: Iterable[ParamVerdict]) -> ParamVerdict:
    """Several sources' verdicts of one parameter: the worst evidence wins (a wrong output,
    then a refusal, then honoured); untested only when no source tested it."""
    found = list(verdicts)
    if not found:
        return ParamVerdict(parameter, label, "not_tested", "no probe of it ran")
    best = min(found, key=lambda v: _RANK[v.status])
    if best.status == "not_tested":
        why = "; ".join(dict.fromkeys(v.why for v in found))
        return ParamVerdict(parameter, label, "not_tested", why)
    return ParamVerdict(parameter, label, best.status, best.why, best.ignored, best.p_value)


# --------------------------------------------------------------------------- sampled probes


def _samples(lines: Sequence[ScoreLine]) -> list[ScoredSample]:
    return [ScoredSample(line.prompt_id, line.sample_index, tuple(
        ScoredToken(p.token, p.logprob, p.top_ids, p.top_logprobs, k)
        for p, k in zip(line.positions, line.classes, strict=True))) for line in lines]


def _drafted(res: ExactResult) -> ClassResult | None:
    return res.classes.get("drafted") or res.classes.get("later")


def _sampled_verdict(probe: SampledProbe, ref: list[RequestRecord], cand: list[RequestRecord],
                     ref_lines: list[ScoreLine], cand_lines: list[ScoreLine], alpha: float,
                     level: float, seed: int, confidence: float) -> ParamVerdict:
    def verdict(status: Status, why: str, ignored: bool = False,
                p: float | None = None) -> ParamVerdict:
        return ParamVerdict(probe.parameter, probe.label, status, why, ignored, p)

    if not ref or not cand:
        return verdict("not_tested", f"{'the baseline' if not ref else 'the candidate'} did "
                       "not run its sampled probe")
    if not any(r.ok for r in ref):
        err = next(r.error for r in ref if not r.ok)
        return verdict("not_tested", f"the baseline itself refuses it: {err}")
    refused = [r for r in cand if not r.ok and is_refusal(r.error)]
    if refused:
        return verdict("refused", f"{refused[0].error} (the baseline accepts it)")
    if not cand_lines or not ref_lines:
        failed = [r for r in cand if not r.ok]
        return verdict("not_tested", f"its requests failed: {failed[0].error}" if failed
                       and not any(r.ok for r in cand) else "its samples were not scored by "
                       "the target")
    temperature = next((r.temperature for r in ref if r.temperature is not None), None)
    served = Served(temperature=float(temperature or 0.0), **dict(probe.settings))
    if served.temperature <= 0:
        return verdict("not_tested", "sampled at temperature 0")
    sizes = {line.vocab for line in (*ref_lines, *cand_lines)}
    vocab = sizes.pop() if len(sizes) == 1 else None
    control = exact_test(_samples(ref_lines), served, alpha, seed + 1, confidence=confidence,
                         vocab=vocab)
    if control.outcome == "fail":
        return verdict("not_tested", f"the target's scores do not describe the baseline's own "
                       f"samples at {served.words()} (A/A control: {control.summary})")
    res = exact_test(_samples(cand_lines), served, alpha, seed, confidence=confidence,
                     vocab=vocab)
    c = _drafted(res)
    if c is None:
        return verdict("not_tested", "no drafted position was sampled")
    if c.p_value >= level:
        return verdict("honoured", f"{c.n} drafted tokens as served at {served.words()}, "
                       f"p={c.p_value:.3g}", p=c.p_value)
    ignored = (c.decisive == "penalties" if probe.parameter.endswith("_penalty") else
               c.outside_support > 0 and _TRUNCATION.get(probe.parameter) == max(
                   c.outside_by.items(), key=lambda kv: kv[1])[0])
    return verdict("not_honoured", f"{describe(c, served)}; served {served.words()}",
                   ignored, c.p_value)


def sampled_verdicts(pilot: Pilot, data: SavedCampaign, reference: str,
                     condition: str) -> dict[str, ParamVerdict]:
    """Each sampled probe's verdict (keyed by parameter), at the probes' Bonferroni share of
    ``limits.quality.distribution_alpha``; {} where the pass ran no sampled probe."""
    ref = [r for r in data.of(reference, mode="params") if (r.probe or "").startswith("sampled:")]
    cand = [r for r in data.of(condition, mode="params")
            if (r.probe or "").startswith("sampled:")]
    if not ref and not cand:
        return {}
    alpha = pilot.limits.quality.distribution_alpha
    out: dict[str, ParamVerdict] = {}
    for probe in SAMPLED_PROBES:
        out[probe.parameter] = _sampled_verdict(
            probe, [r for r in ref if r.probe == probe.name],
            [r for r in cand if r.probe == probe.name], data.scores_of(reference, probe.name),
            data.scores_of(condition, probe.name), alpha, alpha / len(SAMPLED_PROBES),
            pilot.sampling.seed, pilot.decision.confidence)
    out["seed"] = seed_verdict([r for r in ref if r.probe == SEED_PROBE],
                               [r for r in cand if r.probe == SEED_PROBE])
    return out


def seed_verdict(ref: list[RequestRecord], cand: list[RequestRecord]) -> ParamVerdict:
    """The same seeded request twice: the same tokens under speculation wherever the
    baseline gives the same tokens twice."""
    def pairs(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
        out: dict[str, list[RequestRecord]] = {}
        for r in sorted(records, key=lambda r: r.sample_index):
            out.setdefault(r.prompt_id, []).append(r)
        return out

    mine, theirs = pairs(cand), pairs(ref)
    found: list[ParamVerdict] = []
    for pid, base in theirs.items():
        two = mine.get(pid, [])
        if len(base) < 2 or not all(r.ok for r in base):
            found.append(ParamVerdict("seed", "seed", "not_tested", "the baseline's seeded "
                                      "requests did not both complete"))
        elif base[0].output_ids != base[1].output_ids:
            found.append(ParamVerdict("seed", "seed", "not_tested", "the baseline itself gives "
                                      "different tokens for one seed"))
        elif any(not r.ok and is_refusal(r.error) for r in two):
            err = next(r.error for r in two if not r.ok)
            found.append(ParamVerdict("seed", "seed", "refused", f"{err} (the baseline "
                                      "accepts it)"))
        elif len(two) < 2 or not all(r.ok for r in two):
            found.append(ParamVerdict("seed", "seed", "not_tested", "the candidate's seeded "
                                      "requests did not both complete"))
        else:
            pos = first_divergence(two[0].output_ids, two[1].output_ids)
            found.append(ParamVerdict("seed", "seed", "honoured", "") if pos is None else
                         ParamVerdict("seed", "seed", "not_honoured", f"{pid}: one seed, two "
                                      f"outputs that part at token {pos}", True))
    return combine("seed", "seed", found)


def parameter_verdicts(sampled: dict[str, ParamVerdict],
                       greedy: dict[str, ParamVerdict]) -> dict[str, ParamVerdict]:
    """Every parameter of :data:`PARAMETERS`, its sources combined."""
    return {name: combine(name, label, [v for v in (sampled.get(name), greedy.get(name))
                                        if v is not None])
            for name, label in PARAMETERS}


def used_by_service(pilot: Pilot) -> set[str]:
    """The parameters the timed (served) requests set: a refusal of one of these means the
    service cannot run as configured with the drafter."""
    s = pilot.sampling.serving
    used = {"temperature", "seed"} if s.sampled else set()
    if s.sampled and s.top_p < 1:
        used.add("top_p")
    if s.sampled and s.top_k is not None:
        used.add("top_k")
    if s.sampled and s.min_p > 0:
        used.add("min_p")
    return used
