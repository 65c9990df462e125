"""pytest-osprey: keep or drop a speculative-decoding drafter, decided with evidence.

The Python API (no pytest needed)::

    from . import PilotRun, RunOptions

    outcome = PilotRun("pilot.yaml", RunOptions(results="out")).run()
    print(outcome.exit_code, [v.line() for v in outcome.judgement.verdicts])

Names are imported on first use, so that importing the package (as pytest's entry point
does) costs nothing.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pilot import Pilot, load_pilot
    from .run.pilot_run import PilotRun, RunOptions, RunOutcome, UsageError
    from .run.rejudge import rejudge
    from .version import __version__

_LAZY = {
    "PilotRun": ".run",
    "RunOptions": ".run",
    "RunOutcome": ".run",
    "UsageError": ".run",
    "rejudge": ".rejudge",
    "Pilot": ".pilot",
    "load_pilot": ".pilot",
    "__version__": ".version",
}

__all__ = ["Pilot", "PilotRun", "RunOptions", "RunOutcome", "UsageError", "__version__",
           "load_pilot", "rejudge"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)
