"""Did each condition run the speculation its pilot names? From campaign.json alone.

Every boot's fingerprint holds ``speculation``: ``asked`` (the pilot's settings in the engine's
terms), ``ran`` (what the server resolved, read back from it after the boot: SGLang's
/server_info, vLLM's dev-mode /server_info, the embedded engine's own k) and
``adaptive_allowed``. The stretches of the schedule hold the engine's counter snapshots, whose
depth gauges (SGLang's ``sglang:spec_num_steps`` / ``spec_num_draft_tokens``) give the depth
that ran per stretch. A setting that differs, or a depth that adapts without the pilot's
``speculation.adaptive: true``, is a fairness difference, named; with it, the depth is
reported per stretch. Where the engine counts draft tokens (vLLM), the mean K per stretch,
draft tokens over verify steps, is compared with the pilot's num_draft_tokens the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..quality.acceptance import K_TOLERANCE

SETTINGS = ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens")
"""The settings compared (a pilot that leaves one unset names no value to compare)."""


def _same(name: str, a: Any, b: Any) -> bool:
    return str(a).lower() == str(b).lower() if name == "algorithm" else bool(a == b)


def speculation_differences(condition: str, facts: Mapping[str, Any],
                            adaptive_allowed: bool | None = None) -> list[str]:
    """Each setting ``condition``'s engine ran otherwise than asked, named ("cand: engine ran
    num_steps 3, pilot says 5"), and adaptive depth unless allowed (``adaptive_allowed``: the
    pilot's speculation.adaptive; None: the fingerprint's). A setting one side does not
    state is not compared."""
    asked = facts.get("asked") if isinstance(facts.get("asked"), Mapping) else {}
    ran = facts.get("ran") if isinstance(facts.get("ran"), Mapping) else {}
    assert isinstance(asked, Mapping) and isinstance(ran, Mapping)
    allowed = bool(facts.get("adaptive_allowed")) if adaptive_allowed is None else adaptive_allowed
    out = []
    for name in SETTINGS:
        want, got = asked.get(name), ran.get(name)
        if want is not None and got is not None and not _same(name, want, got):
            out.append(f"{condition}: engine ran {name} {got}, pilot says {want}")
    if ran.get("adaptive") and not allowed:
        how = f" (K by batch size: {ran['k_by_batch_size']})" if ran.get("k_by_batch_size") else ""
        out.append(f"{condition}: engine adapts its speculation depth at run time{how}, and the "
                   "pilot does not allow it (speculation.adaptive: true)")
    return out


def depth_differences(condition: str, facts: Mapping[str, Any],
                      depths: Iterable[Mapping[str, Any]],
                      adaptive_allowed: bool | None = None) -> list[str]:
    """The stretches whose depth gauges show a depth other than the pilot's (unless adaptive
    depth is allowed): ``depths`` as judgement.quality.acceptance.depth_per_stretch gives."""
    allowed = bool(facts.get("adaptive_allowed")) if adaptive_allowed is None else adaptive_allowed
    asked = facts.get("asked") if isinstance(facts.get("asked"), Mapping) else {}
    if allowed or not isinstance(asked, Mapping):
        return []
    out = []
    for d in depths:
        if d.get("condition") != condition:
            continue
        for name in ("num_steps", "num_draft_tokens"):
            want = asked.get(name)
            seen = [v for v in d.get(name, []) if want is not None and v != want]
            if seen:
                shown = "/".join(f"{v:g}" for v in seen)
                out.append(f"{condition}: engine ran {name} {shown} in stretch {d['stretch']} "
                           f"(load {d.get('load')!r}), pilot says {want}")
        k, want = d.get("mean_k"), asked.get("num_draft_tokens")
        if isinstance(k, int | float) and want is not None and abs(k - want) > K_TOLERANCE:
            out.append(f"{condition}: engine drafted {k:.2f} tokens per verify step in stretch "
                       f"{d['stretch']} (load {d.get('load')!r}), pilot says "
                       f"num_draft_tokens {want}")
    return out
