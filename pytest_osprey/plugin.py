"""The pytest11 entry point: options and activation only.

Loaded by every pytest run where the package is installed, so it imports nothing at module
level (not even pytest): without ``--osprey-config`` it costs nothing and changes nothing.
With it, the pilot run is built (usage errors exit 4) and the adapter in
``pytest_adapter.py`` is registered: the acceptance suites, their fixtures and hooks.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

SUITES_DIR = Path(__file__).resolve().parent / "suites"
if not SUITES_DIR.is_dir():  # running from a checkout without an install
    SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


def pytest_addoption(parser: pytest.Parser) -> None:
    import sys

    if sys.stdout is None:  # standard output closed (``>&-``): see _no_stdout
        _no_stdout()
    group = parser.getgroup("osprey", "speculative-decoding drafter pilot (pytest-osprey)")
    group.addoption("--osprey-config", metavar="PATH", default=None,
                    help="Pilot file (pilot.yaml); activates the drafter pilot and its suites")
    group.addoption("--osprey-results", metavar="DIR", default=None,
                    help="Results folder, new or empty (default: a new timestamped folder "
                         "under osprey-results/)")
    group.addoption("--osprey-reuse", metavar="DIR", default=None,
                    help="Judge a saved campaign under the current pilot's limits into "
                         "DIR/rejudged-<time>/; boot nothing")
    group.addoption("--osprey-dry-run", action="store_true", default=False,
                    help="Check the pilot, command lines and artifacts only; boot nothing")
    group.addoption("--osprey-conditions", metavar="A,B", default=None,
                    help="Run only these conditions (the baseline is always included)")
    group.addoption("--osprey-benchmark-tables", action="store_true", default=False,
                    help="Run the latency series as pytest-benchmark benchmarks and show its "
                         "tables (implied by --benchmark-json, --benchmark-autosave and "
                         "--benchmark-compare)")
    group.addoption("--osprey-shard", metavar="K/N", default=None,
                    help="Run shard K of N (1-based) of the pilot's plan: a disjoint share of "
                         "its passes, every condition; `python -m pytest_osprey merge` pools "
                         "the shards' folders")
    group.addoption("--osprey-compare", metavar="DIR", default=None,
                    help="Compare with an earlier accepted campaign of the same trace and flag "
                         "regressions of the drafters kept there")


def _no_stdout() -> None:
    """With standard output closed, Python has no ``sys.stdout`` and pytest fails making its
    terminal, before a pilot run could start; pytest's capture then saves and restores that
    missing stream. Set here, at the plugin's loading (before capture starts), it is
    /dev/null: the run writes its folder and exits as on the command line, its terminal lines
    going nowhere. Only a session that could not have run at all is changed."""
    import os
    import sys

    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the session's)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "osprey(kind): an acceptance gate of pytest-osprey")
    if not config.pluginmanager.hasplugin("benchmark"):  # the latency-series suite's marker
        config.addinivalue_line("markers", "benchmark: pytest-benchmark settings (inactive)")
    path = config.getoption("osprey_config")
    if not path:
        return
    import pytest

    if hasattr(config, "workerinput") or (config.getoption("numprocesses", None) or 0):
        raise pytest.UsageError("pytest-osprey runs one campaign per session and cannot be "
                                "split over xdist workers: drop -n / --numprocesses")
    from . import pytest_adapter
    from .run.pilot_run import PilotRun, RunOptions, UsageError, sigterm_interrupts
    from .shards.plan import ShardError, parse_shard

    spec = config.getoption("osprey_conditions")
    shard = config.getoption("osprey_shard")
    try:
        parsed = parse_shard(shard) if shard is not None else None  # "": an unset $SHARD
    except ShardError as exc:
        raise pytest.UsageError(str(exc)) from None
    options = RunOptions(
        shard=parsed,
        results=config.getoption("osprey_results"),
        reuse=config.getoption("osprey_reuse"),
        conditions=spec.split(",") if spec else None,
        dry_run=config.getoption("osprey_dry_run"),
        compare=config.getoption("osprey_compare"),
    )
    try:
        run = PilotRun(path, options, cwd=config.invocation_params.dir,
                       progress=pytest_adapter.ProgressPrinter(config))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[pytest_adapter.RUN] = run
    # A skipped gate could not have failed (or was reported only): its reason is listed in
    # the short summary, unless the command line asked for none or for all outcomes.
    chars = config.option.reportchars or ""
    if not set(chars) & set("sNaA"):
        config.option.reportchars = chars + "s"
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:  # registered already: it read the option
            reporter.reportchars += "s"
    config.pluginmanager.register(pytest_adapter, "osprey-run")
    interrupts = sigterm_interrupts()
    interrupts.__enter__()

    def restore() -> None:
        interrupts.__exit__(None, None, None)

    config.add_cleanup(restore)
    # The acceptance suites are the tests of a pilot run, wherever pytest was started.
    suites = str(SUITES_DIR)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [suites]
    elif suites not in config.args:
        config.args.append(suites)
