"""Simulated campaigns under time-correlated noise, replayed through the real replay planner.

Every simulated campaign follows a plan from :func:`pytest_osprey.campaign.schedule.plan_replay`
(blocks re-drawn every pass, cycled to the level's concurrency; stretches, condition order,
boots), so the noise lands on requests in the order a campaign runs them. Requests are timed
(closed loop: a block's ``concurrency`` requests start together on as many lanes; the
runner's fillers keep that load until the last one ends, so a stall at any moment of the
stretch hits every measured request still in flight), copies of a prompt in a stretch are
combined as ``collect`` does, and noise is added in execution order:

* per request: log-normal (or Student-t) noise, AR(1) within a stretch, a share of requests
  slowed ``slow_factor`` x, a long-memory AR(1) running across stretches;
* per stretch: a log-normal shock; with some probability a stall at a random moment that
  slows every request in flight; a penalty on the first request after a condition switch;
* across requests: stalls hitting ``burst_len`` consecutive requests (across stretches);
* per boot and condition: an offset; over the campaign: a slow drift; optionally one pass
  slowed for everything (the drift check must catch it).

Noise multiplies latency and is defined in relative time (per request, per stretch, per
share of a stretch), so both conditions face the same noise distribution: the true
speedup is exactly the one planted (per-prompt geometric mean, or ratio of expected total
times when ``truth="total_time"``).

Everything is vectorised over campaigns; ``benchmarks/stats_calibration.py`` and the tests
(``tests/judgement/test_speed_simulation.py``) use it at different sizes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from pytest_osprey.campaign.schedule import Order, plan_replay
from pytest_osprey.judgement.speed.speedup import FloatArray, IntArray, Metric

CONDITIONS = ("baseline", "candidate")


@dataclass(frozen=True)
class Noise:
    """A noise model (all sizes on the log scale unless named a factor)."""

    name: str = "independent"
    request_sd: float = 0.10
    request_df: float = math.inf
    ar: float = 0.0
    long_sd: float = 0.0
    long_ar: float = 0.0
    shock_sd: float = 0.0
    burst_prob: float = 0.0
    burst_len: int = 4
    burst_factor: float = 2.0
    inflight_rate: float = 0.0  # stalls per round of a stretch (requests / concurrency)
    inflight_factor: float = 2.0
    boot_sd: float = 0.0
    drift_sd: float = 0.0
    drift_cycles: float = 1.0  # periods of the shared drift over the campaign
    slow_prob: float = 0.0
    slow_factor: float = 3.0
    switch_penalty: float = 0.0
    pass_slowdown: tuple[float, float] = (0.0, 0.0)  # one pass slowed by U(lo, hi)
    slowdown_reference_only: bool = False  # that pass slowed for the reference alone (a bias)
    machine_sd: float = 0.0  # per machine (shard): an offset to every condition alike
    machine_interaction_sd: float = 0.0  # per machine: the candidate's gain differs there
    # Per-server stalls: each condition is its own server; a stall starts at one of its
    # requests with ``stall_prob`` and slows that condition's next U(stall_len) requests.
    stall_prob: float = 0.0
    stall_len: tuple[int, int] = (2, 8)
    stall_factor: float = 2.0
    # Heavy-tailed stretch shocks: every stretch x (1 + pareto_scale * Lomax(pareto_shape)).
    pareto_scale: float = 0.0
    pareto_shape: float = 1.5


@dataclass(frozen=True)
class PromptModel:
    """Prompt effects: lognormal base latency and a prompt x drafter interaction."""

    prompt_sd: float = 0.6
    interaction_sd: float = 0.15
    base_s: float = 1.0
    concurrency_exponent: float = 0.3  # latency grows as concurrency ** exponent


@dataclass(frozen=True)
class Design:
    """The campaign's shape (the shipped embedded pilot by default)."""

    prompts: int = 21
    levels: tuple[tuple[str, int], ...] = (("low", 1), ("concurrent", 4))
    primary: str = "concurrent"
    passes: int = 2
    boots: int = 1
    order: Order = "interleaved"
    shards: int = 1  # machines: pass p runs on machine p mod shards (shards/plan.py)

    def level_names(self) -> list[str]:
        return [name for name, _ in self.levels]

    def requests_per_condition(self) -> int:
        return self.prompts * len(self.levels) * self.passes * self.boots


