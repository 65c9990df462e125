"""Repository glue only: safe during users' pilot runs from a checkout.

- ``pytester`` for the project's own tests, not enabled during a pilot run;
- two markers: ``slow`` (boots the tiny models in the embedded engine, or trains: seconds to
  minutes each) and ``engine`` (boots a real SGLang or vLLM server: minutes each; skipped
  where OSPREY_SGLANG_PYTHON / OSPREY_VLLM_PYTHON are not set); the fast tier is
  ``-m "not slow and not engine"``, and ``--skip-slow`` skips both (CI runs them all);
- ``testkit`` (the test-support package) importable: pytest puts this file's folder, the
  checkout, on sys.path.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skip-slow", action="store_true", default=False,
                     help="Skip the project's tests marked slow or engine (they boot models or "
                          "servers, or train)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: boots the tiny models or trains; seconds to minutes")
    config.addinivalue_line("markers", "engine: boots a real SGLang or vLLM server; minutes")
    if not config.getoption("osprey_config", None):
        config.pluginmanager.import_plugin("pytester")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--skip-slow"):
        return
    skip = pytest.mark.skip(reason="--skip-slow")
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("engine"):
            item.add_marker(skip)
