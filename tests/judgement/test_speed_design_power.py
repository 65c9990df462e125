"""What the speed gate says it can see before the campaign: the smallest true speedup kept
with 80% power, per load level, checked by simulating campaigns of that design at that
speedup under the reference noise (testkit.speed_sim.REFERENCE_NOISE).

Tolerance: the statement's power within 0.8 +- 0.1 (the variance model is approximate:
0.75-0.79 measured at x1-x32 with 1000 campaigns; 300 campaigns add s.e. 0.023)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_osprey.judgement import design_sees
from pytest_osprey.judgement.speed.design_power import REFERENCE, level_sees
from testkit.factories import make_pilot
from testkit.speed_sim import KEEP, REFERENCE_NOISE, Design, PromptModel, fixed_outcomes, simulate

ALPHA = 0.025


def power_at(prompts: int, conc: int, speedup: float, n: int, seed: int) -> float:
    design = Design(prompts=prompts, levels=(("low", conc),), primary="low", passes=4)
    c = simulate(design, REFERENCE_NOISE, speedup, n, seed=seed)
    return float(np.mean(fixed_outcomes(c, 1.0) == KEEP))


def test_the_reference_noise_is_the_simulations_reference_setting() -> None:
    prompt = PromptModel()
    assert (REFERENCE.interaction_sd, REFERENCE.request_sd, REFERENCE.request_ar,
            REFERENCE.slow_share, REFERENCE.slow_factor, REFERENCE.stretch_sd) == (
        prompt.interaction_sd, REFERENCE_NOISE.request_sd, REFERENCE_NOISE.ar,
        REFERENCE_NOISE.slow_prob, REFERENCE_NOISE.slow_factor, REFERENCE_NOISE.shock_sd)


@pytest.mark.parametrize(("prompts", "conc"), [(21, 1), (21, 4), (21, 32)])
def test_the_stated_speedup_is_kept_with_about_80_percent_power(prompts: int, conc: int) -> None:
    sees = level_sees("low", conc, conc, True, prompts, 4, 1, 1.0, ALPHA)
    assert 1.0 < sees.detectable < 2.0
    power = power_at(prompts, conc, sees.detectable, 300, seed=prompts + conc)
    assert 0.7 <= power <= 0.9, (sees.phrase(), power)


def test_few_time_units_state_a_larger_speedup_and_do_not_see_a_smaller_one() -> None:
    """x32 on 21 prompts: one block a pass, 4 units (df 3). Its statement is larger than
    x1's, and at x1's detectable speedup it keeps well under 80% (the statement is not a
    formality: simulated, the small design misses what the large one sees)."""
    x1 = level_sees("low", 1, 1, True, 21, 4, 1, 1.0, ALPHA)
    x32 = level_sees("high", 32, 32, True, 21, 4, 1, 1.0, ALPHA)
    wide = level_sees("high", 32, 32, True, 50, 4, 1, 1.0, ALPHA)
    assert (x32.time_units, x32.df, x32.serial) == (4, 3.0, False)
    assert x1.serial and x1.time_units == 84
    assert x32.detectable > x1.detectable and x32.detectable > wide.detectable
    assert power_at(21, 32, x1.detectable, 300, seed=9) < 0.7


def test_the_pilot_statement_names_every_level_and_the_threshold() -> None:
    pilot = make_pilot(load={"levels": {"low": 1, "busy": 32}, "passes": 4},
                       limits={"speedup_min": 1.1})
    sees = design_sees(pilot, 21)
    assert [s.level for s in sees.levels] == ["low", "busy"]
    assert all(s.speedup_min == 1.1 and s.detectable > 1.1 for s in sees.levels)
    line = sees.line()
    assert "21 prompts, 4 passes" in line and "at x1 (84 time units" in line
    assert "at x32 (4 time units, df 3)" in line and "1.1x" in line


def test_one_unit_a_campaign_sees_no_speedup() -> None:
    sees = level_sees("high", 32, 32, True, 21, 1, 1, 1.0, ALPHA)
    assert sees.df == 0 and math.isinf(sees.detectable)
    assert "no speedup" in sees.phrase()
    assert math.isinf(level_sees("low", 1, 1, True, 0, 4, 1, 1.0, ALPHA).detectable)