@dataclass(frozen=True)
class Campaigns:
    """Simulated latencies per level: ``(campaigns, boots, passes, prompts)`` per condition,
    copies of a prompt in a stretch combined as ``collect`` does (geometric mean), prompts
    in first-pass block order (``blocks`` gives each position's first-pass block, the same in
    every plan); ``units`` each cell's time unit ``(campaigns, boots, passes, prompts)``."""

    reference: dict[str, FloatArray]
    candidate: dict[str, FloatArray]
    blocks: dict[str, IntArray]
    design: Design
    units: dict[str, IntArray]


@dataclass(frozen=True)
class _PlanPool:
    cell: IntArray  # (pool, slots): canonical cell of each execution slot
    units: dict[str, IntArray]  # level -> (pool, boots, passes, prompts) time unit
    cond: IntArray  # (pool, slots) per execution slot
    prompt: IntArray
    boot: IntArray
    pass_index: IntArray
    segment: IntArray
    first: npt.NDArray[np.bool_]
    conc: IntArray
    blocks: dict[str, IntArray]
    segments: int


@functools.lru_cache(maxsize=32)
def plan_pool(design: Design, size: int = 256, seed: int = 0) -> _PlanPool:
    """``size`` seeded plans of ``design`` as slot arrays (execution order)."""
    ids = [f"p{i:03d}" for i in range(design.prompts)]
    index = {pid: i for i, pid in enumerate(ids)}
    strata = {pid: ("unusual" if i % 7 == 6 else "core") for i, pid in enumerate(ids)}
    levels = dict(design.levels)
    names = design.level_names()
    n, n_b, n_p = design.prompts, design.boots, design.passes
    rows: dict[str, list[list[int]]] = {k: [] for k in
                                        ("cond", "prompt", "boot", "pass", "seg", "first",
                                         "conc", "cell")}
    blocks: dict[str, IntArray] = {}
    units = {lvl: np.zeros((size, n_b, n_p, n), dtype=np.int64) for lvl in names}
    for q in range(size):
        plan = plan_replay(ids, CONDITIONS, levels, design.passes, design.boots, design.order,
                           strata, seed=f"{seed}:{q}")
        cond, prompt, boot, pas, seg, first, conc, key = [], [], [], [], [], [], [], []
        # Canonical position: first occurrence in the first pass's blocks, in block order
        # (chunk sizes are fixed by the design, so position j's first block is too).
        position = {lvl: {pid: j for j, pid in enumerate(dict.fromkeys(
            pid for b in plan.blocks[lvl] for pid in b))} for lvl in names}
        for s in plan.stretches:
            c = CONDITIONS.index(s.condition)
            lvl = names.index(s.level)
            for j, pid in enumerate(s.prompt_ids):
                cond.append(c)
                prompt.append(index[pid])
                boot.append(s.boot)
                pas.append(s.pass_index)
                seg.append(s.index)
                first.append(int(j == 0))
                conc.append(levels[s.level])
                pos = position[s.level][pid]
                key.append((((lvl * 2 + c) * n_b + s.boot) * n_p + s.pass_index) * n + pos)
                units[s.level][q, s.boot, s.pass_index, pos] = (
                    (s.boot * n_p + s.pass_index) * len(plan.blocks[s.level]) + s.block)
        for level in names:  # number the units in the order they ran, as ``collect`` does
            order: dict[int, int] = {}
            for s in plan.stretches:
                if s.level == level:
                    order.setdefault((s.boot * n_p + s.pass_index) * len(plan.blocks[level])
                                     + s.block, len(order))
            lookup = np.zeros(max(order) + 1, dtype=np.int64)
            lookup[list(order)] = list(order.values())
            units[level][q] = lookup[units[level][q]]
        for name, values in zip(rows, (cond, prompt, boot, pas, seg, first, conc, key),
                                strict=True):
            rows[name].append(values)
        if q == 0:
            for level in names:
                first_block = {pid: k for k, b in enumerate(plan.blocks[level]) for pid in b}
                blocks[level] = np.asarray([first_block[pid] for pid in position[level]],
                                           dtype=np.int64)
    arr = {k: np.asarray(v, dtype=np.int64) for k, v in rows.items()}
    return _PlanPool(arr["cell"], units, arr["cond"], arr["prompt"], arr["boot"], arr["pass"],
                     arr["seg"], arr["first"].astype(bool), arr["conc"], blocks,
                     int(arr["seg"].max()) + 1)


