"""The speed gate on merged shards, by simulated campaigns (testkit/speed_sim.py): pass p on
machine p mod N, every condition on every machine, each machine with its own speed offset
and its own interaction with the drafter (centred: the verdict names the machines that ran).
benchmarks/shard_calibration.py runs the full table (docs/sharding.md)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pytest_osprey.judgement.speed import variance
from testkit.speed_sim import (
    KEEP,
    REFERENCE_NOISE,
    SHIPPED,
    Campaigns,
    Design,
    fixed_outcomes,
    simulate,
)

ALPHA = 0.025
MACHINES = replace(REFERENCE_NOISE, name="machines", machine_sd=0.30,
                   machine_interaction_sd=0.10)


def limit(n: int) -> float:
    return ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / n)


def design(shards: int, passes_each: int = 2) -> Design:
    return Design(prompts=30, levels=(("x4", 4),), primary="x4", passes=shards * passes_each,
                  shards=shards)


def keep_rate(c: Campaigns, drift: bool = True) -> float:
    return float(np.mean(fixed_outcomes(c, 1.0, drift=drift) == KEEP))


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("shards", [2, 4, 8])
def test_false_keep_with_machine_offsets_and_interactions(shards: int) -> None:
    n = 400
    rate = keep_rate(simulate(design(shards), MACHINES, 1.0, n, seed=shards, pool_size=32))
    assert rate <= limit(n), (shards, rate)


@pytest.mark.parametrize("shards", [2, 4])
def test_power_is_that_of_one_machine_with_all_the_passes(shards: int) -> None:
    n = 300
    sharded = keep_rate(simulate(design(shards), MACHINES, 1.1, n, seed=10 + shards,
                                 pool_size=32))
    alone = keep_rate(simulate(replace(design(shards), shards=1), MACHINES, 1.1, n,
                               seed=20 + shards, pool_size=32))
    assert 0.2 < alone < 0.99  # a comparison with room on both sides
    assert sharded >= alone - 4 * math.sqrt(alone * (1 - alone) / n), (sharded, alone)


def test_a_slow_machine_cannot_fake_a_speedup() -> None:
    """One machine runs everything 2x slower or faster than the other. Pairs stay within a
    machine, so it cancels; the planted fault - the reference's passes taken from the slower
    machine and the candidate's from the faster, as a split by condition could - buys keeps."""
    n = 400
    slow = replace(REFERENCE_NOISE, machine_sd=0.7)
    c = simulate(design(2), slow, 1.0, n, seed=5, pool_size=32)
    assert keep_rate(c) <= limit(n)
    ref, cand, units = c.reference["x4"], c.candidate["x4"], c.units["x4"]
    even, odd = [0, 2], [1, 3]  # machine 1's passes, machine 2's
    odd_slower = (np.nanmean(np.log(ref[:, :, odd]), axis=(1, 2, 3))
                  > np.nanmean(np.log(ref[:, :, even]), axis=(1, 2, 3)))[:, None, None, None]
    crossed = replace(
        c, design=replace(c.design, passes=2, shards=1),
        reference={"x4": np.where(odd_slower, ref[:, :, odd], ref[:, :, even])},
        candidate={"x4": np.where(odd_slower, cand[:, :, even], cand[:, :, odd])},
        units={"x4": units[:, :, :2]})
    assert keep_rate(crossed, drift=False) > 0.5


def test_a_pass_slowed_for_the_reference_alone_is_still_caught_on_shards() -> None:
    """A machine's offset is taken out of the drift check (a slower box is no drift); a pass
    that ran slow for the reference alone on one machine is not, and still cannot buy keeps."""
    n = 400
    noise = replace(MACHINES, pass_slowdown=(0.3, 0.7), slowdown_reference_only=True)
    c = simulate(replace(SHIPPED, passes=4, shards=2), noise, 1.0, n, seed=9, pool_size=32)
    with pytest.MonkeyPatch.context() as mp:  # the fault bites a unit-clustered test (the
        mp.setattr(variance, "SERIAL_BELOW", 0)  # serial term alone counts part of it)
        assert keep_rate(c, drift=False) > 4 * ALPHA
    assert keep_rate(c) <= limit(n)


def test_the_drift_check_sees_each_machine_at_its_own_level() -> None:
    from pytest_osprey.judgement.speed.drift import within_machines

    rng = np.random.default_rng(0)
    base = np.exp(rng.normal(0, 0.5, (1, 1, 6))) * np.ones((1, 4, 1))  # (boots, passes, prompts)
    machines = np.arange(4) % 2
    slower = np.where(machines[None, :, None] == 1, 2.0, 1.0)
    ref, cand = base * slower, base * slower / 1.2
    ref[:, 2] *= 1.5  # machine 1's second pass ran slow for the reference alone
    fair_ref, fair_cand = within_machines([ref, cand], machines)
    # The offset is gone from both conditions alike: the speedup of every pass is unchanged.
    assert np.allclose(fair_ref / fair_cand, ref / cand)
    level = np.log(fair_cand).mean(axis=(0, 2))
    assert np.ptp(level) < 1e-9  # no machine is slower any more
    assert np.all(np.log(fair_ref[:, 2] / fair_ref[:, 0]) > 0.3)  # the slow pass stays
