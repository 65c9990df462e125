"""campaign.json as a campaign in progress writes it: the pilot, the plan, each condition's
boots, the schedule and the status."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from .. import __version__
from ..results.campaign_file import CampaignFile, ConditionRun
from .requests import host_facts
from .schedule import plan_facts

if TYPE_CHECKING:
    from .runner import Campaign


def campaign_meta(c: Campaign) -> CampaignFile:
    """The facts of ``c`` as they stand."""
    pilot = c.pilot
    return CampaignFile(
        run_id=c.run_id,
        tool_version=__version__,
        pilot_name=pilot.name,
        config_hash=pilot.digest(),
        pilot_text=c.config_text,
        trace_hash=c.trace.sha256,
        trace_files=[str(f) for f in c.trace.files],
        prompt_ids=[p.id for p in c.trace.prompts],
        baseline=pilot.baseline,
        current=pilot.current,
        candidates=[n for n in pilot.candidates if n in c.conditions],
        load_levels={k: v if isinstance(v, int) else v.model_dump(mode="json")
                     for k, v in pilot.load.levels.items()},
        blocks=c.plan.passes,
        plan=plan_facts(c.plan),
        warmup_requests=pilot.load.warmup_requests,
        order=pilot.load.order,
        sampling=pilot.sampling.model_dump(mode="json"),
        conditions={
            name: ConditionRun(role=pilot.conditions[name].role, error=st.error,
                               boot_s=st.boot_s, peak_memory_mb=st.peak_memory_mb,
                               fingerprint=st.fingerprint)
            for name, st in c.states.items()
        },
        schedule=c.schedule,
        early_stop=c.stop_rule is not None,
        sequential=c.sequential,
        stopped_after_block=c.stopped_after_block,
        status=c.status,
        stop_reason=c.stop_reason,
        writer_pid=os.getpid(),
        started_at=c.started_at,
        ended_at=time.time() if c.status != "running" else None,
        host=host_facts(),
    )
