"""The twin example's pilot (testkit/twin_example.py) is the shipped example's, served by
endpoints: the same conditions, roles, levels, limits and decision, a schema-valid pilot, and
the verdict and crossover the twins' truth implies."""

from __future__ import annotations

import yaml

from pytest_osprey.pilot.schema import Pilot
from testkit.twin_example import (
    EXAMPLE,
    LEVELS,
    PAIRS,
    PLANS,
    pilot_dict,
    right_verdict,
    trace_lines,
    true_crossover,
)


def test_the_pilot_is_the_example_served_by_endpoints() -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    urls = {c: f"http://127.0.0.1:{9000 + i}" for i, c in enumerate(example["conditions"])}
    for plan, load in PLANS.items():
        data = pilot_dict(urls, plan, None)
        pilot = Pilot.model_validate(data)
        assert list(pilot.conditions) == list(example["conditions"]), plan
        assert {n: c.role for n, c in pilot.conditions.items()} == {
            n: c["role"] for n, c in example["conditions"].items()}
        assert dict(pilot.load.levels) == example["load"]["levels"] == LEVELS
        assert pilot.load.passes == load["passes"]
        assert pilot.load.boots_per_condition == load["boots_per_condition"]
        assert data["limits"] == example["limits"] and data["decision"] == example["decision"]
    shipped = pilot_dict(urls, "shipped", None)["load"]
    assert (shipped["passes"], shipped["boots_per_condition"]) == (
        example["load"]["passes"], example["load"]["boots_per_condition"])


def test_trace_outputs_and_truth_reading() -> None:
    lines = trace_lines(9)
    assert {r["max_new_tokens"] for r in lines} == {256, 384, 512}
    assert {r["slice"] for r in lines} == {"core", "unusual"}
    # The profiles' truth (docs/scale.md): Osprey-like slower than EAGLE-3-like, both far
    # above 1.2x against plain at every level: DROP, speculation pays everywhere.
    truth = {(c, r, lv): (0.94 if r == "eagle3" else 1.9) for c, r in PAIRS for lv in LEVELS}
    assert right_verdict(truth, 1.2) == "DROP"
    assert true_crossover(truth, 1.2) == "pays_everywhere"
    faster = {**truth, ("osprey", "eagle3", "medium"): 1.05}
    assert right_verdict(faster, 1.2) == "KEEP"
    crossing = {**truth, ("osprey", "baseline", "high"): 1.1}
    assert true_crossover(crossing, 1.2) == "crosses"
