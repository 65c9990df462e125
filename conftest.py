"""Repository glue only: safe during users' pilot runs from a checkout.

- ``pytester`` for the project's own tests, not enabled during a pilot run;
- ``--skip-slow`` leaves out the tests that boot real engines or train (CI runs them all);
- ``testkit`` (the test-support package) importable: pytest puts this file's folder, the
  checkout, on sys.path.
"""

from __future__ import annotations

import pytest


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
