"""Which gates there are: every kind by name, and the question (family) each belongs to.

A kind is a ``StrEnum``, so it compares equal to its name (``GateKind.SPEEDUP ==
"speedup"``) and reads back from summary.json as one. Which evaluator judges each kind is
in :mod:`.evaluate`.
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """The question a gate answers."""

    PREFLIGHT = "preflight"  # judged before (and without) any boot: the pilot and artifacts
    SERVICE = "service"  # did the conditions serve alike and completely
    QUALITY = "quality"  # did the outputs stay as good
    SPEED = "speed"  # is it faster
    COST = "cost"  # is it worth its cost


class GateKind(StrEnum):
    COMMAND_LINE = "command_line"
    ARTIFACT = "artifact"
    COMPLETED = "completed"
    BOOT_CONSISTENCY = "boot_consistency"
    FAIRNESS = "fairness"
    MEMORY = "memory"
    LATENCY = "latency"
    GOODPUT = "goodput"
    GREEDY_IDENTITY = "greedy_identity"
    CORRECTNESS = "correctness"
    DISTRIBUTION = "distribution"
    SAMPLING_PARAMS = "sampling_params"
    ACCEPTANCE = "acceptance"
    SPEEDUP = "speedup"
    COST = "cost"
    BREAK_EVEN = "break_even"
