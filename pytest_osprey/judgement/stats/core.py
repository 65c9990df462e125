"""What every test here shares: its error, its array type, its three-valued outcome and the
checks of its arguments.

Conventions: two-sided intervals at ``confidence`` have one-sided error
``(1 - confidence) / 2`` per side (a KEEP judged on the lower bound of a 95% interval is a
one-sided test at 2.5%); bad input raises :class:`StatsError` naming the problem.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
StatOutcome = Literal["pass", "fail", "inconclusive"]
"""A statistical test's outcome; a gate adds ``skip`` (see :mod:`..gates.result`)."""


class StatsError(ValueError):
    """Input the statistics cannot judge (empty, NaN, non-positive latency, too few prompts)."""


def check_unit(value: float, name: str) -> None:
    """Raise unless ``value`` lies strictly between 0 and 1 (a confidence, a rate)."""
    if not 0.0 < value < 1.0:
        raise StatsError(f"{name} must lie strictly between 0 and 1, got {value}")
