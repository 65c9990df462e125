"""Every engine has the protocol's capabilities (server process, tokenizer, speculation
counters), reading None where it has none: the campaign calls them without asking."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest

from pytest_osprey.engines import BootSpec, Engine, make_engine
from pytest_osprey.engines.embedded import engine as embedded
from pytest_osprey.engines.kinds import KINDS, serving_kind
from pytest_osprey.engines.sglang import engine as sglang
from pytest_osprey.engines.vllm import engine as vllm
from pytest_osprey.pilot.schema import Engine as EngineName
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


def test_every_engine_a_pilot_names_has_a_kind() -> None:
    assert set(KINDS) == set(get_args(EngineName))


@pytest.mark.parametrize(("name", "valid"), [("transformers", embedded.ALGORITHMS),
                                             ("sglang", sglang.ALGORITHMS),
                                             ("vllm", vllm.METHODS)])
def test_a_kinds_algorithms_are_those_its_engine_runs(name: str, valid: tuple[str, ...]) -> None:
    kind = KINDS[name]
    assert set(kind.algorithms) | kind.no_drafter == set(valid)
    assert kind.default_algorithm in kind.algorithms
    assert kind.plain_algorithm in kind.algorithms


def test_sglangs_default_algorithm_is_the_kinds() -> None:
    assert KINDS["sglang"].default_algorithm == sglang.DEFAULT_ALGORITHM
