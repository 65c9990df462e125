"""Every engine has the protocol's capabilities (server process, tokenizer, speculation
counters), reading None where it has none: the campaign calls them without asking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines import BootSpec, Engine, make_engine
from pytest_osprey.engines.kinds import KINDS, serving_kind
from testkit.factories import endpoint_conditions, make_pilot
from testkit.serving_sim import TemperatureEngine

CAPABILITIES = ("server", "tokenizer", "spec_counters")


def _pilot(engine: str) -> Any:
    if engine == "endpoint":
        return make_pilot(endpoint_conditions({"base": "http://127.0.0.1:9", "cand":
                                               "http://127.0.0.1:10"}),
                          target={"engine": "endpoint"})
    return make_pilot(target={"engine": engine})


@pytest.mark.parametrize("engine", sorted(KINDS))
def test_an_engine_not_started_reads_none_for_what_it_has_not(engine: str,
                                                              tmp_path: Path) -> None:
    pilot = _pilot(engine)
    name = pilot.baseline
    built = make_engine(pilot, name, BootSpec(name, tmp_path))
    assert type(built).__module__ == serving_kind(pilot, name).engine_class.split(":")[0]
    assert isinstance(built, Engine)
    assert built.server is None and built.tokenizer is None
    assert not built.spec_counters()  # None, or an empty snapshot before a server is up


def test_the_simulated_engine_has_the_protocol_too() -> None:
    sim = TemperatureEngine("base", drafter=False)
    assert isinstance(sim, Engine)
    assert all(hasattr(sim, c) for c in CAPABILITIES)
    assert sim.server is None and sim.tokenizer is None and sim.spec_counters() is None