def _standard(rng: np.random.Generator, shape: tuple[int, ...], df: float) -> FloatArray:
    if math.isinf(df):
        return rng.standard_normal(shape)
    return np.asarray(rng.standard_t(df, shape) / math.sqrt(df / (df - 2)), dtype=np.float64)


def simulate(
    design: Design,
    noise: Noise,
    speedup: float,
    n_sims: int,
    seed: int,
    prompts: PromptModel = PromptModel(),
    truth: Metric = "per_prompt",
    pool_size: int = 256,
) -> Campaigns:
    """``n_sims`` campaigns of ``design`` under ``noise`` at a true ``speedup``."""
    rng = np.random.default_rng(seed)
    pool = plan_pool(design, pool_size)
    pick = rng.integers(0, pool.cell.shape[0], n_sims)
    cond, prompt = pool.cond[pick], pool.prompt[pick]
    boot, pas, seg = pool.boot[pick], pool.pass_index[pick], pool.segment[pick]
    first, conc = pool.first[pick], pool.conc[pick]
    shape = cond.shape
    s_idx = np.arange(n_sims)[:, None]

    base = prompts.prompt_sd * rng.standard_normal((n_sims, design.prompts))
    gain = math.log(speedup) + prompts.interaction_sd * rng.standard_normal(base.shape)
    if truth == "total_time":
        gain += prompts.interaction_sd**2 / 2  # 1 / E[exp(-gain)] = speedup
    log_lat = (math.log(prompts.base_s) + base[s_idx, prompt]
               + prompts.concurrency_exponent * np.log(conc) - cond * gain[s_idx, prompt])

    noise_log = np.zeros(shape)
    eta = _standard(rng, shape, noise.request_df)
    long_eta = rng.standard_normal(shape)
    ar_state = np.zeros(n_sims)
    long_state = np.zeros(n_sims)
    rho, rho_l = noise.ar, noise.long_ar
    for j in range(shape[1]):  # AR(1) within a stretch (reset at its first request)
        ar_state = np.where(first[:, j], eta[:, j],
                            rho * ar_state + math.sqrt(1 - rho * rho) * eta[:, j])
        long_state = rho_l * long_state + math.sqrt(1 - rho_l * rho_l) * long_eta[:, j]
        noise_log[:, j] = noise.request_sd * ar_state + noise.long_sd * long_state
    if noise.shock_sd:
        noise_log += noise.shock_sd * rng.standard_normal((n_sims, pool.segments))[s_idx, seg]
    if noise.slow_prob:
        noise_log += math.log(noise.slow_factor) * (rng.random(shape) < noise.slow_prob)
    if noise.boot_sd:
        offsets = noise.boot_sd * rng.standard_normal((n_sims, design.boots, 2))
        noise_log += offsets[s_idx, boot, cond]
    if noise.burst_prob:
        events = np.cumsum(rng.random(shape) < noise.burst_prob, axis=1)
        lagged = np.pad(events, ((0, 0), (noise.burst_len, 0)))[:, : shape[1]]
        noise_log += math.log(noise.burst_factor) * ((events - lagged) > 0)
    if noise.switch_penalty:
        noise_log += noise.switch_penalty * first
    if noise.stall_prob:
        noise_log += math.log(noise.stall_factor) * _stalls(rng, cond, noise)
    if noise.pareto_scale:
        shock = rng.pareto(noise.pareto_shape, (n_sims, pool.segments))
        noise_log += np.log1p(noise.pareto_scale * shock)[s_idx, seg]
    if design.shards > 1 and (noise.machine_sd or noise.machine_interaction_sd):
        # Pairs stay within a machine (a pass is one machine's), so a machine's offset
        # cancels; its interaction with the drafter does not. The verdict names the machines
        # that ran: the planted speedup is their mean, the interactions centred over them.
        machine = pas % design.shards
        offset = noise.machine_sd * rng.standard_normal((n_sims, design.shards))
        inter = noise.machine_interaction_sd * rng.standard_normal((n_sims, design.shards))
        inter -= inter.mean(axis=1, keepdims=True)
        noise_log += offset[s_idx, machine] - cond * inter[s_idx, machine]
    lo, hi = noise.pass_slowdown
    if hi > 0:
        which = rng.integers(0, design.boots * design.passes, n_sims)[:, None]
        slowed = (boot * design.passes + pas) == which
        if noise.slowdown_reference_only:
            slowed &= cond == 0
        noise_log += np.log1p(rng.uniform(lo, hi, (n_sims, 1))) * slowed

    latency = np.exp(log_lat + noise_log)
    start, end = _timeline(latency, first, conc)
    timed = np.zeros(shape)
    if noise.inflight_rate:
        seg_start = np.full((n_sims, pool.segments), np.inf)
        seg_end = np.zeros((n_sims, pool.segments))
        seg_size = np.zeros((n_sims, pool.segments))
        np.minimum.at(seg_start, (np.broadcast_to(s_idx, shape), seg), start)
        np.maximum.at(seg_end, (np.broadcast_to(s_idx, shape), seg), end)
        np.add.at(seg_size, (np.broadcast_to(s_idx, shape), seg), 1.0 / conc)
        hit = rng.random(seg_size.shape) < np.minimum(1.0, noise.inflight_rate * seg_size)
        when = seg_start + rng.random(seg_size.shape) * (seg_end - seg_start)
        inflight = (start <= when[s_idx, seg]) & (when[s_idx, seg] < end) & hit[s_idx, seg]
        timed += math.log(noise.inflight_factor) * inflight
    if noise.drift_sd:
        u = start / end.max(axis=1, keepdims=True)
        phase = rng.uniform(0, 2 * math.pi, (n_sims, 1))
        timed += noise.drift_sd * math.sqrt(2) * np.sin(2 * math.pi * noise.drift_cycles * u
                                                        + phase)
    latency *= np.exp(timed)

    # Copies of a prompt in a stretch combine into one cell by the mean of logs (collect).
    n_lvl = len(design.levels)
    n_cells = n_lvl * 2 * design.boots * design.passes * design.prompts
    flat = (s_idx * n_cells + pool.cell[pick]).ravel()
    sums = np.bincount(flat, weights=np.log(latency).ravel(), minlength=n_sims * n_cells)
    counts = np.bincount(flat, minlength=n_sims * n_cells)
    dense = np.exp(sums / np.maximum(counts, 1)).reshape(
        n_sims, n_lvl, 2, design.boots, design.passes, design.prompts)
    names = design.level_names()
    return Campaigns({n: dense[:, i, 0] for i, n in enumerate(names)},
                     {n: dense[:, i, 1] for i, n in enumerate(names)},
                     dict(pool.blocks), design,
                     {n: pool.units[n][pick] for n in names})


