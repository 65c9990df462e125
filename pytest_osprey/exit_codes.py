"""The exit status every entry point gives a judged run: ``run``, pytest's own status for a
pilot run, ``report``, ``merge`` and the Ray launcher all answer with :func:`exit_code`, so a
folder judged one way exits the same way whichever reads it.

0 every gating gate passed (an INCONCLUSIVE one too, unless ``decision.inconclusive: fail``),
1 a gating gate failed (or the campaign could not run, or its results were lost),
2 interrupted, or a saved campaign that is partial (no verdict is claimed),
3 an internal error, 4 a usage error (pilot, options, folders).
"""

from __future__ import annotations

from collections.abc import Iterable

from .judgement.gates.result import GateResult
from .judgement.verdict.judge import Judgement
from .pilot.schema import Decision

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_INTERRUPTED = 2  # pytest's ExitCode.INTERRUPTED; also: a saved campaign that is partial
EXIT_INTERNAL = 3
EXIT_USAGE = 4  # pytest's ExitCode.USAGE_ERROR


def gate_fails(result: GateResult, decision: Decision) -> bool:
    """Whether this gate fails the run: a gating FAIL, or a gating INCONCLUSIVE when the pilot
    says so (``decision.inconclusive: fail``). A reported-only gate never does."""
    if not result.spec.gating:
        return False
    return result.outcome == "fail" or (result.outcome == "inconclusive"
                                        and decision.inconclusive == "fail")


def exit_code(judgement: Judgement | Iterable[GateResult], decision: Decision, *,
              incomplete: bool = False, failed_outside_gates: bool = False) -> int:
    """The run's status from its judgement (or, with no campaign judged, the gates that were:
    preflight's) under the pilot's ``decision``.

    ``incomplete``: the campaign is partial (2, whatever the gates say: no verdict is
    claimed); ``failed_outside_gates``: no campaign, or results that could not be written (1).
    """
    if incomplete:
        return EXIT_INTERRUPTED
    results = judgement.results.values() if isinstance(judgement, Judgement) else judgement
    if failed_outside_gates or any(gate_fails(r, decision) for r in results):
        return EXIT_GATE_FAILED
    return EXIT_OK
