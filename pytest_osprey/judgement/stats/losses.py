"""Answers a candidate newly gets wrong: an exact binomial rule on the prompts at risk.

A drafter is meant to be lossless: it should not change what users get, so what counts is the
answers it *breaks*, not its pass rate. Among the R prompts whose ``expect`` check the
reference passed (the prompts at risk: only those can be lost), L the candidate fails are its
losses. Prompts the reference got wrong cannot be lost; the candidate getting them right is a
gain, reported and never set against a loss.

The rule (an exact one-sided binomial test of H0 "loss rate <= ``max_loss_rate``"): fail when
L exceeds the critical count c, the smallest count with P(Bin(R, max_loss_rate) > c) <= alpha.
A drafter at the tolerated rate therefore fails with probability <= alpha (exactly: the
binomial tail at c); with the default ``max_loss_rate`` 0, c = 0 and a lossless drafter never
fails, while any loss fails. Power against a drafter that breaks a share q of the answers is
P(Bin(R, q) > c): with c = 0, 1 - (1 - q)^R (R = 13: 0.75 at q = 10 %, 0.95 at 20 %).

"Not evaluable" when R = 0 (the reference got nothing right: nothing could be lost, so a pass
would prove nothing). A reference that is *always* right is the best case for this rule:
every checked prompt is at risk. A pass is reported with the one-sided (1 - alpha)
Clopper-Pearson upper bound on the loss rate, what "no loss seen" shows at this size, and is
marked underpowered when its power against ``DETECT_RATE`` is below ``DETECT_POWER``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scipy import stats as sps

from .core import StatsError

DETECT_RATE = 0.2  # the loss rate a tested pass must have been able to catch ...
DETECT_POWER = 0.8  # ... with this power
POWER_AT = (0.1, 0.2)  # loss rates whose power every result states


@dataclass(frozen=True)
class LossTest:
    outcome: Literal["pass", "fail", "skip"]
    at_risk: int  # R: prompts the reference got right
    losses: int  # L: of those, prompts the candidate got wrong
    max_loss_rate: float
    alpha: float
    critical: int  # c: fail when losses > c
    p_value: float  # P(Bin(R, max_loss_rate) >= L): 1 when L = 0
    upper: float  # one-sided (1 - alpha) Clopper-Pearson upper bound on the loss rate
    power: dict[float, float] = field(default_factory=dict)  # loss rate -> P(fail)

    @property
    def underpowered(self) -> bool:
        return self.at_risk > 0 and fail_probability(
            self.at_risk, DETECT_RATE, self.critical) < DETECT_POWER


def critical_count(at_risk: int, max_loss_rate: float, alpha: float) -> int:
    """The most losses a drafter at ``max_loss_rate`` exceeds with probability <= alpha."""
    if max_loss_rate <= 0:
        return 0
    return int(sps.binom.isf(alpha, at_risk, max_loss_rate))


def fail_probability(at_risk: int, loss_rate: float, critical: int) -> float:
    """P(more than ``critical`` losses) when each prompt at risk is lost with ``loss_rate``."""
    return float(sps.binom.sf(critical, at_risk, loss_rate))


def loss_test(at_risk: int, losses: int, max_loss_rate: float, alpha: float) -> LossTest:
    """The loss rule (module docstring) for ``losses`` of ``at_risk`` prompts."""
    if at_risk < 0 or not 0 <= losses <= max(at_risk, 0):
        raise StatsError(f"losses must lie in [0, at_risk], got {losses} of {at_risk}")
    if not 0 <= max_loss_rate < 1:
        raise StatsError(f"max_loss_rate must lie in [0, 1), got {max_loss_rate}")
    if not 0 < alpha < 1:
        raise StatsError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    if at_risk == 0:
        return LossTest("skip", 0, 0, max_loss_rate, alpha, 0, 1.0, 1.0)
    c = critical_count(at_risk, max_loss_rate, alpha)
    p = 1.0 if losses == 0 else float(sps.binom.sf(losses - 1, at_risk, max_loss_rate))
    upper = 1.0 if losses >= at_risk else float(sps.beta.ppf(1 - alpha, losses + 1,
                                                              at_risk - losses))
    power = {q: fail_probability(at_risk, q, c) for q in POWER_AT}
    return LossTest("fail" if losses > c else "pass", at_risk, losses, max_loss_rate, alpha,
                    c, p, upper, power)