def _stalls(rng: np.random.Generator, cond: IntArray, noise: Noise) -> FloatArray:
    """1 where a request falls in a stall of its own condition's server: per condition, in
    the order its requests ran, a stall starts at each with ``stall_prob`` and covers that
    request and the condition's next U(stall_len) - 1."""
    lo, hi = noise.stall_len
    out = np.zeros(cond.shape)
    rows = np.arange(cond.shape[0])[:, None]
    for c in range(len(CONDITIONS)):
        slots = np.argsort(cond != c, axis=1, kind="stable")[:, : int((cond[0] == c).sum())]
        onset = rng.random(slots.shape) < noise.stall_prob
        length = rng.integers(lo, hi + 1, slots.shape)
        hit = np.zeros(slots.shape, dtype=bool)
        for lag in range(hi):
            hit[:, lag:] |= (onset & (length > lag))[:, : slots.shape[1] - lag]
        out[rows, slots] = hit
    return out


def _timeline(
    latency: FloatArray, first: npt.NDArray[np.bool_], conc: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Start and end times: each stretch starts when the previous one has finished and keeps
    ``concurrency`` requests in flight (a request takes the first free lane)."""
    n_sims, n_slots = latency.shape
    lanes_max = int(conc.max())
    lanes = np.zeros((n_sims, lanes_max))
    lane_ids = np.arange(lanes_max)[None, :]
    start, end = np.zeros_like(latency), np.zeros_like(latency)
    rows = np.arange(n_sims)
    for j in range(n_slots):
        now = lanes.max(axis=1, keepdims=True)
        lanes = np.where(first[:, j, None], now, lanes)
        usable = np.where(lane_ids < conc[:, j, None], lanes, np.inf)
        lane = usable.argmin(axis=1)
        start[:, j] = usable[rows, lane]
        end[:, j] = start[:, j] + latency[:, j]
        lanes[rows, lane] = end[:, j]
    return start, end


# --------------------------------------------------------------------------- noise models


def noise_models() -> dict[str, Noise]:
    """The calibration's noise models; each is a shared baseline plus one structure."""
    base = Noise(request_sd=0.10)
    models = [
        base,
        replace(base, name="ar0.3", ar=0.3),
        replace(base, name="ar0.3+shock3%", ar=0.3, shock_sd=0.03),
        replace(base, name="ar0.3+shock5%", ar=0.3, shock_sd=0.05),
        replace(base, name="burst4", burst_prob=0.03, burst_factor=2.0),
        replace(base, name="inflight@4", inflight_rate=0.15, inflight_factor=2.0),
        replace(base, name="drift", drift_sd=0.10),
        replace(base, name="slow10%x3", slow_prob=0.10, slow_factor=3.0),
        replace(base, name="heavy-t3", request_sd=0.15, request_df=3.0),
        replace(base, name="long-memory", long_sd=0.10, long_ar=0.98),
        replace(base, name="switch", switch_penalty=0.10),
        replace(base, name="mixed", ar=0.3, shock_sd=0.05, burst_prob=0.02,
                inflight_rate=0.1, slow_prob=0.1, drift_sd=0.05),
        replace(base, name="reference", ar=0.3, shock_sd=0.03, slow_prob=0.10),
    ]
    return {m.name: m for m in models}


DRIFT_25 = math.log(1.25) / math.sqrt(2)  # drift_sd whose sine swings +-25%


def low_load_models() -> dict[str, Noise]:
    """Noise that breaks a test reading time units as independent at low load: per-server
    stalls of 2-8 consecutive requests of one condition, smooth drift of +-25% shared by both
    conditions over the campaign, heavy-tailed (Pareto) stretch shocks, and their mixture."""
    base = Noise(request_sd=0.10)
    models = [
        replace(base, name="stalls5%", stall_prob=0.05),
        replace(base, name="stalls10%", stall_prob=0.10),
        replace(base, name="drift25%", drift_sd=DRIFT_25),
        replace(base, name="pareto", pareto_scale=0.05),
        replace(base, name="mixture", stall_prob=0.05, drift_sd=DRIFT_25, pareto_scale=0.05),
    ]
    return {m.name: m for m in models}


# The issue's own setting: AR(1) 0.3 within a stretch, 3% stretch shocks, 10% of requests
# slowed 3x (with the prompt effects of PromptModel): the noise the shipped claims are made in.
REFERENCE_NOISE = Noise(name="reference", request_sd=0.10, ar=0.3, shock_sd=0.03,
                        slow_prob=0.10, slow_factor=3.0)
BOOT_NOISE = replace(Noise(request_sd=0.10), name="boot5%", boot_sd=0.05)
# The embedded pilot's shape: 21 prompts, low (1) and concurrent (4), primary concurrent,
# four passes with early stopping (looks after each pass).
SHIPPED = Design(passes=4)


# --------------------------------------------------------------------------- judging


KEEP, INCONCLUSIVE, DROP = 2, 1, 0


def _upto(lat: FloatArray, design: Design, look: int, looks: int) -> FloatArray:
    """The data an interim look sees (one boot: passes <= look; several: boots <= look+1)."""
    if look == looks:
        return lat
    if design.boots == 1:
        out = lat.copy()
        out[:, :, look:, :] = np.nan
        return out
    return lat[:, : look + 1]


def looks_of(design: Design) -> int:
    if design.order == "sequential" or design.boots > 1:
        return max(1, design.boots - 1)
    return design.passes


def z_scores(
    c: Campaigns, level: str, metric: Metric, log_values: list[float | FloatArray], look: int = 0
) -> tuple[list[FloatArray], FloatArray]:
    """Per log value v: z of the deciding test of log speedup vs v (normal scale), and the
    degrees of freedom of the first value's test, at ``look`` (0: all data)."""
    from pytest_osprey.judgement.speed.sequential import z_from_p
    from pytest_osprey.judgement.speed.speedup import deciding_t, p_value

    ref, cand, units = c.reference[level], c.candidate[level], c.units[level]
    if look:
        n_looks = looks_of(c.design)
        ref, cand = _upto(ref, c.design, look, n_looks), _upto(cand, c.design, look, n_looks)
        units = units[:, : ref.shape[1]]
    out = []
    first_df = np.zeros(0)
    for v in log_values:
        t, df = deciding_t(ref, cand, units, metric, v)
        out.append(z_from_p(p_value(t, df)))
        first_df = df if first_df.size == 0 else first_df
    return out, first_df


def drift_state(c: Campaigns, look: int = 0) -> tuple[npt.NDArray[np.bool_], FloatArray]:
    """The drift check per campaign as the gate runs it (the reference and the candidate at
    every level, each against itself; the bias bound from the pairs at each level), on the
    data of ``look`` (0: all): (unstable, log bias bound)."""
    from pytest_osprey.judgement.speed.drift import drift_batch, within_machines

    n_looks = looks_of(c.design)
    names = c.design.level_names()
    cut = [(_upto(side[name], c.design, look, n_looks) if look else side[name], name)
           for side in (c.reference, c.candidate) for name in names]
    series = [(x, c.units[name][:, : x.shape[1]]) for x, name in cut]  # the boots looked at
    if c.design.shards > 1:  # as the gate does for a merged campaign (gate.machines_of)
        machines = np.arange(c.design.passes) % c.design.shards
        n_lv = len(names)
        for i in range(n_lv):  # each level's two conditions together, as the gate does
            ref, cand = within_machines([series[i][0], series[i + n_lv][0]], machines)
            series[i], series[i + n_lv] = (ref, series[i][1]), (cand, series[i + n_lv][1])
    n = len(names)
    batch = drift_batch(series, pairs=[(i, i + n) for i in range(n)])
    return batch.unstable, batch.log_bias_bound


def unstable(c: Campaigns, look: int = 0) -> npt.NDArray[np.bool_]:
    """The drift check's verdict per campaign (see ``drift_state``)."""
    return drift_state(c, look)[0]


def drift_withheld(
    c: Campaigns, code: IntArray, threshold: float, metric: Metric, crit: float,
    look: int = 0, level: str | None = None,
) -> npt.NDArray[np.bool_]:
    """Keeps and drops the gate withholds (``speed_test``'s rule): the environment unstable
    and the verdict not holding on the paired comparison without some instance that changed
    (the drift-adjusted speedup)."""
    from pytest_osprey.judgement.speed.drift import drift_batch, within_machines

    n_looks = looks_of(c.design)
    names = c.design.level_names()
    level = level or c.design.primary
    data = {name: [(_upto(side[name], c.design, look, n_looks) if look else side[name])
                   for side in (c.reference, c.candidate)] for name in names}
    checked = dict(data)
    if c.design.shards > 1:  # as the gate does for a merged campaign (gate.machines_of)
        machines = np.arange(c.design.passes) % c.design.shards
        checked = {name: within_machines(pair, machines) for name, pair in data.items()}
    # An interim look with several boots sees the first boots only: their units too.
    series = [(checked[name][k], c.units[name][:, : checked[name][k].shape[1]])
              for k in (0, 1) for name in names]
    n = len(names)
    batch = drift_batch(series, pairs=[(i, i + n) for i in range(n)])
    held = np.zeros(code.shape, dtype=bool)
    ref, cand = data[level]
    units = c.units[level][:, : ref.shape[1]]
    passes = ref.shape[2]
    for r in range(batch.changed.shape[1]):
        hit = batch.unstable & batch.changed[:, r] & ((code == KEEP) | (code == DROP))
        if not hit.any():
            continue
        boot, pas = divmod(r, passes)
        rest = [x[hit].copy() for x in (ref, cand)]
        for x in rest:
            x[:, boot, pas] = np.nan
        (z,), _ = z_scores(Campaigns({level: rest[0]}, {level: rest[1]}, c.blocks, c.design,
                                     {level: units[hit]}), level, metric, [math.log(threshold)])
        lost = np.where(code[hit] == KEEP, z < crit, -z < crit)
        held[np.flatnonzero(hit)[lost]] = True
    return held


def fixed_outcomes(
    c: Campaigns, threshold: float, metric: Metric = "per_prompt", alpha: float = 0.025,
    level: str | None = None, drift: bool = True,
) -> IntArray:
    """KEEP / INCONCLUSIVE / DROP codes of the fixed design (all data, one test); with
    ``drift`` an unstable environment turns a KEEP or DROP that does not hold on the
    drift-adjusted speedup into INCONCLUSIVE, as the gate does."""
    from scipy import stats

    (z,), _ = z_scores(c, level or c.design.primary, metric, [math.log(threshold)])
    crit = float(stats.norm.isf(alpha))
    code = np.where(z >= crit, KEEP, np.where(-z >= crit, DROP, INCONCLUSIVE))
    if drift:
        code[drift_withheld(c, code, threshold, metric, crit, level=level)] = INCONCLUSIVE
    return code


def sequential_outcomes(
    c: Campaigns, threshold: float, metric: Metric = "per_prompt", alpha: float = 0.025,
    futility_power: float = 0.20, rho: float = 2.0, drift: bool = True,
) -> tuple[IntArray, IntArray]:
    """(decision code, looks used) of the group-sequential design per campaign; with an
    unstable environment a keep or drop that does not hold on the drift-adjusted speedup turns
    into "continue" (inconclusive at the last look)."""
    from scipy import stats

    from pytest_osprey.judgement.speed.sequential import decide, sequential_plan

    looks = looks_of(c.design)
    plan = sequential_plan(looks, alpha, futility_power=futility_power, rho=rho)
    n = c.reference[c.design.primary].shape[0]
    code = np.full(n, -1, dtype=np.int64)
    used = np.full(n, looks, dtype=np.int64)
    for look in range(1, looks + 1):
        (z,), df = z_scores(c, c.design.primary, metric, [math.log(threshold)], look)
        now = decide(z, plan, look, df)
        if drift:
            withheld = drift_withheld(c, now, threshold, metric,
                                       float(stats.norm.isf(alpha)), look)
            now[withheld] = INCONCLUSIVE if look == looks else -1
        fresh = (code == -1) & (now != -1)
        code[fresh] = now[fresh]
        used[fresh] = look
    return code, used
