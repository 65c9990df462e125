"""Fixtures of the project's tests. The factories (records, pilots, saved campaigns, traces,
tiny-model paths) live in testkit/factories.py.

pytest also loads this file in a pilot run started from a checkout (testpaths names tests/):
it adds no hooks and imports nothing heavy (no numpy, torch), so such a run is unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.factories import TINY_DRAFTER, TINY_MODELS, TINY_TARGET


@pytest.fixture(scope="session")
def tiny_models() -> Path:
    """The tiny models' folder (fixtures/models or OSPREY_TINY_MODELS); skips the test where
    the target or the drafter is missing."""
    if not all((m / "config.json").is_file() for m in (TINY_TARGET, TINY_DRAFTER)):
        pytest.skip(f"tiny models not found under {TINY_MODELS} (set OSPREY_TINY_MODELS)")
    return TINY_MODELS


@pytest.fixture(scope="session", autouse=True)
def _no_xdist_worker_environment() -> Iterator[None]:
    """The suite runs on xdist workers (README's test command), whose variables a pytest
    started by a test would inherit: pytest-benchmark then takes it for a worker and disables
    itself. The session's tests and fixtures (module fixtures too: this one comes first) see
    the environment of a plain pytest run; xdist reads its own state from the worker's config,
    not from these."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                     "PYTEST_XDIST_TESTRUNUID"):
            mp.delenv(name, raising=False)
        yield
