"""Repository glue only: safe during users' pilot runs from a checkout.

- ``pytester`` for the project's own tests, not enabled during a pilot run;
- ``--skip-slow`` leaves out the tests that boot real engines or train (CI runs them all);
- ``tests/`` and ``benchmarks/`` importable (test servers, benchmark drivers) by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
for _folder in ("tests", "benchmarks"):
    if str(ROOT / _folder) not in sys.path:
        sys.path.insert(0, str(ROOT / _folder))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skip-slow", action="store_true", default=False,
                     help="Skip the project's tests marked slow (they boot engines or train)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: boots real engines or trains; minutes")
    if not config.getoption("osprey_config", None):
        config.pluginmanager.import_plugin("pytester")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--skip-slow"):
        return
    skip = pytest.mark.skip(reason="--skip-slow")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
